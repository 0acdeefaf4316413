"""Evaluate a checkpoint the paper's way: `python src/evaluate.py ckpt=<file> [split=test]`.

A thin entry point: the command is :mod:`aiayn.cli.evaluate` (also installed as ``aiayn-evaluate``).
"""

from aiayn.cli.evaluate import main

if __name__ == "__main__":
    main()
