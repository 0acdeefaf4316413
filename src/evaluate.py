"""Evaluate a checkpoint the paper's way: `python src/evaluate.py ckpt=<file> [split=test]`.

A thin entry point (:mod:`aiayn.launch`): the command is :mod:`aiayn.cli.evaluate` (also installed as ``aiayn-evaluate``).
"""

from aiayn.launch import evaluate

if __name__ == "__main__":
    evaluate()
