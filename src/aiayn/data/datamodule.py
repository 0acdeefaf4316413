"""The Lightning data module of a line-aligned parallel corpus (:class:`TranslationDataModule`),
which the corpus-specific data modules subclass; the dataset and collation are in
:mod:`aiayn.data.corpus`."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import lightning as L
import numpy as np
from torch.utils.data import DataLoader, Dataset

from aiayn.data.batching import evaluation_tokens
from aiayn.data.cache import given_folder
from aiayn.data.checks import ROLES, SplitFiles
from aiayn.data.corpus import ParallelCorpus, filter_pairs, report_kept
from aiayn.data.encoded import encoded_training_pairs
from aiayn.data.loaders import split_loader
from aiayn.data.position import Position, align_progress, rank_batches, read_position, saved_position
from aiayn.data.readers import read_parallel
from aiayn.data.storage import MappedCorpus, within_length
from aiayn.data.subwords import Subwords, given_subwords, train_or_load
from aiayn.errors import ConfigError, DataError
from aiayn.metrics.scorers import CorpusBleu, Scorer

# The splits setup(stage) checks the files of and loads. Fitting takes the test split too, read once training
# ends (trainer.test): a missing file fails the run before its first step, not after its last, and what the
# test needs is known to fit (:meth:`_check_evaluation_batches`).
_STAGE_ROLES = {"fit": ROLES, "validate": ("val",), "test": ("test",), "predict": ("test",), None: ROLES}


class TranslationDataModule(SplitFiles, L.LightningDataModule):
    """Subword-encoded train/val/test splits of a line-aligned parallel corpus in token-budget
    batches; a subclass only says where each split's two files are (:meth:`split_files`).

    ``max_tokens`` bounds a batch's padded size per side (BOS/EOS included); ``max_length``
    drops training pairs with a side of more subword ids than that (BOS/EOS not counted);
    ``seed`` sets the training batch order; ``cache_dir`` (default paths.cache_dir's, ``$AIAYN_CACHE_DIR`` or
    ``~/.cache/aiayn``) holds the subword models and the training pairs encoded once (:mod:`aiayn.data.encoded`).

    The task's questions are the data module's to answer, so that no tool asks which kind of task
    it has: what its models do (:meth:`does`), which splits can be scored (:meth:`check_split`,
    :attr:`EVALUATION_SPLITS`), with what and against what (:meth:`scorer`, :meth:`evaluation_data`),
    the constraint decoding may put on its outputs (:meth:`output_constraint`, the object itself)
    and how raw text is read and outputs written (:meth:`raw_text`).
    """

    # The class of the constraint decoding may put on this task's outputs (decoding.constrained):
    # None, or e.g. aiayn.data.parsing.constraints.TreeConstraint (well-formed trees over the input's words).
    OUTPUT_CONSTRAINT: ClassVar[type | None] = None
    # The names of the splits of this corpus that evaluate.py can score; None: whatever split
    # names its files have (:meth:`split_files` says whether they are there).
    EVALUATION_SPLITS: ClassVar[tuple[str, ...] | None] = None

    def __init__(
        self,
        data_root: str,
        src_lang: str,
        tgt_lang: str,
        vocab_size: int,
        max_tokens: int,
        max_length: int,
        cache_dir: str | None,
        seed: int,
        num_workers: int,
        download: bool,
        train_split: str,
        val_split: str,
        test_split: str,
        eval_max_tokens: int | None,
        length_buckets: list[int] | None = None,
        subword_model: str | None = None,
    ):
        super().__init__()
        self.data_root = given_folder(data_root, self.DATA_ROOT_SETTING, "AIAYN_DATA_ROOT")
        self.src_lang, self.tgt_lang = src_lang, tgt_lang
        self.vocab_size = vocab_size
        self.max_tokens = max_tokens
        self.max_length = max_length
        # Training batches padded to these lengths (both sides) and to the rows their budget holds:
        # one shape per bucket (aiayn.data.batching.TokenBatchSampler); None: each batch as long as its longest.
        self.length_buckets = list(length_buckets) if length_buckets is not None else None
        self.cache_dir = given_folder(cache_dir, "paths.cache_dir", "AIAYN_CACHE_DIR") or _default_cache_dir()
        self.seed = seed
        self.num_workers = num_workers
        self.download = download
        self.splits = {"train": train_split, "val": val_split, "test": test_split}
        self.eval_max_tokens = evaluation_tokens(max_tokens, eval_max_tokens)
        if self.eval_max_tokens is None:  # max_tokens=auto: train.py's plan sizes the training batch
            raise ConfigError(f"task.datamodule.max_tokens={max_tokens} leaves the evaluation batches unsized: "
                              "give task.datamodule.eval_max_tokens=N")
        # The subword model given (task.subword_model), checked before anything is read; else one is learnt.
        self.subword_model = Path(subword_model) if subword_model is not None else None
        self.given_vocab = given_subwords(self.subword_model, vocab_size) if self.subword_model is not None else None
        self.vocab: Subwords | None = None
        self.filtered: dict[str, int] = {}
        self._datasets: dict[str, Dataset] = {}
        self._sources: dict[str, list[str]] = {}
        self._references: dict[str, list[str]] = {}
        self._resume_position: tuple[Position, int] | None = None
        self._old_order_epoch: int | None = None  # the epoch an older checkpoint goes on in its batch order

    def prepare_data(self, hashes: bool = False) -> None:
        """Check (fetching what is missing, where allowed) every split's files, then train or
        reuse the subword model (checked by its SHA-256 in any case: ``hashes`` is for corpora
        with larger prepared files)."""
        self.check_files(ROLES)
        self.load_vocab()

    def load_vocab(self) -> Subwords:
        """The joint subword model of the training split's source and target lines (cached), or the
        one given (``task.subword_model``)."""
        if self.vocab is None and self.given_vocab is not None:
            self.vocab = self.given_vocab
        if self.vocab is None:
            src_path, tgt_path = self.split_files(self.splits["train"], self.download)
            src, tgt = read_parallel(src_path, tgt_path)
            require_lines(src, src_path, tgt_path)
            self.vocab = self._train_or_load(src, tgt)
        return self.vocab

    def _train_or_load(self, src: list[str], tgt: list[str]) -> Subwords:
        # the vocabulary belongs to the data, not to the run: ``seed`` (batch order) is not passed
        return train_or_load(src + tgt, self.vocab_size, self.cache_dir)

    def setup(self, stage: str | None = None) -> None:
        """Check the files of every split the run will read (for ``"fit"``: train, validation
        and test, see :meth:`check_files`), then load the subword model and the splits ``stage``
        needs; splits already loaded are kept."""
        if stage not in _STAGE_ROLES:
            raise ValueError(f"unknown stage {stage!r}; expected one of {tuple(_STAGE_ROLES)}")
        self.check_files(_STAGE_ROLES[stage])
        for role in _STAGE_ROLES[stage]:
            if role not in self._datasets:
                self._datasets[role] = self._load(role)
                if role != "train":
                    self._check_evaluation_batches(role)

    def _check_evaluation_batches(self, role: str) -> None:
        """A ConfigError naming ``task.datamodule.eval_max_tokens`` when an example of an
        evaluation split is longer than a batch may be (evaluation keeps every example whole), so
        the run stops before its first step rather than at a validation or the test hours in."""
        length, example = self._longest_example(role)
        if length > self.eval_max_tokens:
            raise ConfigError(
                f"task.datamodule.eval_max_tokens={self.eval_max_tokens} (it defaults to max_tokens) is below the "
                f"longest {example}, which evaluation keeps whole; set it to at least {length}")

    def check_positions(self, max_positions: int) -> None:
        """A ConfigError naming ``model.max_positions`` when an example of an evaluation split
        loaded needs more positions than the model has (a side's subwords with its BOS or EOS; the
        examples are kept whole), so the run stops before its first step rather than at a validation
        or the test hours in. Training pairs are held to ``max_length``, checked against the
        positions with the config."""
        for role in ("val", "test"):
            if role in self._datasets:
                length, example = self._longest_example(role)
                if length > max_positions:
                    raise ConfigError(f"model.max_positions={max_positions} is below the longest {example}, which "
                                      f"evaluation keeps whole; raise model.max_positions to at least {length}")

    def _longest_example(self, role: str) -> tuple[int, str]:
        """The length of the longest example of a loaded evaluation split (the longer side, with
        BOS/EOS; 0 if the split is empty), and a phrase naming it for a message."""
        dataset = self._datasets[role]
        longest = np.maximum(np.asarray(dataset.src_lengths), np.asarray(dataset.tgt_lengths))  # with BOS/EOS
        if not longest.size:
            return 0, ""
        index = int(longest.argmax())
        name = self.splits[role] if self.splits[role] == role else f"{role} ({self.splits[role]})"
        return int(longest[index]), (f"example of the split {name}: {longest[index]} subword tokens with BOS/EOS "
                                     f"(pair {index + 1})")

    def _load(self, role: str) -> Dataset:
        """Read and encode the split of ``role``; a subclass may store its splits otherwise (a
        dataset with ``src_lengths``, ``tgt_lengths`` and ``(index, src_ids, tgt_ids)`` items)."""
        src_path, tgt_path = self.split_files(self.splits[role], self.download)
        src, tgt = read_parallel(src_path, tgt_path)
        require_lines(src, src_path, tgt_path)
        if self.vocab is None:
            learnt = role == "train" and self.given_vocab is None
            self.vocab = self._train_or_load(src, tgt) if learnt else self.load_vocab()
        if role == "train" and (stored := encoded_training_pairs(src, tgt, self.vocab, self.cache_dir)) is not None:
            return self._kept(stored, f"{src_path} / {tgt_path}")
        src_ids, tgt_ids = self.vocab.encode(src), self.vocab.encode(tgt)
        if role != "train":
            self._sources[role], self._references[role] = src, tgt
            return ParallelCorpus(src_ids, tgt_ids)
        keep, self.filtered = filter_pairs(src_ids, tgt_ids, self.max_length)  # encoded in memory: no cache held them
        report_kept(len(keep), len(src), f"{src_path} / {tgt_path}", self.filtered, self.max_length)
        return ParallelCorpus([src_ids[i] for i in keep], [tgt_ids[i] for i in keep], keep)

    def _prepared_training_pairs(self, folder: Path, source: str) -> Dataset:
        self.load_vocab()  # the pairs binarised in ``folder``, for a corpus prepared once
        return self._kept(MappedCorpus(folder, "train"), source)

    def _kept(self, corpus: MappedCorpus, source: str) -> Dataset:
        """The pairs of a binarised training corpus that ``max_length`` keeps; ``source`` names them."""
        kept, self.filtered = within_length(corpus, self.max_length)
        report_kept(len(kept), corpus.stored_size, source, self.filtered, self.max_length)
        return kept

    def dataset(self, split: str) -> Dataset:
        """The loaded dataset of ``split`` (``"train"``, ``"val"``, ``"test"`` or its file name)."""
        role = self._role(split)
        if role not in self._datasets:
            raise RuntimeError(f"split {split!r} is not loaded; call setup() with a stage that uses it first")
        return self._datasets[role]

    def references(self, split: str) -> list[str]:
        """The raw target lines of an evaluation split, indexed by dataset index."""
        return self._raw(self._references, split)

    def scorer(self) -> Scorer:
        """What evaluation scores decoded output with: BLEU both ways, sacreBLEU and the paper's
        tokenized BLEU of the target language (§6.1); a ConfigError where sacreBLEU's tokenizer
        for that language needs its extras."""
        try:
            return CorpusBleu(self.tgt_lang)
        except ValueError as error:
            raise ConfigError(str(error)) from None

    def preparation_needed(self) -> str | None:
        """What reading an evaluation split would start beyond reading (or fetching) its files:
        None here; a corpus that must be prepared first says so (WMT's data module)."""
        return None

    @classmethod
    def does(cls, datamodule: Mapping[str, Any]) -> str:
        """What a model of this task (its data module's config ``datamodule``) does, in words."""
        return f"translates {datamodule.get('src_lang')}→{datamodule.get('tgt_lang')}"

    @classmethod
    def output_constraint(cls, vocab: Subwords) -> Any:
        """The constraint decoding may put on this task's outputs (aiayn.model.search's
        OutputConstraint) for a model of ``vocab``; None: the task has none. A vocabulary the
        constraint cannot read (no tree symbols) is a ConfigError."""
        if cls.OUTPUT_CONSTRAINT is None:
            return None
        try:
            return cls.OUTPUT_CONSTRAINT(vocab)
        except ValueError as error:
            raise ConfigError(str(error)) from None

    @classmethod
    def raw_text(cls, vocab: Subwords, constraint: Any = None) -> Any:
        """How a model of ``vocab`` reads lines of text and how its outputs are written, where the
        task has its own way (aiayn.decoding.translator.RawTextForm: a parser's outputs as trees
        over the line's words, read with ``constraint``, the task's :meth:`output_constraint` of
        ``vocab`` where one is built already); None: encoded and decoded as text, as translations are."""
        return None

    def check_split(self, split: str, task: str) -> str:
        """The file name of the evaluation split ``split`` (a role, ``val``/``test``, or a name);
        a ConfigError naming the splits there are when this corpus has no such split."""
        name = self.splits.get(split, split)
        if self.EVALUATION_SPLITS is not None and name not in self.EVALUATION_SPLITS:
            roles = [role if named == role else f"{role} ({named})" for role, named in self.splits.items()
                     if role != "train"]
            shown = {named for role, named in self.splits.items() if role != "train"}
            names = [*roles, *(known for known in self.EVALUATION_SPLITS if known not in shown)]
            raise ConfigError(f"split={split}: task {task} has no such split; its splits are {', '.join(names)}")
        return name

    def evaluation_data(self, split: str, vocab: Subwords | None = None) -> tuple[list[str], list[str], list[str]]:
        """An evaluation split (a file name, :meth:`check_split`'s), aligned: its source lines,
        its target lines (what the model is trained to write: perplexity is theirs) and what
        :meth:`scorer` scores outputs against (here the same target lines); ``vocab``, the model's."""
        sources, targets = read_parallel(*(files := self.split_files(split, self.download)))
        require_lines(sources, *files)  # as training refuses it: nothing to score (perplexity would divide by 0)
        return sources, targets, targets

    def scoring_references(self, split: str) -> list[str]:
        """What :meth:`scorer` scores an evaluation split's output against, indexed by dataset
        index: the raw target lines."""
        return self.references(split)

    def sources(self, split: str) -> list[str]:
        """The raw source lines of an evaluation split, indexed by dataset index."""
        return self._raw(self._sources, split)

    def _raw(self, lines: dict[str, list[str]], split: str) -> list[str]:
        self.dataset(split)
        role = self._role(split)
        if role not in lines:
            raise KeyError(f"raw lines are kept for the evaluation splits only, not for {split!r}")
        return lines[role]

    @property
    def split_sizes(self) -> dict[str, int]:
        """Number of pairs of each loaded split (training pairs after filtering)."""
        return {role: len(dataset) for role, dataset in self._datasets.items()}

    def _role(self, split: str) -> str:
        if split in ROLES:
            return split
        for role, name in self.splits.items():
            if name == split:
                return role
        raise KeyError(f"unknown split {split!r}; use one of {ROLES} or {tuple(self.splits.values())}")

    def train_dataloader(self) -> DataLoader:
        loader = self._loader("train", self.max_tokens, shuffle=True, pad_to_equal=True)
        if self._resume_position is not None:  # restored from a checkpoint (aiayn.data.position)
            position, batches = self._resume_position
            loader.batch_sampler.resume(position.epoch, batches, position.by_steps)
            align_progress(position, self.trainer)
            self._resume_position, self._old_order_epoch = None, None if position.by_steps else position.epoch
        return loader

    def state_dict(self) -> dict[str, Any]:
        """Where training is in its epoch, in any layout (:func:`aiayn.data.position.saved_position`)."""
        return saved_position(self.trainer, self._old_order_epoch) if self.trainer is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume the training batches where the checkpoint's epoch stopped, as this run's ranks
        share them; a ConfigError where this run's step would take other batches."""
        position = read_position(state_dict, self.trainer)
        if position is not None:
            self._resume_position = (position, rank_batches(position, self.trainer))

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", self.eval_max_tokens, shuffle=False, pad_to_equal=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", self.eval_max_tokens, shuffle=False, pad_to_equal=False)

    def _loader(self, role: str, max_tokens: int, shuffle: bool, pad_to_equal: bool) -> DataLoader:
        trainer = self.trainer
        num_replicas, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        accumulate = getattr(trainer, "accumulate_grad_batches", 1) if role == "train" else 1  # per rank and step
        return split_loader(role, self.dataset(role), self.vocab, max_tokens, shuffle=shuffle, pad_to_equal=pad_to_equal,
                            seed=self.seed, num_replicas=num_replicas, rank=rank, accumulate=accumulate,
                            length_buckets=self.length_buckets if role == "train" else None,
                            num_workers=self.num_workers)


def require_lines(src: list[str], src_path: Path, tgt_path: Path) -> None:
    if not src:
        raise DataError(f"{src_path} / {tgt_path}: no lines; a split needs one sentence pair per line")


def _default_cache_dir() -> Path:  # conf/paths/default.yaml's paths.cache_dir, for one built without (Python)
    return Path(os.environ.get("AIAYN_CACHE_DIR") or Path.home() / ".cache" / "aiayn")
