"""Data: reading corpora (plain, gz, sgm), WMT14 preparation, subword vocabularies, binarised
storage, token-budget batching and Lightning data modules.

Names are re-exported lazily, so importing a light submodule (e.g. ``aiayn.data.readers``)
does not import Lightning.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "DataError": "readers",
    "read_lines": "readers",
    "read_parallel": "readers",
    "iter_lines": "readers",
    "iter_parallel": "readers",
    "read_sgm": "sgm",
    "MappedCorpus": "storage",
    "prepare_wmt": "preparation",
    "WMTDataModule": "wmt_datamodule",
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
