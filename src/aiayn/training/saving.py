"""When a training step is saved: after the validation that follows it, and which steps are.

Lightning validates after a training batch's ``on_train_batch_end`` hooks, where a ModelCheckpoint
saves. A run killed between the two (during the validation, or just after the last step's
checkpoint) would leave a checkpoint whose resume skips that validation: Lightning restarts after
the batch and never validates that step again, so its dev point, and after the last step the run's
final figures, would be lost for good. Here a checkpoint of a step that is validated is written
when that validation has ended. A run killed during a validation then resumes from the checkpoint
before and validates that step on its way; the last step's checkpoint holds the last dev figures.

The last step is always validated (as fairseq validates at ``--max-update``), so that the run's
summary describes the model it ends with, whatever ``trainer.val_check_interval`` is.

Which steps are saved: every ``checkpoint.every_n_train_steps``, and in §6.1's window before the
last step only the window's (aiayn.config.checkpointing). ``last.ckpt`` is a link to the newest.
Which are kept: the newest ``checkpoint.save_top_k`` of those steps, those an uninterrupted run of
the same settings keeps, whatever earlier attempts of the run saved (a preempted step, the last
step of a run since extended, the one resumed from go once it would not keep them).
What the callbacks do to the files goes through the run's checkpoint writer, in order with its
saves (:func:`after_saves`; aiayn.checkpoints.background saves while training goes on).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn

from aiayn.config.checkpointing import kept_before, window_steps
from aiayn.files import atomic_path

STEP_FILE = re.compile(r"^step(\d+)\.ckpt$")  # the names StepCheckpoint and the preemption give a step


def validation_follows(trainer: L.Trainer) -> bool:
    """Whether Lightning validates right after the training batch whose ``on_train_batch_end``
    hooks are running: the decision its training loop takes a moment later, from the same state."""
    if trainer.sanity_checking or not trainer.enable_validation:
        return False
    loop = trainer.fit_loop.epoch_loop
    # Lightning's own predicate (a private method of the loop, stable across 2.x): reimplementing
    # its cases (steps, epochs, time intervals, should_stop) would drift from what it then does.
    return bool(loop._should_check_val_fx(trainer.fit_loop._data_fetcher))


def after_saves(trainer: L.Trainer, action: Callable[..., Any], *args: Any) -> None:
    """``action(*args)`` once the checkpoints the trainer's writer has under way are on disk
    (``checkpoint.in_background``: aiayn.checkpoints.background), or at once for one that saves
    before it returns."""
    run_after = getattr(trainer.strategy.checkpoint_io, "after_saves", None)
    if run_after is None:
        action(*args)
    else:
        run_after(action, *args)


def wait_for_saves(trainer: L.Trainer) -> None:
    """Return once the trainer's checkpoints are on disk."""
    wait = getattr(trainer.strategy.checkpoint_io, "wait", None)
    if wait is not None:
        wait()


def link_last(filepath: str | os.PathLike, linkpath: str | os.PathLike) -> None:
    """``linkpath`` (``last.ckpt``) as a relative link to ``filepath``, swapped in atomically (never
    a moment without one); a copy where no link can be made."""
    try:
        with atomic_path(linkpath) as temporary:
            os.symlink(os.path.relpath(filepath, os.path.dirname(linkpath)), temporary)
    except OSError:
        shutil.copy(filepath, linkpath)


def in_folder(state: dict[str, Any], dirpath: str | os.PathLike | None) -> dict[str, Any]:
    """A ModelCheckpoint's ``state`` of the checkpoints it saved, read in ``dirpath`` where it names
    another folder: a file of its folder is the one of that name in ``dirpath``, or forgotten where
    there is none (its score and rank with it)."""
    before = state.get("dirpath")
    if dirpath is None or before is None:
        return state
    if os.path.abspath(before) == os.path.abspath(dirpath):
        return {**state, "dirpath": dirpath}

    def moved(path: Any) -> str:
        if not path or os.path.dirname(os.path.abspath(path)) != os.path.abspath(before):
            return path
        here = os.path.join(dirpath, os.path.basename(path))
        return here if os.path.exists(here) else ""

    state = {**state, "dirpath": dirpath}
    for key in ("best_model_path", "kth_best_model_path", "last_model_path"):
        if key in state:
            state[key] = moved(state[key])
    if "best_k_models" in state:
        state["best_k_models"] = {here: score for path, score in state["best_k_models"].items() if (here := moved(path))}
    if not state.get("best_model_path"):
        state["best_model_score"] = None
    if not state.get("kth_best_model_path"):
        state.pop("kth_value", None)
    return state


class ValidateLastStep(L.Callback):
    """Ask Lightning to validate after the last training step (``trainer.max_steps``): stopping
    there through ``trainer.should_stop``, which Lightning honours with a validation."""

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if 0 < trainer.max_steps <= trainer.global_step:
            trainer.should_stop = True


class StepCheckpoint(ModelCheckpoint):
    """A ModelCheckpoint that saves a step Lightning is about to validate once that validation has
    ended, by Lightning's own deferral (the one it uses for a monitored metric validation computes).
    Steps without a validation are saved at the end of their batch, as before. The loggers are
    flushed before each save; ``last.ckpt`` is a link to the newest. ``save_last_step``: the last
    step (``trainer.max_steps``) is saved too, so that ``last.ckpt`` of a finished run is the model
    it ended with; so is a step after whose validation training stops (callbacks.early_stopping).
    ``average_last`` and ``average_every_n_steps``: §6.1's window before the last step
    (aiayn.config.checkpointing), in which its steps are saved and no others."""

    def __init__(self, *args: Any, save_last_step: bool = False, average_last: int | None = None,
                 average_every_n_steps: int | None = None, **kwargs: Any):
        # A name is a step's: saved again (a resumed run retraining it), it is that step again,
        # written over atomically, never a Lightning "-v1" copy beside it (last.ckpt included).
        super().__init__(*args, enable_version_counter=False, **kwargs)
        self.save_last_step = save_last_step
        self.average_last, self.average_every_n_steps = average_last, average_every_n_steps
        self._window: range | None = None  # its steps, once the run's last step is known (setup)
        self._before_validation = False
        self._saved_step: int | None = None  # a step just saved, whose strays go once last.ckpt names it

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self._window = window_steps(trainer.max_steps, self.average_last, self.average_every_n_steps)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        # The step a run resumed from is saved (it is the checkpoint resumed). Lightning starts its
        # record of the step saved last at 0 whatever the step, so with accumulated batches it saved
        # the resumed step again after the first batch of the next: half a step, over a whole one.
        self._last_global_step_saved = trainer.global_step

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # A run folder moved or copied (from a cluster's scratch, say) holds its checkpoints under the
        # same names: the record of them is read in this folder. Lightning, given the old folder, kept
        # only the old best_model_path, with a warning that the rest was not reloaded.
        super().load_state_dict(in_folder(state_dict, self.dirpath))

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._before_validation = validation_follows(trainer)
        window = self._window
        try:
            if self.save_last_step and 0 < trainer.max_steps <= trainer.global_step:
                self._save_now(trainer)  # the model the run ends with, whatever every_n_train_steps is
            elif window is not None and trainer.global_step >= window.start:
                if trainer.global_step in window:
                    self._save_now(trainer)
            else:
                super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        finally:
            self._before_validation = False

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning's smoke test (trainer.fast_dev_run) suppresses checkpoints, as it says, but its
        # ModelCheckpoint still wrote last.ckpt when training ended (Lightning 2.6).
        if not trainer.fast_dev_run:
            super().on_train_end(trainer, pl_module)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if trainer.should_stop and trainer.state.fn == TrainerFn.FITTING:
            # Training stops after this validation (callbacks.early_stopping): its step is the model
            # the run ends with, saved whatever every_n_train_steps is (once: a step saved is skipped).
            self._save_now(trainer)

    def _monitor_candidates(self, trainer: L.Trainer) -> dict[str, Any]:
        # The step saved is the trainer's: a validation logs the step it validated as "step" (for the
        # loggers' x-axis, aiayn.training.module), which Lightning would take for the steps after it.
        candidates = super()._monitor_candidates(trainer)
        candidates["step"] = torch.tensor(trainer.global_step)
        return candidates

    def _save_now(self, trainer: L.Trainer) -> None:
        if not self._should_skip_saving_checkpoint(trainer):
            candidates = self._monitor_candidates(trainer)
            self._save_topk_checkpoint(trainer, candidates)
            self._save_last_checkpoint(trainer, candidates)

    def _save_topk_checkpoint(self, trainer: L.Trainer, monitor_candidates: dict[str, Any]) -> None:
        if self._before_validation:
            self._defer_save_until_validation = True  # on_validation_end saves it (and last.ckpt)
            return
        super()._save_topk_checkpoint(trainer, monitor_candidates)

    def _save_last_checkpoint(self, trainer: L.Trainer, monitor_candidates: dict[str, Any]) -> None:
        if self._before_validation:
            self._defer_save_until_validation = True
            return
        super()._save_last_checkpoint(trainer, monitor_candidates)
        if self._saved_step is not None:  # after last.ckpt names the new one: it never names a file removed
            step, self._saved_step = self._saved_step, None
            self._drop_strays(trainer, step)

    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        # What the loggers hold goes to disk first (the CSV logger writes every 100 steps): every
        # metric of the steps a checkpoint holds, its validation's included, outlives a kill.
        for logger in trainer.loggers:
            logger.save()
        super()._save_checkpoint(trainer, filepath)
        self._saved_step = trainer.global_step
        if not self.save_last:
            self._saved_step = None
            self._drop_strays(trainer, trainer.global_step)

    @staticmethod
    def _link_checkpoint(trainer: L.Trainer, filepath: str, linkpath: str) -> None:
        # ``last.ckpt`` as a link to the newest checkpoint (save_last="link"), not a second copy of
        # its bytes (2.5 GB for big, written and hashed at every save), swapped in atomically once
        # that checkpoint is on disk (after_saves), so that it never names a file not yet written.
        if trainer.is_global_zero and os.path.abspath(filepath) != os.path.abspath(linkpath):
            after_saves(trainer, link_last, filepath, linkpath)
        trainer.strategy.barrier()

    def _remove_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        # Which step checkpoints go is :meth:`_drop_strays`'s alone: Lightning's choice follows the
        # files it saved itself in this attempt and the ones before, which a preempted or extended
        # run's history leaves incomplete (and it never removes the one resumed from).
        if not STEP_FILE.match(Path(filepath).name):
            super()._remove_checkpoint(trainer, filepath)

    def _drop_strays(self, trainer: L.Trainer, step: int) -> None:
        """Remove the step checkpoints older than ``step`` (just saved) that an uninterrupted run of
        these settings would not keep now: beyond the newest ``save_top_k`` of the steps it saves, or
        never saved by it (a preempted attempt's step, aiayn.training.preemption; a step of an
        earlier attempt with another ``optim.train_steps``, whose window or last step was elsewhere).
        They go once ``step`` is on disk and ``last.ckpt`` names it (through the run's checkpoint
        writer, in order with its saves), the one resumed from included; newer ones (a resume past
        a damaged one) are left. In the window, a stray left there would be one of the newest
        ``average_last`` that §6.1's average takes."""
        if self.dirpath is None:
            return
        keep = kept_before(step, self.save_top_k, self._every_n_train_steps, self._window)
        for path in Path(self.dirpath).glob("step*.ckpt"):
            match = STEP_FILE.match(path.name)
            saved = int(match.group(1)) if match else None
            if saved is not None and saved < step and saved not in keep:
                trainer.strategy.remove_checkpoint(path)  # rank zero's; its digest with it
