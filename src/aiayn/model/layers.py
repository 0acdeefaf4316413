"""Encoder and decoder layers (§3.1, §3.3).

Every sub-layer is wrapped as LayerNorm(x + Dropout(Sublayer(x))): a residual connection around
it, followed by layer normalisation ("post-norm"), with dropout on the sub-layer output before
the residual sum (§5.4).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.model.attention import MultiHeadAttention


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (Eq. 2), applied to each position alike.

    No dropout on the inner ReLU activations: §5.4 names none, and tensor2tensor's
    ``relu_dropout`` was 0.0 in the paper's runs (``transformer_base_v1``)."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        """x: (batch, length, d_model) → (batch, length, d_model), through a hidden (batch, length, d_ff)."""
        return self.w_2(F.relu(self.w_1(x)))  # (batch, length, d_ff) → (batch, length, d_model)


class ResidualNorm(nn.Module):
    """LayerNorm(x + Dropout(y)) where y = Sublayer(x) (§3.1, §5.4)."""

    def __init__(self, d_model: int, dropout: float):
        super().__init__()
        # The paper is silent on LayerNorm's ε: torch's default 1e-5 (tensor2tensor used 1e-6);
        # both negligible beside the variance of the residual sum, of order 1.
        self.norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, sublayer_out: Tensor) -> Tensor:
        """x, sublayer_out: (batch, length, d_model) → (batch, length, d_model)."""
        return self.norm(x + (self.dropout(sublayer_out) if self.training else sublayer_out))


@dataclass
class LayerAttention:
    """Attention weights of one layer, kept when asked for (the paper's Figures 3–5)."""

    self_attention: Tensor | None = None
    cross_attention: Tensor | None = None


class EncoderLayer(nn.Module):
    """Multi-head self-attention, then the position-wise feed-forward network (§3.1).

    ``attention_window``: self-attention restricted to r positions on each side (§4), or None."""

    def __init__(self, d_model: int, d_ff: int, n_heads: int, d_k: int, d_v: int, dropout: float,
                 attention_dropout: float = 0.0, attention: str = "sdpa", attention_window: int | None = None):
        super().__init__()
        self.self_attention = MultiHeadAttention(d_model, n_heads, d_k, d_v, attention_dropout, attention,
                                                 window=attention_window)
        self.residual_1 = ResidualNorm(d_model, dropout)
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff)
        self.residual_2 = ResidualNorm(d_model, dropout)

    def forward(self, x: Tensor, src_mask: Tensor, return_weights: bool = False) -> tuple[Tensor, LayerAttention]:
        """x: (batch, src_len, d_model), ``src_mask``: (batch, 1, 1, src_len) → (batch, src_len, d_model),
        and the self-attention weights (batch, h, src_len, src_len) if asked for."""
        q, kv = self.self_attention.project_self(x)  # Q (batch, h, src_len, d_k), K and V
        # attended: (batch, src_len, d_model)
        attended, weights = self.self_attention.attend(q, kv, mask=src_mask, return_weights=return_weights)
        x = self.residual_1(x, attended)
        x = self.residual_2(x, self.feed_forward(x))
        return x, LayerAttention(self_attention=weights)


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention, then the feed-forward network (§3.1).

    ``attention_window``: self-attention restricted to the r positions before each and itself
    (§4), or None; encoder-decoder attention always sees the whole source."""

    def __init__(self, d_model: int, d_ff: int, n_heads: int, d_k: int, d_v: int, dropout: float,
                 attention_dropout: float = 0.0, attention: str = "sdpa", attention_window: int | None = None):
        super().__init__()
        self.self_attention = MultiHeadAttention(d_model, n_heads, d_k, d_v, attention_dropout, attention,
                                                 window=attention_window)
        self.residual_1 = ResidualNorm(d_model, dropout)
        self.cross_attention = MultiHeadAttention(d_model, n_heads, d_k, d_v, attention_dropout, attention)
        self.residual_2 = ResidualNorm(d_model, dropout)
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff)
        self.residual_3 = ResidualNorm(d_model, dropout)

    def forward(
        self,
        x: Tensor,
        memory_kv: tuple[Tensor, Tensor],
        src_mask: Tensor,
        self_kv_cache: tuple[Tensor, Tensor] | None = None,
        return_weights: bool = False,
        cache_rows: Tensor | None = None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor], LayerAttention]:
        """``memory_kv``: the encoder output projected by this layer's cross-attention (computed
        once per source). ``self_kv_cache``: keys and values of the earlier target positions when
        decoding incrementally, or None for a whole target at once.

        Shapes: x (batch, q_len, d_model), the q_len newest target positions (q_len = tgt_len for a
        whole target, 1 per step when decoding incrementally); ``memory_kv`` K (batch, h, src_len,
        d_k) and V (batch, h, src_len, d_v); ``src_mask`` (batch, 1, 1, src_len); ``self_kv_cache``
        K (batch, h, k_len - q_len, d_k) and V (batch, h, k_len - q_len, d_v), where k_len counts
        the target positions up to and including x. ``cache_rows`` (batch,): the row of
        ``self_kv_cache`` each row of x continues (beam search's reordering), or None: the same row.

        Returns the layer output, the self-attention keys/values up to and including x (the new
        cache), and the attention weights if asked for: (batch, q_len, d_model), K (batch, h,
        k_len, d_k) and V (batch, h, k_len, d_v), self-attention weights (batch, h, q_len, k_len)
        and cross-attention weights (batch, h, q_len, src_len).
        """
        # Q (batch, h, q_len, d_k); K (batch, h, q_len, d_k), V (batch, h, q_len, d_v)
        q, (k, v) = self.self_attention.project_self(x)
        if self_kv_cache is not None:
            k = extend_cache(self_kv_cache[0], k, cache_rows)  # (batch, h, k_len, d_k)
            v = extend_cache(self_kv_cache[1], v, cache_rows)  # (batch, h, k_len, d_v)
        # Position i of x is position k_len - q_len + i overall and sees the keys up to there
        # (one new token at a time needs no causal mask; a window still keeps it to the last r + 1).
        causal = x.size(1) > 1
        # attended: (batch, q_len, d_model)
        attended, self_weights = self.self_attention.attend(q, (k, v), causal=causal, return_weights=return_weights)
        x = self.residual_1(x, attended)
        # attended: (batch, q_len, d_model)
        attended, cross_weights = self.cross_attention(x, memory_kv, mask=src_mask, return_weights=return_weights)
        x = self.residual_2(x, attended)
        x = self.residual_3(x, self.feed_forward(x))
        return x, (k, v), LayerAttention(self_attention=self_weights, cross_attention=cross_weights)


def extend_cache(cache: Tensor, new: Tensor, rows: Tensor | None = None) -> Tensor:
    """The keys (or values) ``cache`` (cached, h, length, d) of the earlier positions followed by
    those of the ``new`` ones (batch, h, q_len, d) → (batch, h, length + q_len, d). With ``rows``
    (batch,), row i continues the cached row ``rows[i]`` (beam search's reordering): the cache is
    gathered straight into place, copied once rather than by a concatenation and a reordering."""
    if rows is None:
        return torch.cat([cache, new], dim=2)
    if torch.compiler.is_dynamo_compiling():  # an out= slice cannot be traced; inductor fuses these into one copy
        return torch.cat([cache.index_select(0, rows), new], dim=2)
    length = cache.size(2)
    out = new.new_empty(new.size(0), new.size(1), length + new.size(2), new.size(3))
    torch.index_select(cache, 0, rows, out=out[:, :, :length])  # (batch, h, length, d)
    out[:, :, length:] = new
    return out
