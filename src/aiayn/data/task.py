"""The data module class a task's config names, found without building it: what a tool asks
about a task it holds only the config of (what its models do, its output constraint, the splits it
scores). Importing this imports no Lightning; asking does, through the data module's own module."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiayn.data.datamodule import TranslationDataModule


def task_module(task: Mapping[str, Any]) -> type[TranslationDataModule] | None:
    """The data module class ``task`` names (its ``datamodule._target_``), without building it;
    None for a target that is no data module of ours."""
    from aiayn.data.datamodule import TranslationDataModule

    module, _, name = str((task.get("datamodule") or {}).get("_target_", "")).rpartition(".")
    try:
        kind = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None
    return kind if isinstance(kind, type) and issubclass(kind, TranslationDataModule) else None
