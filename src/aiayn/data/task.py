"""The data module class a task's config names, found without building it: what a tool asks
about a task it holds only the config of (what its models do, its output constraint, the splits it
scores). Importing this imports no Lightning; asking does, through the data module's own module."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiayn.data.datamodule import TranslationDataModule
    from aiayn.data.subwords import Subwords


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


def raw_text_of(task: Mapping[str, Any], vocab: Subwords, constraint: Any = None) -> Any:
    """How a model of ``task`` (its config, or as much as names its data module) and ``vocab`` reads
    lines of text and writes its outputs, as the task's data module hands it over
    (aiayn.decoding.translator.RawTextForm, reading outputs with ``constraint`` where given; None:
    as text, a translation's). Only a vocabulary with tree symbols can be a parser's: another's task
    is not asked, whose data module's import is Lightning's (translate.py of a translation model
    starts without it)."""
    from aiayn.data.parsing.constraints import has_tree_symbols

    if not has_tree_symbols(vocab):
        return None
    kind = task_module(task)
    return kind.raw_text(vocab, constraint) if kind is not None else None
