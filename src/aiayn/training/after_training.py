"""The test after training, stopped by a signal: one line and the preemption's exit status.

Training is finished and saved by then, so a SIGTERM (or Ctrl-C, or another of the preemption
signals) during the test costs only the test: the run says so and ends with
:data:`aiayn.training.preemption.EXIT_STATUS` (75); the same command with ``resume=auto`` trains
nothing more and runs the test. Without this, a SIGTERM ended the process with status 143 and no
word, Ctrl-C with Lightning's "graceful shutdown" and status 1, and under DDP with "a training
process failed".

:class:`StopsAfterTraining` is a callback, so that it acts in every process that runs the test: the
single process, each DDP rank, the ranks ``ddp_spawn`` starts for the test. Its handlers are
installed as the run sets up and do nothing new until training has finished. It comes with the
preemption callback, which has Lightning register no SIGTERM handler of its own (it would
broadcast from inside the handler, a collective at an arbitrary point: a ``ddp_spawn`` job was seen
to hang as its test began).

* One process: the signal stops it at once (the test only reads).
* Several (DDP, however launched): a rank cannot leave alone, for the others would wait for it in
  the test's closing collectives (the metrics' sync, the hypotheses' gather) until
  ``distributed.timeout_minutes``. A rank that got the signal passes it to the ranks it launched
  (``ddp``'s first process; ``ddp_spawn``'s launching process passes it on itself:
  aiayn.training.preemption), empties its remaining test batches (the step then only takes part,
  as a rank's empty share does) and, at the test's end, before those collectives, the ranks agree
  in one all-reduce and all stop with the line. A signal that reached one rank alone (a ``kill``
  of one process) stops the job once the other ranks have run their share of the test.
* ``ddp_spawn``'s launching process, which passes the signals on to its ranks, stops before the
  test's ranks are started on a signal that came as training's ranks ended, and reports the line
  however the test's ranks ended once it has passed one on (:meth:`StopsAfterTraining.around_the_test`),
  or however training's ranks ended once their last step is saved (:meth:`StopsAfterTraining.around_the_training`:
  a rank past its handlers dies of the signal passed on as it ends).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies.launchers import _MultiProcessingLauncher

from aiayn.reporting.loggers import close_runs
from aiayn.training.early_stopping import stopped_early_at
from aiayn.training.lightning_signals import put_back
from aiayn.training.preemption import EXIT_STATUS, Preempted, hold_signals, signal_numbers
from aiayn.training.saving import STEP_FILE

log = logging.getLogger(__name__)


class Stopped(BaseException):
    """Raised by the single process's handler wherever the process is, a log line's writing
    included: as a BaseException (as KeyboardInterrupt is) no ``except Exception`` on the way
    swallows it (before: logging's did, and the run went on to exit 0). The tool turns it into
    :class:`Preempted` (aiayn.cli.train_run)."""


def stop_message(signum: int, checkpoint: Path) -> str:
    saved = f"training is finished and saved ({checkpoint})" if checkpoint.exists() else "training is finished"
    return (f"stopped by {signal.Signals(signum).name} after training, before the test had finished; {saved}; "
            "the same command with resume=auto runs only the test")


def _came_late(signum: int) -> None:
    log.warning("%s came as the test ended; its results are complete", signal.Signals(signum).name)


class StopsAfterTraining(Callback):
    """Each signal of ``names`` and SIGINT, once training has finished, stops the test with one
    line naming the signal and ``checkpoint`` (the run's newest); before that it has the effect it
    had before (see the module's docstring)."""

    def __init__(self, names: list[str] | tuple[str, ...], checkpoint: Path | str):
        self.numbers = sorted(set(signal_numbers(list(names))) | {int(signal.SIGINT)})
        self.checkpoint = Path(checkpoint)
        self.received: int | None = None  # the first signal after training, in this process
        self._before: dict[int, Any] = {}  # the handlers this process had before ours
        self._trainer: L.Trainer | None = None
        self._agreed = False  # the ranks have agreed to go on: a later signal finds the test done

    def __getstate__(self) -> dict[str, Any]:  # ddp_spawn's ranks get their own, without handlers
        return {**self.__dict__, "received": None, "_before": {}, "_trainer": None, "_agreed": False}

    # -- the handlers --------------------------------------------------------------------------
    def _install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for number in self.numbers:
            if number not in self._before:
                self._before[number] = signal.getsignal(number)
            signal.signal(number, self._on_signal)

    def _restore(self) -> None:
        put_back(self._before)
        self._before = {}

    def _ignore(self) -> None:
        """Stopping: a second signal changes nothing."""
        for number in self.numbers:
            signal.signal(number, signal.SIG_IGN)

    def _finished(self) -> bool:
        trainer = self._trainer
        return trainer is not None and (trainer.testing or trainer.fit_loop.done)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if not self._finished():  # setting up or training: as without this callback
            put_back({signum: self._before.get(signum)})
            signal.raise_signal(signum)
            return
        if self.received is None:
            self.received = signum
        trainer = self._trainer
        kill = getattr(trainer.strategy.launcher, "kill", None)  # the ranks ddp's first process started
        if callable(kill):
            kill(signum)
        if trainer.world_size == 1:
            self._ignore()
            raise Stopped(stop_message(signum, self.checkpoint))
        # Several ranks: the test's remaining batches are emptied and the ranks stop together at its end.

    # -- ddp_spawn's launching process -------------------------------------------------------------
    @contextlib.contextmanager
    def around_the_training(self, trainer: L.Trainer) -> Iterator[None]:
        """``fit``, in the process that calls it. ``ddp_spawn``'s launching process passes a
        signal on to training's ranks; one that comes as they end, their last step saved, can kill
        a rank that no longer handles it, and ``fit`` fails: training is finished and saved all the
        same, and the line says so (not "as the training processes started", which
        aiayn.training.preemption says of ranks killed by it before their first step)."""
        try:
            yield
        except Exception:
            if isinstance(trainer.strategy.launcher, _MultiProcessingLauncher) and self._saved_its_last_step(trainer):
                passed = hold_signals(False)
                if passed is not None:
                    raise Preempted(stop_message(passed, self.checkpoint)) from None
            raise

    def _saved_its_last_step(self, trainer: L.Trainer) -> bool:
        """The run's newest checkpoint is of the last step training was to take, or of the step it
        stopped early at (aiayn.training.early_stopping)."""
        newest = self.checkpoint.resolve()
        found = STEP_FILE.match(newest.name)
        if found is None or not newest.is_file():
            return False
        step = int(found.group(1))
        return step == trainer.max_steps or stopped_early_at(newest) == step

    @contextlib.contextmanager
    def around_the_test(self, trainer: L.Trainer) -> Iterator[None]:
        """The test, in the process that calls ``fit`` and ``test``. ``ddp_spawn``'s launching
        process, which passes the signals on to its ranks (aiayn.training.preemption), starts new
        ranks for the test: it stops before them on a signal it passed on to training's ranks as
        their training ended (they no longer act on it), and holds one that comes while no rank
        lives."""
        if not isinstance(trainer.strategy.launcher, _MultiProcessingLauncher):
            yield
            return
        passed = hold_signals()
        if passed is not None:
            hold_signals(False)
            raise Preempted(stop_message(passed, self.checkpoint))
        try:
            yield
        except Exception:
            passed = hold_signals(False)
            if passed is None:
                raise
            # The ranks were told to stop: however they ended (they stop together, or one that was
            # still starting had no handler yet and died of the signal), the test stopped on it.
            raise Preempted(stop_message(passed, self.checkpoint)) from None
        finally:
            passed = hold_signals(False)  # (None after the lines above)
        if passed is not None:  # the ranks had agreed to go on: the test is done
            _came_late(passed)

    # -- the hooks -----------------------------------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._trainer = trainer
        self._install()

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._agreed = False

    def on_test_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int,
                            dataloader_idx: int = 0) -> None:
        if self.received is not None and isinstance(batch, dict) and "index" in batch:
            batch["index"] = batch["index"][:0]  # TranslationModule's step then only takes part

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        received = torch.tensor(self.received or 0, device=trainer.strategy.root_device)
        if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
            dist.all_reduce(received, op=dist.ReduceOp.MAX)  # before the module's own collectives
        signum = int(received.item())
        if signum:
            self._ignore()
            raise Preempted(stop_message(signum, self.checkpoint))
        self._agreed = True

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "test":
            return
        if self.received is not None and self._agreed:
            _came_late(self.received)
        self._restore()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._restore()
        if isinstance(exception, (Preempted, Stopped)) and trainer.is_global_zero:  # before Lightning ends them as failed
            close_runs(trainer.loggers, preempted_exit=EXIT_STATUS)
