"""Export a checkpoint for Hugging Face Transformers or CTranslate2:

A thin entry point (:mod:`aiayn.launch`): the command is :mod:`aiayn.cli.export` (also installed as ``aiayn-export``).
"""

from aiayn.launch import export

if __name__ == "__main__":
    export()
