"""Scaled dot-product and multi-head attention (§3.2 of the paper).

Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V                                  (Eq. 1)
MultiHead(Q, K, V) = Concat(head_1, …, head_h) W^O,
    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

d_k and d_v are their own settings rather than d_model / h, because Table 3 rows (A) and (B)
vary them independently of d_model (e.g. h=1 with d_k=d_v=512, or d_k=16 with h=8).

Eq. 1 is computed one of two ways (``attention``, a model setting; both give the same numbers up
to rounding): ``"sdpa"`` by ``torch.nn.functional.scaled_dot_product_attention``, which
dispatches to fused kernels (flash / memory-efficient attention) where the hardware has them, or
``"explicit"``, Eq. 1 written out as matrix products and a softmax (the plain reference path; it
is also what computes the weights when they are asked for, Figures 3–5).

Restricted self-attention (§4): "self-attention could be restricted to considering only a
neighborhood of size r in the input sequence centered around the respective output position".
With ``window=r`` a query at position i sees the keys at positions j with |i − j| ≤ r: r on each
side, 2r + 1 positions in all (the reading by which Table 1 counts it O(r·n·d)); with ``causal``
as well, i − r ≤ j ≤ i. It is a boolean mask combined with the padding and causal masks, so both
kinds of Eq. 1 and incremental decoding (the queries being the newest of the cached keys) apply it
alike. ``window=None`` is full attention, the paper's models.

Speed, not semantics (the paper is silent; every choice gives the same numbers up to rounding):
self-attention projects Q, K and V with one matrix product (W^Q, W^K and W^V stacked, the
parameters staying the paper's three), encoder-decoder attention K and V likewise, once per
source; and a single query (one decoding step) on the CPU takes the written-out Eq. 1, which is
about 3× faster there than SDPA's CPU kernels, built for many queries (benchmarks/decode_speed.py),
at a batch's hundreds of rows (1.2 against 3.2 ms at 512). At a few rows SDPA is a little faster
(15 against 20 µs at 4, one core of an AMD EPYC, 2026-11-26); the written-out form is kept there
too, one path at every batch size, so that fp32 outputs stay bit for bit what they were.

On CUDA, SDPA is kept off cuDNN's attention kernel (process-wide, once an attention with SDPA is
built or first attends; :func:`keep_cudnn_attention_off`): torch prefers it on Hopper GPUs, and it
builds a plan for every new shape, hundreds of milliseconds each, while our batches change length
at every step and a beam search's keys grow by one at every step. Flash and memory-efficient
attention take any length at no such cost. A user may turn it back on after building the model
(``torch.backends.cuda.enable_cudnn_sdp(True)``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aiayn.model.kept_weights import kept_key

# How Eq. 1 is computed: fused by torch, or written out (see the module docstring).
ATTENTION_KINDS = ("sdpa", "explicit")
_cudnn_attention_turned_off = False  # once per process: see keep_cudnn_attention_off


def keep_cudnn_attention_off() -> None:
    """SDPA on CUDA without cuDNN's attention kernel, for this process, once (see the module
    docstring). With it on, on an H200, the base model's bf16 training steps on batches of varying
    length took 0.31 s (median) where the fastest took 0.04 s, and bf16 beam search ran at a seventh
    of the speed of fp32 (which cuDNN's kernel never serves): the signs of a plan built per shape
    (docs/performance/gpu.md). Once only, so that a user's own choice made afterwards stands."""
    global _cudnn_attention_turned_off
    if not _cudnn_attention_turned_off:
        torch.backends.cuda.enable_cudnn_sdp(False)
        _cudnn_attention_turned_off = True


class MultiHeadAttention(nn.Module):
    """h parallel attention heads with learned projections W^Q, W^K (d_model→d_k), W^V
    (d_model→d_v) per head, and W^O (h·d_v→d_model).

    The projections carry no bias, as the paper's equations have none (tensor2tensor's 1×1
    convolutions of 2017, ``qkv_transform``, carried biases; its later dense projections none). ``window``: restricted self-attention, r positions on each side (§4; see the
    module docstring), or None to attend to every position.
    """

    def __init__(self, d_model: int, n_heads: int, d_k: int, d_v: int, attention_dropout: float = 0.0,
                 attention: str = "sdpa", window: int | None = None):
        super().__init__()
        if attention not in ATTENTION_KINDS:
            raise ValueError(f"attention must be one of {', '.join(ATTENTION_KINDS)}, got {attention!r}")
        self.n_heads, self.d_k, self.d_v = n_heads, d_k, d_v
        self.attention = attention
        self.window = window
        if attention == "sdpa":
            keep_cudnn_attention_off()
        self.w_q = nn.Linear(d_model, n_heads * d_k, bias=False)
        self.w_k = nn.Linear(d_model, n_heads * d_k, bias=False)
        self.w_v = nn.Linear(d_model, n_heads * d_v, bias=False)
        self.w_o = nn.Linear(n_heads * d_v, d_model, bias=False)
        self._stacks: dict[tuple[str, ...], tuple[tuple, Tensor]] = {}  # see _stacked
        # §5.4 names no dropout on the attention weights; tensor2tensor's default for the paper's
        # runs was 0.0, so it is off unless asked for.
        self.attention_dropout = attention_dropout

    def split_heads(self, x: Tensor, d_head: int) -> Tensor:
        """(batch, length, h·d_head) → (batch, h, length, d_head)."""
        batch, length, _ = x.shape
        return x.view(batch, length, self.n_heads, d_head).transpose(1, 2)  # (batch, h, length, d_head)

    def project_keys_values(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """K = memory W^K and V = memory W^V, split into heads (cached once per source).

        ``memory``: (batch, k_len, d_model) → K (batch, h, k_len, d_k), V (batch, h, k_len, d_v).
        """
        k, v = self._project(memory, "w_k", "w_v")  # (batch, k_len, h·d_k), (batch, k_len, h·d_v)
        return self.split_heads(k, self.d_k), self.split_heads(v, self.d_v)

    def project_self(self, x: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """Self-attention's Q = x W^Q, K = x W^K and V = x W^V, split into heads, from one product.

        ``x``: (batch, length, d_model) → Q (batch, h, length, d_k) and the keys/values as from
        ``project_keys_values``: K (batch, h, length, d_k), V (batch, h, length, d_v).
        """
        q, k, v = self._project(x, "w_q", "w_k", "w_v")  # (batch, length, h·d_k), … h·d_k, … h·d_v
        return self.split_heads(q, self.d_k), (self.split_heads(k, self.d_k), self.split_heads(v, self.d_v))

    def _project(self, x: Tensor, *names: str) -> list[Tensor]:
        """``x`` (…, d_model) through each of the projections ``names`` (…, its width), as one
        matrix product with their weights stacked. Layers replaced for decoding
        (aiayn.decoding.speed) stack themselves where their kind offers it (``stacked``, e.g.
        oneDNN's products), else run one by one (e.g. int8-quantised ones)."""
        layers = [getattr(self, name) for name in names]
        widths = [layer.out_features for layer in layers]
        kind = type(layers[0]) if all(type(layer) is type(layers[0]) for layer in layers) else None
        if kind is nn.Linear:
            return list(F.linear(x, self._stacked(*names)).split(widths, dim=-1))  # (…, Σ widths) split
        if hasattr(kind, "stacked"):
            return list(kind.stacked(layers)(x).split(widths, dim=-1))  # (…, Σ widths) split
        return [layer(x) for layer in layers]

    def stack_once(self, *names: str) -> None:
        """Stack the weights of the projections ``names`` once and for good (a buffer, which moves
        with the module), for a decoding copy whose weights no longer change: the step that
        aiayn.decoding.speed compiles. torch.compile cannot trace how a kept stack is otherwise
        checked (its weights' storages and versions): it breaks the step into eager pieces there.
        Projections replaced for decoding (int8's) are not stacked: ``_project`` runs them one by one."""
        if not all(type(getattr(self, name)) is nn.Linear for name in names):
            return
        with torch.no_grad():
            stack = torch.cat([getattr(self, name).weight for name in names])
        self.register_buffer(_stack_name(names), stack, persistent=False)

    def _stacked(self, *names: str) -> Tensor:
        """The weights of the projections ``names`` stacked row-wise, for one matrix product. While
        no gradient is taken (decoding) the stack is kept until a weight changes (its storage or
        version) or an optimizer takes a step (aiayn.model.kept_weights), instead of being copied at
        every step; or it is the one made by ``stack_once``. A step that torch.compile traces
        otherwise stacks them in its graph: it cannot trace the check of a kept stack."""
        weights = [getattr(self, name).weight for name in names]
        if torch.is_grad_enabled():
            return torch.cat(weights)  # part of the graph: gradients flow back to each projection
        once = self._buffers.get(_stack_name(names))  # (not getattr: a miss there raises inside nn.Module, every step)
        if once is not None:
            return once
        if torch.compiler.is_dynamo_compiling():  # a compiled forward without gradients (validation): stacked in its graph
            return torch.cat(weights)
        key = kept_key(*weights)
        cached = self._stacks.get(names)
        if cached is None or cached[0] != key:
            cached = self._stacks[names] = (key, torch.cat(weights))
        return cached[1]

    def forward(
        self,
        query: Tensor,
        keys_values: tuple[Tensor, Tensor],
        mask: Tensor | None = None,
        causal: bool = False,
        return_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query`` (batch, q_len, d_model) to projected ``keys_values``: K
        (batch, h, k_len, d_k) and V (batch, h, k_len, d_v), as from ``project_keys_values``.

        ``mask`` is boolean, broadcastable to (batch, h, q_len, k_len), True where attention is
        allowed. ``causal`` masks position j > i (decoder self-attention, §3.2.3). The queries are
        the last q_len of the k_len positions (all of them but when decoding incrementally); a
        ``window`` keeps each to its neighbourhood of those positions.
        Returns the output (batch, q_len, d_model) and, if asked, the attention weights
        (batch, h, q_len, k_len), which are computed explicitly for inspection (Figures 3–5).
        """
        q = self.split_heads(self.w_q(query), self.d_k)  # (batch, h, q_len, d_k)
        return self.attend(q, keys_values, mask, causal, return_weights)

    def attend(
        self,
        q: Tensor,
        keys_values: tuple[Tensor, Tensor],
        mask: Tensor | None = None,
        causal: bool = False,
        return_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """``forward`` for queries already projected and split into heads, (batch, h, q_len, d_k)
        (from ``project_self``); the rest as there."""
        k, v = keys_values  # (batch, h, k_len, d_k), (batch, h, k_len, d_v)
        # A branch, not ``causal`` itself: traced by torch.compile with dynamic lengths, a layer's
        # ``x.size(1) > 1`` is a symbolic bool, which SDPA's is_causal refuses (a graph break there
        # sends the layers' loop back to eager); branching on it makes it a plain one.
        causal = True if causal else False  # noqa: SIM210
        q_len, k_len = q.size(-2), k.size(-2)
        # A window reaching every key (r ≥ k_len − 1) restricts nothing: full attention as it is.
        restricted = self.window is not None and self.window < k_len - 1
        if restricted or (causal and q_len != k_len):
            # SDPA's is_causal would align the queries with the first q_len positions, and it takes
            # no window: spell the mask out. (q_len, k_len), broadcast over batch and heads.
            allowed = allowed_positions(q_len, k_len, self.window if restricted else None, causal, q.device)
            if restricted and mask is not None:
                # Every query keeps its own position, the centre of its window: a padded position
                # more than r past the sentence's end would otherwise see no key at all, and the NaN
                # of that empty softmax would reach later layers through its value (0 · NaN = NaN).
                mask = mask | allowed_positions(q_len, k_len, 0, False, q.device)  # (batch, 1, q_len, k_len)
            mask = allowed if mask is None else mask & allowed  # broadcastable to (batch, h, q_len, k_len)
            causal = False
        dropout_p = self.attention_dropout if self.training else 0.0
        # One query on the CPU (a decoding step): the written-out form is faster there.
        single_query_on_cpu = q_len == 1 and q.device.type == "cpu"
        if return_weights or self.attention == "explicit" or single_query_on_cpu:
            out, weights = _explicit_attention(q, k, v, mask, causal, dropout_p)  # out (batch, h, q_len, d_v)
            weights = weights if return_weights else None
        else:
            if not _cudnn_attention_turned_off:  # a model unpickled in a process of its own (ddp_spawn)
                keep_cudnn_attention_off()
            # (batch, h, q_len, d_v)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal)
            weights = None
        batch, _, q_len, _ = out.shape
        out = out.transpose(1, 2).reshape(batch, q_len, self.n_heads * self.d_v)  # (batch, q_len, h·d_v)
        return self.w_o(out), weights  # (batch, q_len, d_model), (batch, h, q_len, k_len) or None


def _stack_name(names: tuple[str, ...]) -> str:
    return "stacked_" + "_".join(name.removeprefix("w_") for name in names)  # e.g. stacked_q_k_v


def allowed_positions(q_len: int, k_len: int, window: int | None, causal: bool, device=None) -> Tensor:
    """(q_len, k_len), True where a query may see a key. The queries are positions
    k_len − q_len … k_len − 1 of the k_len keys; query position i sees key position j where
    |i − j| ≤ ``window`` (None: no limit) and, if ``causal``, j ≤ i."""
    i = torch.arange(k_len - q_len, k_len, device=device)[:, None]  # (q_len, 1)
    j = torch.arange(k_len, device=device)[None, :]  # (1, k_len)
    allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    if window is not None:
        allowed &= (i - j).abs() <= window  # the neighbourhood of size r on each side (§4)
    if causal:
        allowed &= j <= i  # no attending to later positions (§3.2.3)
    return allowed


def _explicit_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, dropout_p: float
) -> tuple[Tensor, Tensor]:
    """Eq. 1 written out: the plain path (``attention="explicit"``), and how the attention
    weights themselves are computed when they are wanted.

    q: (batch, h, q_len, d_k), k: (batch, h, k_len, d_k), v: (batch, h, k_len, d_v) → the output
    (batch, h, q_len, d_v) and the weights (batch, h, q_len, k_len).
    """
    # (batch, h, q_len, d_k) @ (batch, h, d_k, k_len); scaled and masked in place (the product is a new tensor)
    scores = (q @ k.transpose(-2, -1)).div_(q.size(-1) ** 0.5)
    if causal:
        allowed = allowed_positions(*scores.shape[-2:], None, True, q.device)  # broadcast over batch and heads
        scores.masked_fill_(~allowed, float("-inf"))
    if mask is not None:
        scores.masked_fill_(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)  # (batch, h, q_len, k_len)
    dropped = F.dropout(weights, dropout_p) if dropout_p else weights
    return dropped @ v, weights  # (batch, h, q_len, d_v), (batch, h, q_len, k_len)
