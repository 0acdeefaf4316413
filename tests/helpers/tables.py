"""experiments/tables.py run in this process, as the tables' tests call it."""

from __future__ import annotations

import importlib.util
import sys

from tests.helpers.runs import REPO


def tables_command(*args: str) -> int:
    """experiments/tables.py, run in this process (as `python experiments/tables.py ...`), then
    W&B's service closed as the process's exit closes it: a service left to a test that removed its
    settings (WANDB_*, HOME) failed the next tool's wandb.init in this process."""
    spec = importlib.util.spec_from_file_location("tables_command", REPO / "experiments" / "tables.py")
    command = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(command)
    try:
        return command.main(list(args))
    finally:
        if "wandb" in sys.modules:
            sys.modules["wandb"].teardown()
