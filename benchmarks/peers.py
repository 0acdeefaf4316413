"""Peer implementations of the same Transformer, for side-by-side speed measurements: torch's
``nn.Transformer`` and Hugging Face's ``MarianMTModel``, each built with our sizes and able to take
a copy of our weights, so that both compute the very function ours does (§3 of the paper).

Where the peers differ from ours and how each is bridged:

* ``nn.Transformer`` adds a final LayerNorm after each stack; ours (post-norm, §3.1) has none, so
  those two are removed. Its attention projections have biases and fused W^Q/W^K/W^V
  (``in_proj_weight`` = cat of the three); ours have no bias, so the copied biases are zero.
  It has no embeddings, positions or output projection: :class:`TorchTransformer` wraps it with
  embeddings × √d_model, our sinusoid table and the output projection tied to the embeddings.
  It needs d_k = d_v = d_model / h.
* ``MarianMTModel`` is post-norm, scales embeddings by √d_model and ties the output projection;
  its configuration and the copy of our weights are those of src/export.py
  (:mod:`aiayn.export.marian`): ReLU, our layer-norm ε, BOS as the decoder start token, no forced
  EOS at the maximum length, zero attention and output biases, and d_model reordered so that our
  interleaved sinusoids (§3.5) are Marian's sines-then-cosines table.
* Marian's ``generate`` keeps every sentence of a batch going to one shared maximum length; ours
  stops each at its own (input length + 50). Its length penalty divides by |Y|^α rather than
  GNMT's ((5 + |Y|) / 6)^α; α is the same number.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.export import marian
from aiayn.model import Transformer
from aiayn.model.positional import sinusoidal_table


def model_sizes(model: Transformer) -> dict[str, int]:
    """The sizes of ``model`` that a peer needs: vocabulary, N, d_model, d_ff, h, d_k, d_v."""
    return marian.model_sizes(model)


def _check_shareable(model: Transformer) -> dict[str, int]:
    """``model``'s sizes, or a ValueError (aiayn's ConfigError) naming what the peers cannot mirror:
    separate embeddings, learned positions, heads not d_model / h wide (the same as MarianMT's)."""
    return marian.check_expressible(model)


# ---------------------------------------------------------------------------------- nn.Transformer


class TorchTransformer(nn.Module):
    """``torch.nn.Transformer`` with embeddings × √d_model, sinusoidal positions and the tied
    output projection: the same function as our Transformer once :func:`copy_to_torch` has run."""

    def __init__(self, vocab_size: int, *, n_layers: int, d_model: int, d_ff: int, n_heads: int,
                 dropout: float = 0.1, max_positions: int = 1024, pad_id: int = 0, **_unused):
        super().__init__()
        self.pad_id, self.d_model = pad_id, d_model
        self.embedding = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.embedding.weight, std=d_model**-0.5)
        self.register_buffer("positions", sinusoidal_table(max_positions, d_model), persistent=False)
        self.dropout = nn.Dropout(dropout)
        self.transformer = nn.Transformer(
            d_model, n_heads, n_layers, n_layers, d_ff, dropout, activation="relu", batch_first=True, norm_first=False)
        # Post-norm as §3.1: every sub-layer ends in a LayerNorm already, no extra one per stack.
        self.transformer.encoder.norm = None
        self.transformer.decoder.norm = None

    def embed(self, tokens: Tensor) -> Tensor:
        x = self.embedding(tokens) * math.sqrt(self.d_model) + self.positions[: tokens.size(1)]
        return self.dropout(x)

    def encode(self, src: Tensor) -> Tensor:
        return self.transformer.encoder(self.embed(src), src_key_padding_mask=src == self.pad_id)

    def decode(self, tgt_in: Tensor, memory: Tensor, src: Tensor) -> Tensor:
        causal = nn.Transformer.generate_square_subsequent_mask(tgt_in.size(1), device=tgt_in.device)
        x = self.transformer.decoder(self.embed(tgt_in), memory, tgt_mask=causal, tgt_is_causal=True,
                                     memory_key_padding_mask=src == self.pad_id)
        return F.linear(x, self.embedding.weight)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        return self.decode(tgt_in, self.encode(src), src)


def torch_peer(model: Transformer, dropout: float = 0.1) -> TorchTransformer:
    """A :class:`TorchTransformer` of ``model``'s sizes (its own random weights)."""
    sizes = _check_shareable(model)
    return TorchTransformer(**sizes, dropout=dropout, pad_id=model.pad_id)


@torch.no_grad()
def copy_to_torch(model: Transformer, peer: TorchTransformer) -> TorchTransformer:
    """Copy our weights into ``peer``; its extra biases (attention projections) become zero."""
    peer.embedding.weight.copy_(model.src_embedding.weight)
    stacks = ((model.encoder_layers, peer.transformer.encoder.layers, "encoder"),
              (model.decoder_layers, peer.transformer.decoder.layers, "decoder"))
    for ours, theirs, kind in stacks:
        for layer, other in zip(ours, theirs, strict=True):
            _copy_attention(layer.self_attention, other.self_attn)
            other.norm1.load_state_dict(layer.residual_1.norm.state_dict())
            other.norm2.load_state_dict(layer.residual_2.norm.state_dict())
            if kind == "decoder":
                _copy_attention(layer.cross_attention, other.multihead_attn)
                other.norm3.load_state_dict(layer.residual_3.norm.state_dict())
            other.linear1.load_state_dict(layer.feed_forward.w_1.state_dict())
            other.linear2.load_state_dict(layer.feed_forward.w_2.state_dict())
    return peer


def _copy_attention(ours, theirs: nn.MultiheadAttention) -> None:
    theirs.in_proj_weight.copy_(torch.cat([ours.w_q.weight, ours.w_k.weight, ours.w_v.weight]))
    theirs.in_proj_bias.zero_()
    theirs.out_proj.weight.copy_(ours.w_o.weight)
    theirs.out_proj.bias.zero_()


@torch.no_grad()
def torch_greedy(peer: TorchTransformer, src: Tensor, *, bos_id: int, eos_id: int, max_len_offset: int = 50) -> list[list[int]]:
    """Greedy decoding with ``nn.Transformer`` (it has no incremental decoding: the whole prefix
    is re-run every step); per-sentence limits and output as our ``greedy_search``."""
    memory = peer.encode(src)
    max_lengths = (src != peer.pad_id).sum(-1) + max_len_offset
    tokens = torch.full((src.size(0), 1), bos_id, dtype=torch.long, device=src.device)
    for _ in range(int(max_lengths.max())):
        next_token = peer.decode(tokens, memory, src)[:, -1].argmax(-1)
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)
        if ((tokens == eos_id).any(-1) | (tokens.size(1) - 1 >= max_lengths)).all():
            break
    return [_strip(row[1:].tolist(), eos_id, int(limit)) for row, limit in zip(tokens, max_lengths)]


def _strip(ids: list[int], eos_id: int, limit: int) -> list[int]:
    ids = ids[:limit]
    return ids[: ids.index(eos_id)] if eos_id in ids else ids


# ------------------------------------------------------------------------------------ MarianMT


def marian_peer(model: Transformer, *, bos_id: int, eos_id: int, dropout: float = 0.1):
    """A ``MarianMTModel`` of ``model``'s sizes (its own random weights), configured as ours
    (aiayn.export.marian, the mapping src/export.py writes)."""
    from transformers import MarianMTModel

    return MarianMTModel(marian.marian_config(model, bos_id=bos_id, eos_id=eos_id, dropout=dropout))


def copy_to_marian(model: Transformer, peer):
    """Copy our weights into a ``MarianMTModel`` from :func:`marian_peer`, d_model reordered to
    Marian's sinusoid layout, its extra biases zero (:func:`aiayn.export.marian.copy_to_marian`)."""
    return marian.copy_to_marian(model, peer)


def marian_inputs(src: Tensor, pad_id: int) -> dict[str, Tensor]:
    """``generate``/``forward`` arguments for a right-padded source batch."""
    return {"input_ids": src, "attention_mask": (src != pad_id).long()}


@torch.no_grad()
def marian_generate(peer, src: Tensor, *, pad_id: int, max_len_offset: int = 50, **generate_args) -> list[list[int]]:
    """``peer.generate`` with one maximum length for the batch (its longest input + offset, EOS
    counted as ours does); output ids per sentence without the start token, cut at EOS."""
    eos_id = peer.config.eos_token_id
    longest = int((src != pad_id).sum(-1).max())
    out = peer.generate(**marian_inputs(src, pad_id), max_new_tokens=longest + max_len_offset, min_new_tokens=0,
                        do_sample=False, **generate_args)
    return [_strip(row[1:].tolist(), eos_id, len(row)) for row in out]
