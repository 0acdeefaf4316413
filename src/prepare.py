"""Prepare a task's data ahead of training: `python src/prepare.py task=wmt_en_de [task.raw_dir=...]`.

A thin entry point (:mod:`aiayn.launch`): the command is :mod:`aiayn.cli.prepare` (also installed as ``aiayn-prepare``).
"""

from aiayn.launch import prepare

if __name__ == "__main__":
    prepare()
