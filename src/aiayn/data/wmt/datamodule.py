"""WMT 2014 English-German and English-French (§5.1) as a :class:`TranslationDataModule`.

``prepare_data`` (Lightning runs it on one process per node, before ``setup`` on every rank)
prepares the pair once (:func:`aiayn.data.wmt.preparation.prepare_wmt`), or checks that the
prepared folder still matches the raw files; ``setup`` checks the prepared files of every split
the run reads, then maps the binarised training pairs and encodes the small dev (newstest2013)
and test (newstest2014) sets.
"""

from __future__ import annotations

import os
from pathlib import Path

from torch.utils.data import Dataset

from aiayn.data.datamodule import ROLES, TranslationDataModule
from aiayn.data.storage import corpus_files
from aiayn.data.subwords import Subwords
from aiayn.data.wmt.archives import expected_files
from aiayn.data.wmt.cleaning import CleaningRules
from aiayn.data.wmt.preparation import (
    TEST_SPLIT,
    VAL_SPLIT,
    is_prepared,
    prepare_wmt,
    prepared_dir,
)


class WMTDataModule(TranslationDataModule):
    """WMT14 ``src_lang``→``tgt_lang`` (en↔de or en↔fr) from the raw corpora under ``raw_dir``.

    ``max_words`` and ``max_ratio`` are the cleaning rules (:class:`aiayn.data.wmt.cleaning.CleaningRules`);
    ``subword_sample_pairs`` bounds the pairs the subword model is learnt from;
    ``prepare_workers`` is the number of encoding processes (default: one per CPU). The prepared
    data lives under ``<cache_dir>/wmt14/``. The rest is :class:`TranslationDataModule`'s.
    """

    EVALUATION_SPLITS = (VAL_SPLIT, TEST_SPLIT)  # newstest2013 (Table 3), newstest2014 (Table 2)
    DATA_ROOT_SETTING = "task.raw_dir"

    def __init__(
        self,
        raw_dir: str,
        src_lang: str = "en",
        tgt_lang: str = "de",
        vocab_size: int = 37000,
        max_tokens: int = 3200,
        max_length: int = 256,
        cache_dir: str | None = None,
        seed: int = 0,
        num_workers: int = 0,
        download: bool = True,
        val_split: str = VAL_SPLIT,
        test_split: str = TEST_SPLIT,
        eval_max_tokens: int | None = None,
        max_words: int = 250,
        max_ratio: float = 2.5,
        subword_sample_pairs: int = 1_000_000,
        prepare_workers: int | None = None,
        length_buckets: list[int] | None = None,
        subword_model: str | None = None,
    ):
        super().__init__(
            raw_dir, src_lang, tgt_lang, vocab_size, max_tokens, max_length, cache_dir, seed,
            num_workers, download, "train", val_split, test_split, eval_max_tokens, length_buckets, subword_model,
        )
        expected_files(raw_dir, src_lang, tgt_lang)  # an unsupported pair fails here, not later
        if (val_split, test_split) != (VAL_SPLIT, TEST_SPLIT):
            raise ValueError(f"WMT14 splits are {VAL_SPLIT!r} (validation) and {TEST_SPLIT!r} (test), got {val_split!r}, {test_split!r}")
        self.raw_dir = Path(raw_dir)
        self.rules = CleaningRules(max_words=max_words, max_ratio=max_ratio)
        self.subword_sample_pairs = subword_sample_pairs
        self.prepare_workers = prepare_workers
        self._matched = False  # whether this process has prepared the data or checked it against the raw files
        self.save_hyperparameters(logger=False)  # in checkpoints; the logged config has them as task.datamodule.*

    @property
    def prepared(self) -> Path:
        """The folder of the prepared data (see :mod:`aiayn.data.wmt.preparation`)."""
        return prepared_dir(self.raw_dir, self.cache_dir, self.src_lang, self.tgt_lang, self.vocab_size, self.rules,
                            self.subword_sample_pairs, self.subword_model)

    def prepare_data(self, hashes: bool = False) -> None:
        """Prepare the pair once (locate or download, clean, learn subwords, binarise), or reuse
        the folder prepared from the same raw files, once its files are checked as written (sizes;
        the SHA-256 of the token arrays too with ``hashes``, as ``prepare.py`` asks); then check
        the prepared files of every split."""
        self.check_folders()
        prepare_wmt(
            self.raw_dir, self.cache_dir, self.src_lang, self.tgt_lang, self.vocab_size, self.rules,
            self.subword_sample_pairs, self.prepare_workers or os.cpu_count(), self.download, hashes, self.subword_model,
        )
        self._matched = True
        self.check_files(ROLES)

    def preparation_needed(self) -> str | None:
        """What reading an evaluation split would start: the whole preparation (hours at full
        scale) when the data is not prepared yet; None when it is."""
        if is_prepared(self.prepared):
            return None
        return (f"its test sets are read from the prepared WMT14 {self.src_lang}-{self.tgt_lang} data, which is not "
                f"prepared under {self.cache_dir} (from task.raw_dir={self.raw_dir}); preparing it takes hours at full "
                "scale: run src/prepare.py with this task first")

    def _ready(self) -> Path:
        if not self._matched:  # setup() on a rank that did not run prepare_data(), or outside a Trainer
            self.prepare_data()
        return self.prepared

    def fetch_files(self, split: str) -> None:
        """Prepare the data (or check the preparation against the raw files) if this process has not."""
        self._ready()

    def required_files(self, split: str) -> dict[Path, str]:
        """The prepared files ``split`` is read from: the subword model and the binarised pairs
        for ``"train"``, the two text files for the evaluation splits."""
        directory = self.prepared
        if split == self.splits["train"]:
            paths = [directory / "sentencepiece.model", *(p for pair in corpus_files(directory, "train").values() for p in pair)]
        else:
            paths = list(self.split_files(split, self.download))
        return {path: f"part of the preparation at {directory}" for path in paths}

    def check_contents(self, split: str, role: str) -> None:
        """Nothing to read through: the prepared files were checked against the sizes and hashes
        recorded when they were written (:meth:`prepare_data`), and the raw dev and test sets
        for alignment and emptiness when they were prepared."""

    def missing_files_message(self, listing: str) -> str:
        return (f"the prepared WMT14 {self.src_lang}-{self.tgt_lang} data is incomplete: {listing}. Delete "
                f"{self.prepared}; the next run (or src/prepare.py) prepares it again from task.raw_dir={self.raw_dir}")

    def split_files(self, split: str, download: bool) -> tuple[Path, Path]:
        """The prepared (source, target) text files of ``newstest2013`` or ``newstest2014``."""
        if split not in (VAL_SPLIT, TEST_SPLIT):
            raise KeyError(f"only the evaluation splits {VAL_SPLIT!r} and {TEST_SPLIT!r} are text files; the training pairs are binarised")
        directory = self._ready()
        return directory / f"{split}.{self.src_lang}", directory / f"{split}.{self.tgt_lang}"

    def load_vocab(self) -> Subwords:
        """The shared subword model the data was prepared with."""
        if self.vocab is None:
            self.vocab = Subwords(self._ready() / "sentencepiece.model")
        return self.vocab

    def _load(self, role: str) -> Dataset:
        if role != "train":
            return super()._load(role)
        folder = self._ready()
        return self._prepared_training_pairs(folder, f"the preparation in {folder}")
