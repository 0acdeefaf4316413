"""A signal while a run sets up, before its first step: one line and the preemption's exit status.

Before training's first step a run checks its config and data files (fetching what is missing),
builds the model, starts its loggers, then, inside ``trainer.fit``, prepares and loads the data (the
data module's ``prepare_data`` and ``setup``: for WMT, minutes of encoding) and restores the
checkpoint a resumed run continues; only at the sanity check (else the first step) do the preemption
callback's handlers take over (aiayn.training.preemption). A signal before that ended the run
without a word of ours: Ctrl-C with Lightning's "Detected KeyboardInterrupt, attempting graceful
shutdown ..." and status 1, a SIGTERM (a kill, SLURM's preemption) with status 143.

:func:`stops_while_setting_up`, from the start of the run to that moment, handles the preemption's
signals and SIGINT: the handler stops the process at once (waiting for the data to load could take
minutes), with :class:`StoppedSettingUp`, whose message says that no step was taken and nothing of
this attempt was saved, and how to go on: a run that resumed a checkpoint continues from it with the
same command; a fresh run is run again (its folder, which holds nothing of use, is removed as a run
refused before training is: aiayn.cli.train_run). Under SLURM with ``callbacks.preemption.requeue``, a
preemption signal (not Ctrl-C) requeues the job first, so that SLURM runs the same command again.
The tools end with one line and :data:`aiayn.training.preemption.EXIT_STATUS` (75). From the moment
the preemption callback installs its handlers (:data:`~aiayn.training.preemption.TAKEN_OVER`), or
once the window is closed, this handler only gives each signal to the handler it replaced.

A preemption signal that came as train started, before the window opened (its imports, Hydra's
composition), was held (aiayn.training.starting): the window takes it, and the run, as its set-up
begins, has it as if it came then (:meth:`SettingUp.give_held`).

``ddp``'s first process passes the signal on to the ranks it launched, which stop in the same way;
``ddp_spawn``'s launching process sets nothing up inside ``fit`` (its ranks do, in processes of their
own): its window closes once its trainer is built, and it keeps its own handling from there
(aiayn.training.preemption's forwarding).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import lightning as L
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.strategies.launchers import _MultiProcessingLauncher
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from aiayn.errors import ConfigError
from aiayn.training.lightning_signals import put_back
from aiayn.training.preemption import TAKEN_OVER, Preempted, signal_numbers
from aiayn.training.slurm import requeue, slurm_job
from aiayn.training.starting import take


class StoppedSettingUp(BaseException):
    """Raised by the handler wherever the process is: as a BaseException (as KeyboardInterrupt is),
    no ``except Exception`` on the way swallows it, and Lightning's ``fit`` lets it through after
    its own cleanup (the callbacks' ``on_exception``, the loggers finished as failed)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class StoppedBeforeTraining(Preempted):
    """The one line of a run stopped by a signal before its first step (see the module's docstring)."""


def stop_message(signum: int, resumed: bool, requeues: bool = False) -> str:
    """The line of a run stopped by ``signum`` as it set up; ``requeues``: under SLURM, requeue the
    job (rank 0 does) when the signal is not Ctrl-C."""
    go_on = ("continue with the same command (it resumes the same checkpoint)" if resumed
             else "run the same command again")
    job = slurm_job()
    if requeues and job is not None and signum != signal.SIGINT and rank_zero_only.rank == 0:
        failure = requeue(job)
        go_on = (f"requeueing SLURM job {job} failed ({failure}); {go_on}" if failure
                 else f"SLURM job {job} requeued: it runs the same command again")
    return (f"stopped by {signal.Signals(signum).name} while the run set up (its data, its model), before its "
            f"first step; nothing of this attempt was saved; {go_on}")


class SettingUp:
    """The open window of :func:`stops_while_setting_up`: ``resumed`` (whether the run continues a
    checkpoint) once that is known; :meth:`attach` the trainer once it is built."""

    def __init__(self) -> None:
        self.resumed = False
        self.open = True
        self.kill: Callable[[int], Any] | None = None
        self.held: int | None = None  # a signal that came as train started, before this window

    def give_held(self) -> None:
        """The run, as its set-up begins, has the signal held since train started, as if it came now:
        one of its preemption signals stops it in this window's line; another, or any with
        preemption off, has the action it would have had."""
        signum, self.held = self.held, None
        if signum is not None:
            signal.raise_signal(signum)

    def attach(self, trainer: L.Trainer) -> None:
        """The ranks ``ddp``'s first process will launch are stopped with it; ``ddp_spawn``'s
        launching process closes the window (see the module's docstring)."""
        if isinstance(trainer.strategy.launcher, _MultiProcessingLauncher):
            self.close()
        kill = getattr(trainer.strategy.launcher, "kill", None)
        self.kill = kill if callable(kill) else None

    def close(self) -> None:
        """From here on a signal goes to the handler the window replaced (training's are in place,
        or ``fit`` has returned)."""
        self.open = False


@contextlib.contextmanager
def stops_while_setting_up(cfg: Any) -> Iterator[SettingUp]:
    """Around a run of ``cfg`` (its composed config, or the resolved one) up to its first step:
    with the preemption callback on, one of its signals or SIGINT raises
    :class:`StoppedBeforeTraining` (see the module's docstring)."""
    window = SettingUp()
    window.held = take()  # the handlers from before train started back (aiayn.training.starting)
    numbers = _signals(cfg)
    if numbers is None or threading.current_thread() is not threading.main_thread():
        yield window
        return
    before = {number: signal.getsignal(number) for number in numbers}
    fired, owner = [], os.getpid()

    def on_signal(signum: int, frame: Any) -> None:
        if os.getpid() != owner:
            return  # a forked child that inherited this handler (a data loader worker): its rank handles it
        if TAKEN_OVER.is_set() or not window.open:  # training's handlers took over, or the window closed
            _as_before(before[signum], signum, frame, reinstall=signal.getsignal(signum) is on_signal)
            return
        fired.append(signum)
        for number in numbers:  # stopping: a second Ctrl-C changes nothing
            signal.signal(number, signal.SIG_IGN)
        if window.kill is not None:
            window.kill(signum)
        raise StoppedSettingUp(signum)

    for number in numbers:
        signal.signal(number, on_signal)
    TAKEN_OVER.clear()
    try:
        yield window
    except StoppedSettingUp as stopped:
        raise StoppedBeforeTraining(stop_message(stopped.signum, window.resumed, _requeues(cfg))) from None
    finally:
        window.close()
        put_back({number: handler for number, handler in before.items()
                  if signal.getsignal(number) is on_signal or (fired and signal.getsignal(number) == signal.SIG_IGN)})


def _as_before(handler: Any, signum: int, frame: Any, reinstall: bool) -> None:
    """What ``handler`` (the one replaced) does with the signal; ``reinstall``: this handler is still
    the signal's, so ``handler`` is put back for good (else another handler passed it on to us)."""
    if reinstall:
        put_back({signum: handler})
    if callable(handler):
        handler(signum, frame)
    elif handler != signal.SIG_IGN:  # the default action (None: one not set from Python)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


# What reading the settings may raise before the config's check, which names the setting.
_UNREADABLE = (ConfigError, OmegaConfBaseException, AttributeError, TypeError, ValueError)


def _preemption(cfg: Any) -> dict:
    settings = (cfg.get("callbacks") or {}).get("preemption") or {}
    return OmegaConf.to_container(settings, resolve=True) if OmegaConf.is_config(settings) else settings


def _signals(cfg: Any) -> list[int] | None:
    """The signals the window handles: the preemption's and SIGINT; None with preemption off, or
    settings it cannot read (the config's check names those)."""
    try:
        preemption = _preemption(cfg)
        if not preemption.get("enabled", False):
            return None
        return sorted(set(signal_numbers(list(preemption.get("signals", ())))) | {int(signal.SIGINT)})
    except _UNREADABLE:
        return None


def _requeues(cfg: Any) -> bool:
    try:
        return bool(_preemption(cfg).get("requeue", True))
    except _UNREADABLE:
        return False
