"""Label-smoothed cross-entropy (§5.4, "Label Smoothing").

With ε_ls the target distribution puts 1 - ε_ls on the reference token and spreads ε_ls
uniformly over the whole vocabulary (the reference token included), as torch, fairseq and
tensor2tensor's ``smoothing_cross_entropy`` (up to a constant) do; the paper does not say how the
mass is spread. Only non-padding target positions count.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def label_smoothed_loss(logits: Tensor, target: Tensor, label_smoothing: float, pad_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """Returns (smoothed loss summed over tokens, negative log-likelihood summed over tokens,
    number of non-pad tokens). Sums, not means, so that batches of any size combine exactly. The
    count is a tensor on the logits' device: nothing here waits for the device."""
    log_probs = logits.float().log_softmax(dim=-1).view(-1, logits.size(-1))
    target = target.reshape(-1)
    real = target != pad_id
    nll = F.nll_loss(log_probs, target, ignore_index=pad_id, reduction="sum")
    n_tokens = real.sum()
    if label_smoothing == 0.0:
        return nll, nll.detach(), n_tokens
    # Cross-entropy against the uniform distribution, at real tokens only.
    uniform = -(log_probs.mean(dim=-1) * real).sum()
    loss = (1.0 - label_smoothing) * nll + label_smoothing * uniform
    return loss, nll.detach(), n_tokens
