"""Data: reading corpora (plain, gz, sgm), WMT14 preparation, subword vocabularies, binarised
storage, token-budget batching and Lightning data modules.

What every task shares is here (readers, subwords, batching, the parallel corpus and the base
data module); each corpus has its own module or subpackage (``multi30k``, ``wmt``, ``parsing``).

Names are re-exported lazily, so importing a light submodule (e.g. ``aiayn.data.readers``)
does not import Lightning.
"""

from __future__ import annotations

from aiayn._lazy import lazy_exports

_EXPORTS = {
    "DataError": "readers",
    "read_lines": "readers",
    "read_parallel": "readers",
    "iter_lines": "readers",
    "iter_parallel": "readers",
    "read_sgm": "wmt.sgm",
    "MappedCorpus": "storage",
    "prepare_wmt": "wmt.preparation",
    "WMTDataModule": "wmt.datamodule",
    "multi30k_files": "multi30k",
    "Subwords": "subwords",
    "train_or_load": "subwords",
    "TokenBatchSampler": "batching",
    "ParallelCorpus": "corpus",
    "TranslationBatch": "corpus",
    "TranslationCollator": "corpus",
    "TranslationDataModule": "datamodule",
    "Multi30kDataModule": "multi30k",
    "filter_pairs": "corpus",
}
__all__ = sorted(_EXPORTS)  # noqa: PLE0605  the lazily imported names above, one list of them
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
