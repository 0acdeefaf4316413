"""A signal while a run sets up inside ``fit``, before its first step: one line and the
preemption's exit status.

``trainer.fit`` first prepares and loads the data (the data module's ``prepare_data`` and
``setup``: for WMT, minutes of encoding), then builds the model on its devices and restores the
checkpoint a resumed run continues; only then, at the sanity check (else the first step), do the
preemption callback's handlers take over (aiayn.training.preemption). A signal before that ended
the run without a word of ours: Ctrl-C with Lightning's "Detected KeyboardInterrupt, attempting
graceful shutdown ..." and status 1, a SIGTERM with status 143.

:func:`stops_while_setting_up`, around ``fit``, handles the preemption's signals and SIGINT there:
the handler stops the process at once (waiting for the data to load could take minutes), with
:class:`StoppedSettingUp`, whose message says that no step was taken and nothing of this attempt
was saved, and how to go on: a run that resumed a checkpoint continues from it with the same
command; a fresh run is run again (its folder, which holds nothing of use, is removed as a run
refused before training is: aiayn.cli.train). The tools end with one line and
:data:`aiayn.training.preemption.EXIT_STATUS` (75). From the moment the preemption callback
installs its handlers (:data:`~aiayn.training.preemption.TAKEN_OVER`) this handler only gives each signal to the
handler it replaced.

``ddp``'s first process passes the signal on to the ranks it launched, which stop in the same way;
``ddp_spawn``'s launching process sets nothing up itself (its ranks do, in processes of their own),
so it keeps its own handling (aiayn.training.preemption's forwarding).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

import lightning as L
from lightning.pytorch.strategies.launchers import _MultiProcessingLauncher

from aiayn.training.lightning_signals import put_back
from aiayn.training.preemption import TAKEN_OVER, Preempted, signal_numbers


class StoppedSettingUp(BaseException):
    """Raised by the handler wherever the process is: as a BaseException (as KeyboardInterrupt is),
    no ``except Exception`` on the way swallows it, and Lightning's ``fit`` lets it through after
    its own cleanup (the callbacks' ``on_exception``, the loggers finished as failed)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class StoppedBeforeTraining(Preempted):
    """The one line of a run stopped by a signal before its first step (see the module's docstring)."""


def stop_message(signum: int, resumed: bool) -> str:
    go_on = ("continue with the same command (it resumes the same checkpoint)" if resumed
             else "run the same command again")
    return (f"stopped by {signal.Signals(signum).name} while the run set up (its data, its model), before its "
            f"first step; nothing of this attempt was saved; {go_on}")


@contextlib.contextmanager
def stops_while_setting_up(config: dict, trainer: L.Trainer, resumed: bool) -> Iterator[None]:
    """Around ``trainer.fit`` of the run of ``config`` (``resumed``: from a checkpoint): with the
    preemption callback on, one of its signals or SIGINT before its handlers take over raises
    :class:`StoppedBeforeTraining` (see the module's docstring)."""
    preemption = config["callbacks"].get("preemption") or {}
    if not preemption.get("enabled", False) or threading.current_thread() is not threading.main_thread() or \
            isinstance(trainer.strategy.launcher, _MultiProcessingLauncher):
        yield
        return
    numbers = sorted(set(signal_numbers(list(preemption.get("signals", ())))) | {int(signal.SIGINT)})
    before = {number: signal.getsignal(number) for number in numbers}

    fired, owner = [], os.getpid()

    def on_signal(signum: int, frame: Any) -> None:
        if os.getpid() != owner:
            return  # a forked child that inherited this handler (a data loader worker): its rank handles it
        if TAKEN_OVER.is_set():  # training's handlers took over, then put this one back: as before
            put_back({signum: before[signum]})
            signal.raise_signal(signum)
            return
        fired.append(signum)
        for number in numbers:  # stopping: a second Ctrl-C changes nothing
            signal.signal(number, signal.SIG_IGN)
        kill = getattr(trainer.strategy.launcher, "kill", None)  # the ranks ddp's first process launched
        if callable(kill):
            kill(signum)
        raise StoppedSettingUp(signum)

    for number in numbers:
        signal.signal(number, on_signal)
    TAKEN_OVER.clear()
    try:
        yield
    except StoppedSettingUp as stopped:
        raise StoppedBeforeTraining(stop_message(stopped.signum, resumed)) from None
    finally:
        put_back({number: handler for number, handler in before.items()
                  if signal.getsignal(number) is on_signal or (fired and signal.getsignal(number) == signal.SIG_IGN)})
