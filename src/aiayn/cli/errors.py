"""How every command-line tool fails: :func:`reports_errors` wraps a tool's Hydra task function.

An error the user can fix is one line on stderr, ``<tool>: <what to change>`` (the tool named as
it was invoked: ``train.py``, ``aiayn-train``), and exit status 2:

* :class:`aiayn.errors.UserError` (``ConfigError``, ``DataError``, a checkpoint of another vocabulary, ...);
* a mandatory setting left out (``ckpt=???``: omegaconf's ``MissingMandatoryValue``), also where
  another setting reads it (aiayn.cli.unresolved, as each error of resolving the config that stands for one);
* ``FileNotFoundError``, ``IsADirectoryError``, ``PermissionError``, a read-only disk (a path that
  is not there, not readable, or not writable);
* a GPU asked for (``hardware=gpu``, ``device=cuda``) on a machine without a usable CUDA device;
* a write refused for want of room (a full disk, a quota, a file-size limit): the file, and to
  free space (what aiayn writes is written whole or not at all, aiayn.files).

A multi-node run whose other nodes never joined says how nodes are started (exit 2). A run that
stopped on its own is one line and exit status 1: non-finite losses too many steps in a row
(``NonFiniteLossError``), or another DDP rank that died (this rank's collective lost its
peer, or ``ddp_spawn`` saw a child exit or raise); the line says to continue with ``resume=auto``.
A user error a ``ddp_spawn`` rank raised is the user error itself: train makes it again in the
launching process (aiayn.cli.rank_errors.user_error_of_a_rank), its one line and exit status 2;
so too a rank's full disk, path not there, not permitted, read-only disk (os_error_of_a_rank).

Before the task function runs, Hydra composes the config: an override it cannot parse or apply,
a group option that does not exist, an interpolation it cannot resolve is also one line and exit
status 2 (:func:`reports_composition_errors`, which wraps ``@hydra.main``).

Anything else propagates with its traceback (exit status 1): that is a bug.

Exception classes are looked up in ``sys.modules`` rather than imported, so the wrapper costs no
import of torch or Lightning: an exception of a class whose module was never imported cannot occur.
"""

from __future__ import annotations

import errno
import functools
import os
import re
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from omegaconf.errors import (
    InterpolationResolutionError,
    MissingMandatoryValue,
    OmegaConfBaseException,
)

from aiayn.cli.naming import say
from aiayn.cli.rank_errors import a_rank_failed, is_a, never_joined, what_gloo_saw
from aiayn.cli.typos import named_after_the_model
from aiayn.cli.unresolved import missing_line, user_error_within
from aiayn.errors import UserError
from aiayn.files import no_room

USER_ERROR = 2  # exit status: the user can fix it
STOPPED = 1  # exit status: the run stopped on its own (resume=auto continues it)
INTERRUPTED = 130  # exit status after Ctrl-C: 128 + SIGINT, as a shell reports a process Ctrl-C ended

Result = TypeVar("Result")


def fail(message: str, status: int = USER_ERROR) -> NoReturn:
    """Print ``<tool>: message`` as one line on stderr and exit with ``status``."""
    line = " ".join(part.strip() for part in str(message).splitlines() if part.strip())
    say(line)
    stop = SystemExit(status)
    stop.message = line  # for a sweep's table of its jobs (aiayn.cli.sweep)
    raise stop


def reader_gone() -> NoReturn:
    """The reader of the output has gone (``--help | head -3``): stop quietly, as cat does, with the
    status a process killed by SIGPIPE has; nothing of stdout is left to flush at exit."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno() if sys.stdout else 1)  # None: closed (>&-)
    sys.exit(128 + signal.SIGPIPE)


def _page_written() -> None:
    """Hydra's page (``--help``, ``--cfg job``), written out now rather than at the interpreter's exit,
    where a reader that has gone (``| head -3``) would end the tool with "Exception ignored …
    BrokenPipeError" and status 120 (stdout to a pipe is block-buffered, unless PYTHONUNBUFFERED)."""
    if _task_started:
        return
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        reader_gone()


def interrupted() -> NoReturn:
    """Ctrl-C stopped the tool before it finished: one line, exit status 130."""
    fail("interrupted (Ctrl-C) before it finished; what it writes is written whole or not at all: run the same "
         "command again", INTERRUPTED)


def reports_errors(task: Callable[[Any], Result]) -> Callable[[Any], Result]:
    """Wrap a tool's task function (under ``@hydra.main``) so that the errors above end the
    process with one line and their exit status; anything else is raised unchanged."""

    @functools.wraps(task)
    def run(cfg: Any) -> Result:
        global _task_started
        _task_started = True
        try:
            return task(cfg)
        except KeyboardInterrupt:  # Ctrl-C where the tool has no way of its own to stop (prepare's, translate's)
            interrupted()
        except Exception as error:
            reported = describe(error, cfg)
            if reported is None:
                raise
            fail(*reported)

    return run


_task_started = False  # set once a tool's task function runs: composition is over


def reports_composition_errors(main: Callable[..., Result]) -> Callable[..., Result]:
    """Wrap a tool's ``@hydra.main`` function so that what Hydra refuses while composing the config
    (an unknown key, a bad override, a group option that does not exist) is one line and exit 2
    rather than Hydra's multi-line report and exit 1."""

    @functools.wraps(main)
    def run(*args: Any, **kwargs: Any) -> Result:
        global _task_started
        _task_started = False  # this invocation's composition (a process may run a tool more than once)
        # Hydra re-raises instead of printing its own report and exiting with 1, whatever the user's
        # HYDRA_FULL_ERROR says (0 would bring that report back).
        before = os.environ.get("HYDRA_FULL_ERROR")
        os.environ["HYDRA_FULL_ERROR"] = "1"
        try:
            result = main(*args, **kwargs)
            _page_written()
            return result
        except SystemExit:  # Hydra's --help exits once its page is printed
            _page_written()
            raise
        except BrokenPipeError:
            if _task_started:
                raise
            reader_gone()  # Hydra's --help or --cfg job page, piped into a reader that stopped early
        except Exception as error:
            if not _task_started and _is_mode_conflict(error):  # e.g. --multirun with --cfg job
                fail(f"{error}: --cfg job shows one job's settings, so give them without --multirun")
            written = error if isinstance(error, OSError) else error.__cause__ or error.__context__  # (its log file)
            if not _task_started and isinstance(written, OSError) and written.filename is not None:
                fail(_output_folder_message(written))
            if _task_started or not is_composition_error(error):
                raise
            within = user_error_within(error)
            fail(str(within) if within is not None else composition_message(error))
        finally:
            if before is None:
                os.environ.pop("HYDRA_FULL_ERROR", None)
            else:
                os.environ["HYDRA_FULL_ERROR"] = before

    return run


def _output_folder_message(error: OSError) -> str:
    """Hydra could not make the job's output folder (a file of that name, or under it; no
    permission) or write its log there (a read-only disk): the setting that names the folder and
    what to do."""
    setting = "hydra.sweep.dir" if any(arg in ("-m", "--multirun") for arg in sys.argv[1:]) else "hydra.run.dir"
    reason = "a file of that name is there" if isinstance(error, FileExistsError) else error.strerror
    if Path(error.filename).name in (".lock", ".job") or Path(error.filename).suffix in (".log", ".yaml"):  # in it
        return f"{setting}: cannot write {error.filename} ({reason}); give {setting}= a folder that can be written to"
    return (f"{setting}: cannot make the output folder {error.filename} ({reason}); "
            f"give {setting}= a folder that can be made there")


def _is_mode_conflict(error: BaseException) -> bool:
    """Hydra's refusal of two run modes at once, raised as a plain ValueError before composing."""
    return isinstance(error, ValueError) and str(error).startswith("Only one of --run, --multirun, --cfg")


def is_composition_error(error: BaseException) -> bool:
    hydra_errors = sys.modules.get("hydra.errors")
    kinds = (OmegaConfBaseException,) + ((hydra_errors.HydraException,) if hydra_errors else ())
    return isinstance(error, kinds)


def composition_message(error: BaseException) -> str:
    """One line for an error Hydra raised while composing: its own first lines, the cause
    (omegaconf's) and, for a missing group option, the options there are."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if "Config search path:" in lines:  # a missing config: keep what it says and the options, not the search path
        lines = lines[: lines.index("Config search path:")]
    if any(line.startswith("Available options in") for line in lines):
        at = next(i for i, line in enumerate(lines) if line.startswith("Available options in"))
        lines = [*lines[:at], f"{lines[at]} {', '.join(lines[at + 1:])}{named_after_the_model(lines[0])}"]
    match = re.match(r"Could not override '([^']+)'\.", lines[0]) if lines else None
    cause = error.__cause__
    because = str(cause).strip().splitlines()[0] if cause is not None and str(cause).strip() else ""
    if match:
        from aiayn.cli.typos import refused_key  # composes the config again: only on this path

        return refused_key(match.group(1), because or lines[0])
    message = " ".join(line if line.endswith((":", ".")) or line.startswith("Available") else f"{line}."
                       for line in lines)
    return f"{message} {because}".strip() if because and because not in message else message


def describe(error: BaseException, cfg: Any = None) -> tuple[str, int] | None:
    """(one-line message, exit status) for an error the tools report without a traceback; None
    for any other (a bug)."""
    if is_a(error, "hydra.errors", "InstantiationException") and isinstance(error.__cause__, UserError):
        error = error.__cause__  # raised by a class hydra.utils.instantiate built (a data module)
    if isinstance(error, UserError):
        return str(error), USER_ERROR
    if isinstance(error, MissingMandatoryValue):
        return missing_line(error.full_key or "a setting", getattr(error, "parent_node", None)), USER_ERROR
    if (within := user_error_within(error)) is not None:
        return str(within), USER_ERROR
    if isinstance(error, InterpolationResolutionError):
        where = f"{error.full_key}: " if getattr(error, "full_key", None) else ""
        return f"{where}{str(error).strip().splitlines()[0]}", USER_ERROR
    if (full := no_room(error)) is not None:  # a full disk, a quota, a file-size limit
        elsewhere = ", or give out= a folder on a disk with room," if _has(cfg, "out") else ""
        return (f"{_os_error(full)} while writing; nothing of that file was kept (what was written before it is "
                f"whole). Free space there{elsewhere} and run again"), USER_ERROR
    if isinstance(error, (FileNotFoundError, IsADirectoryError, PermissionError)) or _errno(error) == errno.EROFS:
        return _os_error(error), USER_ERROR
    preemption = sys.modules.get("aiayn.training.preemption")  # stopped on a signal after saving: exit 75
    if preemption is not None and (preempted := preemption.describe(error)) is not None:
        return preempted
    if is_a(error, "aiayn.training.nonfinite", "NonFiniteLossError"):
        return str(error), STOPPED
    if (joined := never_joined(error, cfg)) is not None:
        return joined, USER_ERROR
    if a_rank_failed(error):
        rank = os.environ.get("RANK") or os.environ.get("LOCAL_RANK")
        where = f" (seen by rank {rank})" if rank else ""
        lines = str(error).strip().splitlines() or [type(error).__name__]
        return (f"a training process failed, so the job stopped{where}: {what_gloo_saw(lines[-1])[:300]}. "
                "Continue from the newest checkpoint with resume=auto"), STOPPED
    if _no_gpu(error):
        setting = "device=cpu" if _has(cfg, "device") else "hardware=cpu"
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return f"this machine has no usable CUDA GPU ({first[:200]}); use {setting}", USER_ERROR
    return None


def _os_error(error: OSError) -> str:
    if error.filename is None:
        return str(error)
    path = str(error.filename) + (f" → {error.filename2}" if error.filename2 is not None else "")
    writes = "; the tool writes there: give it a folder on a disk it may write to" if _errno(error) == errno.EROFS else ""
    return f"{path}: {error.strerror or type(error).__name__}{writes}"


def _errno(error: BaseException) -> int | None:
    return getattr(error, "errno", None) if isinstance(error, OSError) else None


def _no_gpu(error: BaseException) -> bool:
    """A GPU was asked for (Lightning's accelerator, torch's device) but CUDA is not usable here."""
    torch = sys.modules.get("torch")
    if torch is None or torch.cuda.is_available():
        return False
    kinds = isinstance(error, (RuntimeError, AssertionError)) or is_a(
        error, "lightning.fabric.utilities.exceptions", "MisconfigurationException")
    return kinds and re.search(r"cuda|gpu|nvidia", str(error), re.IGNORECASE) is not None


def _has(cfg: Any, key: str) -> bool:
    try:
        return key in cfg
    except TypeError:
        return False
