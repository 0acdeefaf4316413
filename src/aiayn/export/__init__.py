"""Sharing and serving a trained model with the tools everyone uses: a Hugging Face MarianMT
folder (:mod:`aiayn.export.huggingface`: weights mapped exactly by :mod:`aiayn.export.marian`, the
tokenizer's files, a model card) and a CTranslate2 model converted from it
(:mod:`aiayn.export.ctranslate2`, which also translates with it). ``transformers`` and
``ctranslate2`` are the optional extra ``pip install 'aiayn[serve]'``; nothing here imports them
until it is used.
"""
