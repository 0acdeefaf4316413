"""Decoding (§6.1): length penalty, beam search vs greedy, maximum length, batching, early stop."""

from __future__ import annotations

import math

import pytest
import torch

from aiayn.model import Transformer, beam_search, greedy_search, length_penalty
from tests.helpers.plain_search import top_candidates

pytestmark = pytest.mark.usefixtures("single_thread")


PAD, BOS, EOS = 0, 1, 2
V = 12
SMALL = {"n_layers": 2, "d_model": 16, "d_ff": 32, "n_heads": 2, "d_k": 8, "d_v": 8, "dropout": 0.0, "max_positions": 64}


class BiasedTransformer(Transformer):
    """A Transformer whose logits can be edited per step, and which counts ``decode`` calls."""

    def __init__(self, *args, edit=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.edit = edit  # edit(logits, state_length_after_this_call) -> logits
        self.decode_calls = 0

    def decode(self, tgt_in, state, return_weights=False):
        self.decode_calls += 1
        logits, state, weights = super().decode(tgt_in, state, return_weights)
        if self.edit is not None:
            logits = self.edit(logits.clone(), state.length)
        return logits, state, weights


def random_model(seed: int, edit=None, **overrides) -> BiasedTransformer:
    torch.manual_seed(seed)
    return BiasedTransformer(V, V, edit=edit, **{**SMALL, **overrides}).double().eval()


def padded_sources(lengths: list[int], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths)), PAD)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.randint(3, V, (n,), generator=g)
    return src


def no_eos(logits, _length):
    logits[..., EOS] = float("-inf")
    return logits


@torch.no_grad()
def sequence_log_prob(model, src_row: torch.Tensor, hypothesis: list[int], with_eos: bool) -> float:
    """log P(hypothesis [+ EOS] | source) by teacher forcing, in float64."""
    src = src_row[src_row != PAD][None]
    target = hypothesis + ([EOS] if with_eos else [])
    tgt_in = torch.tensor([[BOS] + target[:-1]])
    logits = model.decode(tgt_in, model.start_decoding(*model.encode(src)[:2]))[0]
    log_probs = logits.double().log_softmax(-1)[0]
    return float(sum(log_probs[t, tok] for t, tok in enumerate(target)))


# ------------------------------------------------------------------------------ length penalty


def test_length_penalty_is_gnmts_and_grows_with_length():
    assert length_penalty(1, 0.6) == pytest.approx(1.0, abs=1e-15)
    assert length_penalty(10, 0.6) == pytest.approx((15 / 6) ** 0.6, rel=1e-15)
    assert length_penalty(10, 0.6) == pytest.approx(1.73286, abs=1e-5)  # 2.5^0.6
    assert length_penalty(3, 1.0) == pytest.approx(8 / 6, rel=1e-15)
    for n in (1, 2, 7, 50):
        assert length_penalty(n, 0.0) == 1.0
    as_tensor = length_penalty(torch.tensor([1.0, 10.0]), 0.6)
    torch.testing.assert_close(as_tensor, torch.tensor([1.0, (15 / 6) ** 0.6]))
    # Longer hypotheses are penalised less per log-probability unit (lp grows with length).
    assert length_penalty(20, 0.6) > length_penalty(10, 0.6) > length_penalty(1, 0.6)


# ------------------------------------------------------------------------- beam 1 vs greedy


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5])
def test_beam_size_one_equals_greedy_without_eos_alternatives(seed):
    """Without EOS in play, a beam of 1 follows exactly the argmax path, like greedy search."""
    model = random_model(seed, edit=no_eos)
    src = padded_sources([6, 4, 2, 5], seed)
    greedy = greedy_search(model, src, bos_id=BOS, eos_id=EOS, max_len_offset=4)
    beam = beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=1, alpha=0.0, max_len_offset=4)
    assert beam == greedy
    assert [len(h) for h in greedy] == [10, 8, 6, 9]


def test_beam_size_one_equals_greedy_exactly_on_random_models():
    mismatches = []
    for seed in range(8):
        model = random_model(seed)
        src = padded_sources([6, 4, 2, 5], seed)
        greedy = greedy_search(model, src, bos_id=BOS, eos_id=EOS, max_len_offset=5)
        beam = beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=1, alpha=0.0, max_len_offset=5)
        mismatches += [(seed, g, b) for g, b in zip(greedy, beam) if g != b]
    assert mismatches == []


# ------------------------------------------------------------- beam beats greedy (constructed)

A, B = 3, 4


class TableState:
    """The prefix decoded so far per batch row; ``select`` reorders it like DecoderState."""

    def __init__(self, prefixes: torch.Tensor):
        self.prefixes = prefixes
        self.length = prefixes.size(1)

    def select(self, indices: torch.Tensor) -> TableState:
        return TableState(self.prefixes.index_select(0, indices))


class TableModel:
    """Next-token distribution read from a table keyed by the prefix (BOS included)."""

    max_positions = 100
    vocab = 5

    def __init__(self, table: dict[tuple[int, ...], dict[int, float]]):
        self.table = table
        self.decode_calls = 0

    def encode(self, src):
        return torch.zeros(src.size(0), src.size(1), 1), (src != PAD)[:, None, None, :], []

    def start_decoding(self, memory, src_mask):
        return TableState(torch.zeros(memory.size(0), 0, dtype=torch.long))

    def next_logits(self, prefix: tuple[int, ...]) -> torch.Tensor:
        probs = torch.full((self.vocab,), 1e-9, dtype=torch.float64)
        for token, p in self.table.get(prefix, {EOS: 1.0}).items():
            probs[token] = p
        return probs.log()

    def decode(self, tgt_in, state):
        self.decode_calls += 1
        prefixes = torch.cat([state.prefixes, tgt_in], dim=1)
        rows = [self.next_logits(tuple(p)) for p in prefixes.tolist()]
        logits = torch.stack(rows)[:, None, :].expand(-1, tgt_in.size(1), -1)
        return logits, TableState(prefixes), []

    def log_prob(self, hypothesis: list[int]) -> float:
        prefix, total = (BOS,), 0.0
        for token in hypothesis + [EOS]:
            total += float(self.next_logits(prefix).log_softmax(-1)[token])
            prefix += (token,)
        return total


GARDEN_PATH = {
    (BOS,): {A: 0.6, B: 0.4},  # greedy takes A...
    (BOS, A): {A: 0.34, B: 0.33, EOS: 0.33},  # ...whose continuations are all unlikely
    (BOS, A, A): {EOS: 1.0},
    (BOS, B): {EOS: 0.9, A: 0.1},  # while B is almost surely followed by EOS
}


@pytest.mark.parametrize("beam_size", [2, 3])
def test_beam_finds_higher_scoring_hypothesis_than_greedy(beam_size):
    model = TableModel(GARDEN_PATH)
    src = torch.tensor([[5, 6, 7]])
    greedy = greedy_search(model, src, bos_id=BOS, eos_id=EOS, max_len_offset=5)
    beam = beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=beam_size, alpha=0.0, max_len_offset=5)
    assert greedy == [[A, A]]
    assert beam == [[B]]
    greedy_lp, beam_lp = model.log_prob([A, A]), model.log_prob([B])
    assert greedy_lp == pytest.approx(math.log(0.6 * 0.34 * 1.0), abs=1e-6)
    assert beam_lp == pytest.approx(math.log(0.4 * 0.9), abs=1e-6)
    assert beam_lp > greedy_lp
    # Beam is the best over every sequence of up to 2 tokens: brute force.
    candidates = [[]] + [[x] for x in (A, B)] + [[x, y] for x in (A, B) for y in (A, B)]
    assert max(candidates, key=model.log_prob) == [B]


def test_beam_reorders_decoder_state_when_the_second_beam_overtakes():
    """At step 2 the best live hypothesis (B B) descends from beam 1 and the next (A A) from
    beam 0, so the decoder state must be reordered; a stale state would feed B B the
    distribution of prefix A B (which never ends) and return a different hypothesis."""
    table = {
        (BOS,): {A: 0.5, B: 0.4, EOS: 0.1},
        (BOS, A): {A: 0.3, B: 0.3, EOS: 0.4},
        (BOS, B): {B: 0.95, EOS: 0.05},
        (BOS, B, B): {EOS: 1.0},
        (BOS, A, A): {EOS: 1.0},
        (BOS, A, B): {A: 1.0},
    }
    model = TableModel(table)
    src = torch.tensor([[5, 6, 7]])
    assert beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=2, alpha=0.0, max_len_offset=5) == [[B, B]]
    assert greedy_search(model, src, bos_id=BOS, eos_id=EOS, max_len_offset=5) == [[A]]
    assert model.log_prob([B, B]) > model.log_prob([A]) > model.log_prob([A, A])


def test_constructed_case_batched_with_other_sentences():
    """The same garden-path sentence solved inside a batch (sentences leave the batch independently)."""
    model = TableModel(GARDEN_PATH)
    src = torch.tensor([[5, 6, 7], [5, PAD, PAD]])
    beam = beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=2, alpha=0.0, max_len_offset=5)
    assert beam == [[B], [B]]


# ------------------------------------------------------------------- reference beam search


@torch.no_grad()
def reference_beam_search(model, src: torch.Tensor, k: int, alpha: float, max_len: int) -> list[int]:
    """The algorithm of beam_search's docstring for one unpadded sentence, written plainly: no
    cache (every step re-runs the full teacher-forced forward), Python lists, float64 scores."""
    live: list[tuple[float, list[int]]] = [(0.0, [])]
    best, best_score = [], float("-inf")
    for step in range(1, max_len + 1):
        top = top_candidates(model, src, live, k, BOS)
        for score, hyp, token in top[:k]:  # only EOS among the best k finishes a hypothesis
            if token == EOS and score / length_penalty(step, alpha) > best_score:
                best, best_score = hyp, score / length_penalty(step, alpha)
        live = [(score, hyp + [token]) for score, hyp, token in top if token != EOS][:k]
        if step == max_len:  # out of length: the best live hypothesis only where none finished
            if best_score == float("-inf"):
                best = live[0][1]
            break
        if live[0][0] / length_penalty(max_len, alpha) <= best_score:
            break
    return best


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("beam_size, alpha", [(2, 0.0), (3, 0.6), (4, 1.0)])
def test_beam_search_matches_reference_implementation(seed, beam_size, alpha):
    """Checks the cached, batched implementation (state reordering, sentences leaving the batch,
    the stopping rule) against the plain algorithm on random models."""

    def eos_rising(logits, length):
        # EOS grows likelier with length, so hypotheses finish at varied lengths (2 to 8 here)
        # instead of at once or never, and finished and live hypotheses compete.
        logits[..., EOS] = -2.0 + 0.7 * length
        return logits

    model = random_model(30 + seed, edit=eos_rising)
    lengths, offset = [4, 2, 6], 4
    src = padded_sources(lengths, 30 + seed)
    got = beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=beam_size, alpha=alpha, max_len_offset=offset)
    want = [reference_beam_search(model, src[i: i + 1, :n], beam_size, alpha, n + offset)
            for i, n in enumerate(lengths)]
    assert got == want


# ----------------------------------------------------------------------- maximum output length


@pytest.mark.parametrize("beam_size, alpha", [(1, 0.0), (2, 0.6), (3, 0.0), (4, 1.0)])
def test_max_length_is_source_length_plus_offset(beam_size, alpha):
    model = random_model(7, edit=no_eos)
    lengths, offset = [5, 2, 7, 1], 3
    src = padded_sources(lengths, 7)
    beam = beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=beam_size, alpha=alpha, max_len_offset=offset)
    greedy = greedy_search(model, src, bos_id=BOS, eos_id=EOS, max_len_offset=offset)
    expected = [n + offset for n in lengths]
    assert [len(h) for h in beam] == expected
    assert [len(h) for h in greedy] == expected
    assert all(EOS not in h for h in beam + greedy)
    assert model.decode_calls == 2 * max(expected)  # one decode per step in each search, no more


def test_max_length_capped_by_max_positions():
    model = random_model(8, edit=no_eos, max_positions=6)
    src = padded_sources([4, 2], 8)
    beam = beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=2, alpha=0.6, max_len_offset=50)
    greedy = greedy_search(model, src, bos_id=BOS, eos_id=EOS, max_len_offset=50)
    assert [len(h) for h in beam] == [6, 6]
    assert [len(h) for h in greedy] == [6, 6]


# ---------------------------------------------------------------------------------- batching


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batched_search_equals_one_sentence_at_a_time(seed):
    model = random_model(10 + seed)
    lengths = [3, 7, 1, 5, 4]
    src = padded_sources(lengths, seed)
    for search, kwargs in (
        (beam_search, {"beam_size": 3, "alpha": 0.6}),
        (beam_search, {"beam_size": 2, "alpha": 0.0}),
        (greedy_search, {}),
    ):
        batched = search(model, src, bos_id=BOS, eos_id=EOS, max_len_offset=4, **kwargs)
        alone = [search(model, src[i: i + 1, :n], bos_id=BOS, eos_id=EOS, max_len_offset=4, **kwargs)[0]
                 for i, n in enumerate(lengths)]
        assert batched == alone


# ---------------------------------------------------------------------------- early termination


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_stops_after_one_step_when_eos_dominates(alpha):
    def eos_first(logits, _length):
        logits[..., EOS] += 100.0
        return logits

    model = random_model(20, edit=eos_first)
    src = padded_sources([5, 3, 6], 20)
    beam = beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=4, alpha=alpha, max_len_offset=50)
    assert beam == [[], [], []]
    assert model.decode_calls == 1
    model.decode_calls = 0
    assert greedy_search(model, src, bos_id=BOS, eos_id=EOS, max_len_offset=50) == [[], [], []]
    assert model.decode_calls == 1


def test_beam_stops_once_no_live_hypothesis_can_win():
    """EOS becomes overwhelmingly likely at step 3: the search ends there, far before the
    maximum length of source length + 50."""

    def eos_at_three(logits, length):
        logits[..., EOS] = 100.0 if length == 3 else -100.0
        return logits

    model = random_model(21, edit=eos_at_three)
    src = padded_sources([4, 6], 21)
    beam = beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=4, alpha=0.6, max_len_offset=50)
    assert [len(h) for h in beam] == [2, 2]
    assert model.decode_calls == 3
