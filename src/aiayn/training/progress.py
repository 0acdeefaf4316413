"""The progress of a training run: Lightning's bar on a terminal, plain lines in a log file.

On a terminal, the bar. Lightning's bars describe epochs ("Epoch 0/-2" when ``max_epochs=-1``, as
every run here trains for ``trainer.max_steps`` steps), print the learning rate as ``0.000`` and
show the logger's version (``v_num``). This one names the epoch and the step the run trains to,
writes the rate in scientific notation and the other values to four significant digits, and
leaves the version out. When stdout is not a terminal (nohup, SLURM, ``> log``) the bar is not
drawn: a file would get only its redrawn frames.

Plain lines, as fairseq's ``--log-format simple``: :class:`ProgressLog` (``callbacks.progress_log``)
logs a line every ``every_n_steps`` optimizer steps and after each validation. They always go to
the run folder's train.log, and to stdout when it is not a terminal (aiayn.training.run_log keeps
them off a terminal, where the bar shows the same). Rank zero's alone.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
from lightning.pytorch.callbacks.progress.rich_progress import _RICH_AVAILABLE

from aiayn.training.callbacks import RunSummaryCallback
from aiayn.training.run_log import BAR_SHOWS_IT, is_terminal

log = logging.getLogger(__name__)


def progress_bar(trainer: Mapping[str, Any]) -> RichProgressBar | TQDMProgressBar | None:
    """The bar (Rich's when rich is installed, as Lightning chooses), or None when
    ``trainer.enable_progress_bar`` is false; switched off (drawing nothing) when stdout is not a
    terminal. Lightning would add a bar of its own were none given."""
    if trainer.get("enable_progress_bar") is False:
        return None
    bar = StepRichProgressBar() if _RICH_AVAILABLE else StepTQDMProgressBar()
    if not is_terminal(sys.stdout):
        bar.disable()
    return bar


def describe_values(metrics: dict[str, Any]) -> dict[str, Any]:
    """The bar's values: no ``v_num``; learning rates (``*lr``) as ``1.23e-04``; other numbers to
    four significant digits."""
    shown = {}
    for key, value in metrics.items():
        if key == "v_num":
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = f"{value:.2e}" if key.endswith("lr") else f"{value:.4g}"
        shown[key] = value
    return shown


def describe_training(trainer: Any) -> str:
    """``Epoch 3`` and, for a run bounded by steps, the step it trains to: ``Epoch 3 (to step 100000)``."""
    text = f"Epoch {trainer.current_epoch}"
    if trainer.max_epochs is not None and trainer.max_epochs > 0:
        text += f"/{trainer.max_epochs - 1}"
    if trainer.max_steps is not None and trainer.max_steps > 0:
        text += f" (to step {trainer.max_steps})"
    return text


class StepRichProgressBar(RichProgressBar):
    def _get_train_description(self, current_epoch: int) -> str:
        return f"{describe_training(self.trainer):{len(self.validation_description)}}"

    def get_metrics(self, trainer: Any, pl_module: Any) -> dict[str, Any]:
        return describe_values(super().get_metrics(trainer, pl_module))


class StepTQDMProgressBar(TQDMProgressBar):
    def on_train_epoch_start(self, trainer: Any, *args: Any) -> None:
        super().on_train_epoch_start(trainer, *args)
        self.train_progress_bar.set_description(describe_training(trainer))

    def get_metrics(self, trainer: Any, pl_module: Any) -> dict[str, Any]:
        return describe_values(super().get_metrics(trainer, pl_module))


class ProgressLog(L.Callback):
    """fairseq's ``--log-format simple --log-interval N``: every ``every_n_steps`` optimizer steps,
    and at the last step,

        step 200/2000 | loss 4.123 | lr 3.20e-04 | 5,321 tok/s | ETA 0:09:10

    and after each validation (not the sanity check)

        validation at step 1000 | loss 2.345 | ppl 6.482 | bleu 27.31 | 12.3 s, validations 4% of the time so far

    and as the test after training starts (its beam search can take minutes)

        testing on newstest2014: 3,003 sentences

    (``; trainer.limit_test_batches keeps 4 of its 14 batches`` where that setting cuts the test).

    (the task's headline figure: ``bleu`` for translation, ``f1`` for parsing). ``loss``: the
    training loss (label-smoothed) per target token of the steps since the last line, every rank's
    (the module's ``step_loss``, what it logs as ``train/loss``: at a line every step, that step's
    figure), a step with a non-finite loss left out; ``lr``: the
    rate of the step; ``tok/s``: target tokens a second since the last line, every rank's, as the run
    summary counts them (:class:`aiayn.training.callbacks.RunSummaryCallback`; left out without
    it), validation time left out; ``ETA``: the steps left at this attempt's pace so far,
    validations included. A validation's line ends with how long it took and the share of this
    attempt's time validations have taken (on fast hardware ``trainer.val_check_interval`` and
    ``validation.bleu_sentences`` decide much of the wall time). Logged by rank zero through the
    ``aiayn.training.progress`` logger.
    """

    def __init__(self, every_n_steps: int = 100):
        self.every_n_steps = every_n_steps
        self._summary: RunSummaryCallback | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._summary = next((each for each in trainer.callbacks if isinstance(each, RunSummaryCallback)), None)
        self._started = self._since = time.perf_counter()
        self._first_step = self._last_step = trainer.global_step
        self._tokens_since = self._tokens()
        self._paused = 0.0  # validation time since the last line
        self._paused_at: float | None = None
        self._validating = 0.0  # validation time of this attempt
        self._losses = torch.zeros(2, dtype=torch.float64, device=pl_module.device)  # loss summed, tokens
        self._lr: float | None = None

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        if trainer.optimizers:  # the rate this step trains with (the schedule moves it after the step)
            self._lr = trainer.optimizers[0].param_groups[0]["lr"]

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step
        if step == self._last_step:
            return  # a batch accumulated into a step still to come
        self._last_step = step
        losses = getattr(pl_module, "step_loss", None)  # the step's, over every rank (TranslationModule)
        if losses is not None:
            losses = losses.detach().to(torch.float64)
            self._losses += torch.where(torch.isfinite(losses).all(), losses, 0.0)
        if step % self.every_n_steps == 0 or step == trainer.max_steps:
            self._report_step(trainer, step)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._paused_at = time.perf_counter()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        timing = None  # how long it took, and validations' share of the attempt's time
        if self._paused_at is not None:
            now = time.perf_counter()
            took = now - self._paused_at
            self._paused += took
            self._validating += took
            self._paused_at = None
            timing = f"{took:.1f} s, validations {self._validating / (now - self._started):.0%} of the time so far"
        if not trainer.is_global_zero:
            return
        metrics = trainer.callback_metrics
        scorer = getattr(getattr(pl_module, "scorer", None), "name", None)
        shown = [f"{key} {float(metrics[f'val/{key}']):{form}}"
                 for key, form in (("loss", ".3f"), ("ppl", ".2f"), (scorer, ".2f")) if f"val/{key}" in metrics]
        line = [f"validation at step {trainer.global_step}", *shown, *([timing] if timing else [])]
        log.info(" | ".join(line), extra={BAR_SHOWS_IT: True})

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        data = trainer.datamodule
        if not trainer.is_global_zero or not hasattr(data, "splits"):
            return
        line = f"testing on {data.splits['test']}: {len(data.dataset('test')):,} sentences"
        loader = trainer.test_dataloaders
        batches = len(loader) if hasattr(loader, "__len__") else None
        kept = trainer.num_test_batches[0] if trainer.num_test_batches else batches
        if batches and kept is not None and kept < batches:  # (on this process: each rank tests its share)
            line += f"; trainer.limit_test_batches keeps {kept} of its {batches} batches"
        log.info(line, extra={BAR_SHOWS_IT: True})

    def _report_step(self, trainer: L.Trainer, step: int) -> None:
        loss_sum, tokens_trained = self._losses.tolist()  # every rank's already
        self._losses.zero_()
        now = time.perf_counter()
        tokens = self._tokens()
        seconds = now - self._since - self._paused
        rate = (tokens - self._tokens_since) / seconds if tokens is not None and seconds > 0 else None
        self._since, self._paused, self._tokens_since = now, 0.0, tokens
        if not trainer.is_global_zero:
            return
        total = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else None
        parts = [f"step {step}/{total}" if total else f"step {step}",
                 f"loss {loss_sum / tokens_trained:.3f}" if tokens_trained else "loss - (every step skipped)"]
        if self._lr is not None:
            parts.append(f"lr {self._lr:.2e}")
        if rate is not None:
            parts.append(f"{rate:,.0f} tok/s")
        if total and step > self._first_step:
            left = (total - step) * (now - self._started) / (step - self._first_step)
            parts.append(f"ETA {timedelta(seconds=round(left))}")
        log.info(" | ".join(parts), extra={BAR_SHOWS_IT: True})

    def _tokens(self) -> float | None:
        """The target tokens trained on so far, every rank's (the run summary's count)."""
        if self._summary is None:
            return None
        totals = self._summary.totals if self._summary.totals is not None else self._summary.restored_totals
        return float(totals[1])
