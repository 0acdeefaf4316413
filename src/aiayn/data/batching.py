"""Token-budget batches of similar-length examples, sharded across data-parallel ranks."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import Sampler


def evaluation_tokens(max_tokens: int | str | None, eval_max_tokens: int | None) -> int | None:
    """The tokens of an evaluation batch (validation's, the test's, evaluate.py's perplexity pass):
    ``eval_max_tokens``, else the training batch's ``max_tokens``; None where that is no number
    (``max_tokens=auto``, which train.py's plan sizes for training alone)."""
    tokens = eval_max_tokens if eval_max_tokens is not None else max_tokens
    return tokens if isinstance(tokens, int) else None


class TokenBatchSampler(Sampler[list[int]]):
    """Batches of dataset indices whose padded size stays within ``max_tokens`` on each side.

    Indices are sorted by (source length, target length), ties broken by a seeded random
    permutation when ``shuffle`` (else by index), and cut into consecutive runs such that
    ``len(batch) * max(length in batch) <= max_tokens`` for source and target alike: a batch is
    counted by its longer side's padded tokens, as tensor2tensor counted an example by the longer
    of its input and target, so the shorter side (English against German) holds fewer. The
    batches are built once; each epoch, when ``shuffle``, their order is permuted with the seed
    ``seed + epoch`` (the paper is silent; fairseq's way: the same sentences batched together
    every epoch, which tensor2tensor's shuffled input pipeline regrouped; built once, the batches
    cost nothing per epoch and a resumed run meets exactly the batches it would have). Rank ``r``
    takes batches ``r, r + num_replicas, ...`` of that order. With
    ``pad_to_equal`` (training, where DDP ranks must take the same number of steps) the batches
    holding the most examples are split in two until their number is a multiple of
    ``num_replicas``, so every rank gets the same number and each example is still seen exactly
    once per epoch (only when there are too few examples to split, the first batches of the order
    are repeated instead). With ``batches_per_step`` > 1 (gradient accumulation: each rank's
    optimizer step takes that many batches) the count is made a multiple of
    ``num_replicas × batches_per_step``, so that every step has its full share of batches and the
    batches of step k are the same whichever way processes and accumulation share them (1 process
    × 8 batches or 8 processes × 1: batches 8k to 8k+7 of the epoch's order). A step's batches are
    neighbours in length: the epoch shuffles whole steps of consecutive batches, not batches, so
    that a step of 8 batches of 3,125 tokens holds sentences of about one length, as one batch of
    25,000 does — the paper's step (§5.1: "batched together by approximate sequence length", each
    batch about 25,000 tokens), which tensor2tensor drew as one batch of the step's size from one
    length bucket and split between its GPUs (its batch size times the shards, then ``tf.split``).
    Without it (evaluation) batches are left whole, as one process cuts them, so that every metric
    is computed on the same batches however many ranks share the work; counts may differ by one,
    and a rank left without a batch (a split of fewer batches than ranks) gets one empty batch
    (``[]``, no examples): every rank must run the evaluation loop, whose first step and end take
    part in collectives with the other ranks.

    Resuming mid-epoch: :meth:`resume` makes the next iteration over epoch ``epoch`` start after
    the first ``batches_done`` batches of this rank's share, so a restarted run sees the rest of
    the interrupted epoch in the same order; later epochs are whole again.

    With ``length_buckets`` (ascending lengths; the last covers every example) each example counts
    as the bucket of its longer side, examples are sorted by bucket first, and a batch of bucket
    ``L`` holds at most ``max_tokens // L`` examples: the collator then pads it to exactly that
    many rows of ``L`` positions on both sides (:func:`bucket_shape`), so that training sees one
    batch shape per bucket (CUDA graphs, torch.compile) instead of a new one at almost every step.
    """

    def __init__(
        self,
        src_lengths: Sequence[int],
        tgt_lengths: Sequence[int],
        max_tokens: int,
        shuffle: bool,
        seed: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        pad_to_equal: bool = True,
        batches_per_step: int = 1,
        length_buckets: Sequence[int] | None = None,
    ):
        src = np.asarray(src_lengths, dtype=np.int64).reshape(-1)
        tgt = np.asarray(tgt_lengths, dtype=np.int64).reshape(-1)
        if len(src) != len(tgt):
            raise ValueError(f"{len(src)} source lengths but {len(tgt)} target lengths")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be positive, got {max_tokens}")
        if num_replicas is None:
            num_replicas = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if rank is None:
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, {num_replicas})")
        if batches_per_step < 1:
            raise ValueError(f"batches_per_step must be positive, got {batches_per_step}")
        self.max_tokens = int(max_tokens)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.num_replicas = int(num_replicas)
        self.rank = int(rank)
        self.pad_to_equal = bool(pad_to_equal)
        self.length_buckets = check_buckets(length_buckets, self.max_tokens)
        # Training: the batches of one optimizer step over all ranks; the epoch's count is a multiple of it.
        self.step_batches = self.num_replicas * int(batches_per_step) if self.pad_to_equal else self.num_replicas
        self.epoch = 0
        # (epoch, batches of it already consumed, whether that epoch's order shuffles whole steps)
        self._resume: tuple[int, int, bool] | None = None
        self.sampler = _EpochRelay(self)
        self.batches = self._build(src, tgt)
        if self.pad_to_equal and self.step_batches > 1:
            self.batches = _split_for_ranks(self.batches, self.step_batches)
        self._padding_fraction = _padding_fraction(self.batches, src, tgt, self.length_buckets, self.max_tokens)

    def _build(self, src: np.ndarray, tgt: np.ndarray) -> _Batches:
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed)
            tie = torch.randperm(len(src), generator=generator).numpy()
        else:
            tie = np.arange(len(src))
        if self.length_buckets is None:
            order = _sort_order(src, tgt, tie)
            longest = np.maximum(src[order], tgt[order])
        else:  # by bucket first: a batch holds one bucket's examples (two where a bucket's last ones meet the next's)
            bucket = bucket_lengths(np.maximum(src, tgt), self.length_buckets)
            order = np.lexsort((tie, tgt, src, bucket))
            longest = bucket[order]
        over = np.flatnonzero(longest > self.max_tokens)
        if over.size:
            index = int(order[over[0]])
            raise ValueError(
                f"example {index} has {src[index]} source and {tgt[index]} target tokens (with BOS/EOS), more than "
                f"max_tokens={self.max_tokens}; raise max_tokens or lower max_length"
            )
        # Greedy cut, vectorised per batch: a batch of the next k examples costs k times their
        # running maximum length, which grows with k; take the largest k within the budget. Its
        # first example bounds k (k * longest[start] <= max_tokens), so that is the window looked at.
        bounds, start, count = [0], 0, len(order)
        while start < count:
            first = int(longest[start])
            window = count - start if first == 0 else min(count - start, self.max_tokens // first)
            cost = np.maximum.accumulate(longest[start : start + window]) * np.arange(1, window + 1)
            start += int(np.searchsorted(cost, self.max_tokens, side="right"))
            bounds.append(start)
        return _Batches(order, np.asarray(bounds, dtype=np.int64))

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose batch order the next iteration yields (Lightning calls it
        through :attr:`sampler`)."""
        self.epoch = int(epoch)

    def resume(self, epoch: int, batches_done: int, by_steps: bool = True) -> None:
        """Skip this rank's first ``batches_done`` batches the next time epoch ``epoch`` is iterated;
        ``by_steps=False``: that epoch in the order of a checkpoint written before whole steps were
        shuffled (batch by batch), so that its run trains the rest of the epoch it began."""
        if batches_done < 0:
            raise ValueError(f"batches_done must be non-negative, got {batches_done}")
        self._resume = (int(epoch), int(batches_done), bool(by_steps)) if batches_done else None

    def _epoch_order(self, by_steps: bool = True) -> list[int]:
        count = len(self.batches)
        # Whole steps of consecutive (length-neighbouring) batches shuffled; one batch a step: batches.
        step = self.step_batches if self.pad_to_equal and by_steps else 1
        groups = math.ceil(count / step)
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            chosen = torch.randperm(groups, generator=generator).tolist()
        else:
            chosen = list(range(groups))
        order = [b for g in chosen for b in range(g * step, min((g + 1) * step, count))]
        if self.pad_to_equal and count:
            total = math.ceil(count / self.step_batches) * self.step_batches
            order = (order * math.ceil(total / count))[:total]
        return order

    def __iter__(self) -> Iterator[list[int]]:
        skip, by_steps = 0, True
        if self._resume is not None and self._resume[0] == self.epoch:
            (_, skip, by_steps), self._resume = self._resume, None
        share = self._epoch_order(by_steps)[self.rank :: self.num_replicas]
        if not share and self._empty_share_padded():
            yield []
            return
        for position in share[skip:]:
            yield list(self.batches[position])

    def __len__(self) -> int:
        count = len(self.batches)
        if self.pad_to_equal:
            return math.ceil(count / self.step_batches) * self.step_batches // self.num_replicas
        share = len(range(self.rank, count, self.num_replicas))
        return 1 if not share and self._empty_share_padded() else share

    def _empty_share_padded(self) -> bool:
        """Whether this rank, having no batch of its own, yields one empty batch instead (evaluation
        with several ranks: Lightning refuses a rank with no batch while others have some)."""
        return not self.pad_to_equal and self.num_replicas > 1

    @property
    def padding_fraction(self) -> float:
        """Padding tokens over all tokens of all batches, source and target sides together."""
        return self._padding_fraction


def check_buckets(buckets: Sequence[int] | None, max_tokens: int) -> tuple[int, ...] | None:
    """``buckets`` as a tuple, checked: ascending positive lengths, each within ``max_tokens``."""
    if buckets is None:
        return None
    buckets = tuple(buckets)
    if not buckets or any(isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1 for b in buckets) \
            or list(buckets) != sorted(set(buckets)):
        raise ValueError(f"length_buckets must be ascending positive lengths, got {list(buckets)}")
    if buckets[-1] > max_tokens:
        raise ValueError(f"length bucket {buckets[-1]} is longer than a batch of max_tokens={max_tokens} holds")
    return tuple(int(b) for b in buckets)


def bucket_lengths(lengths: np.ndarray, buckets: Sequence[int]) -> np.ndarray:
    """The bucket of each length: the shortest bucket at least as long; ValueError past the last."""
    lengths = np.asarray(lengths)
    at = np.searchsorted(np.asarray(buckets), lengths, side="left")
    if lengths.size and at.max() >= len(buckets):
        raise ValueError(f"an example of {int(lengths.max())} tokens (with BOS/EOS) is longer than the last length "
                         f"bucket, {buckets[-1]}; make the last bucket at least max_length + 2")
    return np.asarray(buckets)[at]


def bucket_shape(longest: int, rows: int, buckets: Sequence[int], max_tokens: int) -> tuple[int, int]:
    """(rows, length) a batch of ``rows`` examples whose longest side is ``longest`` tokens is padded
    to: its bucket's length, and as many rows as ``max_tokens`` allows at that length."""
    length = int(bucket_lengths(np.asarray([longest]), buckets)[0])
    return max(rows, max_tokens // length), length


def _sort_order(src: np.ndarray, tgt: np.ndarray, tie: np.ndarray) -> np.ndarray:
    """``np.lexsort((tie, tgt, src))`` (``tie`` is a permutation): as one int64 key when the
    three fit in 63 bits, which sorts millions of examples several times faster."""
    if len(src) == 0 or src.min() < 0 or tgt.min() < 0:
        return np.lexsort((tie, tgt, src))
    tie_bits, tgt_bits = len(tie).bit_length(), int(tgt.max()).bit_length()
    if tie_bits + tgt_bits + int(src.max()).bit_length() > 63:
        return np.lexsort((tie, tgt, src))
    key = (src << (tgt_bits + tie_bits)) | (tgt << tie_bits) | tie.astype(np.int64)
    return np.argsort(key)  # keys are distinct: no stability needed


def _split_for_ranks(batches: _Batches, num_replicas: int) -> _Batches:
    """``batches`` with those holding the most examples halved until their number is a multiple
    of ``num_replicas`` (or no batch has two examples left): each half is within the budget."""
    bounds = batches.bounds
    while True:
        sizes = np.diff(bounds)
        needed = -len(sizes) % num_replicas
        splittable = np.flatnonzero(sizes > 1)
        if needed == 0 or len(splittable) == 0:
            return _Batches(batches.order, bounds)
        chosen = splittable[np.argsort(-sizes[splittable], kind="stable")[:needed]]
        bounds = np.sort(np.concatenate([bounds, bounds[chosen] + sizes[chosen] // 2]))


def _padding_fraction(batches: _Batches, src: np.ndarray, tgt: np.ndarray, buckets: tuple[int, ...] | None = None,
                      max_tokens: int = 0) -> float:
    if not len(batches):
        return 0.0
    starts, sizes = batches.bounds[:-1], np.diff(batches.bounds)
    real = int(src[batches.order].sum() + tgt[batches.order].sum())
    if buckets is None:
        padded = sum(int((np.maximum.reduceat(lengths, starts) * sizes).sum())
                     for lengths in (src[batches.order], tgt[batches.order]))
    else:  # both sides padded to the batch's bucket, and the rows to what the budget holds at that length
        longest = np.maximum.reduceat(np.maximum(src, tgt)[batches.order], starts)
        shapes = [bucket_shape(int(n), int(rows), buckets, max_tokens) for n, rows in zip(longest, sizes, strict=True)]
        padded = 2 * sum(rows * length for rows, length in shapes)
    return 1.0 - real / padded if padded else 0.0


class _Batches(Sequence):
    """The batches as one index array cut at ``bounds`` (batch ``b`` is
    ``order[bounds[b]:bounds[b + 1]]``): compact for millions of examples; items are lists."""

    def __init__(self, order: np.ndarray, bounds: np.ndarray):
        self.order, self.bounds = order, bounds

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def __getitem__(self, position):
        if isinstance(position, slice):
            return [self[i] for i in range(len(self))[position]]
        position = range(len(self))[position]  # negative positions; IndexError past the end
        return self.order[self.bounds[position] : self.bounds[position + 1]].tolist()

    def __eq__(self, other) -> bool:
        return list(self) == list(other) if isinstance(other, Sequence) else NotImplemented


class _EpochRelay:
    """The batch sampler's ``sampler`` attribute: Lightning calls ``set_epoch`` on
    ``dataloader.sampler`` and ``dataloader.batch_sampler.sampler``, never on the batch sampler."""

    def __init__(self, owner: TokenBatchSampler):
        self._owner = owner

    def set_epoch(self, epoch: int) -> None:
        self._owner.set_epoch(epoch)
