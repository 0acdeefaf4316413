"""Data: reading corpora, subword vocabularies, token-budget batching and Lightning data modules.

Names are re-exported lazily, so importing a light submodule (e.g. ``aiayn.data.readers``)
does not import Lightning.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "DataError": "readers",
    "read_lines": "readers",
    "read_parallel": "readers",
    "multi30k_files": "multi30k",
    "Subwords": "subwords",
    "train_or_load": "subwords",
    "TokenBatchSampler": "batching",
    "ParallelCorpus": "datamodule",
    "TranslationBatch": "datamodule",
    "TranslationCollator": "datamodule",
    "TranslationDataModule": "datamodule",
    "Multi30kDataModule": "datamodule",
    "filter_pairs": "datamodule",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
