"""A training run that signals itself at a chosen moment: the callback or data module a test adds to
src/train.py's command line (``signal_at(step, name)``, ``signal_while_setting_up(name)``,
``signal_while_checking_files(name)``), so that a stop lands there and not wherever a signal from
outside happens to reach. The command needs the checkout on PYTHONPATH."""

from __future__ import annotations

import os
import signal

import lightning as L

from aiayn.data.multi30k import Multi30kDataModule


class SignalAt(L.Callback):
    """Sends the signal ``name`` to its own process during the step that makes ``global_step`` equal
    ``step``; ``step`` 0: during the sanity check's validation."""

    def __init__(self, step: int, name: str):
        self.step, self.signum = step, signal.Signals[name]

    def on_train_batch_start(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step == self.step - 1:
            os.kill(os.getpid(), self.signum)

    def on_validation_batch_start(self, trainer: L.Trainer, *args) -> None:
        if self.step == 0 and trainer.sanity_checking:
            os.kill(os.getpid(), self.signum)


def signal_at(step: int, name: str) -> list[str]:
    """The overrides that add :class:`SignalAt` to a run's callbacks."""
    return ["+callbacks.signal_at._target_=tests.helpers.signals.SignalAt",
            f"+callbacks.signal_at.step={step}", f"+callbacks.signal_at.name={name}"]


class SignalWhileSettingUp(L.Callback):
    """Sends the signal ``name`` to its own process in ``fit``'s setup, once the data module has
    loaded its data and before the sanity check and the first step."""

    def __init__(self, name: str):
        self.signum = signal.Signals[name]

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            os.kill(os.getpid(), self.signum)


def signal_while_setting_up(name: str) -> list[str]:
    """The overrides that add :class:`SignalWhileSettingUp` to a run's callbacks."""
    return ["+callbacks.signal_setting_up._target_=tests.helpers.signals.SignalWhileSettingUp",
            f"+callbacks.signal_setting_up.name={name}"]


class SignalWhileCheckingFiles(Multi30kDataModule):
    """Multi30k's data module that sends the signal ``signal_name`` to its own process as the run
    checks its data files: before ``fit``, as the model, the loggers and the trainer are still to
    be built."""

    def __init__(self, *args, signal_name: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.signum = signal.Signals[signal_name]

    def check_files(self, *args, **kwargs) -> None:
        os.kill(os.getpid(), self.signum)
        super().check_files(*args, **kwargs)


def signal_while_checking_files(name: str) -> list[str]:
    """The overrides that make a Multi30k run's data module :class:`SignalWhileCheckingFiles`."""
    return ["task.datamodule._target_=tests.helpers.signals.SignalWhileCheckingFiles",
            f"+task.datamodule.signal_name={name}"]


class WaitForAStopAt(L.Callback):
    """At the step that makes ``global_step`` equal ``step``, writes the file ``sign`` and waits (at
    most ``limit_s``) until the run's preemption handler has got a signal from outside: a test
    that sends one once it sees ``sign`` stops the run at that step."""

    def __init__(self, step: int, sign: str, limit_s: float = 120.0):
        self.step, self.sign, self.limit_s = step, sign, limit_s

    def on_train_batch_start(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step != self.step - 1:
            return
        import time

        with open(self.sign, "w") as file:
            file.write(str(os.getpid()))
        received = [c for c in trainer.callbacks if hasattr(c, "received")]
        deadline = time.monotonic() + self.limit_s
        while received and received[0].received is None and time.monotonic() < deadline:
            time.sleep(0.05)


def wait_for_a_stop_at(step: int, sign: str) -> list[str]:
    """The overrides that add :class:`WaitForAStopAt` to a run's callbacks."""
    return ["+callbacks.wait_for_a_stop._target_=tests.helpers.signals.WaitForAStopAt",
            f"+callbacks.wait_for_a_stop.step={step}", f"+callbacks.wait_for_a_stop.sign={sign}"]
