"""Parallel-corpus dataset and batch collation shared by every translation task: encoded pairs
(:class:`ParallelCorpus`), their filtering and their collation into a :class:`TranslationBatch`."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from typing import TypedDict

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from aiayn.data.batching import bucket_shape
from aiayn.errors import DataError

log = logging.getLogger(__name__)


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
    """Collates ``(index, src_ids, tgt_ids)`` items into a :class:`TranslationBatch`.

    With ``length_buckets`` (and the batches' ``max_tokens``; aiayn.data.batching) both sides are
    padded to the batch's bucket and the batch to the rows the budget holds at that length; a row
    added so is a one-token source (EOS) and a target of BOS alone with nothing to predict (its
    ``tgt_out`` all padding, its ``index`` -1), which attention and the loss handle as any padding."""

    def __init__(self, pad_id: int, bos_id: int, eos_id: int, length_buckets: Sequence[int] | None = None,
                 max_tokens: int | None = None):
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.length_buckets = tuple(length_buckets) if length_buckets is not None else None
        if self.length_buckets is not None and not max_tokens:
            raise ValueError("length_buckets needs the batches' max_tokens")
        self.max_tokens = max_tokens

    def __call__(self, items: Sequence[tuple[int, Sequence[int], Sequence[int]]]) -> TranslationBatch:
        size = len(items)
        src_len = max((len(src) for _, src, _ in items), default=0) + 1  # no items: an empty batch
        tgt_len = max((len(tgt) for _, _, tgt in items), default=0) + 1
        rows = size
        if self.length_buckets is not None and items:
            rows, src_len = bucket_shape(max(src_len, tgt_len), size, self.length_buckets, self.max_tokens)
            tgt_len = src_len
        src = np.full((rows, src_len), self.pad_id, dtype=np.int64)
        tgt_in = np.full((rows, tgt_len), self.pad_id, dtype=np.int64)
        tgt_out = np.full((rows, tgt_len), self.pad_id, dtype=np.int64)
        src[size:, 0], tgt_in[size:, 0] = self.eos_id, self.bos_id  # the rows added for the bucket's shape
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
            index=torch.tensor([index for index, _, _ in items] + [-1] * (rows - size), dtype=torch.long),
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


def report_kept(kept: int, total: int, source: str, dropped: dict[str, int], max_length: int) -> None:
    """Log how many of the ``total`` training pairs of ``source`` :func:`filter_pairs`'s rules kept
    and why each other was dropped; a :class:`DataError` when none was kept."""
    log.info("kept %d of %d training pairs of %s: dropped %d with an empty side, %d with a side over max_length=%d "
             "subword tokens", kept, total, source, dropped["empty"], dropped["too_long"], max_length)
    if not kept:
        raise DataError(f"{source}: every one of the {total} training pairs was dropped ({dropped}); check the files, "
                        "or raise task.datamodule.max_length")
