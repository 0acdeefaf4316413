"""How a DDP job's failures read: another rank gone (a child of ``ddp_spawn`` that died, a
collective that lost its peer), the other nodes of a multi-node run that never joined, or an error
the user can fix raised in a rank of ``ddp_spawn`` (:func:`user_error_of_a_rank`). Exception
classes are looked up in ``sys.modules``, as aiayn.cli.errors does: nothing of torch is imported."""

from __future__ import annotations

import re
import sys
from typing import Any

from aiayn.errors import UserError


def is_a(error: BaseException, module: str, name: str) -> bool:
    """Whether ``error`` is of the class ``module.name`` (False where that module was never imported)."""
    kind = getattr(sys.modules.get(module), name, None)
    return isinstance(kind, type) and isinstance(error, kind)


def what_gloo_saw(line: str) -> str:
    """gloo's message without its source location and its closing advice: ``[…/pair.cc:537] Read
    error [127.0.0.1]:652: Connection reset by peer. This is typically caused by … GLHF!`` is
    ``Read error [127.0.0.1]:652: Connection reset by peer``; any other line as it is."""
    line = re.sub(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\] ", "", line)
    return line.split(". This is typically caused by")[0].rstrip(".")


_JOINED = re.compile(r"waiting for clients\. (\d+)/(\d+) clients joined")


def never_joined(error: BaseException, cfg: Any) -> str | None:
    """torch's rendezvous gave up waiting for the job's other processes (a multi-node run whose
    other nodes were never started): what happened and how nodes are started; else None."""
    match = _JOINED.search(str(error)) if isinstance(error, RuntimeError) else None
    if match is None:
        return None
    try:
        minutes = f"={cfg.distributed.timeout_minutes}"
    except Exception:  # noqa: BLE001  a config without it: the line names the setting alone
        minutes = ""
    return (f"the job's other nodes never joined ({match[1]} of its {match[2]} processes started within "
            f"distributed.timeout_minutes{minutes}): trainer.num_nodes=N runs the same command on each of N nodes. "
            "Under SLURM, srun starts them (one task per device on every node); by hand, start it on node k with "
            "MASTER_ADDR=<node 0's address> MASTER_PORT=<one free port for all> NODE_RANK=k set, node 0 first")


def user_error_of_a_rank(error: BaseException) -> UserError | None:
    """The :class:`UserError` a rank of ``ddp_spawn`` raised (a test split found damaged, a setting
    refused as the data loads), made again in the launching process: its class and message; None
    for any other error. torch gives that process the rank's traceback as text alone, in a
    ``ProcessRaisedException``; the error it ended with is the first line after the last traceback
    header that is not a frame (frames are indented), ``<module>.<class>: <message>``, the message
    running to the end. A class of a module this process never imported is not taken for one."""
    if not is_a(error, "torch.multiprocessing", "ProcessRaisedException"):
        return None
    text = str(error)
    header = "Traceback (most recent call last):"
    lines = text[text.rfind(header) + len(header):].splitlines() if header in text else []
    first = next((at for at, line in enumerate(lines) if line.strip() and not line[0].isspace()), None)
    if first is None:
        return None
    name, _, message = lines[first].partition(": ")
    module, _, kind_name = name.rpartition(".")
    kind = getattr(sys.modules.get(module), kind_name, None) if module else None
    if not (isinstance(kind, type) and issubclass(kind, UserError)):
        return None
    message = "\n".join([message, *lines[first + 1:]]).strip()
    try:
        return kind(message)
    except TypeError:  # a class that is made otherwise: the message, as a UserError
        return UserError(message)


def a_rank_failed(error: BaseException) -> bool:
    """ddp_spawn: a child process died or raised (torch has stopped the others); ddp: this rank's
    collective found another rank gone (gloo or NCCL)."""
    if is_a(error, "torch.multiprocessing", "ProcessExitedException") or is_a(
            error, "torch.multiprocessing", "ProcessRaisedException"):
        return True
    if not isinstance(error, RuntimeError):
        return False
    return is_a(error, "torch.distributed", "DistError") or any(
        sign in str(error) for sign in ("Connection closed by peer", "Connection reset by peer",
                                        "NCCL communicator was aborted"))
