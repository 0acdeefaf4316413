"""Length buckets (``task.datamodule.length_buckets``): training batches padded to a few shapes, one
per bucket, so that CUDA graphs and torch.compile see shapes repeat; every example still once an
epoch, within the budget, the step's batches still shared alike by processes and accumulation; and a
padded batch trains the model exactly as the unpadded one (the rows added are masked out)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from aiayn.data.batching import TokenBatchSampler
from aiayn.data.corpus import ParallelCorpus, TranslationCollator
from aiayn.data.readers import read_parallel
from aiayn.errors import ConfigError
from aiayn.model import Transformer
from aiayn.model.loss import label_smoothed_loss

BUCKETS = (16, 24, 32, 48, 64, 96)
MAX_TOKENS = 1024


@pytest.fixture(scope="module")
def corpus(data_root: Path) -> ParallelCorpus:
    """Multi30k's training pairs as whitespace tokens (ids from a hash), lengths as they come."""
    en, de = read_parallel(data_root / "multi30k" / "train.en.gz", data_root / "multi30k" / "train.de.gz")
    ids = lambda line: [4 + hash(word) % 400 for word in line.split()]
    return ParallelCorpus([ids(line) for line in en], [ids(line) for line in de])


def _collated(corpus: ParallelCorpus, sampler: TokenBatchSampler, buckets=BUCKETS) -> list[dict]:
    collate = TranslationCollator(0, 2, 3, buckets, sampler.max_tokens)
    return [collate([corpus[i] for i in batch]) for batch in sampler]


def test_every_example_once_within_budget_in_one_shape_per_bucket(corpus: ParallelCorpus) -> None:
    sampler = TokenBatchSampler(corpus.src_lengths, corpus.tgt_lengths, MAX_TOKENS, shuffle=True, seed=1,
                                num_replicas=1, rank=0, length_buckets=BUCKETS)
    batches = _collated(corpus, sampler)
    seen = [int(i) for batch in batches for i in batch["index"] if i >= 0]
    assert sorted(seen) == list(range(len(corpus)))
    shapes = Counter(tuple(batch["src"].shape) for batch in batches)
    assert set(shapes) <= {(MAX_TOKENS // length, length) for length in BUCKETS}
    assert len(shapes) <= len(BUCKETS) < len({tuple(b["src"].shape) for b in _unbucketed(corpus)}) / 10
    for batch in batches:
        assert batch["src"].shape == batch["tgt_in"].shape == batch["tgt_out"].shape
        assert batch["src"].numel() <= MAX_TOKENS
        added = batch["index"] < 0
        assert (batch["tgt_out"][added] == 0).all() and (batch["src"][added, 0] == 3).all()
    assert 0 < sampler.padding_fraction < 0.6


def _unbucketed(corpus: ParallelCorpus) -> list[dict]:
    sampler = TokenBatchSampler(corpus.src_lengths, corpus.tgt_lengths, MAX_TOKENS, shuffle=True, seed=1,
                                num_replicas=1, rank=0)
    return [TranslationCollator(0, 2, 3)([corpus[i] for i in batch]) for batch in sampler]


def test_the_padding_fraction_counts_the_added_rows_and_positions(corpus: ParallelCorpus) -> None:
    sampler = TokenBatchSampler(corpus.src_lengths, corpus.tgt_lengths, MAX_TOKENS, shuffle=False,
                                num_replicas=1, rank=0, length_buckets=BUCKETS)
    batches = _collated(corpus, sampler)
    real = sum(int((b["src"] != 0).sum() + (b["tgt_out"] != 0).sum()) - int((b["index"] < 0).sum()) for b in batches)
    padded = sum(b["src"].numel() + b["tgt_out"].numel() for b in batches)
    assert sampler.padding_fraction == pytest.approx(1 - real / padded)


@pytest.mark.parametrize("epoch", [0, 3])
def test_a_step_takes_the_same_bucketed_batches_however_processes_and_accumulation_share_it(
        corpus: ParallelCorpus, epoch: int) -> None:
    def steps(processes: int, accumulate: int) -> list[list[int]]:
        shares = []
        for rank in range(processes):
            sampler = TokenBatchSampler(corpus.src_lengths, corpus.tgt_lengths, MAX_TOKENS, shuffle=True, seed=5,
                                        num_replicas=processes, rank=rank, batches_per_step=accumulate,
                                        length_buckets=BUCKETS)
            sampler.set_epoch(epoch)
            shares.append(list(sampler))
        per_step = processes * accumulate
        flat = [batch for k in range(len(shares[0]) // accumulate) for rank in range(processes)
                for batch in shares[rank][k * accumulate:(k + 1) * accumulate]]
        return [sorted(i for batch in flat[s:s + per_step] for i in batch) for s in range(0, len(flat), per_step)]

    assert steps(1, 4) == steps(2, 2) == steps(4, 1)


def test_buckets_that_leave_an_example_out_or_are_not_ascending_are_refused(corpus: ParallelCorpus) -> None:
    with pytest.raises(ValueError, match="longer than the last length bucket, 16"):
        TokenBatchSampler(corpus.src_lengths, corpus.tgt_lengths, MAX_TOKENS, shuffle=False, num_replicas=1, rank=0,
                          length_buckets=(8, 16))
    with pytest.raises(ValueError, match="ascending positive lengths"):
        TokenBatchSampler(corpus.src_lengths, corpus.tgt_lengths, MAX_TOKENS, shuffle=False, num_replicas=1, rank=0,
                          length_buckets=(64, 32))


def test_a_bucketed_batch_gives_the_unpadded_batchs_loss_and_gradient(corpus: ParallelCorpus) -> None:
    """The rows and positions added are padding to the model: the same summed loss, the same
    number of target tokens and the same gradient as the batch collated without buckets."""
    items = [corpus[i] for i in range(5)]
    plain = TranslationCollator(0, 2, 3)(items)
    bucketed = TranslationCollator(0, 2, 3, BUCKETS, 512)(items)
    assert bucketed["src"].shape[0] > plain["src"].shape[0] and bucketed["src"].shape[1] >= plain["src"].shape[1]

    def loss_and_gradient(batch):
        torch.manual_seed(0)
        model = Transformer(404, 404, n_layers=1, d_model=32, d_ff=64, n_heads=2, d_k=16, d_v=16, dropout=0.0)
        loss, _, tokens = label_smoothed_loss(model(batch["src"], batch["tgt_in"]), batch["tgt_out"], 0.1, 0)
        loss.backward()
        return loss.detach(), tokens, [p.grad for p in model.parameters()]

    (loss_a, tokens_a, grads_a), (loss_b, tokens_b, grads_b) = loss_and_gradient(plain), loss_and_gradient(bucketed)
    assert int(tokens_a) == int(tokens_b)
    torch.testing.assert_close(loss_b, loss_a, rtol=1e-6, atol=0)  # fp32: the sums run over other shapes
    for a, b in zip(grads_a, grads_b, strict=True):
        assert float((b - a).norm() / a.norm()) < 1e-5


@pytest.mark.slow
def test_the_data_module_refuses_buckets_that_miss_a_training_pair_in_one_line(data_root: Path, tmp_path: Path) -> None:
    from aiayn.data.multi30k import Multi30kDataModule

    data = Multi30kDataModule(str(data_root), vocab_size=500, max_tokens=512, max_length=40, cache_dir=str(tmp_path),
                              download=False, length_buckets=[8, 16])
    data.setup("fit")
    with pytest.raises(ConfigError, match=r"^task.datamodule.length_buckets=\[8, 16\]: an example of \d+ tokens"):
        data.train_dataloader()
    assert np.asarray(data.dataset("train").src_lengths).max() > 16
