"""The test after training, stopped by a signal: one line and the preemption's exit status.

Training is finished and saved by then, so a SIGTERM (or Ctrl-C, or another of the preemption
signals) during the test costs only the test: the run says so and ends with
:data:`aiayn.training.preemption.EXIT_STATUS` (75); the same command with ``resume=auto`` trains
nothing more and runs the test. Without this, a SIGTERM ended the process with status 143 and no
word, and Ctrl-C with Lightning's "graceful shutdown" and status 1.

In a single process the signal is acted on at once (the test only reads). Under ``ddp_spawn`` the
test runs in other processes, which get the signal from their terminal or launcher as before.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from aiayn.training.preemption import Preempted, signal_numbers


class _Stop(BaseException):
    """Raised by the signal handler wherever the process is, a log line's writing included: as a
    BaseException (as KeyboardInterrupt is) no ``except Exception`` on the way swallows it (before:
    logging's did, and the run went on to exit 0); :class:`Preempted` once out of the block."""


@contextlib.contextmanager
def stops_on_signals(names: list[str] | tuple[str, ...], checkpoint: Path,
                     finished: Callable[[], bool] = lambda: True) -> Iterator[None]:
    """While the block runs, each signal of ``names`` and SIGINT raises :class:`Preempted` naming
    the signal and ``checkpoint`` (the run's newest) once ``finished()`` says training is done;
    before that (the block holds the training too, whose preemption callback has handlers of its
    own while it trains) the signal has the effect it had before the block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    numbers = sorted(set(signal_numbers(list(names))) | {int(signal.SIGINT)})
    before = {number: signal.getsignal(number) for number in numbers}

    def stop(signum: int, frame: Any) -> None:
        if not finished():  # setting up, before training: as without this block
            signal.signal(signum, signal.SIG_DFL if before[signum] is None else before[signum])
            signal.raise_signal(signum)
            return
        for number in numbers:  # a second signal while stopping changes nothing
            signal.signal(number, signal.SIG_IGN)
        saved = f"training is finished and saved ({checkpoint})" if checkpoint.exists() else "training is finished"
        raise _Stop(f"stopped by {signal.Signals(signum).name} after training, before the test had finished; "
                    f"{saved}; the same command with resume=auto runs only the test")

    for number in numbers:
        signal.signal(number, stop)
    try:
        yield
    except _Stop as stopped:
        raise Preempted(str(stopped)) from None
    finally:
        for number, handler in before.items():
            signal.signal(number, signal.SIG_DFL if handler is None else handler)
