"""What every tool says of itself: its name as the user invoked it (which prefixes each one-line
error), how to run it again, the options of a config group, the folder conf/ is composed from,
and a name a folder can take; with the resolvers conf/hydra/help/*.yaml and the sweep folders use.
A leaf of the tools' package: its other modules import these names from here."""

from __future__ import annotations

import hashlib
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


def say(line: str) -> None:
    """``<tool>: line`` on stderr in one write, newline included: the DDP ranks of a job share
    stderr, and print's separate write of the newline lets their lines run into one another."""
    sys.stderr.write(f"{tool_name()}: {line}\n")
    sys.stderr.flush()


def tool_command() -> str:
    """How to run the tool again: ``python src/train.py`` (as it was given) or ``aiayn-train``."""
    return f"python {sys.argv[0]}" if sys.argv[0].endswith(".py") else tool_name()


def config_options(group: str) -> str:
    """The options of a config group (``conf/<group>/*.yaml``), comma-separated."""
    return ", ".join(sorted(path.stem for path in Path(CONFIG_DIR, group).glob("*.yaml")))


def dirname(text: str, limit: int = 120) -> str:
    """``text`` as a folder name: itself when it is at most ``limit`` bytes long, else its start
    (slashes made underscores) and a hash of the whole, so that a sweep job with a dozen overrides
    gets a name the file system accepts (255 bytes at most) and two jobs never share one."""
    if len(text.encode()) <= limit:
        return text
    digest = hashlib.sha1(text.encode()).hexdigest()[:10]
    start = text.encode()[: limit - len(digest) - 1].decode(errors="ignore").replace(os.sep, "_")
    return f"{start}~{digest}"


# For conf/train.yaml's sweep folders: ${aiayn.dirname:${hydra.job.override_dirname}}.
OmegaConf.register_new_resolver("aiayn.dirname", dirname, replace=True)
# For conf/hydra/help/*.yaml: ${aiayn.tool:}, ${aiayn.command:}, ${aiayn.config_options:task}.
OmegaConf.register_new_resolver("aiayn.tool", tool_name, replace=True)
OmegaConf.register_new_resolver("aiayn.command", tool_command, replace=True)
OmegaConf.register_new_resolver("aiayn.config_options", config_options, replace=True)
