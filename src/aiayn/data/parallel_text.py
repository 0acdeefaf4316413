"""A parallel corpus of one's own (``task=parallel_text``): line-aligned text files under one
folder, a pair per split, named as fairseq names them, ``<split>.<lang>`` (``train.de``,
``train.en``, ``valid.de`` …), each plain or gzipped (``train.de.gz``), as a
:class:`TranslationDataModule`.

The joint subword model is learnt from the training split's two sides, as for Multi30k; every split
is read and encoded when it is loaded, in every process (minutes and GBs for millions of pairs;
WMT14's corpora go through their own streaming preparation, :mod:`aiayn.data.wmt`).
"""

from __future__ import annotations

from pathlib import Path

from aiayn.data.datamodule import TranslationDataModule
from aiayn.errors import ConfigError, DataError


def corpus_file(data_dir: str | Path, split: str, lang: str) -> Path:
    """The file of ``split`` in ``lang`` under ``data_dir``: ``<split>.<lang>``, else
    ``<split>.<lang>.gz`` where only that one is there (the plain name when neither is)."""
    plain = Path(data_dir) / f"{split}.{lang}"
    gzipped = plain.with_name(f"{plain.name}.gz")
    return gzipped if not plain.exists() and gzipped.exists() else plain


class ParallelTextDataModule(TranslationDataModule):
    """The splits ``train_split``, ``val_split`` and ``test_split`` of the corpus in ``data_dir``,
    ``src_lang``→``tgt_lang`` (see the module). Any other split whose two files are there can be
    scored too (``evaluate.py split=<name>``)."""

    DATA_ROOT_SETTING = "task.data_dir"

    def __init__(
        self,
        data_dir: str,
        src_lang: str,
        tgt_lang: str,
        vocab_size: int = 8000,
        max_tokens: int = 3400,
        max_length: int = 256,
        cache_dir: str | None = None,
        seed: int = 0,
        num_workers: int = 0,
        train_split: str = "train",
        val_split: str = "valid",
        test_split: str = "test",
        eval_max_tokens: int | None = None,
        length_buckets: list[int] | None = None,
    ):
        for setting, lang in (("task.src_lang", src_lang), ("task.tgt_lang", tgt_lang)):
            if not isinstance(lang, str) or not lang.strip() or any(c in lang for c in "/\\"):
                raise ConfigError(f"{setting}={lang!r}: give the side's language code, as its files' names end (de, en)")
        if src_lang == tgt_lang:
            raise ConfigError(f"task.src_lang and task.tgt_lang are both {src_lang!r}: the two sides would be one file")
        super().__init__(
            data_dir, src_lang, tgt_lang, vocab_size, max_tokens, max_length, cache_dir, seed,
            num_workers, False, train_split, val_split, test_split, eval_max_tokens, length_buckets,
        )
        self.save_hyperparameters(logger=False)  # in checkpoints; the logged config has them as task.datamodule.*

    def split_files(self, split: str, download: bool) -> tuple[Path, Path]:
        """The (source, target) files of ``split``; a :class:`DataError` naming those not there."""
        paths = self._paths(split)
        missing = [str(path) for path in paths if not path.is_file()]
        if missing:
            raise DataError(self.missing_files_message("; ".join(f"{path} (split {split!r}: missing)" for path in missing)))
        return paths

    def required_files(self, split: str) -> dict[Path, str]:
        return {path: "" for path in self._paths(split)}

    def missing_files_message(self, listing: str) -> str:
        if not self.data_root.is_dir():
            return f"task.data_dir={self.data_root}: no such folder; give the folder that holds the corpus's files"
        test = self.splits["test"]
        untested = "" if all(path.is_file() for path in self._paths(test)) or test == self.splits["val"] else (
            f"; a corpus without a test split: task.datamodule.test_split={self.splits['val']} tests on the "
            "validation split")
        return (f"corpus files missing or unreadable: {listing}. Each split is two files under task.data_dir, "
                f"<split>.{self.src_lang} and <split>.{self.tgt_lang} (or .gz){untested}")

    def _paths(self, split: str) -> tuple[Path, Path]:
        return corpus_file(self.data_root, split, self.src_lang), corpus_file(self.data_root, split, self.tgt_lang)
