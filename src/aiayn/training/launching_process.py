"""What stopped a rank: the signal it got, or the end of the process that launched it.

torch starts ``ddp_spawn``'s ranks with ``PR_SET_PDEATHSIG`` set to SIGINT
(``torch.multiprocessing.spawn``): when their launching process ends without passing a signal on
(SIGKILL, the OOM killer), each rank gets a SIGINT nobody sent. The preemption callback saves the
step reached on it as on any of its signals (aiayn.training.preemption); its lines then say that
the launching process ended, not that the run was interrupted with Ctrl-C. A SIGINT while the
launching process lives (a Ctrl-C in the terminal, or one it passed on) is named as it is.
"""

from __future__ import annotations

import multiprocessing
import signal


def ended_launcher() -> int | None:
    """The process id of the process that started this one through multiprocessing (``ddp_spawn``'s
    launching process) once it has ended; None while it lives, or where no such process started it."""
    parent = multiprocessing.parent_process()
    if parent is None or parent.is_alive():
        return None
    return parent.pid


def named(signum: int) -> str:
    """The signal's name; for the SIGINT of a launching process that ended, that end."""
    pid = ended_launcher() if signum == signal.SIGINT else None
    return signal.Signals(signum).name if pid is None else f"the launching process (pid {pid}) ended"


def stopped_at(signum: int, step: int) -> str:
    """How a preemption's line begins: ``preempted by SIGTERM at step 9``, or ``stopped at step 9:
    the launching process (pid 4242) ended``."""
    name = named(signum)
    return f"preempted by {name} at step {step}" if name.startswith("SIG") else f"stopped at step {step}: {name}"
