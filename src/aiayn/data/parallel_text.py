"""A parallel corpus of one's own (``task=parallel_text``): line-aligned text files under one
folder, a pair per split, named as fairseq names them, ``<split>.<lang>`` (``train.de``,
``train.en``, ``valid.de`` …), each plain or gzipped (``train.de.gz``), as a
:class:`TranslationDataModule`.

The training split is prepared once (:mod:`aiayn.data.prepared_text`: the joint subword model
learnt from its two sides, every pair encoded into memory-mapped arrays that every process shares)
and prepared again when its files change; the validation and test splits are read and encoded
when they are loaded, as Multi30k's.
"""

from __future__ import annotations

import os
from pathlib import Path

from torch.utils.data import Dataset

from aiayn.data.checks import ROLES
from aiayn.data.datamodule import TranslationDataModule
from aiayn.data.prepared_text import MODEL, prepare_text, prepared_dir
from aiayn.data.readers import COMPRESSED_SUFFIXES, plain_or_gzipped
from aiayn.data.subwords import Subwords
from aiayn.errors import ConfigError, DataError


def corpus_file(data_dir: str | Path, split: str, lang: str) -> Path:
    """The file of ``split`` in ``lang`` under ``data_dir``: ``<split>.<lang>``, else
    ``<split>.<lang>.gz`` where only that one is there (the plain name when neither is; where both
    are, the plain one, with a warning: :func:`~aiayn.data.readers.plain_or_gzipped`)."""
    return plain_or_gzipped(Path(data_dir) / f"{split}.{lang}")


class ParallelTextDataModule(TranslationDataModule):
    """The splits ``train_split``, ``val_split`` and ``test_split`` of the corpus in ``data_dir``,
    ``src_lang``→``tgt_lang`` (see the module). Any other split whose two files are there can be
    scored too (``evaluate.py split=<name>``).

    ``subword_sample_pairs`` bounds the training pairs the subword model is learnt from (a uniform
    sample of a larger corpus); ``prepare_workers`` is the number of encoding processes (default:
    one per CPU). The prepared training split lives under ``<cache_dir>/parallel_text/``."""

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
        subword_sample_pairs: int = 1_000_000,
        prepare_workers: int | None = None,
        subword_model: str | None = None,
    ):
        for setting, lang in (("task.src_lang", src_lang), ("task.tgt_lang", tgt_lang)):
            if not isinstance(lang, str) or not lang.strip() or any(c in lang for c in "/\\"):
                raise ConfigError(f"{setting}={lang!r}: give the side's language code, as its files' names end (de, en)")
        if src_lang == tgt_lang:
            raise ConfigError(f"task.src_lang and task.tgt_lang are both {src_lang!r}: the two sides would be one file")
        super().__init__(
            data_dir, src_lang, tgt_lang, vocab_size, max_tokens, max_length, cache_dir, seed,
            num_workers, False, train_split, val_split, test_split, eval_max_tokens, length_buckets, subword_model,
        )
        for role, split in self.splits.items():
            self._named(split, f"task.datamodule.{role}_split")
        self.subword_sample_pairs = subword_sample_pairs
        self.prepare_workers = prepare_workers
        self._prepared: Path | None = None  # the prepared training split, once this process has prepared or checked it
        self._hashes = False  # whether that check takes the token arrays' SHA-256 too (prepare.py's)
        self.save_hyperparameters(logger=False)  # in checkpoints; the logged config has them as task.datamodule.*

    @property
    def prepared(self) -> Path:
        """The folder of the prepared training split (see :mod:`aiayn.data.prepared_text`)."""
        src_path, tgt_path = self.split_files(self.splits["train"], False)
        return prepared_dir(src_path, tgt_path, self.cache_dir, self.src_lang, self.tgt_lang, self.vocab_size,
                            self.subword_sample_pairs, self.subword_model)

    def prepare_data(self, hashes: bool = False) -> None:
        """Check every split's files, preparing the training split (or checking its preparation
        against its files; the token arrays by their SHA-256 too with ``hashes``, as ``prepare.py``
        asks), once: a folder prepared here is not checked again (before: prepared, then its new
        arrays read back and hashed), one checked here without ``hashes`` is, with them."""
        if hashes and not self._hashes:
            self._prepared, self._hashes = None, True
        self.check_files(ROLES)  # the training split's contents: its preparation (check_contents)
        self.load_vocab()

    def check_contents(self, split: str, role: str) -> None:
        """The training split is read through by its preparation, which stops at a misaligned
        pair or a line that is not UTF-8; the others as any corpus's."""
        if role != "train":
            return super().check_contents(split, role)
        try:
            self._ready()
        except DataError as error:
            raise DataError(f"{role} split {split!r}: {error}") from None

    def load_vocab(self) -> Subwords:
        """The joint subword model the training split was prepared with."""
        if self.vocab is None:
            self.vocab = Subwords(self._ready() / MODEL)
        return self.vocab

    def _ready(self) -> Path:
        if self._prepared is None:  # setup() on a rank that did not run prepare_data(), or outside a Trainer
            self._prepared = self._prepare(self._hashes)
        return self._prepared

    def _prepare(self, hashes: bool) -> Path:
        src_path, tgt_path = self.split_files(self.splits["train"], False)
        return prepare_text(src_path, tgt_path, self.cache_dir, self.src_lang, self.tgt_lang, self.vocab_size,
                            self.subword_sample_pairs, self.prepare_workers, hashes, self.subword_model)

    def _load(self, role: str) -> Dataset:
        if role != "train":
            return super()._load(role)
        src_path, tgt_path = self.split_files(self.splits["train"], False)
        folder = self._ready()
        return self._prepared_training_pairs(folder, f"{src_path} / {tgt_path} (prepared in {folder})")

    def check_split(self, split: str, task: str) -> str:
        """The split ``split`` names (a role, ``val``/``test``, or the name of a split whose files
        are in task.data_dir, :meth:`TranslationDataModule.check_split`); a path is no split's name
        (:meth:`_named`)."""
        name = super().check_split(split, task)
        self._named(name, "split", f"task=parallel_text task.data_dir=<its folder> task.src_lang={self.src_lang} "
                                   f"task.tgt_lang={self.tgt_lang} split=<its name>")
        return name

    def _named(self, split: str, setting: str, instead: str | None = None) -> None:
        """A ConfigError where ``split`` is a path, not a name: each split is two files in
        task.data_dir, ``<split>.<lang>``, and files elsewhere (``split=/data/mine`` for
        /data/mine.en and /data/mine.de) are another folder, given as task.data_dir (``instead``),
        not read from outside the corpus's folder under the corpus's name."""
        if split not in (".", "..") and "/" not in split and "\\" not in split and not split.startswith("~"):
            return
        where = Path(os.path.normpath(self.data_root / Path(split).expanduser()))
        instead = (instead or f"task.data_dir=<its folder> {setting}=<its name>").replace("<its folder>", str(
            where.parent)).replace("<its name>", where.name)
        raise ConfigError(f"{setting}={split}: a split is named by its files in task.data_dir ({self.data_root}), "
                          f"<split>.{self.src_lang} and <split>.{self.tgt_lang}, not by a path; for "
                          f"{where}.{self.src_lang} and .{self.tgt_lang} give {instead}")

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
            return (f"task.data_dir={self.data_root}: no such folder; give the folder that holds the corpus's files "
                    "(evaluate.py, for a checkpoint trained on a folder since moved: task=parallel_text "
                    f"task.data_dir=<folder> task.src_lang={self.src_lang} task.tgt_lang={self.tgt_lang})")
        test, val = self.splits["test"], self.splits["val"]
        there = [all(path.is_file() for path in self._paths(split)) for split in (test, val)]
        untested = "" if there != [False, True] or test == val else (  # the validation split there to test on
            f"; a corpus without a test split: task.datamodule.test_split={val} tests on the validation split")
        return (f"corpus files missing or unreadable: {listing}. Each split is two files under task.data_dir, "
                f"<split>.{self.src_lang} and <split>.{self.tgt_lang} (or .gz){untested}{self._found_instead(listing)}")

    def _found_instead(self, listing: str) -> str:
        """What task.data_dir holds in place of the files ``listing`` names: one compressed otherwise
        than with gzip (``test.de.xz``), and splits the settings do not name (``dev``)."""
        names = sorted(path.name for path in self.data_root.iterdir() if path.is_file())
        said = [f"; {name} is there, but a split's files are read plain or gzipped only: "
                + (f"decompress it, or gzip it as {stem}.gz" if f".{suffix}" in COMPRESSED_SUFFIXES else
                   f"if it is that file, name it {stem} (or gzip it as {stem}.gz)")
                for name in names for stem, _, suffix in (name.rpartition("."),)
                if stem and suffix != "gz" and f"{self.data_root / stem} (" in listing]
        sides = [{name.removesuffix(".gz").removesuffix(f".{lang}") for name in names
                  if name.removesuffix(".gz").endswith(f".{lang}")} for lang in (self.src_lang, self.tgt_lang)]
        there = sorted(sides[0] & sides[1])
        others = [split for split in there if split not in self.splits.values()]
        missing = [role for role, split in self.splits.items() if f"{role} split {split!r}: missing" in listing]
        if others and missing:
            said.append(f"; task.data_dir also holds the split(s) {', '.join(others)}: name one with "
                        + " or ".join(f"task.datamodule.{role}_split={others[0]}" for role in missing))
        elif there and " (split '" in listing:  # a split asked for by its name (evaluate.py split=<name>)
            said.append(f"; task.data_dir holds the split(s) {', '.join(there)}")
        binarised = [name for name in names
                     if name.endswith(".bin") or (name.startswith("dict.") and name.endswith(".txt"))]
        if any(name.endswith(".bin") for name in binarised):  # fairseq-preprocess's output, not its input
            said.append(f"; task.data_dir holds fairseq's binarised data ({', '.join(binarised[:3])}, …): give the "
                        "folder of the text files fairseq-preprocess read (its --trainpref, --validpref, --testpref)")
        return "".join(said)

    def _paths(self, split: str) -> tuple[Path, Path]:
        return corpus_file(self.data_root, split, self.src_lang), corpus_file(self.data_root, split, self.tgt_lang)
