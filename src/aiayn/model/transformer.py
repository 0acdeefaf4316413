"""The Transformer (§3, Figure 1): an encoder-decoder built from attention alone."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.model.layers import DecoderLayer, EncoderLayer, LayerAttention
from aiayn.model.positional import positional_encoding


class ScaledEmbedding(nn.Module):
    """Token embedding multiplied by √d_model (§3.4).

    Initialised N(0, d_model^-0.5) as in tensor2tensor: after the √d_model scaling the inputs
    have unit variance, and the weight (shared with the pre-softmax projection) starts small.
    """

    def __init__(self, vocab_size: int, d_model: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))
        nn.init.normal_(self.weight, std=d_model**-0.5)
        self.scale = math.sqrt(d_model)

    def forward(self, tokens: Tensor) -> Tensor:
        """tokens: (batch, length) ids → (batch, length, d_model)."""
        return F.embedding(tokens, self.weight) * self.scale  # (batch, length, d_model)


@dataclass
class DecoderState:
    """What incremental decoding keeps between steps: the source padding mask, each layer's
    cross-attention keys/values (computed once per source) and self-attention cache.

    ``cache_rows``: the row of ``self_kv`` each hypothesis continues, where beam search has
    reordered or dropped hypotheses since the last step (None: row i continues row i). The cache
    is taken in that order as the next step appends to it (aiayn.model.layers.extend_cache): one
    copy of the cache per step instead of two."""

    src_mask: Tensor  # (batch, 1, 1, src_len)
    memory_kv: list[tuple[Tensor, Tensor]]  # per layer: K (batch, h, src_len, d_k), V (batch, h, src_len, d_v)
    # per layer: K (cached, h, length, d_k), V (cached, h, length, d_v), or None before the first step
    self_kv: list[tuple[Tensor, Tensor] | None] = field(default_factory=list)
    length: int = 0  # target positions decoded so far
    cache_rows: Tensor | None = None  # (batch,): indices into the cached rows of self_kv, or None

    def select(self, indices: Tensor) -> DecoderState:
        """Keep/reorder batch entries (beam search): every tensor indexed along dim 0, the
        self-attention cache when the next step extends it.

        ``indices``: (rows,) → every tensor's batch dimension becomes rows, e.g. batch·beam."""
        # K (rows, h, len, d_k), V (rows, h, len, d_v)
        pick = lambda kv: (kv[0].index_select(0, indices), kv[1].index_select(0, indices))
        return replace(self.reorder_beams(indices), src_mask=self.src_mask.index_select(0, indices),  # (rows, 1, 1, src_len)
                       memory_kv=[pick(kv) for kv in self.memory_kv])

    def reorder_beams(self, indices: Tensor) -> DecoderState:
        """The state of the hypotheses ``indices`` (rows,), each taken from a beam of its own
        sentence: only the self-attention cache differs between a sentence's beams, so the source
        mask and the encoder-decoder keys/values (the same for all of them) are kept as they are."""
        rows = indices if self.cache_rows is None else self.cache_rows.index_select(0, indices)  # (rows,)
        return replace(self, cache_rows=rows)


def head_widths(d_model: int, n_heads: int, d_k: int | None, d_v: int | None) -> tuple[int | None, int | None]:
    """§3.2.2: "d_k = d_v = d_model/h", each unless given (Table 3's rows (B) set d_k alone); a
    ValueError where h does not divide d_model. Sizes that are no positive whole numbers are left
    for the caller's checks to name. (The settings' default of model.d_k and model.d_v is the same
    rule, aiayn.config.schemas.per_head, which needs no torch.)"""
    if (d_k is not None and d_v is not None) or any(
            isinstance(size, bool) or not isinstance(size, int) or size < 1 for size in (d_model, n_heads)):
        return d_k, d_v
    if d_model % n_heads:
        raise ValueError(f"d_k and d_v are d_model / n_heads unless given, and n_heads={n_heads} does not divide "
                         f"d_model={d_model}: give d_k and d_v")
    return (d_model // n_heads if d_k is None else d_k), (d_model // n_heads if d_v is None else d_v)


class Transformer(nn.Module):
    """Encoder and decoder stacks of N identical layers (§3.1) with embeddings, positional
    encodings (§3.5) and a pre-softmax linear projection tied to the embeddings (§3.4).

    Token id ``pad_id`` marks padding: source padding is masked out of attention; target padding
    only ever follows the real tokens, so the causal mask already keeps it from them. The
    decoder's inputs are "offset by one position" (§3.1) behind a BOS token, the paper being silent
    on what comes first (tensor2tensor shifted the embedded target right behind a zero vector).
    ``share_embeddings=False`` (no paper setting: for separate vocabularies) gives the source its
    own embedding; the target embedding stays the pre-softmax matrix. The paper's models all had
    one shared vocabulary; what of §3.4's sharing separate vocabularies still allow is this tie of
    its reference [30] (Press & Wolf: the decoder's input and output embeddings), which
    tensor2tensor kept too (``shared_embedding_and_softmax_weights``).
    ``attention`` picks how Eq. 1 is computed, ``"sdpa"`` (fused) or ``"explicit"``
    (aiayn.model.attention); it changes speed, not the parameters or the results.
    ``attention_window`` restricts self-attention to a neighbourhood of r positions on each side
    (§4; the decoder's causally, the r before and itself), None attending to every position as
    the paper's models do; encoder-decoder attention is never restricted.
    """

    # The layers each stack is built of (§3.1); a subclass of one's own may name others (pre-norm
    # layers, say: docs/extending.md), built with the same arguments.
    encoder_layer: type[EncoderLayer] = EncoderLayer
    decoder_layer: type[DecoderLayer] = DecoderLayer

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        *,
        n_layers: int = 6,
        d_model: int = 512,
        d_ff: int = 2048,
        n_heads: int = 8,
        d_k: int | None = None,
        d_v: int | None = None,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        attention: str = "sdpa",
        positional: str = "sinusoidal",
        max_positions: int = 1024,
        share_embeddings: bool = True,
        pad_id: int = 0,
        attention_window: int | None = None,
    ):
        super().__init__()
        if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 0:
            raise ValueError(f"n_layers must be a whole number, 0 or more, got {n_layers!r}")
        d_k, d_v = head_widths(d_model, n_heads, d_k, d_v)
        sizes = {"d_model": d_model, "d_ff": d_ff, "n_heads": n_heads, "d_k": d_k, "d_v": d_v,
                 "max_positions": max_positions, "src_vocab_size": src_vocab_size, "tgt_vocab_size": tgt_vocab_size}
        for name, value in sizes.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive whole number, got {value!r}")
        for name, value in {"dropout": dropout, "attention_dropout": attention_dropout}.items():
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value!r}")
        if attention_window is not None and (
                isinstance(attention_window, bool) or not isinstance(attention_window, int) or attention_window < 1):
            raise ValueError(f"attention_window must be a whole number of at least 1 (r, the positions on each "
                             f"side self-attention sees, §4) or null for full attention, got {attention_window!r}")
        self.d_model, self.pad_id, self.max_positions = d_model, pad_id, max_positions
        self.attention_window = attention_window
        if share_embeddings and src_vocab_size != tgt_vocab_size:
            raise ValueError(
                f"share_embeddings needs one shared vocabulary, got source {src_vocab_size} and target "
                f"{tgt_vocab_size}; set model.share_embeddings=false or use a joint vocabulary"
            )
        if positional == "sinusoidal" and d_model % 2:  # sin and cos in pairs of dimensions (§3.5)
            raise ValueError(f"d_model must be even for the sinusoidal encoding, got {d_model}")
        self.src_embedding = ScaledEmbedding(src_vocab_size, d_model)
        # §3.4: "we share the same weight matrix between the two embedding layers and the
        # pre-softmax linear transformation".
        self.tgt_embedding = self.src_embedding if share_embeddings else ScaledEmbedding(tgt_vocab_size, d_model)
        # The pre-softmax matrix is the target embedding's, with separate vocabularies too (see
        # above). A decoding copy may set a projection of its own (aiayn.decoding.speed).
        self.output_projection: nn.Linear | None = None
        self.src_positions = positional_encoding(positional, d_model, max_positions)
        # Learned positions are per stack; the fixed sinusoids are the same table for both.
        self.tgt_positions = self.src_positions if positional == "sinusoidal" else positional_encoding(
            positional, d_model, max_positions)
        self.embedding_dropout = nn.Dropout(dropout)  # §5.4: on the sums of embeddings and positions
        layer_args = (d_model, d_ff, n_heads, d_k, d_v, dropout, attention_dropout, attention, attention_window)
        self.encoder_layers = nn.ModuleList(self.encoder_layer(*layer_args) for _ in range(n_layers))
        self.decoder_layers = nn.ModuleList(self.decoder_layer(*layer_args) for _ in range(n_layers))
        self._init_linear_weights()

    def _init_linear_weights(self) -> None:
        # The paper is silent on initialisation. tensor2tensor's (transformer_base_v1): every dense
        # layer Glorot-uniform ("uniform_unit_scaling", gain 1: variance scaling over the mean of
        # fan-in and fan-out), biases zero; the embeddings and the pre-softmax matrix N(0,
        # d_model^-0.5) (its symbol modality; ScaledEmbedding). Each projection of attention is its own
        # matrix here, as in tensor2tensor's later dense layers; its code of 2017 drew W^Q, W^K
        # and W^V of self-attention as one stacked matrix (qkv_transform; W^K, W^V of
        # encoder-decoder attention as kv_transform), a Glorot bound over the stacked width:
        # √(6 / (512 + 1536)) ≈ 0.054 against √(6 / 1024) ≈ 0.077 here, for the base model.
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def source_mask(self, src: Tensor) -> Tensor:
        """(batch, 1, 1, src_len), True at real source tokens: broadcasts over heads and queries."""
        return (src != self.pad_id)[:, None, None, :]  # (batch, src_len) → (batch, 1, 1, src_len)

    def encode(self, src: Tensor, return_weights: bool = False) -> tuple[Tensor, Tensor, list[LayerAttention]]:
        """src: (batch, src_len) token ids → memory (batch, src_len, d_model), source mask,
        per-layer attention weights (empty unless asked for)."""
        src_mask = self.source_mask(src)  # (batch, 1, 1, src_len)
        x = self.embedding_dropout(self.src_positions(self.src_embedding(src)))  # (batch, src_len, d_model)
        weights = []
        for layer in self.encoder_layers:
            x, layer_weights = layer(x, src_mask, return_weights)
            weights.append(layer_weights)
        return x, src_mask, weights if return_weights else []

    def start_decoding(self, memory: Tensor, src_mask: Tensor) -> DecoderState:
        """Project the encoder output once per layer for encoder-decoder attention.

        ``memory``: (batch, src_len, d_model), ``src_mask``: (batch, 1, 1, src_len)."""
        return DecoderState(
            src_mask=src_mask,
            # per layer: K (batch, h, src_len, d_k), V (batch, h, src_len, d_v)
            # (contiguous: every decoding step reads them whole)
            memory_kv=[tuple(t.contiguous() for t in layer.cross_attention.project_keys_values(memory))
                       for layer in self.decoder_layers],
            self_kv=[None] * len(self.decoder_layers),
        )

    def decode(
        self, tgt_in: Tensor, state: DecoderState, return_weights: bool = False
    ) -> tuple[Tensor, DecoderState, list[LayerAttention]]:
        """Decoder logits for ``tgt_in`` (batch, t) continuing ``state``.

        Call with a whole shifted target for teacher forcing, or one token at a time: the state
        returned holds the self-attention keys/values of every position decoded so far.
        Returns logits (batch, t, tgt_vocab), that state (K (batch, h, state.length + t, d_k) and
        V (batch, h, state.length + t, d_v) per layer) and the attention weights if asked for.
        """
        # (batch, t) → (batch, t, d_model)
        x = self.embedding_dropout(self.tgt_positions(self.tgt_embedding(tgt_in), offset=state.length))
        new_self_kv, weights = [], []
        for layer, memory_kv, cache in zip(self.decoder_layers, state.memory_kv, state.self_kv):
            # x: (batch, t, d_model); kv: K (batch, h, state.length + t, d_k), V (batch, h, state.length + t, d_v)
            x, kv, layer_weights = layer(x, memory_kv, state.src_mask, cache, return_weights, state.cache_rows)
            new_self_kv.append(kv)
            weights.append(layer_weights)
        state = DecoderState(state.src_mask, state.memory_kv, new_self_kv, state.length + tgt_in.size(1))
        return self.logits(x), state, weights if return_weights else []  # logits (batch, t, tgt_vocab)

    def logits(self, x: Tensor) -> Tensor:
        """x: (batch, length, d_model) → pre-softmax logits (batch, length, tgt_vocab)."""
        if self.output_projection is not None:
            return self.output_projection(x)  # (batch, length, tgt_vocab)
        # x @ weightᵀ with the tied weight (tgt_vocab, d_model): (batch, length, tgt_vocab)
        return F.linear(x, self.tgt_embedding.weight)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits (batch, tgt_len, tgt_vocab) for target inputs ``tgt_in`` (BOS + y[:-1]).

        src: (batch, src_len) and tgt_in: (batch, tgt_len) token ids."""
        memory, src_mask, _ = self.encode(src)  # (batch, src_len, d_model), (batch, 1, 1, src_len)
        logits, _, _ = self.decode(tgt_in, self.start_decoding(memory, src_mask))
        return logits
