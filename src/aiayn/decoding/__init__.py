"""Decoding: turning a trained model and decoding settings into outputs.

``settings`` (the settings as one frozen, checked object that names and describes itself),
``declarations`` (each setting's row: what it takes, its names, what each engine and mode serves),
``switches`` (the speed switches' defaults and checks), ``search`` (the front: a Decoding made
into beam search or sampling, aiayn.model's), ``translator`` (sentences in, translations and
perplexity out, in input order), ``speed`` (the speed switches applied, each on a copy of the
model), ``onnx_step`` (the decoder step run by ONNX Runtime), ``ctranslate2`` (translating with a
CTranslate2 export) and ``packages`` (what an engine needs installed, asked for in one line).
"""
