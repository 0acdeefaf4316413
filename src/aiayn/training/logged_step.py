"""The step a logged row is put at, in every attempt of a run: the trainer's own count of steps.

Lightning puts a row of a training step's metrics at its count of the batches that stepped (the
training loop's ``_batches_that_stepped``): the steps taken before it, 0 for the first step's loss.
A checkpoint keeps that count as it stands in the hooks of the step it saves, one below the
trainer's step, and a resumed run brings it up only where Lightning restarts in the middle of its
own loop (after a batch; after a validation it scheduled itself). Resumed from a step validated for
another reason (the last step, which aiayn.training.saving.ValidateLastStep validates: a finished
run extended with more steps; an early stop's), the count stayed one below for the whole attempt:
every row of metrics.csv, W&B and MLflow fell on the step before its own, the first on a step the
run had logged already.

:func:`align` brings the count to the trainer's step before each training batch, where it equals
it in a run never stopped. A validation and the test log the step they evaluated as ``step``
(aiayn.training.module), which Lightning takes for their row's: the count there is the steps before
it, and a run resumed with nothing left to train never brings it up at all.
"""

from __future__ import annotations

from typing import Any


def align(trainer: Any) -> None:
    """Before a training batch: the loggers' step is the trainer's (the optimizer steps taken)."""
    trainer.fit_loop.epoch_loop._batches_that_stepped = trainer.global_step


def without_step(results: dict[str, float]) -> dict[str, float]:
    """An evaluation's figures without the ``step`` it logged for its row's place."""
    return {key: value for key, value in results.items() if key != "step"}
