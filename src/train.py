"""Train a Transformer: `python src/train.py [task=...] [model=...] [hardware=...] [key=value ...]`.

A thin entry point: the command is :mod:`aiayn.cli.train` (also installed as ``aiayn-train``).
"""

from aiayn.cli.train import main

if __name__ == "__main__":
    main()
