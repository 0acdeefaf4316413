"""Stopping early (``callbacks.early_stopping``): training ends once validation's figure has not
improved for ``patience`` validations in a row, as fairseq's ``--patience`` and eole's
``early_stopping`` end it. Not the paper's recipe, which trains for ``optim.train_steps``; so it is
off unless ``callbacks.early_stopping.patience`` is given.

The figure (``metric``): ``score``, the task's own (``bleu`` for translation, ``f1`` for parsing:
the scorer's headline, higher is better), or ``loss`` or ``ppl`` (lower is better). At each
validation that improves on the best, the model is saved as ``checkpoints/best.ckpt`` (its weights,
the run's settings and subword model: what evaluate.py, translate.py and export.py read, not a point
to resume from, 1/3 of a step checkpoint with Adam's moments), as fairseq's ``checkpoint_best.pt``;
the test after training scores it (aiayn.cli.weights_tested), where the paper's recipe would score
the last weights or §6.1's average. The step training stops at is validated and saved too
(aiayn.training.saving.StepCheckpoint saves a step after which training stops) and ``last.ckpt``
names it. The checkpoint records the stop, so the same command with ``resume=auto`` trains no more:
it runs only what is left (the test); resumed with a larger ``patience``, the run goes on.

In DDP every rank computes the same figures (they are gathered before scoring), and the ranks agree
on the stop in one all-reduce, so that they all leave training after the same step.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import lightning as L
import torch

from aiayn.checkpoints.layout import BEST, checkpoint_folder
from aiayn.errors import ConfigError

log = logging.getLogger(__name__)

STATE_KEY = "EarlyStopping"  # its state's key among a checkpoint's callbacks
METRICS = ("score", "loss", "ppl")  # what callbacks.early_stopping.metric may name
LOWER_IS_BETTER = ("loss", "ppl")


def early_stopping(patience: int | None = None, metric: str = "score", min_delta: float = 0.0,
                   dirpath: str | None = None) -> EarlyStopping | None:
    """The callback of ``callbacks.early_stopping`` (conf/callbacks/default.yaml), keeping the best
    model in ``dirpath`` (the run's checkpoints folder); None (none) when ``patience`` is null, the
    paper's recipe."""
    return EarlyStopping(patience, metric, min_delta, dirpath) if patience is not None else None


def best_checkpoint(config: dict[str, Any]) -> Path | None:
    """Where a run of the resolved training ``config`` keeps its best validation's model
    (``<run>/checkpoints/best.ckpt``); None for a run that does not stop early, which keeps none."""
    if ((config.get("callbacks") or {}).get("early_stopping") or {}).get("patience") is None:
        return None
    return checkpoint_folder(config["paths"]["output_dir"]) / BEST


def check_settings(entry: dict[str, Any]) -> None:
    """A :class:`ConfigError` naming the setting of ``callbacks.early_stopping`` that cannot be."""
    patience, metric, delta = entry.get("patience"), entry.get("metric", "score"), entry.get("min_delta", 0.0)
    if patience is not None and (isinstance(patience, bool) or not isinstance(patience, int) or patience < 1):
        raise ConfigError(f"callbacks.early_stopping.patience must be a positive whole number of validations without "
                          f"improvement (null: train for optim.train_steps, the paper's recipe), got {patience!r}")
    if metric not in METRICS:
        raise ConfigError(f"callbacks.early_stopping.metric must be one of {', '.join(METRICS)} (score: the task's own, "
                          f"bleu or f1), got {metric!r}")
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or delta < 0:
        raise ConfigError(f"callbacks.early_stopping.min_delta must be a number, 0 or more (the least change that "
                          f"counts as an improvement), got {delta!r}")


def stopped_early_at(checkpoint: str | os.PathLike) -> int | None:
    """The step at which the run of ``checkpoint`` stopped early, as the checkpoint records it;
    None where it did not, or the file cannot be read (its weights are mapped, not read)."""
    try:
        state = torch.load(checkpoint, map_location="cpu", mmap=True, weights_only=False)
        return (state.get("callbacks") or {}).get(STATE_KEY, {}).get("stopped_at")
    except Exception:  # noqa: BLE001 - a file that is no readable checkpoint records no stop
        return None


class EarlyStopping(L.Callback):
    """Ends training after the validation at which ``metric`` has not improved (by more than
    ``min_delta``) on its best for ``patience`` validations in a row, keeping the best model as
    ``<dirpath>/best.ckpt`` (none without ``dirpath``; see the module)."""

    def __init__(self, patience: int, metric: str = "score", min_delta: float = 0.0, dirpath: str | None = None):
        check_settings({"patience": patience, "metric": metric, "min_delta": min_delta})
        self.patience, self.metric, self.min_delta = patience, metric, float(min_delta)
        self.dirpath = dirpath
        self.figure: str | None = None  # the name validation logs it by, known once the model's scorer is
        self.best: float | None = None
        self.best_step: int | None = None
        self.since_best = 0  # validations since the best
        self.stopped_at: int | None = None  # the step training stopped at
        self._stopped_here = False  # in this attempt (not a resumed run's earlier one)
        self._restored_figure: str | None = None  # the figure a resumed run's checkpoint watched

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        scorer = getattr(pl_module, "scorer", None)  # the data module's, once the module is set up
        if self.metric == "score" and scorer is None:
            raise ConfigError("callbacks.early_stopping.metric=score: this task's validation has no score; give "
                              "callbacks.early_stopping.metric=loss")
        self.figure = scorer.name if self.metric == "score" else self.metric
        if self._restored_figure not in (None, self.figure):  # resumed watching another figure: from scratch
            log.info("callbacks.early_stopping watched val %s until the checkpoint; it watches val %s from here",
                     self._restored_figure, self.figure)
            self.best = self.best_step = self.stopped_at = None
            self.since_best = 0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.stopped_at is None:
            return
        if self.since_best >= self.patience:  # resumed from the step the run stopped at: nothing more to train
            log.info("the run stopped early at step %s (%s); nothing more to train", f"{self.stopped_at:,}",
                     self._reason())
            trainer.should_stop = True
        else:  # resumed with a larger patience: the run goes on from there
            log.info("the run stopped early at step %s after %d validations without improvement; with "
                     "callbacks.early_stopping.patience=%d it goes on", f"{self.stopped_at:,}", self.since_best,
                     self.patience)
            self.stopped_at = None

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or self.stopped_at is not None:
            return
        value = trainer.callback_metrics.get(f"val/{self.figure}")
        if value is None:  # a validation without its score (validation.bleu_sentences=0)
            raise ConfigError(f"callbacks.early_stopping.metric={self.metric}: validation reported no val/{self.figure} "
                              f"(validation.bleu_sentences=0 scores no sentence); give validation.bleu_sentences>0 or "
                              "callbacks.early_stopping.metric=loss")
        value, step = float(value), trainer.global_step
        if self.best is None or self._better(value, self.best):
            self.best, self.best_step, self.since_best = value, step, 0
            if self.dirpath is not None:  # every rank: a save is collective (rank zero writes, atomically)
                trainer.save_checkpoint(Path(self.dirpath) / BEST, weights_only=True)
        else:
            self.since_best += 1
        last = 0 < trainer.max_steps <= step  # training ends here anyway: no early stop
        if trainer.strategy.reduce_boolean_decision(self.since_best >= self.patience and not last, all=False):
            self.stopped_at = step
            trainer.should_stop = True
            self._stopped_here = True

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._stopped_here:  # said after the validation's own line
            log.info("stopped early at step %s: %s", f"{self.stopped_at:,}", self._reason())

    def _better(self, value: float, best: float) -> bool:
        if self.metric in LOWER_IS_BETTER:
            return value < best - self.min_delta
        return value > best + self.min_delta

    def _reason(self) -> str:
        by = f" by more than {self.min_delta:g}" if self.min_delta else ""
        return (f"val {self.figure} has not improved{by} on {self.best:.4g} (step {self.best_step:,}) in "
                f"{self.since_best} validations; callbacks.early_stopping.patience={self.patience}")

    def summary(self) -> dict[str, Any]:
        """What the run summary records of it: the step the run stopped at (None: it did not), the
        best validation figure and its step."""
        return {"stopped_early_at": self.stopped_at, f"dev/best_{self.figure}": self.best, "dev/best_step": self.best_step}

    @property
    def state_key(self) -> str:
        return STATE_KEY

    def state_dict(self) -> dict[str, Any]:
        return {"figure": self.figure, "best": self.best, "best_step": self.best_step, "since_best": self.since_best,
                "stopped_at": self.stopped_at}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best, self.best_step = state_dict.get("best"), state_dict.get("best_step")
        self.since_best, self.stopped_at = state_dict.get("since_best", 0), state_dict.get("stopped_at")
        self._restored_figure = state_dict.get("figure")
