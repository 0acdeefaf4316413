"""The GPU memory a training step takes, estimated from the model's shapes, and the biggest batch
that fits a GPU (:func:`tokens_that_fit`): what ``task.datamodule.max_tokens=auto`` plans with
(aiayn.config.plan).

The estimate is ``fixed + per_token × tokens``, ``tokens`` being a batch's padded tokens a side:

* ``fixed``: the weights, their gradients and Adam's two moments (16 bytes a parameter in fp32;
  32 under ``64-true``, 8 under ``bf16-true``/``16-true``), autocast's half-precision copies of
  the weights (2 more under mixed precision), and under DDP its gradient buckets (a gradient's
  bytes more).
* ``per_token``: what autograd keeps of one source and one target position until the backward
  pass, layer by layer (:func:`activation_bytes`), and, at the loss, the fp32 log-probabilities
  and their gradient with the logits and theirs in the compute dtype: ``(8 + 2 × compute bytes)``
  per vocabulary entry — over a 32–37K vocabulary the largest part.

A checkpoint save adds nothing on the GPU: the state is copied into host memory
(aiayn.checkpoints.background), one save at a time.

Checked against every CUDA training record in benchmarks/results (tests/config/test_memory.py):
the estimate is at or above the measured peak (``torch.cuda.max_memory_allocated``) and within
20% of it. A GPU's usable memory is taken as 90% of its total less 1 GiB: the CUDA context,
cuBLAS's workspaces and the allocator's fragmentation are not in torch's count.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiayn.config.schemas import network_arguments, per_head
from aiayn.errors import ConfigError

GIB = 2**30
USABLE_SHARE = 0.9  # of a GPU's total memory, for the allocator's fragmentation and reserve
RESERVED_BYTES = 1 * GIB  # the CUDA context and library workspaces, outside torch's allocator
ROUND_TO = 8  # a batch's token budget is a multiple of this
# The rows the fused loss takes at a time (aiayn.model.loss.FUSED_ROWS; config/ imports no model code,
# and tests/config/test_memory.py holds the two equal).
FUSED_LOSS_ROWS = 4096
# The bytes of a weight (and of its gradient and Adam's moments) where not fp32, by Lightning's precision name.
WEIGHT_BYTES = {"64-true": 8, "64": 8, "bf16-true": 2, "16-true": 2}
# The bytes of an activation in the compute dtype, by Lightning's precision name.
COMPUTE_BYTES = {"32-true": 4, "32": 4, "64-true": 8, "bf16-mixed": 2, "16-mixed": 2, "bf16-true": 2, "16-true": 2,
                 "bf16": 2, "16": 2, "transformer-engine": 2}


@dataclass(frozen=True)
class MemoryEstimate:
    """A training step's memory: ``fixed`` bytes and ``per_token`` bytes per padded token a side."""

    fixed: int
    per_token: int

    def at(self, tokens: int) -> int:
        """Bytes for a batch of ``tokens`` padded tokens a side."""
        return self.fixed + self.per_token * tokens


def _heads_widths(model: Mapping[str, Any]) -> tuple[int, int]:
    """h·d_k and h·d_v: the widths of all heads' queries (and keys) and values together."""
    d, h = int(model.get("d_model", 512)), int(model.get("n_heads", 8))
    return tuple(h * int(model[key] if model.get(key) is not None else per_head(d, h)) for key in ("d_k", "d_v"))


def parameters(model: Mapping[str, Any], vocab_size: int) -> int:
    """The parameters of aiayn.model.Transformer with these arguments (widths as built)."""
    d, f, n = int(model.get("d_model", 512)), int(model.get("d_ff", 2048)), int(model.get("n_layers", 6))
    hq, hv = _heads_widths(model)
    attention = d * (2 * hq + hv) + hv * d  # W^Q, W^K, W^V and W^O, no biases (tensor2tensor)
    feed_forward = d * f + f + f * d + d  # Eq. 2 with its biases
    norm = 2 * d
    encoder_layer = attention + feed_forward + 2 * norm
    decoder_layer = 2 * attention + feed_forward + 3 * norm
    # one matrix, or the source's and the target's (the pre-softmax matrix being the target's, §3.4)
    embeddings = vocab_size * d * (1 if model.get("share_embeddings", True) else 2)
    positions = int(model.get("max_positions", 1024)) * d * 2 if model.get("positional") == "learned" else 0
    return n * (encoder_layer + decoder_layer) + embeddings + positions


def activation_bytes(model: Mapping[str, Any], compute_bytes: int) -> int:
    """What autograd keeps for the backward pass of one source and one target position, the
    logits aside: in each sub-layer the input of every matrix product (in the compute dtype), the
    attention's Q, K, V and output (flash attention keeps no weights), dropout's mask (a byte a
    value) and the fp32 residual sum that LayerNorm normalises."""
    a = compute_bytes
    d, f, n = int(model.get("d_model", 512)), int(model.get("d_ff", 2048)), int(model.get("n_layers", 6))
    h = int(model.get("n_heads", 8))
    hq, hv = _heads_widths(model)
    residual = d + 4 * d + 8  # dropout's mask, the fp32 sum, LayerNorm's mean and 1/σ
    self_attention = a * d + a * (2 * hq + hv) + a * hv + 4 * h + residual
    cross_queries = a * d + a * hq + a * hv + 4 * h + residual  # per target position
    cross_memory = a * d + a * (hq + hv)  # K and V of each source position, in every decoder layer
    feed_forward = a * d + a * f + residual
    encoder = n * (self_attention + feed_forward)
    decoder = n * (self_attention + cross_queries + cross_memory + feed_forward)
    embeddings = 2 * (4 * d + d)  # both sides: the scaled sum and dropout's mask
    return encoder + decoder + embeddings + a * d  # and the decoder's output, into the projection


def training_memory(model: Mapping[str, Any], vocab_size: int, precision: Any, processes: int = 1,
                    fused_loss: bool = False) -> MemoryEstimate:
    """The estimate for the network ``model`` (its arguments as built, widths divided) trained in
    ``precision`` (Lightning's name) by ``processes`` processes (DDP's buckets from two on), with
    the plain loss or the fused one (``loss.fused``: the logits and their gradient in the compute
    dtype, and an fp32 scratch of a block of rows, aiayn.model.loss)."""
    a, w = COMPUTE_BYTES.get(str(precision), 2), WEIGHT_BYTES.get(str(precision), 4)
    weights = parameters(model, vocab_size)
    # (before: 16 + 2 bytes a parameter whatever the weights' dtype: 64-true's half of what it takes)
    fixed = weights * (4 * w + (2 if a == 2 and w == 4 else 0) + (w if processes > 1 else 0))
    if fused_loss:
        fixed += 2 * 4 * FUSED_LOSS_ROWS * vocab_size
    per_token = activation_bytes(model, a) + (2 * a if fused_loss else 8 + 2 * a) * vocab_size
    return MemoryEstimate(fixed=fixed, per_token=per_token)


def config_memory(config: Mapping[str, Any], precision: Any, processes: int) -> MemoryEstimate:
    """:func:`training_memory` of a training config's network (``model``, ``width_divisor``), vocabulary and loss."""
    try:
        network = network_arguments(config["model"], config.get("width_divisor", 1) or 1)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    return training_memory(network, int(config["task"]["vocab_size"]), precision, processes,
                           fused_loss=bool((config.get("loss") or {}).get("fused")))


def batch_over_memory(estimate: MemoryEstimate, batch: int, device_bytes: int, setting: Any,
                      auto_fits: bool = False) -> str | None:
    """The one line that warns of a batch of ``batch`` tokens (from ``task.datamodule.max_tokens=setting``, not
    sized to this GPU) that takes more than a GPU of ``device_bytes`` may use, by the estimate; None where it fits.
    A warning, not a refusal: the estimate is an estimate (within 20% above the peaks measured), and the value as
    given is what trains. ``auto_fits``: ``max_tokens=auto`` would size the batch to the GPU (the step accumulated)."""
    need, room = estimate.at(batch), usable(device_bytes)
    if need <= room:
        return None
    fits = tokens_that_fit(estimate, device_bytes)
    if fits:
        what = f"give task.datamodule.max_tokens={fits} or less" + (
            " (auto: the most that fits, the rest of the step accumulated)" if auto_fits else "")
    else:
        what = f"the weights and optimizer state alone take ~{gib(estimate.fixed, 1)}: train on a GPU with more " \
               "memory or a smaller model"
    return (f"task.datamodule.max_tokens={setting}: a batch of {batch:,} tokens takes ~{gib(need, 1)} by the "
            f"memory estimate, more than the {gib(room, 1)} usable of the GPU's {gib(device_bytes)}, so the "
            f"run may run out of GPU memory at its first step; {what}")


def gib(size: float, digits: int = 0) -> str:
    """``size`` bytes in GiB, as nvidia-smi and the GPUs' names count them (an "80GB" H100 holds 79.6 GiB, which
    decimal GB wrote as 85), e.g. ``79.6 GiB`` for ``digits=1``."""
    return f"{size / GIB:.{digits}f} GiB"


def usable(device_bytes: int) -> int:
    """The bytes of a GPU of ``device_bytes`` a training step may plan to use."""
    return int(USABLE_SHARE * device_bytes) - RESERVED_BYTES


def tokens_that_fit(estimate: MemoryEstimate, device_bytes: int) -> int:
    """The most padded tokens a side one batch may hold on a GPU of ``device_bytes`` (a multiple
    of 8; 0 when not even the weights and optimizer state fit)."""
    room = usable(device_bytes) - estimate.fixed
    return max(0, room // estimate.per_token // ROUND_TO * ROUND_TO)
