"""How a DDP job's failures read: another rank gone (a child of ``ddp_spawn`` that died, a
collective that lost its peer), the other nodes of a multi-node run that never joined, or an error
the user can fix raised in a rank of ``ddp_spawn`` (:func:`user_error_of_a_rank`,
:func:`os_error_of_a_rank`); and ``ddp``'s rank that Lightning kills as another has died, which
says the line first (:func:`report_dead_ranks_before_lightning_kills`). Exception classes are
looked up in ``sys.modules``, as aiayn.cli.errors does: nothing of torch is imported."""

from __future__ import annotations

import ast
import builtins
import errno
import re
import sys
from typing import Any

from aiayn.cli.naming import say
from aiayn.errors import UserError
from aiayn.files import no_room


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


_HEADER = "Traceback (most recent call last):"


def _raised(error: BaseException) -> list[list[str]]:
    """What a rank of ``ddp_spawn`` raised, as torch gives it to the launching process (the rank's
    traceback as text, in a ``ProcessRaisedException``): for each error of its chain, the cause
    first, the lines from the one it ended with on (the first after its traceback header that is
    not a frame: frames are indented), ``<module>.<class>: <message>``; [] for any other error."""
    if not is_a(error, "torch.multiprocessing", "ProcessRaisedException"):
        return []
    raised = []
    for block in str(error).split(_HEADER)[1:]:
        lines = block.splitlines()
        first = next((at for at, line in enumerate(lines) if line.strip() and not line[0].isspace()), None)
        raised.append(lines[first:] if first is not None else [])
    return raised


def user_error_of_a_rank(error: BaseException) -> UserError | None:
    """The :class:`UserError` a rank of ``ddp_spawn`` raised (a test split found damaged, a setting
    refused as the data loads), made again in the launching process: its class and message (it runs
    to the end of the text); None for any other error. A class of a module this process never
    imported is not taken for one."""
    lines = (_raised(error) or [[]])[-1]
    if not lines:
        return None
    name, _, message = lines[0].partition(": ")
    module, _, kind_name = name.rpartition(".")
    kind = getattr(sys.modules.get(module), kind_name, None) if module else None
    if not (isinstance(kind, type) and issubclass(kind, UserError)):
        return None
    message = "\n".join([message, *lines[1:]]).strip()
    try:
        return kind(message)
    except TypeError:  # a class that is made otherwise: the message, as a UserError
        return UserError(message)


_SAID_IN_ONE_LINE = (FileNotFoundError, IsADirectoryError, PermissionError)  # aiayn.cli.errors.describe's
_OS_ERROR = re.compile(r"(\w+): (?:\[Errno (\d+)\] (.*?)(?:: (.*))?|(.*))")


def os_error_of_a_rank(error: BaseException) -> OSError | None:
    """The OSError a rank of ``ddp_spawn`` raised that aiayn.cli.errors says in one line (a full
    disk, a quota or a file-size limit, also as the cause of the error the rank ended with; a path
    not there, a folder, not permitted; a read-only disk), made again in the launching process: its
    builtin class, errno, strerror and file names as Python prints them (``OSError: [Errno 28] No
    space left on device: '/path'``); None for any other error."""
    chain = _raised(error)
    for at, lines in reversed(list(enumerate(chain))):
        found = _OS_ERROR.fullmatch(lines[0]) if lines else None
        kind = getattr(builtins, found[1], None) if found else None
        if not (isinstance(kind, type) and issubclass(kind, OSError)):
            continue
        try:
            again = kind(found[5]) if found[2] is None else kind(
                int(found[2]), found[3], *_names(found[4]) if found[4] is not None else ())
        except TypeError:  # a class made otherwise (BlockingIOError's third argument is a count)
            continue
        last = at == len(chain) - 1  # the error itself; one it was raised from counts only for want of room
        if no_room(again) or last and (isinstance(again, _SAID_IN_ONE_LINE) or again.errno == errno.EROFS):
            return again
    return None


def _names(text: str) -> tuple[Any, ...]:
    """(filename,) or (filename, None, filename2) from ``'a'`` or ``'a' -> 'b'`` (reprs)."""
    for at in [None, *(match.start() for match in re.finditer(" -> ", text))]:
        try:
            if at is None:
                return (ast.literal_eval(text),)
            return ast.literal_eval(text[:at]), None, ast.literal_eval(text[at + 4:])
        except (ValueError, SyntaxError):
            continue
    return (text,)  # a name not printed as a literal (a Path object's repr): as it reads


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


def report_dead_ranks_before_lightning_kills() -> None:
    """With the ``ddp`` strategy, Lightning's launching process (rank 0) watches the ranks it
    started, every 5 s; when one has died it SIGKILLs them all and itself, which may come before
    this rank's own collective notices the lost peer and reports it (:func:`describe`). Then the
    job would end with Lightning's log line alone; this makes it say the one line first."""
    try:
        from lightning.fabric.strategies.launchers import subprocess_script
    except ImportError:
        return
    observer = getattr(subprocess_script, "_ChildProcessObserver", None)
    if observer is None or getattr(observer._terminate_all, "reports", False):
        return
    terminate_all = observer._terminate_all

    def report_then_terminate(self: Any) -> None:
        dead = [(rank, process.returncode) for rank, process in enumerate(self._child_processes, start=1)
                if process.returncode]
        if dead:
            rank, code = dead[0]
            how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
            say(f"a training process failed, so the job stopped (rank {rank} {how}). "
                "Continue from the newest checkpoint with resume=auto")
        terminate_all(self)

    report_then_terminate.reports = True
    observer._terminate_all = report_then_terminate
