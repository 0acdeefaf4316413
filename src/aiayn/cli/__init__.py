"""The command-line tools: ``aiayn-train``, ``aiayn-prepare``, ``aiayn-evaluate``,
``aiayn-translate``, ``aiayn-average`` and ``aiayn-visualize`` (also ``python src/<name>.py``).

Each composes its Hydra config from the repository's ``conf/`` folder (or ``$AIAYN_CONFIG_DIR``),
reports the errors a user can fix as one line (:mod:`aiayn.cli.errors`) and has a ``--help`` of
its own (``conf/hydra/help/<tool>.yaml``, which uses the resolvers registered here).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from omegaconf import OmegaConf

# src/aiayn/cli/ → the repository root's conf/ (aiayn is installed editable from its checkout).
CONFIG_DIR = os.environ.get("AIAYN_CONFIG_DIR") or str(Path(__file__).resolve().parents[3] / "conf")


def tool_name() -> str:
    """The tool's name as the user invoked it: ``train.py`` for ``python src/train.py``,
    ``aiayn-train`` for the console script. It prefixes every one-line error."""
    return Path(sys.argv[0]).name or "aiayn"


def tool_command() -> str:
    """How to run the tool again: ``python src/train.py`` (as it was given) or ``aiayn-train``."""
    return f"python {sys.argv[0]}" if sys.argv[0].endswith(".py") else tool_name()


def config_options(group: str) -> str:
    """The options of a config group (``conf/<group>/*.yaml``), comma-separated."""
    return ", ".join(sorted(path.stem for path in Path(CONFIG_DIR, group).glob("*.yaml")))


# For conf/hydra/help/*.yaml: ${aiayn.tool:}, ${aiayn.command:}, ${aiayn.config_options:task}.
OmegaConf.register_new_resolver("aiayn.tool", tool_name, replace=True)
OmegaConf.register_new_resolver("aiayn.command", tool_command, replace=True)
OmegaConf.register_new_resolver("aiayn.config_options", config_options, replace=True)
