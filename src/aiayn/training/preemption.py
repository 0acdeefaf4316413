"""Stopping a training run cleanly when it is told to go: SIGTERM (a kill, SLURM's time limit or
preemption), SIGUSR1 (SLURM's warning before the time limit, ``#SBATCH --signal=USR1@120``) or
SIGUSR2 (the same warning as submitit asks for it, conf/hydra/launcher/slurm.yaml).

On such a signal the run finishes the step under way (the optimizer step included; and the
validation of a step that is validated, which its checkpoint follows: aiayn.training.saving), saves
``checkpoints/step<N>.ckpt`` through the trainer (atomically, :class:`aiayn.checkpoints.background.AtomicCheckpointIO`;
``last.ckpt`` then points at it), logs that step's metrics, finishes the W&B run so that its files
are complete, requeues the SLURM job when it runs under SLURM, and raises :class:`Preempted`: the
tools print one line, ``preempted by SIGTERM at step N ...; ... resume=auto``, and exit with status
:data:`EXIT_STATUS` (75). ``resume=auto`` continues from that checkpoint exactly (aiayn.checkpoints.resume).

How it lives with what else handles these signals:

* The handler only records the signal (nothing else is safe at an arbitrary point of the step);
  :meth:`PreemptionCallback.on_train_batch_end` acts on it at the next step boundary. It does not
  call the handler it replaces (submitit's requeues and exits from inside the handler, before any
  checkpoint).
* Lightning's own SIGTERM handling (its ``_SignalConnector``, installed as each stage starts)
  forwards the signal to the processes of a ``ddp`` launch, broadcasts from inside the handler (a
  collective at an arbitrary point, which can deadlock against the step's own, or wait for ever
  for a rank that is elsewhere), and makes the loops raise ``SIGTERMException``, a ``SystemExit``
  with status 0, without a checkpoint. So this callback has Lightning register none (``setup``):
  from the sanity check (else ``on_train_start``) to the end of training this callback's handler
  acts; after it, aiayn.training.after_training's (the test); before it, from the start of the run
  (its checks, its data, its model), aiayn.training.before_training's (one line, at once). Lightning's
  SLURM auto-requeue (its SIGUSR1 handler, which saves ``hpc_ckpt_<n>.ckpt`` from inside the
  handler, where ``resume=auto`` never looks) is switched off in favour of this.
* DDP: the signal may reach only some ranks (a ``kill`` of one process); SLURM signals every task.
  Every rank takes part in one reduction of the flag (the signal's number, 0 for none; the maximum
  over the ranks) at every step boundary: one all-reduce of one number per optimizer step, beside
  the step's own, so that all ranks stop after the same step, at most one step after the signal,
  and save together (``trainer.save_checkpoint`` is collective; rank 0 writes).
* ``ddp_spawn``: the launching process is no rank and would die of SIGTERM, taking the ranks with
  it. :func:`preemption_handling`, which builds the callback in that process, has it pass these
  signals on to the ranks instead (a rank still starting dies of it; the job says so in its own
  line: :func:`describe`); a process without spawned ranks does what it did before. Ended without
  passing one on (SIGKILL), its ranks get a SIGINT from torch: aiayn.training.launching_process.

Requeueing (``requeue``; only under SLURM, ``SLURM_JOB_ID`` set): after saving, rank 0 runs
``scontrol requeue <job>`` (as Lightning's SLURM auto-requeue); SLURM starts the batch script again,
whose command must continue the run (``resume=auto`` or a run directory), else it is not requeued
(it would start afresh), and the line says so.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
from contextlib import suppress
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Checkpoint

from aiayn.checkpoints.layout import LAST, step_file
from aiayn.errors import ConfigError
from aiayn.reporting.loggers import close_runs
from aiayn.training.launching_process import ended_launcher, named, stopped_at
from aiayn.training.lightning_signals import PlainSigterm, put_back, register_none
from aiayn.training.saving import after_saves, link_last, validation_follows, wait_for_saves
from aiayn.training.slurm import continues_itself, requeue, slurm_job

log = logging.getLogger(__name__)

# EX_TEMPFAIL of sysexits.h, "temporary failure, try again": the run stopped on purpose at a step
# boundary; the same command with resume=auto goes on.
EXIT_STATUS = 75

_stopping = False  # this process is on its way out after a preemption: the signals are ignored


class Preempted(RuntimeError):
    """Training stopped on a signal after saving the step it had reached; the message is one line
    that names the step, the checkpoint, and how the run goes on."""


def describe(error: BaseException) -> tuple[str, int] | None:
    """(one-line message, :data:`EXIT_STATUS`) for a preempted run, else None. ``ddp_spawn``'s
    launching process gets a rank's :class:`Preempted` as a ``ProcessRaisedException`` whose last
    line is the message; a ``ProcessExitedException`` of a rank that died of a signal passed on to
    it, which had no handler yet: it was starting (after training, aiayn.training.after_training's)."""
    if isinstance(error, Preempted):
        return str(error), EXIT_STATUS
    kind = type(error).__name__ if type(error).__module__.startswith("torch.multiprocessing") else None
    last = (str(error).strip().splitlines() or [""])[-1]
    if kind == "ProcessRaisedException" and last.startswith(prefix := f"{__name__}.{Preempted.__name__}: "):
        return last[len(prefix):], EXIT_STATUS
    name = getattr(error, "signal_name", None)
    if kind == "ProcessExitedException" and _passed_on is not None and name == signal.Signals(_passed_on).name:
        return (f"stopped by {name} as the training processes started, before their first step; nothing of this "
                "attempt was saved; continue with the same command and resume=auto"), EXIT_STATUS
    return None


def preemption_handling(enabled: bool, dirpath: str, signals: list[str] | tuple[str, ...] = ("SIGTERM",),
                        requeue: bool = True, resume: str | None = None) -> PreemptionCallback | PlainSigterm:
    """The :class:`PreemptionCallback` of conf/callbacks/default.yaml (``dirpath``, ``resume``: the
    run's); this process then passes ``signals`` on to the ranks it spawns (``ddp_spawn``). Not
    ``enabled``: none of this; Lightning's SIGTERM handler is kept off too (aiayn.training.lightning_signals)."""
    if not enabled:
        return PlainSigterm()
    numbers = signal_numbers(signals)
    _forward_to_spawned_ranks(numbers)
    return PreemptionCallback(dirpath, numbers, requeue=requeue, resume=resume)


class PreemptionCallback(Checkpoint):
    """On one of ``signals``, save ``<dirpath>/step<N>.ckpt`` at the next step boundary and stop
    training with :class:`Preempted` (see the module's docstring). ``requeue``: under SLURM, requeue
    the job after saving, when ``resume`` (the run's setting) makes the requeued job continue.

    A :class:`Checkpoint`, so that Lightning runs it after every other callback at the end of a
    batch: the checkpoint holds their state after the step (tokens counted, say), as a
    ModelCheckpoint's does."""

    def __init__(self, dirpath: str, signals: list[int], requeue: bool = True, resume: str | None = None):
        self.dirpath = Path(dirpath)
        self.signals = list(signals)
        self.requeue = requeue
        self.resume = resume
        self.received: int | None = None  # the first of `signals` this process got
        self._previous: dict[int, Any] = {}  # the handlers ours replaced while training
        self._checked_step: int | None = None
        self._saved: tuple[int, Path] | None = None  # (step, checkpoint) once saved: stop at the next hook
        self._after_validation: int | None = None  # a step to save when its validation has ended

    # -- the signal ----------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.received is None:
            self.received = signum  # only this: the step goes on, the boundary acts

    def _install(self) -> None:
        if self._previous:
            return  # installed already (at the sanity check)
        if threading.current_thread() is not threading.main_thread():
            log.warning("preemption: not in the main thread, so no signal handlers; a signal ends training as before")
            return
        for signum in self.signals:
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._on_signal)
        TAKEN_OVER.set()  # a signal while the run set up stopped it at once; from here on, at a step boundary

    def _restore(self) -> None:
        put_back(self._previous)
        self._previous = {}

    # -- the hooks -----------------------------------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # Lightning registers its handlers as each stage starts, after this hook: none, in every
        # process of the run (see the module's docstring; a ddp_spawn test was seen to hang).
        register_none(trainer)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Before Lightning installs its handlers: one owner of requeueing (see the module's docstring).
        environment = getattr(trainer.strategy, "cluster_environment", None)
        if environment is None:  # a single-device strategy keeps it in the connector only
            environment = getattr(getattr(trainer, "_accelerator_connector", None), "cluster_environment", None)
        if getattr(environment, "auto_requeue", False):
            environment.auto_requeue = False

    def on_sanity_check_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.received, self._saved, self._after_validation = None, None, None
        self._install()  # a signal during the sanity check stops training after its first step

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._previous:
            self.received, self._saved, self._after_validation = None, None, None
        self._checked_step = trainer.global_step  # a resumed run's first boundary is the next step
        self._install()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step
        if step == self._checked_step or self._saved is not None or self._after_validation is not None:
            return  # no optimizer step since the last boundary (gradient accumulation)
        self._checked_step = step
        # Every rank, every step: stop when any rank got a signal (the highest-numbered one, to name it).
        received = torch.tensor(self.received or 0, device=trainer.strategy.root_device)
        if trainer.world_size > 1 and dist.is_available() and dist.is_initialized():
            dist.all_reduce(received, op=dist.ReduceOp.MAX)  # one collective (Lightning's reduce adds a barrier)
        received = int(received.item())
        if not received:
            return
        self.received = received
        if validation_follows(trainer):  # saved once it has ended, as every validated step (aiayn.training.saving)
            log.warning("preemption: %s; validating step %d, then saving it", named(received), step)
            self._after_validation = step
            return
        self._save(trainer, step)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._after_validation is not None and not trainer.sanity_checking:
            step, self._after_validation = self._after_validation, None
            self._save(trainer, step)

    def _save(self, trainer: L.Trainer, step: int) -> None:
        path = step_file(self.dirpath, step)
        log.warning("preemption: %s; saving step %d to %s", named(self.received), step, path)
        if not self._saved_just_now(trainer, path):  # else a ModelCheckpoint saved this step a moment ago
            wait_for_saves(trainer)  # a save under way first: a wait here says nothing of how often saves come
            trainer.save_checkpoint(path, weights_only=False)  # collective; rank 0 writes, atomically
            if trainer.is_global_zero:
                self._point_last_at(trainer, path)
        wait_for_saves(trainer)  # on disk (checkpoint.in_background) before the run says it is saved
        self._saved = (step, path)
        # The step's metrics are logged after this hook; the run stops at the next one.

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,
                             batch_idx: int) -> None:
        self._stop_if_saved(trainer)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop_if_saved(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop_if_saved(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop_if_saved(trainer)
        self._restore()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, Preempted):
            self._restore()
        # Preempted: ours stay until Lightning puts back the handlers from before `fit` (the
        # forwarding below, which then ignores these signals), so that the SIGTERM SLURM sends
        # after a requeue never reaches Lightning's handler and its collective.

    # -- stopping ------------------------------------------------------------------------------
    def _stop_if_saved(self, trainer: L.Trainer) -> None:
        if self._saved is None:
            return
        global _stopping
        _stopping = True
        step, path = self._saved
        message = None
        if trainer.is_global_zero:  # every rank reaches this hook, the same one
            close_runs(trainer.loggers, preempted_exit=EXIT_STATUS)  # complete (offline) or uploaded (online)
            message = f"{stopped_at(self.received, step)}; saved {path}; {self._go_on()}"
            if ended_launcher() is not None:  # no process is left to print it (ddp_spawn's ranks)
                log.warning("%s", message)
        message = trainer.strategy.broadcast(message, src=0)  # also: no rank leaves before rank 0 is done
        raise Preempted(message)

    def _go_on(self) -> str:
        """How the run continues: the requeued SLURM job, or the user with resume=auto."""
        again = "continue with the same command and resume=auto"
        job = slurm_job()
        if not self.requeue or job is None:
            return again
        if not continues_itself(self.resume):
            return (f"SLURM job {job} not requeued: its command has resume={self.resume}, so it would start "
                    f"afresh; {again}")
        failure = requeue(job)
        if failure:
            return f"requeueing SLURM job {job} failed ({failure}); {again}"
        return f"SLURM job {job} requeued: it continues from this checkpoint (resume={self.resume})"

    def _saved_just_now(self, trainer: L.Trainer, path: Path) -> bool:
        """Whether a ModelCheckpoint (which runs before this callback) wrote ``path`` at this step:
        its ``best_model_path`` names the file it wrote last (with no metric to monitor)."""
        return any(getattr(callback, "best_model_path", None) and Path(callback.best_model_path).resolve() ==
                   path.resolve() for callback in trainer.checkpoint_callbacks if callback is not self)

    def _point_last_at(self, trainer: L.Trainer, path: Path) -> None:
        """Make ``last.ckpt`` (a ModelCheckpoint's with ``save_last`` in this folder) a link to ``path``, the newest."""
        if not any(getattr(callback, "save_last", None) and callback.dirpath
                   and Path(callback.dirpath).resolve() == path.parent.resolve()
                   for callback in trainer.checkpoint_callbacks if callback is not self):
            return
        after_saves(trainer, link_last, path, path.parent / LAST)


def signal_numbers(names: list[str] | tuple[str, ...]) -> list[int]:
    """The numbers of the ``callbacks.preemption.signals`` setting (``SIGTERM`` or ``TERM``, any
    case); ConfigError for a name that is no signal a process can handle here."""
    numbers = []
    for name in names:
        upper = str(name).upper()
        number = getattr(signal, upper if upper.startswith("SIG") else f"SIG{upper}", None)
        if not isinstance(number, signal.Signals) or number in (signal.SIGKILL, signal.SIGSTOP):
            raise ConfigError(f"callbacks.preemption.signals: {name!r} is not a signal a process can handle here; "
                              "use names such as SIGTERM, SIGUSR1, SIGUSR2")
        numbers.append(int(number))
    return numbers


# -- the launching process of ddp_spawn -----------------------------------------------------------
# Set once the callback's handlers are installed (aiayn.training.before_training clears it as a run sets up).
TAKEN_OVER = threading.Event()
_before_forwarding: dict[int, Any] = {}  # signal → the handler this process had before
_forwarding_pid: int | None = None  # the process that installed the forwarding
_passed_on: int | None = None  # the first signal passed on to the ranks (or held), since the last hold_signals
_holding = False  # between training and the test: a signal with no rank alive to take it is held


def hold_signals(hold: bool = True) -> int | None:
    """``ddp_spawn``'s launching process, between training and the test (whose ranks are new
    processes): hold a signal that comes while no rank lives instead of acting on it, until
    ``hold_signals(False)``. Returns the signal passed on since the last call, if any: one passed
    to training's ranks as their training ended, which they no longer act on (aiayn.training.after_training)."""
    global _passed_on, _holding
    passed, _passed_on, _holding = _passed_on, None, hold
    return passed


def _forward_to_spawned_ranks(signals: list[int]) -> None:
    """Handle ``signals`` in this process by passing them on to the training processes it has
    spawned (``ddp_spawn``), which stop at a step boundary; with none, as before (its earlier
    handler, else the default action). Installed once per process; a process forked from it (a
    data loader worker) ignores them: its rank handles them and ends it."""
    global _forwarding_pid, _passed_on, _holding
    if threading.current_thread() is not threading.main_thread():
        return
    _forwarding_pid = os.getpid()
    _passed_on, _holding = None, False  # a new run (the next job of a --multirun in this process)
    for signum in signals:
        if signum not in _before_forwarding:
            _before_forwarding[signum] = signal.getsignal(signum)
            signal.signal(signum, _forward)


def _forward(signum: int, frame: Any) -> None:
    global _passed_on
    if os.getpid() != _forwarding_pid:
        return  # a forked child that inherited this handler
    # The training processes of ddp_spawn are this process's non-daemonic multiprocessing children
    # (data loader workers, also such children, are daemonic and stop with their rank).
    ranks = [p for p in multiprocessing.active_children() if not p.daemon]
    for rank in ranks:
        with suppress(ProcessLookupError):
            os.kill(rank.pid, signum)
    if ranks or _holding:
        _passed_on = _passed_on or signum
        return
    if _stopping:
        return
    before = _before_forwarding.get(signum)
    if callable(before):
        before(signum, frame)
    elif before in (signal.SIG_DFL, None):  # what the signal would have done: end the process
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
