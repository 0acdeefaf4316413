"""Export a checkpoint for Hugging Face Transformers or CTranslate2:

A thin entry point: the command is :mod:`aiayn.cli.export` (also installed as ``aiayn-export``).
"""

from aiayn.cli.export import main

if __name__ == "__main__":
    main()
