"""Restricted self-attention (§4, ``model.attention_window`` r): each encoder position sees the r
positions on each side of it, each decoder position the r before it and itself; a window as wide
as the sentence is full attention, a stack of N layers sees N·r positions away and no farther,
and decoding one token at a time with the key/value cache applies the same window."""

from __future__ import annotations

import pytest
import torch

from aiayn.model import Transformer, beam_search, greedy_search
from aiayn.model.attention import ATTENTION_KINDS

pytestmark = pytest.mark.usefixtures("single_thread")

PAD, BOS, EOS = 0, 1, 2
V = 16
SMALL = {"n_layers": 2, "d_model": 16, "d_ff": 32, "n_heads": 2, "d_k": 8, "d_v": 8, "dropout": 0.0,
         "max_positions": 64}


def model_with(window, attention="sdpa", seed=0, dtype=torch.float32, **sizes) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(V, V, attention=attention, attention_window=window, **{**SMALL, **sizes}).to(dtype).eval()


def ragged(lengths: list[int], seed: int) -> torch.Tensor:
    """Token ids, each row ``lengths[i]`` real tokens ending in EOS, then padding."""
    g = torch.Generator().manual_seed(seed)
    rows = torch.full((len(lengths), max(lengths)), PAD)
    for i, n in enumerate(lengths):
        rows[i, :n] = torch.randint(3, V, (n,), generator=g)
        rows[i, n - 1] = EOS
    return rows


@pytest.mark.parametrize("attention", ATTENTION_KINDS)
def test_a_window_as_wide_as_the_sentence_is_full_attention(attention):
    src, tgt = ragged([9, 4, 7], seed=0), ragged([8, 3, 6], seed=1)
    with torch.no_grad():
        full = model_with(None, attention)(src, tgt)
        for r in (src.size(1) - 1, src.size(1), 100):
            assert torch.equal(model_with(r, attention)(src, tgt), full), r
        assert not torch.allclose(model_with(2, attention)(src, tgt), full)  # a narrower one restricts


def stacked_gradients(model: Transformer, stack: str, length: int, i: int) -> torch.Tensor:
    """|∂ output i / ∂ input j| summed over the width, for every input position j of one sentence
    through ``stack`` (encoder, or the decoder's self-attention with a fixed source)."""
    x = torch.randn(1, length, model.d_model, dtype=torch.float64, requires_grad=True)
    if stack == "encoder":
        out = x
        for layer in model.encoder_layers:
            out, _ = layer(out, torch.ones(1, 1, 1, length, dtype=torch.bool))
    else:
        memory, src_mask, _ = model.encode(ragged([5], seed=3))
        state = model.start_decoding(memory, src_mask)
        out = x
        for layer, memory_kv in zip(model.decoder_layers, state.memory_kv):
            out, _, _ = layer(out, memory_kv, state.src_mask)
    # A random direction: the plain sum of a layer-normalised output is constant.
    (out[0, i] * torch.randn(model.d_model, dtype=torch.float64)).sum().backward()
    return x.grad[0].abs().sum(-1)  # (length,)


@pytest.mark.parametrize("attention", ATTENTION_KINDS)
@pytest.mark.parametrize("n_layers, r", [(2, 2), (3, 1)])
def test_the_encoder_sees_n_times_r_positions_on_each_side_and_no_farther(attention, n_layers, r):
    model = model_with(r, attention, dtype=torch.float64, n_layers=n_layers)
    length, reach = 20, n_layers * r
    for i in (0, 9, 19):
        grad = stacked_gradients(model, "encoder", length, i)
        inside = torch.zeros(length, dtype=torch.bool)
        inside[max(0, i - reach): i + reach + 1] = True
        assert torch.all(grad[~inside] == 0), (i, grad)
        assert torch.all(grad[inside] != 0), (i, grad)  # reaching exactly N·r, the farthest included


@pytest.mark.parametrize("attention", ATTENTION_KINDS)
@pytest.mark.parametrize("n_layers, r", [(2, 2), (3, 1)])
def test_the_decoder_sees_n_times_r_positions_before_and_none_after(attention, n_layers, r):
    model = model_with(r, attention, dtype=torch.float64, n_layers=n_layers)
    length, reach = 20, n_layers * r
    for i in (0, 9, 19):
        grad = stacked_gradients(model, "decoder", length, i)
        inside = torch.zeros(length, dtype=torch.bool)
        inside[max(0, i - reach): i + 1] = True
        assert torch.all(grad[~inside] == 0), (i, grad)
        assert torch.all(grad[inside] != 0), (i, grad)


@pytest.mark.parametrize("attention", ATTENTION_KINDS)
def test_padding_past_a_window_changes_nothing_and_leaves_no_nan(attention):
    """A padded position more than r past its sentence's end has no real key in its window: it
    must not turn into NaN that later layers would pick up through its value."""
    model = model_with(1, attention)
    short, padded = ragged([4], seed=4), ragged([4, 15], seed=4)
    with torch.no_grad():
        alone, _, _ = model.encode(short)
        batched, _, _ = model.encode(padded)
        assert torch.isfinite(batched).all()
        torch.testing.assert_close(batched[0, :4], alone[0], rtol=0, atol=1e-6)
        logits = model(padded, ragged([6, 6], seed=5))
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("attention", ATTENTION_KINDS)
def test_decoding_step_by_step_with_the_cache_gives_the_full_passs_logits(attention):
    model = model_with(2, attention, dtype=torch.float64)
    src, tgt = ragged([9, 4, 7], seed=6), ragged([12, 5, 10], seed=7)
    with torch.no_grad():
        full = model(src, tgt)  # (batch, 12, V)
        memory, src_mask, _ = model.encode(src)
        state, steps = model.start_decoding(memory, src_mask), []
        for t in range(tgt.size(1)):
            logits, state, _ = model.decode(tgt[:, t:t + 1], state)
            steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-12)


@pytest.mark.parametrize("attention", ATTENTION_KINDS)
@pytest.mark.parametrize("seed", [0, 1])
def test_searches_are_the_same_with_and_without_the_cache(attention, seed):
    model = model_with(1, attention, seed=seed)
    src = ragged([3, 9, 6, 12], seed)
    greedy = greedy_search(model, src, bos_id=BOS, eos_id=EOS, max_len_offset=8)
    assert greedy == greedy_search(model, src, bos_id=BOS, eos_id=EOS, max_len_offset=8, kv_cache=False)
    assert max(map(len, greedy)) > 3  # long enough for the window to leave keys out
    beam = beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=3, alpha=0.6, max_len_offset=8)
    assert beam == beam_search(model, src, bos_id=BOS, eos_id=EOS, beam_size=3, alpha=0.6, max_len_offset=8, kv_cache=False)


@pytest.mark.parametrize("window", [0, -1, 2.5, True, "3"])
def test_a_window_that_is_not_a_whole_number_of_at_least_1_is_refused(window):
    with pytest.raises(ValueError, match="attention_window must be a whole number of at least 1"):
        Transformer(V, V, attention_window=window, **SMALL)
