"""A tool's ``--help`` and ``--hydra-help`` without importing the tool: Hydra prints them from the
tool's own config (``conf/<tool>.yaml``, its page ``conf/hydra/help/<tool>.yaml``) and exits before
any command runs, so the command's imports (train's Lightning: seconds) are not needed for them.
:func:`aiayn.launch.run` serves them from here; the page is the one the tool's ``main`` prints.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import hydra
from omegaconf import DictConfig

from aiayn.cli.command_line import read_by_hydra
from aiayn.cli.errors import reports_composition_errors
from aiayn.cli.naming import CONFIG_DIR

HELP = ("--help", "-h", "--hydra-help")


def asks_for_help(arguments: Sequence[str]) -> bool:
    """Whether the command line asks for a help page (Hydra's options, wherever they are)."""
    return any(argument in HELP for argument in arguments)


def help_of(tool: str) -> Callable[[], None]:
    """``tool``'s entry point for its help pages, read as its ``main`` reads its command line."""

    @read_by_hydra(tool)
    @reports_composition_errors
    @hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name=tool)
    def main(cfg: DictConfig) -> None:  # Hydra prints the page and exits before calling it
        raise AssertionError(f"{tool}: a help page was asked for, yet Hydra ran the command")

    return main
