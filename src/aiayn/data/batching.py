"""Token-budget batches of similar-length examples, sharded across data-parallel ranks."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import Sampler


class TokenBatchSampler(Sampler[list[int]]):
    """Batches of dataset indices whose padded size stays within ``max_tokens`` on each side.

    Indices are sorted by (source length, target length), ties broken by a seeded random
    permutation when ``shuffle`` (else by index), and cut into consecutive runs such that
    ``len(batch) * max(length in batch) <= max_tokens`` for source and target alike. The
    batches are built once; each epoch, when ``shuffle``, their order is permuted with the seed
    ``seed + epoch``. Rank ``r`` takes batches ``r, r + num_replicas, ...`` of that order. With
    ``pad_to_equal`` (training) the order is first extended by repeating its first batches so
    every rank gets the same number; without it (evaluation) each example is seen exactly once
    across ranks and batch counts may differ by one.

    Resuming mid-epoch: :meth:`resume` makes the next iteration over epoch ``epoch`` start after
    the first ``batches_done`` batches of this rank's share, so a restarted run sees the rest of
    the interrupted epoch in the same order; later epochs are whole again.
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
        self.max_tokens = int(max_tokens)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.num_replicas = int(num_replicas)
        self.rank = int(rank)
        self.pad_to_equal = bool(pad_to_equal)
        self.epoch = 0
        self._resume: tuple[int, int] | None = None  # (epoch, batches of it already consumed)
        self.sampler = _EpochRelay(self)
        self.batches = self._build(src, tgt)
        self._padding_fraction = _padding_fraction(self.batches, src, tgt)

    def _build(self, src: np.ndarray, tgt: np.ndarray) -> list[list[int]]:
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed)
            tie = torch.randperm(len(src), generator=generator).numpy()
        else:
            tie = np.arange(len(src))
        order = np.lexsort((tie, tgt, src)).tolist()
        src_list, tgt_list = src.tolist(), tgt.tolist()
        batches: list[list[int]] = []
        batch: list[int] = []
        max_src = max_tgt = 0
        for index in order:
            s, t = src_list[index], tgt_list[index]
            if max(s, t) > self.max_tokens:
                raise ValueError(
                    f"example {index} has {s} source and {t} target tokens (with BOS/EOS), more than "
                    f"max_tokens={self.max_tokens}; raise max_tokens or lower max_length"
                )
            new_src, new_tgt = max(max_src, s), max(max_tgt, t)
            if (len(batch) + 1) * max(new_src, new_tgt) > self.max_tokens:
                batches.append(batch)
                batch, new_src, new_tgt = [], s, t
            batch.append(index)
            max_src, max_tgt = new_src, new_tgt
        if batch:
            batches.append(batch)
        return batches

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose batch order the next iteration yields (Lightning calls it
        through :attr:`sampler`)."""
        self.epoch = int(epoch)

    def resume(self, epoch: int, batches_done: int) -> None:
        """Skip this rank's first ``batches_done`` batches the next time epoch ``epoch`` is iterated."""
        if batches_done < 0:
            raise ValueError(f"batches_done must be non-negative, got {batches_done}")
        self._resume = (int(epoch), int(batches_done)) if batches_done else None

    def _epoch_order(self) -> list[int]:
        count = len(self.batches)
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(count, generator=generator).tolist()
        else:
            order = list(range(count))
        if self.pad_to_equal and count:
            total = math.ceil(count / self.num_replicas) * self.num_replicas
            order = (order * math.ceil(total / count))[:total]
        return order

    def __iter__(self) -> Iterator[list[int]]:
        skip = 0
        if self._resume is not None and self._resume[0] == self.epoch:
            skip, self._resume = self._resume[1], None
        for position in self._epoch_order()[self.rank :: self.num_replicas][skip:]:
            yield list(self.batches[position])

    def __len__(self) -> int:
        count = len(self.batches)
        if self.pad_to_equal:
            return math.ceil(count / self.num_replicas)
        return len(range(self.rank, count, self.num_replicas))

    @property
    def padding_fraction(self) -> float:
        """Padding tokens over all tokens of all batches, source and target sides together."""
        return self._padding_fraction


def _padding_fraction(batches: list[list[int]], src: np.ndarray, tgt: np.ndarray) -> float:
    real = padded = 0
    for batch in batches:
        for lengths in (src[batch], tgt[batch]):
            real += int(lengths.sum())
            padded += len(batch) * int(lengths.max())
    return 1.0 - real / padded if padded else 0.0


class _EpochRelay:
    """The batch sampler's ``sampler`` attribute: Lightning calls ``set_epoch`` on
    ``dataloader.sampler`` and ``dataloader.batch_sampler.sampler``, never on the batch sampler."""

    def __init__(self, owner: TokenBatchSampler):
        self._owner = owner

    def set_epoch(self, epoch: int) -> None:
        self._owner.set_epoch(epoch)
