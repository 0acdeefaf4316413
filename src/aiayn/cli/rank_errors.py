"""How a DDP job's failures read: another rank gone (a child of ``ddp_spawn`` that died, a
collective that lost its peer), or the other nodes of a multi-node run that never joined. Exception
classes are looked up in ``sys.modules``, as aiayn.cli.errors does: nothing of torch is imported."""

from __future__ import annotations

import re
import sys
from typing import Any


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
