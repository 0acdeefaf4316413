"""A run that ``trainer.max_time`` stopped before its last step says so, and what to do.

Lightning's Timer (built by the Trainer from ``trainer.max_time``) stops training once the run's
training time, validations included, reaches the limit; the step it stopped at is validated and
saved as any step after which training stops (aiayn.training.saving). The Timer's time is kept in
the checkpoint, so the limit counts every attempt of the run together (as fairseq's
``--stop-time-hours``): ``resume=auto`` with the same limit trains nothing more. Lightning's own
line ("Time limit reached ...") names neither the step nor the setting; without this one a run
cut short ended like a finished one, exit status 0 and its summary of the step it stopped at.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Timer

log = logging.getLogger(__name__)


def time_limit(trainer: Mapping[str, Any]) -> TimeLimit | None:
    """The callback of conf/callbacks/default.yaml: none without ``trainer.max_time``."""
    limit = trainer.get("max_time")
    return TimeLimit(str(limit)) if limit else None


class TimeLimit(L.Callback):
    """At the end of ``fit``, one line when the Timer of ``trainer.max_time`` (``limit``, as
    given) ended it before ``trainer.max_steps``."""

    def __init__(self, limit: str):
        self.limit = limit

    # At fit's end, not training's: a resume whose time has run out skips the training loop, its
    # hooks too (Lightning's fit loop is done before it starts).
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        timer = next((callback for callback in trainer.callbacks if isinstance(callback, Timer)), None)
        remaining = None if timer is None else timer.time_remaining()
        step, last = trainer.global_step, trainer.max_steps
        if remaining is None or remaining > 0 or not 0 <= step < last or not trainer.is_global_zero:
            return
        spent = timedelta(seconds=int(timer.time_elapsed()))
        log.warning("training stopped at step %s of %s: trainer.max_time=%s ran out (%s of training and validation, "
                    "counted over every attempt of this run); to train on, the same command with resume=auto and a "
                    "longer trainer.max_time", f"{step:,}", f"{last:,}", self.limit, spent)
