"""Training cost (Table 2's last column), two ways.

**Counted from the model.** The floating-point operations of one forward pass follow from the
model's shapes; a multiply-add is 2 FLOPs. Per layer, with h heads of d_k, d_v:

* attention projections: a query ``2·d_model·h·d_k``, a key ``2·d_model·h·d_k``, a value
  ``2·d_model·h·d_v`` per projected position, and the output ``2·h·d_v·d_model`` per query;
* Eq. 1, per query: scores ``2·h·d_k·L`` and the weighted sum of values ``2·h·d_v·L``, where L is
  the number of keys (source length for encoder self-attention and encoder-decoder attention,
  target length for decoder self-attention);
* the feed-forward network (Eq. 2): ``2·2·d_model·d_ff`` per position;
* the pre-softmax projection (§3.4): ``2·d_model·V`` per target position.

So with source length S and target length T (padded, what is computed) a sentence pair costs

    encoder  S·N·(2·d_model·h·(2·d_k + d_v) + 2·h·d_v·d_model + 2·h·(d_k + d_v)·S + 4·d_model·d_ff)
    decoder  T·N·(2·d_model·h·(2·d_k + d_v) + 2·h·d_v·d_model + 2·h·(d_k + d_v)·T       self
                 + 2·d_model·h·d_k + 2·h·d_v·d_model + 2·h·(d_k + d_v)·S              enc-dec
                 + 4·d_model·d_ff)
             + S·N·2·d_model·h·(d_k + d_v)                  enc-dec keys and values of the memory
             + T·2·d_model·V                                pre-softmax projection

and training (forward and backward, whose gradients for inputs and weights cost about twice the
forward) counts 3× the forward. Where the paper is silent this module chooses: the decoder's
masked self-attention counts the whole T×T score matrix (it is computed, then masked);
embeddings lookups, softmax, layer normalisation, biases, dropout, the loss and the optimizer are
left out (each is O(d_model) per position, against O(d_model²) for what is counted).

Restricted self-attention (§4, ``model.attention_window`` r) counts the keys of each query's
neighbourhood rather than of the whole sequence: min(S, 2r + 1) in the encoder (r on each side)
and min(T, r + 1) in the decoder (the r before and itself), the O(r·n·d) of Table 1. That is the
restricted model's cost as a banded kernel computes it; this project's attention computes the
dense scores and masks them, as it does for the causal mask. A window reaching the whole
sequence counts as full attention.

**The paper's estimate** (§6.1, footnote): training time × number of GPUs × the sustained
single-precision capacity of one GPU, for which the paper used K80 2.8, K40 3.7, M40 6.0 and
P100 9.5 TFLOPS. The paper trained on 8 P100s: base 12 hours (3.3·10^18), big 3.5 days (2.3·10^19).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# The footnote of §6.1: "We used values of 2.8, 3.7, 6.0 and 9.5 TFLOPS for K80, K40, M40 and
# P100, respectively."
SUSTAINED_TFLOPS = {"K80": 2.8, "K40": 3.7, "M40": 6.0, "P100": 9.5}
PAPER_GPU = "P100"  # §5.2: "8 NVIDIA P100 GPUs" (cost.gpu's default, conf/train.yaml)

# Forward + backward: the backward pass computes gradients for the inputs and the weights of
# every matrix product, about twice the forward's operations.
TRAINING_MULTIPLIER = 3


@dataclass(frozen=True)
class Shapes:
    """The sizes that set a Transformer's cost."""

    n_layers: int
    d_model: int
    d_ff: int
    n_heads: int
    d_k: int
    d_v: int
    vocab_size: int
    attention_window: int | None = None  # r of restricted self-attention (§4); None: full attention

    @classmethod
    def from_config(cls, model: Mapping[str, Any], vocab_size: int) -> Shapes:
        """From the network's arguments as built (TranslationModule.hparams.model, or
        aiayn.config.schemas.network_arguments of a model config: width_divisor applied)."""
        window = model.get("attention_window")
        return cls(int(model["n_layers"]), int(model["d_model"]), int(model["d_ff"]), int(model["n_heads"]),
                   int(model["d_k"]), int(model["d_v"]), int(vocab_size), None if window is None else int(window))


def forward_flops(shapes: Shapes, sentences: int, src_len: int, tgt_len: int) -> int:
    """FLOPs of one forward pass over ``sentences`` pairs padded to ``src_len`` source and
    ``tgt_len`` target positions (teacher forcing: the whole shifted target at once)."""
    s = shapes
    n, d, h = s.n_layers, s.d_model, s.n_heads
    projections = 2 * d * h * (2 * s.d_k + s.d_v) + 2 * h * s.d_v * d  # Q, K, V in and the output out
    feed_forward = 4 * d * s.d_ff

    def attend(keys: int) -> int:
        return 2 * h * (s.d_k + s.d_v) * keys  # Q·Kᵀ and the weighted sum of V (Eq. 1)

    r = s.attention_window
    # Keys per query of self-attention: the whole sequence, or a neighbourhood of it (§4).
    encoder_keys = src_len if r is None else min(src_len, 2 * r + 1)  # r on each side
    decoder_keys = tgt_len if r is None else min(tgt_len, r + 1)  # the r before and itself
    encoder = src_len * n * (projections + attend(encoder_keys) + feed_forward)
    cross = 2 * d * h * s.d_k + 2 * h * s.d_v * d + attend(src_len)  # queries and output, per target position
    decoder = tgt_len * n * (projections + attend(decoder_keys) + cross + feed_forward)
    memory = src_len * n * 2 * d * h * (s.d_k + s.d_v)  # the memory's keys and values, once per layer
    logits = tgt_len * 2 * d * s.vocab_size
    return sentences * (encoder + decoder + memory + logits)


def training_flops(shapes: Shapes, sentences: int, src_len: int, tgt_len: int) -> int:
    """FLOPs of one training step's forward and backward over such a batch."""
    return TRAINING_MULTIPLIER * forward_flops(shapes, sentences, src_len, tgt_len)


def flops_per_token(shapes: Shapes, length: int) -> float:
    """Training FLOPs per target token for pairs of ``length`` source and target positions: the
    figure to multiply by the tokens trained."""
    return training_flops(shapes, 1, length, length) / length


def sustained_tflops(gpu: str | float) -> float:
    """The sustained TFLOPS of ``gpu``: one of the paper's (K80, K40, M40, P100) or a number."""
    if isinstance(gpu, (int, float)) and not isinstance(gpu, bool):
        if gpu <= 0:
            raise ValueError(f"cost.gpu: sustained TFLOPS must be positive, got {gpu}")
        return float(gpu)
    key = str(gpu).upper().removeprefix("NVIDIA ").removeprefix("TESLA ")
    if key not in SUSTAINED_TFLOPS:
        raise ValueError(f"cost.gpu={gpu!r} is not one of the paper's GPUs ({', '.join(SUSTAINED_TFLOPS)}); "
                         "name one of them or give its sustained TFLOPS as a number")
    return SUSTAINED_TFLOPS[key]


def paper_estimate(train_seconds: float, n_gpus: int, gpu: str | float = PAPER_GPU) -> float:
    """The paper's training-cost estimate: time × GPUs × sustained FLOPS of one GPU."""
    return train_seconds * n_gpus * sustained_tflops(gpu) * 1e12
