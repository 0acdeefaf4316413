"""TokenBatchSampler on real Multi30k length distributions (whitespace tokens + BOS/EOS)."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
import torch

from aiayn.data.batching import TokenBatchSampler, evaluation_tokens
from aiayn.data.readers import read_parallel


@pytest.fixture(scope="module")
def lengths(data_root) -> tuple[list[int], list[int]]:
    en, de = read_parallel(data_root / "multi30k" / "train.en.gz", data_root / "multi30k" / "train.de.gz")
    return [len(line.split()) + 1 for line in en], [len(line.split()) + 1 for line in de]


def _padded_sizes(batch, src, tgt):
    return len(batch) * max(src[i] for i in batch), len(batch) * max(tgt[i] for i in batch)


@pytest.mark.parametrize("max_tokens", [60, 500, 4096])
@pytest.mark.parametrize("shuffle", [False, True])
def test_one_rank_sees_every_index_once_within_budget(lengths, max_tokens, shuffle):
    src, tgt = lengths
    sampler = TokenBatchSampler(src, tgt, max_tokens, shuffle=shuffle, seed=3)
    batches = list(sampler)
    assert len(batches) == len(sampler)
    assert sorted(i for b in batches for i in b) == list(range(len(src)))
    for batch in batches:
        src_size, tgt_size = _padded_sizes(batch, src, tgt)
        assert src_size <= max_tokens and tgt_size <= max_tokens
    assert 0.0 <= sampler.padding_fraction < 0.5
    if max_tokens == 4096:  # batches are filled: most use more than half the budget
        fill = [max(_padded_sizes(b, src, tgt)) for b in batches]
        assert sorted(fill)[len(fill) // 2] > max_tokens / 2


def test_batches_group_similar_lengths(lengths):
    src, tgt = lengths
    sampler = TokenBatchSampler(src, tgt, 1000, shuffle=False)
    batches = list(sampler)
    for earlier, later in itertools.pairwise(batches):  # consecutive runs of the length order
        assert max(src[i] for i in earlier) <= min(src[i] for i in later)


def test_two_ranks_for_evaluation_cover_every_index_exactly_once(lengths):
    src, tgt = lengths
    ranks = [TokenBatchSampler(src, tgt, 2000, shuffle=False, num_replicas=2, rank=r, pad_to_equal=False) for r in (0, 1)]
    seen = [[i for b in sampler for i in b] for sampler in ranks]
    assert sorted(seen[0] + seen[1]) == list(range(len(src)))
    assert abs(len(ranks[0]) - len(ranks[1])) <= 1
    assert [len(list(s)) for s in ranks] == [len(s) for s in ranks]
    assert len(ranks[0]) + len(ranks[1]) == len(ranks[0].batches)


def test_ranks_for_training_get_equal_counts_and_cover_everything(lengths):
    src, tgt = lengths
    budget = next(b for b in range(2000, 2100) if len(TokenBatchSampler(src, tgt, b, shuffle=False).batches) % 3)
    whole = len(TokenBatchSampler(src, tgt, budget, shuffle=True, seed=7).batches)
    ranks = [TokenBatchSampler(src, tgt, budget, shuffle=True, seed=7, num_replicas=3, rank=r) for r in range(3)]
    total = len(ranks[0].batches)
    assert total % 3 == 0 and total == whole + (-whole % 3), "the largest batches were halved"
    for epoch in (0, 1):
        for sampler in ranks:
            sampler.set_epoch(epoch)
        per_rank = [list(s) for s in ranks]
        assert [len(b) for b in per_rank] == [len(s) for s in ranks] == [total // 3] * 3
        for batch in (b for batches in per_rank for b in batches):
            assert max(_padded_sizes(batch, src, tgt)) <= budget
        counts = Counter(i for batches in per_rank for b in batches for i in b)
        assert sorted(counts) == list(range(len(src))) and set(counts.values()) == {1}, "every index exactly once"


@pytest.mark.parametrize("epoch", [0, 3])
def test_a_step_takes_the_same_batches_however_processes_and_accumulation_share_it(lengths, epoch):
    """The paper's step on any hardware: 8 batches a step as 1 process × 8 accumulated, 2 × 4,
    4 × 2 or 8 × 1 gives step k the same 8 batches (batches 8k to 8k+7 of the epoch's order), and
    every example is seen once an epoch."""
    src, tgt = lengths
    steps_by_layout = {}
    for replicas, accumulate in ((1, 8), (2, 4), (4, 2), (8, 1)):
        ranks = []
        for rank in range(replicas):
            sampler = TokenBatchSampler(src, tgt, 3000, shuffle=True, seed=5, num_replicas=replicas, rank=rank,
                                        batches_per_step=accumulate)
            sampler.set_epoch(epoch)
            ranks.append(list(sampler))
            assert len(ranks[-1]) == len(sampler) and len(sampler) % accumulate == 0  # no step short of batches
        # step k: each rank's batches k*accumulate ... (k+1)*accumulate-1, all ranks together
        steps = [sorted(tuple(batch) for rank in ranks for batch in rank[k * accumulate:(k + 1) * accumulate])
                 for k in range(len(ranks[0]) // accumulate)]
        assert sorted(i for step in steps for batch in step for i in batch) == list(range(len(src)))
        steps_by_layout[(replicas, accumulate)] = steps
    first, *others = steps_by_layout.values()
    assert all(steps == first for steps in others)


def test_a_step_holds_sentences_of_about_one_length_as_one_batch_of_its_size_does(lengths):
    """§5.1's step ("batched together by approximate sequence length"), as tensor2tensor drew it:
    8 batches a step are 8 neighbours in the length order, so a step's length range is about
    that of one batch of the step's tokens; before, the epoch shuffled single batches and a
    step of 8 held 8 lengths from anywhere in the corpus."""
    src, tgt = lengths
    one = TokenBatchSampler(src, tgt, 24_000, shuffle=True, seed=5)
    eight = TokenBatchSampler(src, tgt, 3_000, shuffle=True, seed=5, batches_per_step=8)
    one.set_epoch(1)
    eight.set_epoch(1)
    batches = list(eight)
    steps = [[i for batch in batches[k:k + 8] for i in batch] for k in range(0, len(batches), 8)]
    positions = {tuple(batch): at for at, batch in enumerate(eight.batches)}
    for k in range(0, len(batches), 8):  # consecutive batches of the built (length) order
        at = sorted(positions[tuple(batch)] for batch in batches[k:k + 8])
        assert at == list(range(at[0], at[0] + 8)) and at[0] % 8 == 0

    def spread(groups):  # the median step's range of source lengths
        return sorted(max(src[i] for i in g) - min(src[i] for i in g) for g in groups)[len(groups) // 2]

    assert spread(steps) <= spread(list(one)) + 1
    assert spread([[i for b in list(one)[k:k + 8] for i in b] for k in range(0, len(one), 8)]) > spread(steps) + 5


def test_one_batch_a_step_keeps_the_batch_by_batch_order(lengths):
    """Shuffling whole steps of one batch is the order runs of one batch a step always had
    (the default job's), and the order a checkpoint written before steps were shuffled goes on in."""
    src, tgt = lengths
    sampler = TokenBatchSampler(src, tgt, 2000, shuffle=True, seed=5)
    sampler.set_epoch(4)
    drawn = torch.randperm(len(sampler.batches), generator=torch.Generator().manual_seed(5 + 4)).tolist()
    assert list(sampler) == [sampler.batches[b] for b in drawn]
    stepped = TokenBatchSampler(src, tgt, 2000, shuffle=True, seed=5, batches_per_step=4)
    stepped.set_epoch(4)
    whole = list(stepped)
    drawn = torch.randperm(len(stepped.batches), generator=torch.Generator().manual_seed(5 + 4)).tolist()
    stepped.resume(epoch=4, batches_done=12, by_steps=False)
    assert list(stepped) == [stepped.batches[b] for b in drawn][12:], "the rest of the old order"
    assert list(stepped) == whole, "later passes in the order by steps"


def test_more_ranks_than_batches(lengths):
    src, tgt = lengths
    src, tgt = src[:50], tgt[:50]
    assert len(TokenBatchSampler(src, tgt, 4096, shuffle=True).batches) == 1
    ranks = [TokenBatchSampler(src, tgt, 4096, shuffle=True, num_replicas=4, rank=r) for r in range(4)]
    assert len(ranks[0].batches) == 4  # the one batch split for four ranks
    shares = [list(s) for s in ranks]
    assert [len(share) for share in shares] == [1, 1, 1, 1]
    assert sorted(i for share in shares for b in share for i in b) == list(range(50))
    few = [TokenBatchSampler(src[:2], tgt[:2], 4096, shuffle=True, num_replicas=4, rank=r) for r in range(4)]
    assert [len(list(s)) for s in few] == [1, 1, 1, 1], "two examples for four ranks: repeated"
    evaluation = [TokenBatchSampler(src, tgt, 4096, shuffle=False, num_replicas=4, rank=r, pad_to_equal=False) for r in range(4)]
    assert [list(s) for s in evaluation] == [evaluation[0].batches[:], [[]], [[]], [[]]], "whole batch, then empty ones"
    assert [len(s) for s in evaluation] == [1, 1, 1, 1]


@pytest.mark.parametrize("num_replicas", [2, 3, 8])
def test_evaluation_with_more_ranks_than_batches_gives_every_rank_a_batch(data_root, num_replicas):
    """A DDP rank without an evaluation batch stops Lightning ("within local rank has zero length");
    every rank gets at least one, possibly empty, and together they hold the batches one process
    evaluates, every sentence exactly once."""
    en, de = read_parallel(data_root / "multi30k" / "val.en.gz", data_root / "multi30k" / "val.de.gz")
    src, tgt = [len(line.split()) + 1 for line in en], [len(line.split()) + 1 for line in de]
    budget = 100_000  # the whole dev set (1,014 sentences) in one batch
    alone = TokenBatchSampler(src, tgt, budget, shuffle=False, pad_to_equal=False)
    assert len(alone.batches) < num_replicas
    ranks = [TokenBatchSampler(src, tgt, budget, shuffle=False, num_replicas=num_replicas, rank=r, pad_to_equal=False)
             for r in range(num_replicas)]
    shares = [list(sampler) for sampler in ranks]
    assert [len(share) for share in shares] == [len(sampler) for sampler in ranks] == [1] * num_replicas
    assert sorted(batch for share in shares for batch in share if batch) == sorted(alone), "one process's batches"
    counts = Counter(i for share in shares for batch in share for i in batch)
    assert sorted(counts) == list(range(len(src))) and set(counts.values()) == {1}, "every sentence exactly once"
    assert ranks[0].padding_fraction == alone.padding_fraction


def test_epoch_order_is_seeded(lengths):
    src, tgt = lengths
    first, second = (TokenBatchSampler(src, tgt, 1000, shuffle=True, seed=5) for _ in range(2))
    first.set_epoch(2)
    second.set_epoch(2)
    assert list(first) == list(second)
    epoch2 = list(first)
    first.set_epoch(3)
    epoch3 = list(first)
    assert epoch3 != epoch2
    assert sorted(map(tuple, epoch3)) == sorted(map(tuple, epoch2))  # same batches, new order
    other_seed = TokenBatchSampler(src, tgt, 1000, shuffle=True, seed=6)
    other_seed.set_epoch(2)
    assert list(other_seed) != epoch2
    first.sampler.set_epoch(2)  # where Lightning calls it: dataloader.batch_sampler.sampler
    assert first.epoch == 2 and list(first) == epoch2
    fixed = TokenBatchSampler(src, tgt, 1000, shuffle=False)
    before = list(fixed)
    fixed.set_epoch(9)
    assert list(fixed) == before


def test_greedy_cut_and_padding_fraction_by_hand():
    sampler = TokenBatchSampler([3, 3, 3], [1, 1, 1], 6, shuffle=False)
    assert sampler.batches == [[0, 1], [2]]
    assert sampler.padding_fraction == 0.0
    sampler = TokenBatchSampler([2, 3, 2], [4, 1, 4], 100, shuffle=False)
    assert sampler.batches == [[0, 2, 1]]  # sorted by (source, target) length
    # source: 3 x 3 = 9 slots for 7 tokens; target: 3 x 4 = 12 slots for 9 tokens
    assert sampler.padding_fraction == pytest.approx(5 / 21)
    sampler = TokenBatchSampler([1, 1, 1], [5, 2, 2], 6, shuffle=False)  # the target side limits
    assert sampler.batches == [[1, 2], [0]]


def test_over_long_example_is_an_error():
    with pytest.raises(ValueError, match="raise max_tokens or lower max_length"):
        TokenBatchSampler([5, 9, 5], [5, 5, 5], 8, shuffle=False)
    with pytest.raises(ValueError, match="example 2"):
        TokenBatchSampler([5, 5, 5], [5, 5, 9], 8, shuffle=True)


def test_replica_defaults_and_checks():
    sampler = TokenBatchSampler([2, 2], [2, 2], 10, shuffle=False)
    assert (sampler.num_replicas, sampler.rank) == (1, 0)
    with pytest.raises(ValueError, match="rank 2"):
        TokenBatchSampler([2, 2], [2, 2], 10, shuffle=False, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="target lengths"):
        TokenBatchSampler([2, 2], [2], 10, shuffle=False)


@pytest.mark.parametrize("num_replicas", [1, 2])
def test_resume_mid_epoch_continues_the_same_order(lengths, num_replicas):
    src, tgt = lengths

    def sampler(rank):
        return TokenBatchSampler(src, tgt, 2000, shuffle=True, seed=5, num_replicas=num_replicas, rank=rank)

    for rank in range(num_replicas):
        uninterrupted = sampler(rank)
        uninterrupted.set_epoch(3)
        whole = list(uninterrupted)
        restarted = sampler(rank)  # a new process: built from scratch, told where it stopped
        restarted.set_epoch(3)
        restarted.resume(epoch=3, batches_done=7)
        assert list(restarted) == whole[7:]
        assert list(restarted) == whole, "only the interrupted epoch's first pass is cut"
        restarted.resume(epoch=2, batches_done=7)
        assert list(restarted) == whole, "a position in another epoch is not applied to this one"


def test_the_evaluation_batch_is_eval_max_tokens_else_the_training_batch() -> None:
    # One rule for the data module's validation and test batches and aiayn.load's perplexity.
    assert evaluation_tokens(3400, None) == 3400
    assert evaluation_tokens(3400, 12000) == 12000
    assert evaluation_tokens("auto", 12000) == 12000
    assert evaluation_tokens("auto", None) is None  # train.py's plan sizes the training batch alone
