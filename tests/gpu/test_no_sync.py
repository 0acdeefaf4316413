"""On a GPU a training step never makes the host wait for the device: train.py's own loop, in
process, with torch's sync debug mode set to raise from each batch's start to its end (every batch
but the first, which makes the device's counters, and the last, whose end prints the last progress
line). The CPU's check of the same
(tests/training/test_capture_safe.py) sees reads of values; this one also sees copies to the
device that wait."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch

import aiayn.cli.train_run
from tests.helpers.inprocess import train
from tests.helpers.runs import TINY, offline_environment

pytestmark = pytest.mark.gpu
STEPS = 6


class RaiseOnSync(L.Callback):
    def __init__(self, last: bool) -> None:
        self.last = last  # the callback that ends the window: runs after every other hook of a batch

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        # From the second step: the first makes what the later ones reuse on the device (the
        # counts of skipped steps, Lightning's logged values), copies from the host that wait.
        if not self.last and 0 < trainer.global_step < STEPS - 1:
            torch.cuda.set_sync_debug_mode("error")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.last:
            torch.cuda.set_sync_debug_mode("default")


def test_a_training_step_on_the_gpu_never_waits_for_it(tmp_path: Path, data_root: Path, subword_cache: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    build = aiayn.cli.train_run.build_callbacks
    monkeypatch.setattr(aiayn.cli.train_run, "build_callbacks",
                        lambda *args: [RaiseOnSync(last=False), *build(*args), RaiseOnSync(last=True)])
    try:
        train(tmp_path / "run", *TINY, "logger=csv", f"optim.train_steps={STEPS}", "optim.tokens_per_step=2048",
              "trainer.log_every_n_steps=1000", "callbacks.progress_log.every_n_steps=1000",
              "trainer.limit_val_batches=0", "checkpoint.every_n_train_steps=1000",
              "test_after_training=false", "visualize_at_end=false", env=offline_environment(),
              data_root=data_root, cache_dir=subword_cache)
    finally:
        torch.cuda.set_sync_debug_mode("default")
