"""Average a run's last checkpoints (§6.1):

A thin entry point (:mod:`aiayn.launch`): the command is :mod:`aiayn.cli.average` (also installed as ``aiayn-average``).
"""

from aiayn.launch import average

if __name__ == "__main__":
    average()
