"""Draw a trained model's attention maps (the paper's Figures 3–5) for one sentence:

A thin entry point (:mod:`aiayn.launch`): the command is :mod:`aiayn.cli.visualize` (also installed as ``aiayn-visualize``).
"""

from aiayn.launch import visualize

if __name__ == "__main__":
    visualize()
