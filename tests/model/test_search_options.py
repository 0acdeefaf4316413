"""Decoding options beyond the paper's: the stopping rule (``stop``), n-best lists, sampling and
ensembles, each against a reference computed another way (a plain search written with Python lists,
greedy search, the model alone)."""

from __future__ import annotations

import pytest
import torch

from aiayn.model import Ensemble, Transformer, beam_search, beam_search_nbest, greedy_search, length_penalty, sample
from aiayn.model.sampling import filtered
from tests.helpers.plain_search import top_candidates

pytestmark = pytest.mark.usefixtures("single_thread")

PAD, BOS, EOS = 0, 1, 2
V = 12
SMALL = {"n_layers": 2, "d_model": 16, "d_ff": 32, "n_heads": 2, "d_k": 8, "d_v": 8, "dropout": 0.0, "max_positions": 64}


class RisingEos(Transformer):
    """A random Transformer whose EOS grows likelier with length, so that hypotheses finish at
    varied lengths and finished and live ones compete."""

    def decode(self, tgt_in, state, return_weights=False):
        logits, state, weights = super().decode(tgt_in, state, return_weights)
        logits = logits.clone()
        logits[..., EOS] = -2.0 + 0.7 * state.length
        return logits, state, weights


def random_model(seed: int, cls=RisingEos) -> Transformer:
    torch.manual_seed(seed)
    return cls(V, V, **SMALL).double().eval()


def padded_sources(lengths: list[int], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths)), PAD)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.randint(3, V, (n,), generator=g)
    return src


@torch.no_grad()
def reference_nbest(model, src: torch.Tensor, k: int, alpha: float, max_len: int, stop: str, nbest: int):
    """The search of beam_search_nbest's docstring for one unpadded sentence, written plainly: every
    step re-runs the whole prefix, Python lists; all finished hypotheses kept, then the best nbest."""
    live: list[tuple[float, list[int]]] = [(0.0, [])]
    finished: list[tuple[float, float, list[int]]] = []  # (score, log-prob, tokens), in the order found
    for step in range(1, max_len + 1):
        top = top_candidates(model, src, live, k, BOS, dtype=torch.float32)
        finished += [(score / length_penalty(step, alpha), score, hyp) for score, hyp, token in top[:k] if token == EOS]
        live = [(score, hyp + [token]) for score, hyp, token in top if token != EOS][:k]
        if step == max_len:  # out of length: the best live ones fill the places left, after the finished
            ranked = sorted(finished, key=lambda f: -f[0])[:nbest]
            cut = [(score / length_penalty(step, alpha), score, hyp) for score, hyp in live[:nbest - len(ranked)]]
            return ranked + cut
        ranked = sorted(finished, key=lambda f: -f[0])
        if stop == "first_k" and len(finished) >= k:
            break
        if stop == "paper" and len(ranked) >= nbest and live[0][0] / length_penalty(max_len, alpha) <= ranked[nbest - 1][0]:
            break
    return sorted(finished, key=lambda f: -f[0])[:nbest]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("stop", ["paper", "first_k"])
@pytest.mark.parametrize("beam_size, nbest, alpha", [(3, 1, 0.6), (3, 3, 0.6), (4, 2, 1.0), (2, 2, 0.0)])
def test_nbest_and_stopping_rules_match_a_plain_search(seed, stop, beam_size, nbest, alpha):
    model = random_model(40 + seed)
    lengths, offset = [4, 2, 6], 4
    src = padded_sources(lengths, 40 + seed)
    got = beam_search_nbest(model, src, bos_id=BOS, eos_id=EOS, beam_size=beam_size, alpha=alpha,
                            max_len_offset=offset, stop=stop, nbest=nbest)
    for i, n in enumerate(lengths):
        want = reference_nbest(model, src[i: i + 1, :n], beam_size, alpha, n + offset, stop, nbest)
        assert [h.tokens for h in got[i]] == [tokens for _, _, tokens in want]
        assert [h.score for h in got[i]] == pytest.approx([score for score, _, _ in want], rel=1e-5)
        assert [h.log_prob for h in got[i]] == pytest.approx([lp for _, lp, _ in want], rel=1e-5)


@pytest.mark.parametrize("stop", ["paper", "first_k"])
def test_the_first_of_the_nbest_is_the_1best(stop):
    model = random_model(50)
    src = padded_sources([5, 3, 7, 2], 50)
    settings = {"bos_id": BOS, "eos_id": EOS, "beam_size": 4, "alpha": 0.6, "max_len_offset": 6, "stop": stop}
    one = beam_search(model, src, **settings)
    nbest = beam_search_nbest(model, src, nbest=4, **settings)
    assert [hypotheses[0].tokens for hypotheses in nbest] == one
    assert all(len(hypotheses) == 4 for hypotheses in nbest)
    for hypotheses, limit in zip(nbest, (5 + 6, 3 + 6, 7 + 6, 2 + 6), strict=True):
        # best first: the finished (shorter than the limit) by score, then those cut at the limit by score
        cut = [len(h.tokens) == limit for h in hypotheses]
        assert cut == sorted(cut)
        for kind in (False, True):
            scores = [h.score for h, was_cut in zip(hypotheses, cut, strict=True) if was_cut == kind]
            assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hypotheses}) == 4  # each a different output


def test_first_k_stops_no_later_than_the_paper_rule_here_and_scores_no_better():
    """first_k stops once beam_size hypotheses finished; the paper's bound may search on and can
    only find a better (or the same) best score."""
    model = random_model(51)
    src = padded_sources([5, 3, 7, 2, 6], 51)
    settings = {"bos_id": BOS, "eos_id": EOS, "beam_size": 4, "alpha": 0.6, "max_len_offset": 6}
    paper = beam_search_nbest(model, src, stop="paper", **settings)
    first_k = beam_search_nbest(model, src, stop="first_k", **settings)
    for p, f in zip(paper, first_k):
        assert p[0].score >= f[0].score - 1e-9


class RowCounting(RisingEos):
    """RisingEos that records how many rows each decoder call is given."""

    def decode(self, tgt_in, state, return_weights=False):
        self.rows.append(tgt_in.size(0))
        return super().decode(tgt_in, state, return_weights)


@pytest.mark.parametrize("kv_cache", [True, False])
def test_first_k_runs_its_first_step_once_per_sentence_and_finds_the_plain_search(kv_cache):
    """All beams start from BOS: under first_k (CTranslate2's rule) the first step runs on one row
    per sentence and is copied to the beams, as CTranslate2 runs it; under paper on every beam's row.
    Either way the hypotheses are the plain search's."""
    model, lengths, offset, k = random_model(52, cls=RowCounting), [5, 3, 7, 2, 6], 5, 4
    src = padded_sources(lengths, 52)
    for stop, first_rows in (("first_k", len(lengths)), ("paper", len(lengths) * k)):
        model.rows = []
        got = beam_search_nbest(model, src, bos_id=BOS, eos_id=EOS, beam_size=k, alpha=0.6, max_len_offset=offset,
                                stop=stop, kv_cache=kv_cache)
        assert model.rows[:2] == [first_rows, len(lengths) * k], stop
        for i, n in enumerate(lengths):
            want = reference_nbest(model, src[i: i + 1, :n], k, 0.6, n + offset, stop, 1)
            assert [h.tokens for h in got[i]] == [tokens for _, _, tokens in want]
            assert got[i][0].log_prob == pytest.approx(want[0][1], rel=1e-5)  # the search sums in float32


# ------------------------------------------------------------------------------------ sampling


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sampling_with_top_k_1_is_greedy_search(seed):
    model = random_model(60 + seed, cls=Transformer)
    src = padded_sources([6, 4, 2, 5], seed)
    greedy = greedy_search(model, src, bos_id=BOS, eos_id=EOS, max_len_offset=5)
    samples = sample(model, src, bos_id=BOS, eos_id=EOS, max_len_offset=5, top_k=1, samples=3, temperature=0.7,
                     generator=torch.Generator().manual_seed(seed))
    assert [[h.tokens for h in drawn] for drawn in samples] == [[g] * 3 for g in greedy]


def test_samples_are_reproducible_with_a_seed_and_differ_with_another():
    model = random_model(61, cls=Transformer)
    src = padded_sources([6, 4, 5], 61)
    draw = lambda seed: [[h.tokens for h in drawn] for drawn in sample(
        model, src, bos_id=BOS, eos_id=EOS, max_len_offset=5, samples=4, temperature=2.0,
        generator=torch.Generator().manual_seed(seed))]
    assert draw(7) == draw(7)
    assert draw(7) != draw(8)
    assert len({tuple(tokens) for drawn in draw(7) for tokens in drawn}) > 3  # a flat distribution: samples differ


@torch.no_grad()
def test_a_samples_log_prob_and_score_are_the_models():
    model = random_model(62, cls=Transformer)
    src = padded_sources([5], 62)
    drawn = sample(model, src, bos_id=BOS, eos_id=EOS, max_len_offset=5, samples=5, alpha=0.6, temperature=1.5,
                   generator=torch.Generator().manual_seed(0))[0]
    for h in drawn:
        ended = len(h.tokens) < 10  # the maximum is 5 + 5: shorter ones ended with EOS
        target = h.tokens + ([EOS] if ended else [])
        logits = model.decode(torch.tensor([[BOS] + target[:-1]]), model.start_decoding(*model.encode(src)[:2]))[0]
        want = float(logits[0].float().log_softmax(-1).gather(1, torch.tensor(target)[:, None]).sum())
        assert h.log_prob == pytest.approx(want, rel=1e-5)
        assert h.score == pytest.approx(want / length_penalty(len(target), 0.6), rel=1e-5)
    assert [h.score for h in drawn] == sorted((h.score for h in drawn), reverse=True)


def test_top_k_and_top_p_keep_the_most_probable_tokens():
    log_probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    assert torch.isfinite(filtered(log_probs, 1.0, 2, 1.0)).tolist() == [[True, True, False, False]]
    # the fewest most probable tokens adding up to 0.8: 0.5 + 0.3
    assert torch.isfinite(filtered(log_probs, 1.0, 0, 0.8)).tolist() == [[True, True, False, False]]
    assert torch.isfinite(filtered(log_probs, 1.0, 0, 0.81)).tolist() == [[True, True, True, False]]
    assert torch.isfinite(filtered(log_probs, 1.0, 0, 0.1)).tolist() == [[True, False, False, False]]
    torch.testing.assert_close(filtered(log_probs, 2.0, 0, 1.0), log_probs / 2)


# ------------------------------------------------------------------------------------ ensembles


@pytest.mark.parametrize("stop", ["paper", "first_k"])
@pytest.mark.parametrize("kv_cache", [True, False])
def test_an_ensemble_of_a_model_with_itself_decodes_as_the_model(stop, kv_cache):
    model = random_model(70)
    src = padded_sources([5, 3, 7], 70)
    settings = {"bos_id": BOS, "eos_id": EOS, "beam_size": 3, "alpha": 0.6, "max_len_offset": 5, "stop": stop,
                "nbest": 3, "kv_cache": kv_cache}
    alone = beam_search_nbest(model, src, **settings)
    assert beam_search_nbest(Ensemble([model, model]), src, **settings) == alone
    assert beam_search_nbest(Ensemble([model]), src, **settings) == alone


@torch.no_grad()
def test_an_ensemble_averages_its_models_log_probabilities():
    first, second = random_model(71, cls=Transformer), random_model(72, cls=Transformer)
    src = padded_sources([5, 3], 71)
    ensemble = Ensemble([first, second])
    tokens = torch.tensor([[BOS, 4, 5]] * 2)
    state, _ = ensemble.start_search(src)
    log_probs, _ = ensemble.next_log_probs(tokens, state, kv_cache=False)
    each = [model.decode(tokens, model.start_decoding(*model.encode(src)[:2]))[0][:, -1].float().log_softmax(-1)
            for model in (first, second)]
    torch.testing.assert_close(log_probs, (each[0] + each[1]) / 2)


@pytest.mark.parametrize("nbest", [1, 3])
def test_a_bf16_model_searches_under_a_bf16_default_dtype(nbest: int) -> None:
    """``trainer.precision=bf16-true`` makes bf16 torch's default dtype for the run, its validation's
    search included: the scores are kept in float32 all the same, and the outputs are the float32
    default's (before: the kept hypotheses' scores were bf16 beside float32 ones, and the first
    validation ended in index_copy_'s RuntimeError)."""
    model, src = random_model(0).to(torch.bfloat16), padded_sources([5, 3, 7, 2], 0)
    settings = {"bos_id": BOS, "eos_id": EOS, "max_len_offset": 5, "alpha": 0.6}
    expected = beam_search_nbest(model, src, beam_size=3, nbest=nbest, **settings)
    drawn = sample(model, src, samples=2, generator=torch.Generator().manual_seed(0), **settings)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        assert beam_search_nbest(model, src, beam_size=3, nbest=nbest, **settings) == expected
        assert sample(model, src, samples=2, generator=torch.Generator().manual_seed(0), **settings) == drawn
    finally:
        torch.set_default_dtype(default)
    assert len({len(hypotheses[0].tokens) for hypotheses in expected}) > 1  # sentences finished at different steps
