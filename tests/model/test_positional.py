"""Positional encodings (§3.5): the sinusoid table, offsets, limits, learned positions (Table 3 E)."""

from __future__ import annotations

import math

import pytest
import torch

from aiayn.model import Transformer
from aiayn.model.positional import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    positional_encoding,
    sinusoidal_table,
)

pytestmark = pytest.mark.usefixtures("single_thread")


def _pe(pos: int, dim: int, d_model: int) -> float:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))."""
    two_i = dim - dim % 2
    angle = pos / 10000 ** (two_i / d_model)
    return math.sin(angle) if dim % 2 == 0 else math.cos(angle)


@pytest.mark.parametrize("d_model", [8, 7, 512])
def test_sinusoidal_table_matches_formula(d_model):
    table = sinusoidal_table(300, d_model)
    assert table.shape == (300, d_model)
    positions = [0, 1, 2, 7, 50, 299]
    dims = sorted({0, 1, 2, 3, d_model - 2, d_model - 1} | ({254, 255, 256, 257, 510, 511} if d_model == 512 else set()))
    for pos in positions:
        for dim in dims:
            assert table[pos, dim].item() == pytest.approx(_pe(pos, dim, d_model), abs=1e-6), (pos, dim)


def test_sinusoidal_table_known_values():
    table = sinusoidal_table(4, 6)
    # pos = 0: sin 0 = 0 in even dimensions, cos 0 = 1 in odd ones.
    assert table[0].tolist() == [0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    # pos = 1, i = 0: wavelength 2π → sin 1, cos 1.
    assert table[1, 0].item() == pytest.approx(math.sin(1.0), abs=1e-7)
    assert table[1, 1].item() == pytest.approx(math.cos(1.0), abs=1e-7)
    # pos = 3, 2i = 4: 3 / 10000^(4/6).
    assert table[3, 4].item() == pytest.approx(math.sin(3 / 10000 ** (4 / 6)), abs=1e-7)
    assert table[3, 5].item() == pytest.approx(math.cos(3 / 10000 ** (4 / 6)), abs=1e-7)
    # Odd d_model: the last dimension is a sine.
    odd = sinusoidal_table(3, 5)
    assert odd[0].tolist() == [0.0, 1.0, 0.0, 1.0, 0.0]
    assert odd[2, 4].item() == pytest.approx(math.sin(2 / 10000 ** (4 / 5)), abs=1e-7)


def test_sinusoidal_module_adds_table_with_offset():
    d_model = 10
    module = SinusoidalPositionalEncoding(d_model, max_positions=12)
    assert list(module.parameters()) == []
    torch.manual_seed(0)
    x = torch.randn(2, 3, d_model)
    out = module(x, offset=5)
    expected_rows = torch.tensor([[_pe(p, d, d_model) for d in range(d_model)] for p in (5, 6, 7)])
    torch.testing.assert_close(out - x, expected_rows.expand(2, 3, d_model), rtol=0, atol=1e-6)
    torch.testing.assert_close(out, x + sinusoidal_table(12, d_model)[5:8])
    # Default offset is 0.
    torch.testing.assert_close(module(x), x + sinusoidal_table(12, d_model)[:3])
    # Dtype follows the input.
    assert module(x.double(), offset=5).dtype == torch.float64


@pytest.mark.parametrize("cls", [SinusoidalPositionalEncoding, LearnedPositionalEmbedding])
def test_exceeding_max_positions_raises(cls):
    module = cls(4, max_positions=10)
    module(torch.zeros(1, 10, 4))  # exactly fits
    module(torch.zeros(1, 3, 4), offset=7)  # positions 7..9 fit
    with pytest.raises(ValueError, match="max_positions"):
        module(torch.zeros(1, 11, 4))
    with pytest.raises(ValueError, match="max_positions"):
        module(torch.zeros(1, 3, 4), offset=8)


def test_learned_positions_trainable_and_offset():
    torch.manual_seed(1)
    module = LearnedPositionalEmbedding(6, max_positions=9)
    params = list(module.parameters())
    assert len(params) == 1 and params[0].shape == (9, 6) and params[0].requires_grad
    x = torch.randn(2, 3, 6)
    out = module(x, offset=5)
    torch.testing.assert_close(out, x + module.embedding.weight[5:8])
    out.sum().backward()
    grad = module.embedding.weight.grad
    # Each of positions 5..7 was added to 2 batch entries × 1, so d(sum)/dw = 2 there, 0 elsewhere.
    torch.testing.assert_close(grad[5:8], torch.full((3, 6), 2.0))
    assert torch.all(grad[:5] == 0) and torch.all(grad[8:] == 0)


def test_positional_encoding_builds_the_kind_named_and_refuses_others():
    assert isinstance(positional_encoding("sinusoidal", 8, 16), SinusoidalPositionalEncoding)
    assert isinstance(positional_encoding("learned", 8, 16), LearnedPositionalEmbedding)
    with pytest.raises(ValueError, match="unknown positional"):
        positional_encoding("rotary", 8, 16)


_SMALL = {"n_layers": 1, "d_model": 8, "d_ff": 16, "n_heads": 2, "d_k": 4, "d_v": 4, "dropout": 0.0, "max_positions": 20}


def test_transformer_learned_positions_are_separate_per_stack():
    torch.manual_seed(2)
    learned = Transformer(11, 11, positional="learned", **_SMALL)
    sinus = Transformer(11, 11, positional="sinusoidal", **_SMALL)
    assert isinstance(learned.src_positions, LearnedPositionalEmbedding)
    assert isinstance(learned.tgt_positions, LearnedPositionalEmbedding)
    assert learned.src_positions is not learned.tgt_positions
    src_w, tgt_w = learned.src_positions.embedding.weight, learned.tgt_positions.embedding.weight
    assert src_w is not tgt_w and src_w.data_ptr() != tgt_w.data_ptr()
    assert not torch.equal(src_w, tgt_w)
    names = {name for name, _ in learned.named_parameters()}
    assert {"src_positions.embedding.weight", "tgt_positions.embedding.weight"} <= names
    # Two (max_positions × d_model) tables more than the parameter-free sinusoidal model.
    count = lambda m: sum(p.numel() for p in m.parameters())
    assert count(learned) - count(sinus) == 2 * 20 * 8
    assert list(sinus.src_positions.parameters()) == [] and list(sinus.tgt_positions.parameters()) == []

    # The learned tables receive gradients from a forward pass.
    src = torch.randint(1, 11, (2, 5))
    tgt = torch.randint(1, 11, (2, 4))
    learned(src, tgt).sum().backward()
    assert src_w.grad is not None and src_w.grad[:5].abs().sum() > 0 and torch.all(src_w.grad[5:] == 0)
    assert tgt_w.grad is not None and tgt_w.grad[:4].abs().sum() > 0 and torch.all(tgt_w.grad[4:] == 0)


def test_transformer_unknown_positional_kind_raises():
    with pytest.raises(ValueError, match="unknown positional"):
        Transformer(11, 11, positional="relative", **_SMALL)


def test_transformer_source_longer_than_max_positions_raises():
    model = Transformer(11, 11, positional="sinusoidal", **_SMALL)
    with pytest.raises(ValueError, match="max_positions"):
        model.encode(torch.ones(1, 21, dtype=torch.long))


def test_an_odd_d_model_is_refused_for_the_sinusoids_alone():
    """sin and cos fill the dimensions in pairs (§3.5); learned positions (Table 3 row E) have no
    such need (before: refused for them too)."""
    odd = {**_SMALL, "d_model": 9}
    with pytest.raises(ValueError, match="d_model must be even for the sinusoidal encoding, got 9"):
        Transformer(11, 11, positional="sinusoidal", **odd)
    model = Transformer(11, 11, positional="learned", **odd)
    src, tgt = torch.randint(1, 11, (2, 5)), torch.randint(1, 11, (2, 4))
    assert model(src, tgt).shape == (2, 4, 11)
