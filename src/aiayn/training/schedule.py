"""The learning-rate schedule of §5.3 (Eq. 3):

    lrate = d_model^-0.5 · min(step_num^-0.5, step_num · warmup_steps^-1.5)

linear warm-up for ``warmup_steps`` steps, then decay with the inverse square root of the step.
``factor`` scales the whole curve (tensor2tensor's ``learning_rate`` hyper-parameter; 1.0 is
the paper). ``optim.schedule`` names another function of the step in its place (docs/extending.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from aiayn.config.schemas import constructor_arguments, named_object
from aiayn.errors import ConfigError

if TYPE_CHECKING:  # torch is imported where a scheduler is made: the config's check runs without it
    import torch


def transformer_lr(step: int, d_model: int, warmup_steps: int, factor: float = 1.0) -> float:
    """Eq. 3 at optimizer step ``step`` (counted from 1)."""
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def transformer_scheduler(optimizer: torch.optim.Optimizer, d_model: int, warmup_steps: int,
                          factor: float = 1.0, rate: Callable[..., float] = transformer_lr,
                          train_steps: int | None = None) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR stepping Eq. 3 (or ``rate``, a function of one's own: :func:`rate_of`) once per
    optimizer step; the optimizer's base lr must be 1.0.

    LambdaLR evaluates its function at 0 before the first update, so update n uses Eq. 3 at n.
    """
    import torch

    given = _arguments(rate, d_model=d_model, warmup_steps=warmup_steps, factor=factor, train_steps=train_steps)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda index: rate(index + 1, **given))


def rate_of(schedule: str | None) -> Callable[..., float]:
    """The learning rate a step that ``optim.schedule`` names: Eq. 3 (:func:`transformer_lr`) for
    None, else the function at that dotted path, called as ``rate(step, **those of d_model,
    warmup_steps, factor and train_steps it names)``; a ConfigError naming the setting where there
    is none."""
    if schedule is None:
        return transformer_lr
    what = ("give null (Eq. 3) or the dotted path of a function of the step whose module is on PYTHONPATH "
            "(docs/extending.md)")
    found = named_object(schedule, "optim.schedule", what)
    if not callable(found):
        raise ConfigError(f"optim.schedule={schedule} is not a function; {what}")
    return found


def check_schedule(schedule: str | None, d_model: int, warmup_steps: int, factor: float, train_steps: int) -> None:
    """``optim.schedule``'s function gives a rate at the first and the last step: a finite number of
    at least 0 (a ConfigError naming the setting, before anything is built, where it does not)."""
    rate = rate_of(schedule)
    given = _arguments(rate, d_model=d_model, warmup_steps=warmup_steps, factor=factor, train_steps=train_steps)
    for step in (1, train_steps):
        try:
            value = rate(step, **given)
        except Exception as error:  # noqa: BLE001 - the user's function, named with what it raised
            raise ConfigError(f"optim.schedule={schedule}: rate({step}, {', '.join(given)}) raised "
                              f"{type(error).__name__}: {error}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ConfigError(f"optim.schedule={schedule}: its rate at step {step} is {value!r}; it must give a "
                              "finite number of at least 0 (the learning rate)")


def _arguments(rate: Callable[..., float], **available: object) -> dict[str, object]:
    """Those of ``available`` that ``rate`` names (all where it takes ``**kwargs``)."""
    named, takes_any = constructor_arguments(rate)
    return available if takes_any else {key: value for key, value in available.items() if key in named}
