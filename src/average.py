"""Average a run's last checkpoints (§6.1):

A thin entry point: the command is :mod:`aiayn.cli.average` (also installed as ``aiayn-average``).
"""

from aiayn.cli.average import main

if __name__ == "__main__":
    main()
