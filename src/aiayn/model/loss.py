"""Label-smoothed cross-entropy (§5.4, "Label Smoothing").

With ε_ls the target distribution puts 1 - ε_ls on the reference token and spreads ε_ls
uniformly over the whole vocabulary (the reference token included): q'(k) = (1 - ε_ls)·δ(k, y)
+ ε_ls / V, the definition of the paper's reference [36] (Szegedy et al., 2016) and what torch's
``cross_entropy(label_smoothing=ε)`` computes. The paper does not say how the mass is spread;
tensor2tensor's ``smoothing_cross_entropy`` (the paper's code) and fairseq spread ε_ls over the
V - 1 other tokens instead, the reference keeping exactly 1 - ε_ls: a difference of ε_ls / V in
each target probability (3.1·10^-6 at 32K, 2.7·10^-6 at 37K: the paper's vocabularies). Every class takes its
share, the padding id, BOS and EOS included, as in tensor2tensor (which excludes no id from the
smoothed distribution either); only the target positions that are padding are left out of the
loss and of the token count.

``fused=True`` computes the same loss a block of rows at a time and, in the same pass, its
gradient with respect to the logits, which is all the backward pass needs: it keeps that gradient
in the logits' dtype instead of the fp32 log-probabilities and the fp32 gradients the plain path
makes over the whole vocabulary — over a 32–37K vocabulary the largest part of a training step's
memory (aiayn.config.memory). The same loss and gradient up to fp32 rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

FUSED_ROWS = 4096  # rows of the logits the fused loss takes at a time (its fp32 scratch: rows × vocabulary)


def label_smoothed_loss(logits: Tensor, target: Tensor, label_smoothing: float, pad_id: int,
                        fused: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """Returns (smoothed loss summed over tokens, negative log-likelihood summed over tokens,
    number of non-pad tokens). Sums, not means, so that batches of any size combine exactly. The
    count is a tensor on the logits' device: nothing here waits for the device."""
    target = target.reshape(-1)
    real = target != pad_id
    if fused:
        loss, nll = _FusedLabelSmoothedLoss.apply(logits, target, float(label_smoothing), pad_id)
        return loss, nll, real.sum()
    log_probs = logits.float().log_softmax(dim=-1).view(-1, logits.size(-1))
    nll = F.nll_loss(log_probs, target, ignore_index=pad_id, reduction="sum")
    n_tokens = real.sum()
    if label_smoothing == 0.0:
        return nll, nll.detach(), n_tokens
    # Cross-entropy against the uniform distribution, at real tokens only.
    uniform = -(log_probs.mean(dim=-1) * real).sum()
    loss = (1.0 - label_smoothing) * nll + label_smoothing * uniform
    return loss, nll.detach(), n_tokens


class _FusedLabelSmoothedLoss(torch.autograd.Function):
    """The loss summed over the real tokens, and its gradient with respect to the logits made in
    the forward pass: for a row of log-probabilities log p = x - logsumexp(x) and reference t,
    d loss / d x = p - (1 - ε) onehot(t) - ε / V (zero at padding)."""

    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, eps: float, pad_id: int) -> tuple[Tensor, Tensor]:
        shape, vocab = logits.shape, logits.size(-1)
        rows = logits.reshape(-1, vocab)
        gradient = torch.empty_like(rows)
        loss = rows.new_zeros((), dtype=torch.float32)
        nll = rows.new_zeros((), dtype=torch.float32)
        for start in range(0, rows.size(0), FUSED_ROWS):
            x = rows[start:start + FUSED_ROWS].float()  # (rows, V)
            t = target[start:start + FUSED_ROWS, None]  # (rows, 1)
            real = (t != pad_id).float()  # (rows, 1)
            log_z = torch.logsumexp(x, dim=-1, keepdim=True)  # (rows, 1)
            log_p_target = x.gather(1, t) - log_z
            mean_log_p = x.mean(dim=-1, keepdim=True) - log_z
            nll -= (log_p_target * real).sum()
            loss -= (((1.0 - eps) * log_p_target + eps * mean_log_p) * real).sum()
            x.sub_(log_z).exp_()  # p, in place of x
            x.scatter_add_(1, t, torch.full_like(log_p_target, -(1.0 - eps))).sub_(eps / vocab).mul_(real)
            gradient[start:start + FUSED_ROWS] = x
        ctx.save_for_backward(gradient)
        ctx.shape = shape
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_nll: Tensor) -> tuple[Tensor | None, ...]:
        (gradient,) = ctx.saved_tensors
        return (gradient * grad_loss.to(gradient.dtype)).view(ctx.shape), None, None, None
