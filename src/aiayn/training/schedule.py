"""The learning-rate schedule of §5.3 (Eq. 3):

    lrate = d_model^-0.5 · min(step_num^-0.5, step_num · warmup_steps^-1.5)

linear warm-up for ``warmup_steps`` steps, then decay with the inverse square root of the step.
``factor`` scales the whole curve (tensor2tensor's ``learning_rate`` hyper-parameter; 1.0 is
the paper).
"""

from __future__ import annotations

import torch


def transformer_lr(step: int, d_model: int, warmup_steps: int, factor: float = 1.0) -> float:
    """Eq. 3 at optimizer step ``step`` (counted from 1)."""
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def transformer_scheduler(optimizer: torch.optim.Optimizer, d_model: int, warmup_steps: int,
                          factor: float = 1.0) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR stepping Eq. 3 once per optimizer step; the optimizer's base lr must be 1.0.

    LambdaLR evaluates its function at 0 before the first update, so update n uses Eq. 3 at n.
    """
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda index: transformer_lr(index + 1, d_model, warmup_steps, factor)
    )
