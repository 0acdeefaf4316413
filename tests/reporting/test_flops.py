"""Restricted self-attention (§4, ``model.attention_window``) in the counted FLOPs
(aiayn.reporting.flops): each query's keys are its neighbourhood, not the whole sequence."""

from __future__ import annotations

from aiayn.model.attention import allowed_positions
from aiayn.reporting.flops import Shapes, forward_flops

SIZES = {"n_layers": 2, "d_model": 48, "d_ff": 80, "n_heads": 3, "d_k": 8, "d_v": 24, "vocab_size": 211}


def test_a_window_counts_2r_plus_1_encoder_keys_and_r_plus_1_decoder_keys_per_query():
    full = Shapes(**SIZES)
    batch, src_len, tgt_len, r = 3, 13, 6, 2
    windowed = Shapes(**SIZES, attention_window=r)
    per_key = 2 * full.n_heads * (full.d_k + full.d_v)  # Q·Kᵀ and the weighted sum of V, per query and key
    saved = per_key * full.n_layers * (src_len * (src_len - (2 * r + 1)) + tgt_len * (tgt_len - (r + 1)))
    assert forward_flops(full, batch, src_len, tgt_len) - forward_flops(windowed, batch, src_len, tgt_len) == (
        batch * saved)
    # The widths counted are those of the masks the model applies: the widest row of each.
    assert allowed_positions(src_len, src_len, r, False).sum(-1).max() == 2 * r + 1
    assert allowed_positions(tgt_len, tgt_len, r, True).sum(-1).max() == r + 1


def test_a_window_reaching_the_whole_sequence_counts_as_full_attention():
    full = Shapes(**SIZES)
    assert Shapes.from_config({**SIZES, "attention_window": None}, 211) == full
    for r in (12, 13, 100):  # 2r + 1 ≥ 13 source positions and r + 1 ≥ 6 target positions
        assert forward_flops(Shapes(**SIZES, attention_window=r), 3, 13, 6) == forward_flops(full, 3, 13, 6)
    assert Shapes.from_config({**SIZES, "attention_window": 4}, 211).attention_window == 4
    assert forward_flops(Shapes(**SIZES, attention_window=5), 3, 13, 6) < forward_flops(full, 3, 13, 6)
