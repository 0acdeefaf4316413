"""A preemption signal as train starts, before its set-up window opens: held until it does.

From ``python src/train.py`` (or ``aiayn-train``) starting, through its imports (torch, Lightning:
seconds) and Hydra's composition of its config, to the opening of the set-up window
(aiayn.training.before_training), a SIGTERM, SIGUSR1 or SIGUSR2 took the default action: the process
ended at once with status 143 (SIGTERM) and no word. What a run does with such a signal depends on
its config (``callbacks.preemption``: ``enabled``, its ``signals``, ``requeue``), which is not known
before it is composed, so from the start this module only holds the first that comes (:func:`hold`,
aiayn.launch). The window, opening with the composed config, takes it (:func:`take`) and gives it
to the run as if it came then: one of the run's preemption signals stops the run in its one line with
status 75 (requeueing the SLURM job as its settings say), any other signal, or any with preemption
off, has the default action it would have had. A start that ends before any window opens (a help
page, ``--cfg job``, a config refused) gets the held signal's default action as it ends
(:func:`release`). SIGINT is not held: Ctrl-C while train starts is aiayn.launch's (one line, 130).

Nothing here imports more than the standard library, so that it is in place before the imports.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

HELD = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)  # the preemption's signals a start can get but Ctrl-C

_before: dict[int, Any] = {}  # each held signal's handler before :func:`hold`
_held: list[int] = []  # the first signal that came
_owner: int | None = None  # the process that holds them (a forked child inherits the handler, not the hold)


def hold() -> None:
    """From now until :func:`take`: the first of :data:`HELD` to come is held, not acted on."""
    global _owner
    if threading.current_thread() is not threading.main_thread() or _before:
        return
    _owner = os.getpid()
    for signum in HELD:
        _before[signum] = signal.signal(signum, _hold)


def _hold(signum: int, frame: Any) -> None:
    if os.getpid() != _owner:  # a process forked meanwhile: the action it would have had
        signal.signal(signum, _before.get(signum) or signal.SIG_DFL)
        signal.raise_signal(signum)
    elif not _held:
        _held.append(signum)


def take() -> int | None:
    """The end of holding: each signal's earlier handler back, and the signal held (None: none came).
    The caller gives it to the run (``signal.raise_signal``) once its own handlers are in place."""
    global _owner
    if threading.current_thread() is not threading.main_thread():
        return None  # (handlers are the main thread's: release() takes it as train ends)
    for signum, handler in _before.items():
        if signal.getsignal(signum) is _hold:
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
    _before.clear()
    _owner = None
    return _held.pop() if _held else None


def release() -> None:
    """As train ends: a signal still held (no set-up window opened) has the action it would have had."""
    signum = take()
    if signum is not None:
        signal.raise_signal(signum)
