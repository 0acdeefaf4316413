"""How every command-line tool fails: :func:`reports_errors` wraps a tool's Hydra task function.

An error the user can fix is one line on stderr, ``<tool>: <what to change>`` (the tool named as
it was invoked: ``train.py``, ``aiayn-train``), and exit status 2:

* :class:`aiayn.errors.UserError` (``ConfigError``, ``DataError``, a checkpoint of another
  vocabulary, ...);
* a mandatory setting left out (``ckpt=???``: omegaconf's ``MissingMandatoryValue``);
* ``FileNotFoundError``, ``IsADirectoryError``, ``PermissionError`` (a path that is not there, or
  not readable);
* a GPU asked for (``hardware=gpu``, ``device=cuda``) on a machine without a usable CUDA device.

A run that stopped on its own is one line and exit status 1: non-finite losses too many steps in
a row (``NonFiniteLossError``), or another DDP rank that died (this rank's collective lost its
peer, or ``ddp_spawn`` saw a child exit); the line says to continue with ``resume=auto``.

Anything else propagates with its traceback (Hydra prints it; exit status 1): that is a bug.

Exception classes are looked up in ``sys.modules`` rather than imported, so the wrapper costs no
import of torch or Lightning: an exception of a class whose module was never imported cannot occur.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from omegaconf.errors import MissingMandatoryValue

from aiayn.cli import tool_command, tool_name
from aiayn.errors import ConfigError, UserError

USER_ERROR = 2  # exit status: the user can fix it
STOPPED = 1  # exit status: the run stopped on its own (resume=auto continues it)

Result = TypeVar("Result")


def fail(message: str, status: int = USER_ERROR) -> NoReturn:
    """Print ``<tool>: message`` as one line on stderr and exit with ``status``."""
    line = " ".join(part.strip() for part in str(message).splitlines() if part.strip())
    print(f"{tool_name()}: {line}", file=sys.stderr, flush=True)
    sys.exit(status)


def reports_errors(task: Callable[[Any], Result]) -> Callable[[Any], Result]:
    """Wrap a tool's task function (under ``@hydra.main``) so that the errors above end the
    process with one line and their exit status; anything else is raised unchanged."""

    @functools.wraps(task)
    def run(cfg: Any) -> Result:
        try:
            return task(cfg)
        except Exception as error:
            reported = describe(error, cfg)
            if reported is None:
                raise
            fail(*reported)

    return run


def describe(error: BaseException, cfg: Any = None) -> tuple[str, int] | None:
    """(one-line message, exit status) for an error the tools report without a traceback; None
    for any other (a bug)."""
    if isinstance(error, UserError):
        return str(error), USER_ERROR
    if isinstance(error, MissingMandatoryValue):
        key = error.full_key or "a setting"
        return f"{key} is missing: give {key}=<value> (see {tool_command()} --help)", USER_ERROR
    if isinstance(error, (FileNotFoundError, IsADirectoryError, PermissionError)):
        return _os_error(error), USER_ERROR
    if _is(error, "aiayn.training.module", "NonFiniteLossError"):
        return str(error), STOPPED
    if _a_rank_failed(error):
        rank = os.environ.get("RANK") or os.environ.get("LOCAL_RANK")
        where = f" (seen by rank {rank})" if rank else ""
        lines = str(error).strip().splitlines() or [type(error).__name__]
        return (f"a training process failed, so the job stopped{where}: {lines[-1][:300]}. "
                "Continue from the newest checkpoint with resume=auto"), STOPPED
    if _no_gpu(error):
        setting = "device=cpu" if _has(cfg, "device") else "hardware=cpu"
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return f"this machine has no usable CUDA GPU ({first[:200]}); use {setting}", USER_ERROR
    return None


def check_decoding(settings: dict[str, Any]) -> None:
    """Raise ConfigError for a decoding setting given on the command line (None: not given) that
    beam search would refuse, before the checkpoint is loaded (evaluate.py, translate.py)."""
    def whole(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    for key, least in (("beam_size", 1), ("batch_size", 1), ("max_len_offset", 0)):
        value = settings.get(key)
        if value is not None and (not whole(value) or value < least):
            raise ConfigError(f"{key} must be a whole number of at least {least}, got {value!r}")
    alpha = settings.get("alpha")
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha < 0):
        raise ConfigError(f"alpha (the length penalty's exponent) must be a number, 0 or more, got {alpha!r}")
    if settings.get("kv_cache") not in (None, True, False):
        raise ConfigError(f"kv_cache must be true or false, got {settings['kv_cache']!r}")


def _os_error(error: OSError) -> str:
    if error.filename is None:
        return str(error)
    path = str(error.filename) + (f" → {error.filename2}" if error.filename2 is not None else "")
    return f"{path}: {error.strerror or type(error).__name__}"


def _is(error: BaseException, module: str, name: str) -> bool:
    kind = getattr(sys.modules.get(module), name, None)
    return isinstance(kind, type) and isinstance(error, kind)


def _a_rank_failed(error: BaseException) -> bool:
    """ddp_spawn: a child process died or raised (torch has stopped the others); ddp: this rank's
    collective found another rank gone (gloo or NCCL)."""
    if _is(error, "torch.multiprocessing", "ProcessExitedException") or _is(
            error, "torch.multiprocessing", "ProcessRaisedException"):
        return True
    if not isinstance(error, RuntimeError):
        return False
    return _is(error, "torch.distributed", "DistError") or any(
        sign in str(error) for sign in ("Connection closed by peer", "Connection reset by peer",
                                        "NCCL communicator was aborted"))


def _no_gpu(error: BaseException) -> bool:
    """A GPU was asked for (Lightning's accelerator, torch's device) but CUDA is not usable here."""
    torch = sys.modules.get("torch")
    if torch is None or torch.cuda.is_available():
        return False
    kinds = isinstance(error, (RuntimeError, AssertionError)) or _is(
        error, "lightning.fabric.utilities.exceptions", "MisconfigurationException")
    return kinds and re.search(r"cuda|gpu|nvidia", str(error), re.IGNORECASE) is not None


def _has(cfg: Any, key: str) -> bool:
    try:
        return key in cfg
    except TypeError:
        return False
