"""Positional information (§3.5): fixed sinusoids or learned position embeddings.

PE(pos, 2i)   = sin(pos / 10000^(2i/d_model))
PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))

Table 3 row (E) replaces the sinusoids with learned positional embeddings and finds nearly
identical results.

The equations are followed as written: sines and cosines interleaved, frequencies 10000^(-2i/d_model).
tensor2tensor's ``get_timing_signal_1d`` (the paper's code) laid them out otherwise: all the sines,
then all the cosines, with timescales spaced by log(10000) / (d_model/2 - 1). The same family of
functions, in another order of dimensions and with slightly other frequencies.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


def sinusoidal_table(max_positions: int, d_model: int) -> Tensor:
    """The (max_positions, d_model) table of §3.5: sines in even dimensions, cosines in odd."""
    position = torch.arange(max_positions, dtype=torch.float64).unsqueeze(1)  # (max_positions, 1)
    # (⌈d_model/2⌉,): 1 / 10000^(2i/d_model)
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))
    table = torch.zeros(max_positions, d_model, dtype=torch.float64)  # (max_positions, d_model)
    table[:, 0::2] = torch.sin(position * inv_freq)  # (max_positions, ⌈d_model/2⌉): dimensions 2i
    table[:, 1::2] = torch.cos(position * inv_freq[: d_model // 2])  # (max_positions, ⌊d_model/2⌋): dimensions 2i+1
    return table.float()


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the fixed sinusoidal encoding; has no parameters."""

    def __init__(self, d_model: int, max_positions: int):
        super().__init__()
        self.register_buffer("table", sinusoidal_table(max_positions, d_model), persistent=False)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """x: (batch, length, d_model); ``offset`` is the position of x[:, 0] (incremental decoding).
        Returns (batch, length, d_model)."""
        length = x.size(1)
        if offset + length > self.table.size(0):
            raise ValueError(
                f"sequence of {offset + length} positions exceeds max_positions={self.table.size(0)}; "
                "raise model.max_positions"
            )
        return x + self.table[offset : offset + length].to(x.dtype)  # + (length, d_model), broadcast over batch


class LearnedPositionalEmbedding(nn.Module):
    """Adds a learned embedding per position (Table 3 row E)."""

    def __init__(self, d_model: int, max_positions: int):
        super().__init__()
        self.embedding = nn.Embedding(max_positions, d_model)
        # The paper is silent on their initialisation: N(0, d_model^-0.5), the token embeddings'
        # (aiayn.model.transformer.ScaledEmbedding), but not scaled by √d_model. tensor2tensor's
        # `pos="emb"` took its model-wide Glorot-uniform default over (max_length, d_model), a
        # scale that would change with model.max_positions, a capacity setting; this one does not.
        nn.init.normal_(self.embedding.weight, std=d_model**-0.5)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        """x: (batch, length, d_model); ``offset`` is the position of x[:, 0] (incremental decoding).
        Returns (batch, length, d_model)."""
        length = x.size(1)
        if offset + length > self.embedding.num_embeddings:
            raise ValueError(
                f"sequence of {offset + length} positions exceeds max_positions="
                f"{self.embedding.num_embeddings}; raise model.max_positions"
            )
        positions = torch.arange(offset, offset + length, device=x.device)  # (length,)
        return x + self.embedding(positions)  # + (length, d_model), broadcast over batch


def positional_encoding(kind: str, d_model: int, max_positions: int) -> nn.Module:
    if kind == "sinusoidal":
        return SinusoidalPositionalEncoding(d_model, max_positions)
    if kind == "learned":
        return LearnedPositionalEmbedding(d_model, max_positions)
    raise ValueError(f"unknown positional encoding {kind!r}; use 'sinusoidal' or 'learned'")
