"""Translate text with a checkpoint: `python src/translate.py ckpt=<file> [input=...] [out=...]`.

A thin entry point (:mod:`aiayn.launch`): the command is :mod:`aiayn.cli.translate` (also installed as ``aiayn-translate``).
"""

from aiayn.launch import translate

if __name__ == "__main__":
    translate()
