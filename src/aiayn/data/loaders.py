"""The data loaders of a task's splits: token-budget batches (aiayn.data.batching) of a parallel
corpus, collated (aiayn.data.corpus), one rank's share; what TranslationDataModule hands Lightning."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from torch.utils.data import DataLoader

from aiayn.data.batching import TokenBatchSampler
from aiayn.data.corpus import ParallelCorpus, TranslationCollator
from aiayn.data.subwords import Subwords
from aiayn.errors import ConfigError

log = logging.getLogger("aiayn.data.datamodule")  # the data module's lines, as they always were


def split_loader(role: str, dataset: ParallelCorpus, vocab: Subwords, max_tokens: int, *, shuffle: bool,
                 pad_to_equal: bool, seed: int, num_replicas: int, rank: int, accumulate: int = 1,
                 length_buckets: Sequence[int] | None = None, num_workers: int = 0) -> DataLoader:
    """The loader of one split (``role``: train, val or test) for rank ``rank`` of ``num_replicas``:
    batches of at most ``max_tokens`` padded tokens a side, ``accumulate`` of each rank's to a step
    (aiayn.config.plan), padded to ``length_buckets`` when given (training)."""
    if not isinstance(max_tokens, int):
        raise ConfigError(f"task.datamodule.max_tokens={max_tokens}: the training batch is settled by train.py's "
                          "plan (aiayn.config.plan); give a number to train with this data module elsewhere")
    try:
        sampler = TokenBatchSampler(
            dataset.src_lengths, dataset.tgt_lengths, max_tokens, shuffle=shuffle, seed=seed,
            num_replicas=num_replicas, rank=rank, pad_to_equal=pad_to_equal, batches_per_step=accumulate,
            length_buckets=length_buckets,
        )
    except ValueError as error:
        if length_buckets is None:
            raise
        raise ConfigError(f"task.datamodule.length_buckets={list(length_buckets)}: {error}") from None
    if role == "train":
        log.info("training batches of at most %d padded tokens per side on rank %d of %d: %d batches, "
                 "%.1f%% of their tokens are padding", max_tokens, rank, num_replicas, len(sampler.batches),
                 100 * sampler.padding_fraction)
    elif rank == 0 and len(sampler.batches) < num_replicas:
        log.info("%s batches of at most %d padded tokens: %d for %d ranks; ranks %d to %d evaluate an empty "
                 "batch (the metrics are those of one process)", role, max_tokens, len(sampler.batches),
                 num_replicas, len(sampler.batches), num_replicas - 1)
    return DataLoader(
        dataset,
        batch_sampler=sampler,
        collate_fn=TranslationCollator(vocab.pad_id, vocab.bos_id, vocab.eos_id, length_buckets, max_tokens),
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
    )
