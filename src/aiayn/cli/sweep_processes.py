"""A sweep whose jobs run here as processes of their own: ``hydra/launcher=submitit_local``.

Hydra's basic launcher runs each job in the sweep's process, where a SIGTERM reaches the job's
training (aiayn.training.preemption: the step saved, exit 75). submitit's local launcher starts a
process for each job (through a controller process of its own, which hands a SIGTERM on to it) and
waits for them; the sweep's process held a SIGTERM (aiayn.training.starting, as train starts) until
every job had finished, then ended with status 143 after a table of jobs "done". Here:

* :func:`signals_handed_on`: while the jobs run, a SIGTERM to the sweep is handed on to each job's
  process, which stops as a plain ``train.py`` does (preempted, exit 75; a job still setting up
  stops there); one held since the sweep started is handed on as the jobs start. SIGINT (Ctrl-C in
  a terminal) reaches the jobs' processes without help: they are in the terminal's process group.
* :class:`ExitAsReturn`: a job's exit (``sys.exit(75)``, a refusal's ``sys.exit(2)`` with its one
  line) is returned to the sweep as :class:`JobExited`, so that its table says each job's status
  and exit (before: the job's process ended without a result, which submitit reported as a failure
  of the whole batch), and the sweep stops launching after a stop as with Hydra's basic launcher.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from aiayn.training import starting

_CONTROLLER = b"submitit.local._local"  # the module each job's controller process runs


class JobExited(Exception):
    """A job's process ended with ``sys.exit(code)``; ``message``: its one line, where it said one."""

    def __init__(self, code: int, message: str | None = None):
        super().__init__(code, message)
        self.code, self.message = code, message

    def __str__(self) -> str:
        return self.message or f"exit {self.code}"


class ExitAsReturn:
    """The job's task function, its ``SystemExit`` raised as :class:`JobExited`: Hydra's ``run_job``
    returns that as the job's failure, which submitit hands back to the sweep."""

    def __init__(self, task_function: Callable[[DictConfig], Any]):
        self.task_function = task_function

    def __call__(self, config: DictConfig) -> Any:
        try:
            return self.task_function(config)
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
            if code == 0:
                return None
            raise JobExited(code, getattr(stop, "message", None)) from None


@contextlib.contextmanager
def signals_handed_on(stopped: threading.Event) -> Iterator[None]:
    """While the jobs run: a SIGTERM to the sweep handed on to each job's process, and ``stopped`` set
    (the sweep then launches no more jobs). One held since the sweep started sets it at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = starting.take()  # a SIGTERM (SIGUSR1, SIGUSR2) that came as the sweep started

    def hand_on(signum: int, frame: Any) -> None:
        stopped.set()
        _forward()

    previous = signal.signal(signal.SIGTERM, hand_on)
    if held == signal.SIGTERM:
        stopped.set()
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
    if held is not None and held != signal.SIGTERM:
        signal.raise_signal(held)  # the action it would have had


def _forward() -> None:
    """SIGTERM to each job's controller process still running (submitit's, which hands it on to the
    job): the children of this process that run ``submitit.local._local``, as ``/proc`` lists them."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])  # after "pid (name) state"
            if parent == os.getpid() and _CONTROLLER in (stat.parent / "cmdline").read_bytes():
                os.kill(int(stat.parent.name), signal.SIGTERM)
