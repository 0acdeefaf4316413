"""The counted FLOPs (aiayn.reporting.flops) against torch's own count, the paper's cost estimate
(Table 2), and restricted self-attention (§4, ``model.attention_window``): each query's keys are its
neighbourhood, not the whole sequence."""

from __future__ import annotations

import pytest
import torch

from aiayn.model import Transformer
from aiayn.model.attention import allowed_positions
from aiayn.reporting.flops import Shapes, forward_flops, paper_estimate, training_flops

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


def test_counted_flops_equal_torchs_flop_counter_on_a_real_model(single_thread) -> None:
    """The formula of aiayn.reporting.flops against torch's own count of every matrix product of a
    real forward pass (and forward + backward: 3× the forward)."""
    from torch.utils.flop_counter import FlopCounterMode

    sizes = {"n_layers": 2, "d_model": 48, "d_ff": 80, "n_heads": 3, "d_k": 8, "d_v": 24}
    vocab, batch, src_len, tgt_len = 211, 3, 13, 6
    torch.manual_seed(0)
    model = Transformer(vocab, vocab, dropout=0.0, **sizes)
    src, tgt = torch.randint(4, vocab, (batch, src_len)), torch.randint(4, vocab, (batch, tgt_len))
    with FlopCounterMode(display=False) as forward:
        model(src, tgt)
    with FlopCounterMode(display=False) as both:
        model(src, tgt).sum().backward()
    shapes = Shapes(vocab_size=vocab, **sizes)
    assert forward_flops(shapes, batch, src_len, tgt_len) == forward.get_total_flops()
    assert training_flops(shapes, batch, src_len, tgt_len) == both.get_total_flops()


def test_the_papers_cost_estimate_gives_table2s_figures() -> None:
    """§6.1: 8 P100s (9.5 TFLOPS); base 12 hours → 3.3·10^18, big 3.5 days → 2.3·10^19."""
    assert round(paper_estimate(12 * 3600, 8, "P100") / 1e18, 1) == 3.3
    assert round(paper_estimate(3.5 * 24 * 3600, 8, "P100") / 1e19, 1) == 2.3
    assert paper_estimate(3600, 1, "K80") == 3600 * 2.8e12 and paper_estimate(10, 2, 5.0) == 10 * 2 * 5e12
    with pytest.raises(ValueError, match="not one of the paper's GPUs"):
        paper_estimate(1, 1, "H100")
