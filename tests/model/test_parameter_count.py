"""The parameter counts of base and big (Table 3): the model's own, a count by hand from the
shapes of §3, and the paper's figures (65M, 213M)."""

from __future__ import annotations

import pytest
import torch

from aiayn.model import Transformer


def _count_by_hand(vocab, n_layers, d_model, d_ff, h, d_k, d_v) -> int:
    attention = d_model * h * d_k * 2 + d_model * h * d_v + h * d_v * d_model  # W^Q, W^K, W^V, W^O, no bias
    ffn = 2 * d_model * d_ff + d_ff + d_model  # W_1, W_2 and their biases
    layer_norm = 2 * d_model  # gain and bias
    encoder_layer = attention + ffn + 2 * layer_norm
    decoder_layer = 2 * attention + ffn + 3 * layer_norm
    embedding = vocab * d_model  # shared by source, target and pre-softmax projection; counted once
    return embedding + n_layers * (encoder_layer + decoder_layer)  # sinusoids: no parameters


CONFIGS = {
    "base": ({"n_layers": 6, "d_model": 512, "d_ff": 2048, "n_heads": 8, "d_k": 64, "d_v": 64}, 65e6),
    "big": ({"n_layers": 6, "d_model": 1024, "d_ff": 4096, "n_heads": 16, "d_k": 64, "d_v": 64}, 213e6),
}


@pytest.fixture(scope="module")
def paper_models():
    # Built on the meta device: shapes only, no memory, no initialisation cost, never run.
    with torch.device("meta"):
        return {name: Transformer(37000, 37000, share_embeddings=True, **cfg) for name, (cfg, _) in CONFIGS.items()}


@pytest.mark.parametrize("name", ["base", "big"])
def test_parameter_counts_equal_the_hand_count_and_the_papers_within_3_percent(paper_models, name):
    cfg, paper = CONFIGS[name]
    model = paper_models[name]
    count = sum(p.numel() for p in model.parameters())
    by_hand = _count_by_hand(37000, cfg["n_layers"], cfg["d_model"], cfg["d_ff"], cfg["n_heads"], cfg["d_k"], cfg["d_v"])
    print(f"{name}: {count:,} parameters (by hand {by_hand:,}; paper {paper / 1e6:.0f}M, "
          f"{100 * (count - paper) / paper:+.2f}%)")
    assert count == by_hand
    assert abs(count - paper) / paper < 0.031


def test_parameter_count_formula_concrete_values():
    # Guards the hand formula itself with numbers worked out on paper.
    assert _count_by_hand(37000, 6, 512, 2048, 8, 64, 64) == 63_045_632
    assert _count_by_hand(37000, 6, 1024, 4096, 16, 64, 64) == 214_171_648
