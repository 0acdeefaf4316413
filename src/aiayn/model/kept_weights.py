"""When a copy kept of some weights (stacked W^Q, W^K, W^V; a packed oneDNN weight) is stale.

Decoding keeps such copies between steps instead of making them at every step (speed only, see
aiayn.model.attention). A copy is keyed by its weights' storage, version counter and dtype, which
change when a weight is replaced or changed in place by torch's ordinary operations — and by the
number of optimizer steps taken in this process, since torch's fused (and foreach) Adam update the
weights in place without counting it in their versions.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor
from torch.optim.optimizer import register_optimizer_step_post_hook

_optimizer_steps = 0


def _count_optimizer_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    global _optimizer_steps
    _optimizer_steps += 1


register_optimizer_step_post_hook(_count_optimizer_step)  # every torch optimizer, every step


def kept_key(*weights: Tensor) -> tuple:
    """What a copy of ``weights`` was made from; a copy whose key differs must be made again."""
    return (_optimizer_steps, *((w.data_ptr(), w._version, w.dtype) for w in weights))
