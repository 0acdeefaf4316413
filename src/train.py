"""Train a Transformer: `python src/train.py [task=...] [model=...] [hardware=...] [key=value ...]`.

A thin entry point (:mod:`aiayn.launch`): the command is :mod:`aiayn.cli.train` (also installed as ``aiayn-train``).
"""

from aiayn.launch import train

if __name__ == "__main__":
    train()
