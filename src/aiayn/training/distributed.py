"""The process group's timeout of data-parallel training (:func:`strategy_with_timeout`); how
many processes train, and where, is the plan's (aiayn.config.hardware).

A DDP rank that hangs (a stuck data read, a dead peer that no signal reported) holds every other
rank in its next collective until the process group's timeout; Lightning's default is 30 minutes,
``distributed.timeout_minutes`` makes it shorter.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from aiayn.errors import ConfigError


def check_timeout(timeout_minutes: Any) -> None:
    """ConfigError unless ``distributed.timeout_minutes`` is null or a positive number of minutes
    (aiayn.training.config_check calls it before any job of a sweep starts)."""
    if timeout_minutes is not None and (isinstance(timeout_minutes, bool) or not isinstance(timeout_minutes, (int, float))
                                        or not timeout_minutes > 0):
        raise ConfigError(f"distributed.timeout_minutes must be a positive number of minutes, got {timeout_minutes!r}")


def strategy_with_timeout(strategy: Any, timeout_minutes: float | None, processes: int = 1) -> Any:
    """``strategy`` (the ``trainer.strategy`` setting: a name such as ``"ddp"``, ``"ddp_spawn"``,
    ``"ddp_find_unused_parameters_true"``, ``"auto"``, or a built Strategy) as a DDP strategy whose
    process group times out after ``timeout_minutes`` when it is one; anything else unchanged.

    A name keeps what it stands for in Lightning's registry (``ddp_spawn``: start method spawn;
    ``..._find_unused_parameters_true``: that DDP option). A built DDPStrategy gets the timeout in
    place. ``"auto"`` with ``processes`` > 1 (the plan's training processes) becomes the
    ``ddp`` Lightning would pick for it; with one process it stays ``"auto"``. ``timeout_minutes``
    None leaves Lightning's default (30 minutes)."""
    check_timeout(timeout_minutes)
    if timeout_minutes is None:
        return strategy
    from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry

    timeout = timedelta(minutes=timeout_minutes)
    if isinstance(strategy, DDPStrategy):
        strategy._timeout = timeout  # read when the process group is created, in the Trainer's setup
        return strategy
    if not isinstance(strategy, str):
        return strategy
    name = "ddp" if strategy == "auto" and processes > 1 else strategy
    if name not in StrategyRegistry or not issubclass(StrategyRegistry[name]["strategy"], DDPStrategy):
        return strategy
    entry = StrategyRegistry[name]
    return entry["strategy"](**entry["init_params"], timeout=timeout)
