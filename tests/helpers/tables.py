"""experiments/tables.py run in this process, as the tables' tests call it."""

from __future__ import annotations

import importlib.util

from tests.helpers.runs import REPO


def tables_command(*args: str) -> int:
    """experiments/tables.py, run in this process (as `python experiments/tables.py ...`)."""
    spec = importlib.util.spec_from_file_location("tables_command", REPO / "experiments" / "tables.py")
    command = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(command)
    return command.main(list(args))
