"""How each tool starts: ``src/<tool>.py`` and the ``aiayn-<tool>`` console scripts call
:func:`run`, which imports the tool's command (torch, Lightning, Hydra: seconds) and runs it, so
that Ctrl-C at any moment, start-up included, ends in one line and exit status 130 (before: a
KeyboardInterrupt traceback from inside an import). A help page (``--help``, ``--hydra-help``) is
printed without the command's imports (:mod:`aiayn.cli.help`). Nothing of aiayn is imported here before a
tool is but train's hold on the signals of its start (:mod:`aiayn.training.starting`, the standard
library alone): this module stands above the package, as the scripts do.
"""

from __future__ import annotations

import importlib
import signal
import sys
from pathlib import Path

TOOLS = ("train", "prepare", "evaluate", "translate", "average", "visualize", "export")


def run(tool: str) -> None:
    """``aiayn.cli.<tool>.main()``; Ctrl-C while it is imported, or wherever the tool does not
    handle it itself (while Hydra composes, say), is one line and exit status 130."""
    try:
        pages = importlib.import_module("aiayn.cli.help")  # a help page without the tool's imports
        main = pages.help_of(tool) if pages.asks_for_help(sys.argv[1:]) else importlib.import_module(f"aiayn.cli.{tool}").main
    except KeyboardInterrupt:
        sys.stderr.write(f"{Path(sys.argv[0]).name or 'aiayn'}: interrupted (Ctrl-C) while starting, before it did "
                         "anything: run the same command again\n")
        raise SystemExit(128 + signal.SIGINT) from None
    try:
        main()
    except KeyboardInterrupt:
        from aiayn.cli.errors import interrupted

        interrupted()


def train() -> None:
    """train: a preemption signal as it starts (its imports, Hydra's composition) is held until its
    set-up window opens, which stops the run in one line as it does later (aiayn.training.starting)."""
    from aiayn.training import starting  # the standard library's signal and os alone

    starting.hold()
    try:
        run("train")
    finally:
        starting.release()


def prepare() -> None:
    run("prepare")


def evaluate() -> None:
    run("evaluate")


def translate() -> None:
    run("translate")


def average() -> None:
    run("average")


def visualize() -> None:
    run("visualize")


def export() -> None:
    run("export")
