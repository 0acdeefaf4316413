"""What Lightning's own signal handling may do in an aiayn run. Lightning's ``_SignalConnector``
registers handlers as each stage starts: on SLURM (with auto-requeue) a SIGUSR1 handler that saves
``hpc_ckpt_<n>.ckpt`` and requeues the job; everywhere a SIGTERM handler. The SIGTERM handler
broadcasts from inside the handler (a collective at an arbitrary point, which can wait for ever for
a rank that is elsewhere) and makes the loops raise ``SIGTERMException``. That exception is a
``SystemExit`` without a status (Lightning 2.6), so a killed run ends with status 0, as if it had
finished, without saving the step under way.

* With the preemption callback (aiayn.training.preemption), Lightning registers nothing: the
  callback handles the signals itself (:func:`register_none`).
* With ``callbacks.preemption.enabled=false``, :class:`PlainSigterm` keeps Lightning's SLURM
  requeue but not its SIGTERM handler. A SIGTERM then ends the run as it ends any program: at once,
  with status 143 (killed by the signal), losing the step under way; ``resume=auto`` continues
  from the newest checkpoint.

:func:`put_back` is how every handler of aiayn's gives a signal back to the handler it had before.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Mapping
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback


def put_back(handlers: Mapping[int, Any]) -> None:
    """Each signal's handler as it was (``signal.getsignal``'s None: one not set from Python, so the
    default action), where handlers can be set: in the main thread."""
    if threading.current_thread() is threading.main_thread():
        for signum, handler in handlers.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)


def register_none(trainer: L.Trainer) -> None:
    """Lightning registers no signal handler in this trainer's stages (call it in a callback's
    ``setup``, which each stage runs before Lightning registers its handlers)."""
    connector = getattr(trainer, "_signal_connector", None)
    if connector is not None:
        connector.register_signal_handlers = _registers_none


def _registers_none() -> None:
    """In place of Lightning's ``_SignalConnector.register_signal_handlers``."""


class PlainSigterm(Callback):
    """``callbacks.preemption.enabled=false``: Lightning registers its handlers, then SIGTERM's is
    put back to what the process had (the default action: the process ends). See the module's
    docstring."""

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        connector = getattr(trainer, "_signal_connector", None)
        register = getattr(connector, "register_signal_handlers", None)
        if register is None or getattr(register, "leaves_sigterm", False):
            return

        def register_but_sigterm() -> None:
            before = {signal.SIGTERM: signal.getsignal(signal.SIGTERM)}
            register()
            put_back(before)

        register_but_sigterm.leaves_sigterm = True
        connector.register_signal_handlers = register_but_sigterm
