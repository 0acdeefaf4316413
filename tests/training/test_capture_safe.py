"""A training step reads nothing back from the device: between one batch's start and its end —
the forward pass, the loss, backward, the step's normalisation and non-finite check, fused Adam,
the schedule and every callback of train.py — no ``.item()``, no ``bool``/``int``/``float`` of a
tensor, no ``.tolist()``/``.cpu()``, no operation whose output size depends on the data
(tests/helpers/devices.count_host_syncs). On a GPU any of them would make the host wait for the
device at every step; then CUDA could not run ahead of Python, nor a step be captured as a graph.
Values are read back only at the steps where Lightning reads its logged values
(``trainer.log_every_n_steps``) and at the progress lines. Through train.py itself, in process, on
the CPU; the GPU's own check (``torch.cuda.set_sync_debug_mode``) is in tests/gpu/test_training.py."""

from __future__ import annotations

import contextlib
from pathlib import Path

import lightning as L
import pytest

import aiayn.cli.train_run
from tests.helpers.devices import count_host_syncs
from tests.helpers.inprocess import train
from tests.helpers.runs import TINY, offline_environment

STEPS = 6


class CountFrom(L.Callback):
    """First of the callbacks: counts from a batch's start (before every other hook of it)."""

    def __init__(self) -> None:
        self.stack = contextlib.ExitStack()
        self.per_batch: list[dict[str, int]] = []
        self.seen = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.seen = self.stack.enter_context(count_host_syncs())


class CountTo(L.Callback):
    """Last of the callbacks: stops counting at the batch's end (after every other hook of it)."""

    def __init__(self, start: CountFrom) -> None:
        self.start = start

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.start.stack.close()
        self.start.per_batch.append((trainer.global_step, dict(self.start.seen.kinds)))


@pytest.mark.slow
@pytest.mark.parametrize("accumulate", [1, 2])
def test_no_training_step_reads_a_tensor_back(tmp_path: Path, data_root: Path, subword_cache: Path,
                                              monkeypatch: pytest.MonkeyPatch, accumulate: int) -> None:
    start = CountFrom()
    build = aiayn.cli.train_run.build_callbacks
    monkeypatch.setattr(aiayn.cli.train_run, "build_callbacks",
                        lambda *args: [start, *build(*args), CountTo(start)])
    train(tmp_path / "run", *TINY, "logger=csv", f"optim.train_steps={STEPS}", f"optim.tokens_per_step={1024 * accumulate}",
          "trainer.log_every_n_steps=1000", "callbacks.progress_log.every_n_steps=1000", "trainer.limit_val_batches=0",
          "checkpoint.every_n_train_steps=1000", "test_after_training=false",
          "visualize_at_end=false", env=offline_environment(), data_root=data_root, cache_dir=subword_cache)
    assert len(start.per_batch) == STEPS * accumulate
    # Every batch but the last (whose end prints the last progress line and reads the counts back).
    waits = [(step, kinds) for step, kinds in start.per_batch[:-1] if kinds]
    assert waits == []
