"""Parallel-corpus dataset, batch collation and the Lightning data modules built on them."""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

import lightning as L
import numpy as np
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from aiayn.data.batching import TokenBatchSampler
from aiayn.data.multi30k import multi30k_files, multi30k_path
from aiayn.data.readers import DataError, read_parallel
from aiayn.data.subwords import Subwords, train_or_load

log = logging.getLogger(__name__)

ROLES = ("train", "val", "test")
_STAGE_ROLES = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ("test",), None: ROLES}


class TranslationBatch(TypedDict):
    """A collated batch; a plain dict of tensors at run time."""

    src: Tensor  # (B, S) source ids + EOS, right-padded with pad_id
    tgt_in: Tensor  # (B, T) BOS + target ids, right-padded
    tgt_out: Tensor  # (B, T) target ids + EOS, right-padded
    index: Tensor  # (B,) dataset indices


class ParallelCorpus(Dataset):
    """Encoded sentence pairs (no BOS/EOS), stored flat; item ``i`` is ``(i, src_ids, tgt_ids)``."""

    def __init__(self, src_ids: Sequence[Sequence[int]], tgt_ids: Sequence[Sequence[int]], line_numbers: Sequence[int] | None = None):
        if len(src_ids) != len(tgt_ids):
            raise ValueError(f"{len(src_ids)} source sequences but {len(tgt_ids)} target sequences")
        self._src, self._src_offsets = _pack(src_ids)
        self._tgt, self._tgt_offsets = _pack(tgt_ids)
        # 0-based line of each pair in the files it was read from (differs once pairs are filtered)
        self.line_numbers = np.arange(len(src_ids)) if line_numbers is None else np.asarray(line_numbers, dtype=np.int64)

    def __len__(self) -> int:
        return len(self._src_offsets) - 1

    def __getitem__(self, index: int) -> tuple[int, list[int], list[int]]:
        s0, s1 = self._src_offsets[index], self._src_offsets[index + 1]
        t0, t1 = self._tgt_offsets[index], self._tgt_offsets[index + 1]
        return index, self._src[s0:s1].tolist(), self._tgt[t0:t1].tolist()

    @property
    def src_lengths(self) -> np.ndarray:
        """Source lengths with the EOS that collation adds."""
        return np.diff(self._src_offsets) + 1

    @property
    def tgt_lengths(self) -> np.ndarray:
        """Target lengths with the BOS (input side) or EOS (output side) that collation adds."""
        return np.diff(self._tgt_offsets) + 1


def _pack(seqs: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in seqs], out=offsets[1:])
    flat = np.fromiter(itertools.chain.from_iterable(seqs), dtype=np.int32, count=int(offsets[-1]))
    return flat, offsets


class TranslationCollator:
    """Collates ``(index, src_ids, tgt_ids)`` items into a :class:`TranslationBatch`."""

    def __init__(self, pad_id: int, bos_id: int, eos_id: int):
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id

    def __call__(self, items: Sequence[tuple[int, Sequence[int], Sequence[int]]]) -> TranslationBatch:
        size = len(items)
        src_len = max(len(src) for _, src, _ in items) + 1
        tgt_len = max(len(tgt) for _, _, tgt in items) + 1
        src = np.full((size, src_len), self.pad_id, dtype=np.int64)
        tgt_in = np.full((size, tgt_len), self.pad_id, dtype=np.int64)
        tgt_out = np.full((size, tgt_len), self.pad_id, dtype=np.int64)
        for row, (_, s, t) in enumerate(items):
            src[row, : len(s)] = s
            src[row, len(s)] = self.eos_id
            tgt_in[row, 0] = self.bos_id
            tgt_in[row, 1 : len(t) + 1] = t
            tgt_out[row, : len(t)] = t
            tgt_out[row, len(t)] = self.eos_id
        return TranslationBatch(
            src=torch.from_numpy(src),
            tgt_in=torch.from_numpy(tgt_in),
            tgt_out=torch.from_numpy(tgt_out),
            index=torch.tensor([index for index, _, _ in items], dtype=torch.long),
        )


def filter_pairs(src_ids: Sequence[Sequence[int]], tgt_ids: Sequence[Sequence[int]], max_length: int) -> tuple[list[int], dict[str, int]]:
    """Indices of the pairs with both sides non-empty and at most ``max_length`` ids, and how
    many were dropped by each rule (``"empty"`` first, then ``"too_long"``)."""
    keep: list[int] = []
    dropped = {"empty": 0, "too_long": 0}
    for index, (src, tgt) in enumerate(zip(src_ids, tgt_ids, strict=True)):
        if not src or not tgt:
            dropped["empty"] += 1
        elif len(src) > max_length or len(tgt) > max_length:
            dropped["too_long"] += 1
        else:
            keep.append(index)
    return keep, dropped


class TranslationDataModule(L.LightningDataModule):
    """Subword-encoded train/val/test splits of a line-aligned parallel corpus in token-budget
    batches; a subclass only says where each split's two files are (:meth:`split_files`).

    ``max_tokens`` bounds a batch's padded size per side (BOS/EOS included); ``max_length``
    drops training pairs with a side of more subword ids than that (BOS/EOS not counted);
    ``seed`` sets the training batch order; ``cache_dir`` (default ``~/.cache/aiayn``) holds
    the subword models.
    """

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
    ):
        super().__init__()
        self.data_root = Path(data_root)
        self.src_lang, self.tgt_lang = src_lang, tgt_lang
        self.vocab_size = vocab_size
        self.max_tokens = max_tokens
        self.max_length = max_length
        self.cache_dir = Path(cache_dir) if cache_dir is not None else _default_cache_dir()
        self.seed = seed
        self.num_workers = num_workers
        self.download = download
        self.splits = {"train": train_split, "val": val_split, "test": test_split}
        self.eval_max_tokens = eval_max_tokens if eval_max_tokens is not None else max_tokens
        self.vocab: Subwords | None = None
        self.filtered: dict[str, int] = {}
        self._datasets: dict[str, Dataset] = {}
        self._sources: dict[str, list[str]] = {}
        self._references: dict[str, list[str]] = {}
        self._resume_position: dict[str, int] | None = None

    def split_files(self, split: str, download: bool) -> tuple[Path, Path]:
        """The (source, target) files of ``split``, fetched first if allowed and missing."""
        raise NotImplementedError

    def prepare_data(self) -> None:
        """Locate (or download) every split's files and train or reuse the subword model."""
        for split in self.splits.values():
            self.split_files(split, self.download)
        self.load_vocab()

    def load_vocab(self) -> Subwords:
        """The joint subword model of the training split's source and target lines (cached)."""
        if self.vocab is None:
            src_path, tgt_path = self.split_files(self.splits["train"], self.download)
            src, tgt = read_parallel(src_path, tgt_path)
            _require_lines(src, src_path, tgt_path)
            self.vocab = self._train_or_load(src, tgt)
        return self.vocab

    def _train_or_load(self, src: list[str], tgt: list[str]) -> Subwords:
        # the vocabulary belongs to the data, not to the run: ``seed`` (batch order) is not passed
        return train_or_load(src + tgt, self.vocab_size, self.cache_dir)

    def setup(self, stage: str | None = None) -> None:
        """Load the subword model and the splits ``stage`` needs; splits already loaded are kept."""
        if stage not in _STAGE_ROLES:
            raise ValueError(f"unknown stage {stage!r}; expected one of {tuple(_STAGE_ROLES)}")
        for role in _STAGE_ROLES[stage]:
            if role not in self._datasets:
                self._datasets[role] = self._load(role)

    def _load(self, role: str) -> Dataset:
        """Read and encode the split of ``role``; a subclass may store its splits otherwise (a
        dataset with ``src_lengths``, ``tgt_lengths`` and ``(index, src_ids, tgt_ids)`` items)."""
        src_path, tgt_path = self.split_files(self.splits[role], self.download)
        src, tgt = read_parallel(src_path, tgt_path)
        _require_lines(src, src_path, tgt_path)
        if self.vocab is None:
            self.vocab = self._train_or_load(src, tgt) if role == "train" else self.load_vocab()
        src_ids, tgt_ids = self.vocab.encode(src), self.vocab.encode(tgt)
        if role == "train":
            keep, self.filtered = filter_pairs(src_ids, tgt_ids, self.max_length)
            log.info(
                "kept %d of %d training pairs of %s / %s: dropped %d with an empty side, "
                "%d with a side over max_length=%d subword tokens",
                len(keep), len(src), src_path, tgt_path, self.filtered["empty"], self.filtered["too_long"], self.max_length,
            )
            if not keep:
                raise DataError(f"{src_path} / {tgt_path}: every one of the {len(src)} training pairs was dropped "
                                f"({self.filtered}); check the files, or raise max_length")
            src_ids, tgt_ids = [src_ids[i] for i in keep], [tgt_ids[i] for i in keep]
            return ParallelCorpus(src_ids, tgt_ids, keep)
        self._sources[role], self._references[role] = src, tgt
        return ParallelCorpus(src_ids, tgt_ids)

    def dataset(self, split: str) -> Dataset:
        """The loaded dataset of ``split`` (``"train"``, ``"val"``, ``"test"`` or its file name)."""
        role = self._role(split)
        if role not in self._datasets:
            raise RuntimeError(f"split {split!r} is not loaded; call setup() with a stage that uses it first")
        return self._datasets[role]

    def references(self, split: str) -> list[str]:
        """The raw target lines of an evaluation split, indexed by dataset index."""
        return self._raw(self._references, split)

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
        if self._resume_position is not None:  # restored from a checkpoint written mid-epoch
            loader.batch_sampler.resume(**self._resume_position)
            self._resume_position = None
        return loader

    def state_dict(self) -> dict[str, int]:
        """Where training is in its epoch: the epoch and how many of its batches this rank has
        trained on (saved in every checkpoint; Lightning's own progress counters do the same for
        the steps, and the batch order is a function of seed and epoch)."""
        trainer = self.trainer
        if trainer is None:
            return {}
        return {"epoch": trainer.fit_loop.epoch_progress.current.processed,
                "batches_done": trainer.fit_loop.epoch_loop.batch_progress.current.processed}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        """Resume the training batches where the checkpoint's epoch stopped."""
        if state_dict:
            self._resume_position = {"epoch": state_dict["epoch"], "batches_done": state_dict["batches_done"]}

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", self.eval_max_tokens, shuffle=False, pad_to_equal=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", self.eval_max_tokens, shuffle=False, pad_to_equal=False)

    def _loader(self, role: str, max_tokens: int, shuffle: bool, pad_to_equal: bool) -> DataLoader:
        dataset = self.dataset(role)
        trainer = self.trainer
        num_replicas, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        sampler = TokenBatchSampler(
            dataset.src_lengths, dataset.tgt_lengths, max_tokens, shuffle=shuffle, seed=self.seed,
            num_replicas=num_replicas, rank=rank, pad_to_equal=pad_to_equal,
        )
        if role == "train":
            log.info(
                "training batches of at most %d padded tokens per side on rank %d of %d: %d batches, "
                "%.1f%% of their tokens are padding", max_tokens, rank, num_replicas, len(sampler.batches),
                100 * sampler.padding_fraction,
            )
        vocab = self.vocab
        return DataLoader(
            dataset,
            batch_sampler=sampler,
            collate_fn=TranslationCollator(vocab.pad_id, vocab.bos_id, vocab.eos_id),
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )


def _require_lines(src: list[str], src_path: Path, tgt_path: Path) -> None:
    if not src:
        raise DataError(f"{src_path} / {tgt_path}: no lines; a split needs one sentence pair per line")


def _default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "aiayn"


class Multi30kDataModule(TranslationDataModule):
    """Multi30k task 1 (``<data_root>/multi30k/{split}.{lang}.gz``) as a :class:`TranslationDataModule`."""

    def __init__(
        self,
        data_root: str,
        src_lang: str = "en",
        tgt_lang: str = "de",
        vocab_size: int = 8000,
        max_tokens: int = 4096,
        max_length: int = 256,
        cache_dir: str | None = None,
        seed: int = 0,
        num_workers: int = 0,
        download: bool = True,
        val_split: str = "val",
        test_split: str = "test_2016_flickr",
        eval_max_tokens: int | None = None,
    ):
        super().__init__(
            data_root, src_lang, tgt_lang, vocab_size, max_tokens, max_length, cache_dir, seed,
            num_workers, download, "train", val_split, test_split, eval_max_tokens,
        )
        if src_lang == tgt_lang:
            raise ValueError(f"source and target language are both {src_lang!r}")
        for split in self.splits.values():  # unknown splits or languages fail here, not later
            for lang in (src_lang, tgt_lang):
                multi30k_path(data_root, split, lang)
        self.save_hyperparameters()

    def split_files(self, split: str, download: bool) -> tuple[Path, Path]:
        return multi30k_files(self.data_root, split, self.src_lang, self.tgt_lang, download=download)
