"""Translate text with a checkpoint: `python src/translate.py ckpt=<file> [input=...] [out=...]`.

A thin entry point: the command is :mod:`aiayn.cli.translate` (also installed as ``aiayn-translate``).
"""

from aiayn.cli.translate import main

if __name__ == "__main__":
    main()
