"""Decoding: turning a trained model and decoding settings into outputs.

``search`` (the front: the settings made into beam search or sampling, aiayn.model's),
``translator`` (sentences in, translations and perplexity out, in input order), ``speed`` (the
speed switches, each on a copy of the model), ``onnx_step`` (the decoder step run by ONNX
Runtime), ``ctranslate2`` (translating with a CTranslate2 export) and ``packages`` (what an
engine needs installed, asked for in one line).
"""
