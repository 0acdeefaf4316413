"""Decoding with and without the decoder self-attention key/value cache gives the same outputs."""

from __future__ import annotations

import pytest
import torch

from aiayn.model import Transformer, beam_search, greedy_search
from aiayn.model.search import beam_search_nbest

pytestmark = pytest.mark.usefixtures("single_thread")

PAD, BOS, EOS = 0, 1, 2
V = 16
SMALL = {"n_layers": 2, "d_model": 16, "d_ff": 32, "n_heads": 2, "d_k": 8, "d_v": 8, "dropout": 0.0, "max_positions": 64}


class CountingTransformer(Transformer):
    """Records the target length of every ``decode`` call, and raises the EOS logit by a constant
    so that some hypotheses end before the length limit (random weights seldom pick EOS)."""

    def __init__(self, *args, eos_bias: float = 1.5, **kwargs):
        super().__init__(*args, **kwargs)
        self.fed_lengths: list[int] = []
        self.eos_bias = eos_bias

    def decode(self, tgt_in, state, return_weights=False):
        self.fed_lengths.append(tgt_in.size(1))
        logits, state, weights = super().decode(tgt_in, state, return_weights)
        logits[..., EOS] += self.eos_bias
        return logits, state, weights


def random_model(seed: int) -> CountingTransformer:
    torch.manual_seed(seed)
    return CountingTransformer(V, V, **SMALL).eval()


def ragged_sources(lengths: list[int], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths)), PAD)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.randint(3, V, (n,), generator=g)
        src[i, n - 1] = EOS
    return src


LENGTHS = [[5], [3, 9, 6, 1, 12], [7, 7, 2, 10]]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_same_with_and_without_cache(seed):
    model = random_model(seed)
    src = ragged_sources(LENGTHS[seed], seed)
    cached = greedy_search(model, src, bos_id=BOS, eos_id=EOS, max_len_offset=8)
    assert set(model.fed_lengths) == {1}  # one new token per step
    model.fed_lengths.clear()
    plain = greedy_search(model, src, bos_id=BOS, eos_id=EOS, max_len_offset=8, kv_cache=False)
    assert plain == cached
    assert model.fed_lengths == list(range(1, len(model.fed_lengths) + 1))  # the whole prefix each step


@pytest.mark.parametrize("beam_size", [1, 2, 4, 7])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_same_with_and_without_cache(seed, beam_size):
    model = random_model(seed)
    src = ragged_sources(LENGTHS[seed], seed)
    settings = {"bos_id": BOS, "eos_id": EOS, "beam_size": beam_size, "alpha": 0.6, "max_len_offset": 8}
    cached = beam_search(model, src, **settings)
    assert set(model.fed_lengths) == {1}
    steps = len(model.fed_lengths)
    model.fed_lengths.clear()
    plain = beam_search(model, src, **settings, kv_cache=False)
    assert plain == cached
    assert model.fed_lengths == list(range(1, steps + 1))


def test_cases_end_both_early_and_at_the_limit():
    """The cases above cover hypotheses ending in EOS and ones cut at input length + offset."""
    ends = set()
    for seed, lengths in enumerate(LENGTHS):
        for beam_size in (1, 2, 4, 7):
            hypotheses = beam_search(random_model(seed), ragged_sources(lengths, seed), bos_id=BOS, eos_id=EOS,
                                     beam_size=beam_size, alpha=0.6, max_len_offset=8)
            ends |= {"eos" if len(h) < n + 8 else "limit" for h, n in zip(hypotheses, lengths)}
    assert ends == {"eos", "limit"}


def test_no_cache_keeps_no_keys_values():
    """Without the cache the state carried between steps never holds self-attention keys/values."""
    model = random_model(0)
    seen = []
    decode = model.decode

    def spy(tgt_in, state, return_weights=False):
        seen.append(all(kv is None for kv in state.self_kv) and state.length == 0)
        return decode(tgt_in, state, return_weights)

    model.decode = spy
    beam_search(model, ragged_sources([4, 6], 0), bos_id=BOS, eos_id=EOS, beam_size=3, alpha=0.6, max_len_offset=5,
                kv_cache=False)
    assert seen and all(seen)


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float64, 1e-12), (torch.float32, 2e-6)])
def test_the_cached_search_scores_each_hypothesis_as_the_uncached_up_to_rounding(dtype, tolerance):
    """With and without the cache a search finds the same n-best lists, and scores them with the same
    numbers up to the rounding of ``dtype``: in float64 they agree to 1e-12 relative (the same masks,
    positions, sums and length penalty: nothing but rounding tells the two paths apart); in float32
    to 2e-6, twice the worst seen on a trained model (Multi30k's small model on 64 test sentences,
    beam 4, n-best 4: 9e-7; this random one: 3e-7), each path's products and softmaxes rounding
    differently (the uncached decoder attends over the whole prefix with SDPA, the cached one
    writes a step's Eq. 1 out). Printed to 4 decimals (the n-best files), a few scores of 100 then
    differ in the last decimal, a value on either side of the rounding boundary."""
    torch.set_num_threads(1)
    seen = 0
    for seed in range(3):
        model = random_model(seed).to(dtype)
        src = ragged_sources([3, 9, 6, 1, 12, 20], seed)
        for beam_size, alpha in ((1, 0.0), (4, 0.6), (7, 1.0)):
            settings = {"bos_id": BOS, "eos_id": EOS, "beam_size": beam_size, "alpha": alpha, "max_len_offset": 30,
                        "nbest": beam_size}
            cached = beam_search_nbest(model, src, **settings)
            plain = beam_search_nbest(model, src, **settings, kv_cache=False)
            for ours, theirs in zip(cached, plain, strict=True):
                assert [h.tokens for h in ours] == [h.tokens for h in theirs]
                for h, g in zip(ours, theirs):
                    assert h.log_prob == pytest.approx(g.log_prob, rel=tolerance, abs=0)
                    assert h.score == pytest.approx(g.score, rel=tolerance, abs=0)
                    seen += 1
    assert seen > 200
