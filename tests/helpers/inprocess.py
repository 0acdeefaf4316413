"""Running a tool in this process, as tests/helpers/runs.py runs it as a process of its own: the
same interface (``run_tool``, ``train``; a ``subprocess.CompletedProcess`` back), seconds less
each (torch, Lightning and Hydra are imported once per test session, not once per run).

``run_tool("src/evaluate.py", "ckpt=...")`` calls ``aiayn.cli.evaluate.main()`` with ``sys.argv``
as the process would have it (``src/evaluate.py`` from the checkout, its full path from another
``cwd``; a console script's path for ``aiayn-evaluate``), in ``cwd``, with the environment the
process would have (``env``, else this one with W&B offline and quiet; ``data_root`` and
``cache_dir`` as AIAYN_DATA_ROOT and AIAYN_CACHE_DIR), stdin from ``stdin`` (a real file, so that
translate.py reads its file descriptor), and file descriptors 1 and 2 captured (what Python and
the libraries below it write). The exit status is ``SystemExit``'s code (0 when the tool
returns); an exception the tool lets out is its traceback on stderr and status 1, as in a process.
Other scripts (``benchmarks/*.py``, ``experiments/tables.py``) run as ``__main__``.

Afterwards everything a run changes in the process is put back: the working directory, the
environment, ``sys.argv`` and the standard streams, the logging configuration (handlers, levels;
a fresh process starts with none, so a tool's ``logging.basicConfig`` takes effect), warning
filters (a warning is printed on stderr, as a process prints it), signal handlers, Hydra's
global state, torch's thread count, float32 matmul precision and random states.

What only a process shows — a signal, a kill, an exit status set by the interpreter, several
processes (DDP), a console script as installed — stays with tests/helpers/runs.py.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import os
import random
import runpy
import signal
import subprocess
import sys
import tempfile
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import numpy
import torch

from tests.helpers.runs import REPO, offline_environment

# The signals a tool or Lightning may take over (preemption, SLURM, Ctrl-C, a closed pipe).
SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGPIPE, signal.SIGHUP,
           signal.SIGCHLD]


def run_tool(script: str, *args: str, cwd: Path = REPO, env: Mapping[str, str] | None = None,
             data_root: Path | None = None, cache_dir: Path | None = None,
             stdin: str | bytes | Path | None = None, check: bool = True, timeout: float | None = None, argv0: str | None = None) -> subprocess.CompletedProcess:
    """``script`` (``src/<tool>.py`` or another script of the checkout) with ``args``, in this
    process; the options are tests.helpers.runs.run_tool's (``timeout`` has no effect here).
    ``argv0`` is the name the tool sees itself invoked by (default: the script as a process would
    be given it); a console script's path makes it ``aiayn-<tool>``. ``stdin``: its text, or a
    file (a Path) that stdin is opened on. Returns str output, bytes when ``stdin`` is bytes; with ``check`` a non-zero exit status fails the test."""
    del timeout  # a hang fails under pytest-timeout, as any test does
    path = Path(script)
    argument0 = argv0 or (script if Path(cwd) == REPO else str(REPO / script))
    environment = offline_environment() if env is None else dict(env)
    if data_root is not None:
        environment["AIAYN_DATA_ROOT"] = str(data_root)
    if cache_dir is not None:
        environment["AIAYN_CACHE_DIR"] = str(cache_dir)
    binary = isinstance(stdin, bytes)
    command = _command(path)  # imported first: a tool module's warning filters are the process's
    with _isolated(Path(cwd), environment, [argument0, *map(str, args)], stdin) as captured:
        status = _call(command)
        _close_wandb()
    stdout, stderr = (data if binary else data.decode("utf-8", errors="replace") for data in captured.values())
    result = subprocess.CompletedProcess([argument0, *args], status, stdout, stderr)
    if check and status != 0:
        text_out, text_err = (output.decode(errors="replace") if isinstance(output, bytes) else output
                              for output in (stdout, stderr))
        raise AssertionError(f"exit status {status} from\n  {' '.join(map(str, [script, *args]))}\n(in process, cwd "
                             f"{cwd})\n--- stdout (end) ---\n{text_out[-3000:]}\n--- stderr (end) ---\n"
                             f"{text_err[-5000:]}")
    return result


def train(run_dir: Path, *overrides: str, **options) -> subprocess.CompletedProcess:
    """``src/train.py`` with ``overrides`` into ``run_dir`` (hydra.run.dir), in this process;
    options as run_tool's."""
    return run_tool("src/train.py", *overrides, f"hydra.run.dir={run_dir}", **options)


def _command(script: Path) -> Callable[[], object]:
    """What runs ``script``: a tool's ``main`` (``src/<tool>.py`` is ``aiayn.cli.<tool>``), else
    the script itself as ``__main__``, its folder first on ``sys.path`` as python puts it."""
    if script.parts[:1] == ("src",) and script.suffix == ".py":
        return importlib.import_module(f"aiayn.cli.{script.stem}").main

    def run_script() -> None:
        folder = str((REPO / script).parent)
        sys.path.insert(0, folder)
        try:
            runpy.run_path(str(REPO / script), run_name="__main__")
        finally:
            sys.path.remove(folder)

    return run_script


def _call(command: Callable[[], object]) -> int:
    """Run ``command``; its exit status."""
    try:
        command()
    except SystemExit as stop:
        return _exit_status(stop.code)
    except Exception:  # noqa: BLE001  as the interpreter ends a process on an uncaught exception
        traceback.print_exc(file=sys.stderr)
        return 1
    return 0


def _close_wandb() -> None:
    """What a process's exit does for W&B: its service closes the runs' files, so that they are
    whole when the test reads them (tests.helpers.wandb_offline)."""
    wandb = sys.modules.get("wandb")
    if wandb is not None:
        wandb.teardown()


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def signal_state() -> tuple[dict, dict]:
    """This process's handlers of :data:`SIGNALS`, and the handlers a run's preemption handling
    found as it took them over (aiayn.training.preemption: once per process, so that a later run in
    it, as in a fresh process, takes them over again once they are put back)."""
    preemption = sys.modules.get("aiayn.training.preemption")
    return ({signum: signal.getsignal(signum) for signum in SIGNALS},
            dict(preemption._before_forwarding) if preemption is not None else {})


def put_back_signals(state: tuple[dict, dict]) -> None:
    handlers, taken_over = state
    for signum, handler in handlers.items():
        if signal.getsignal(signum) is not handler:
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
    preemption = sys.modules.get("aiayn.training.preemption")
    if preemption is not None:
        preemption._before_forwarding.clear()
        preemption._before_forwarding.update(taken_over)


@contextlib.contextmanager
def _isolated(cwd: Path, environment: Mapping[str, str], argv: list[str],
              stdin: str | bytes | Path | None) -> Iterator[dict[str, bytes]]:
    """The process state a tool run sees and changes, set as a fresh process has it and put back
    afterwards; yields a dict that holds {"stdout": ..., "stderr": ...} (bytes) once it ends."""
    captured: dict[str, bytes] = {}
    saved_cwd, saved_environ, saved_argv = os.getcwd(), dict(os.environ), sys.argv
    saved_signals = signal_state()
    saved_torch = (torch.get_num_threads(), torch.get_float32_matmul_precision(), torch.get_rng_state(),
                   random.getstate(), numpy.random.get_state())
    saved_logging = _logging_state()
    saved_hydra = _hydra_config()
    redirected: list[tuple[logging.StreamHandler, object]] = []
    with contextlib.ExitStack() as stack:
        out, err = (stack.enter_context(tempfile.TemporaryFile()) for _ in range(2))
        source = stack.enter_context(_stdin(stdin))
        saved_streams = sys.stdin, sys.stdout, sys.stderr
        saved_fds = os.dup(1), os.dup(2)
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            sys.stdin = source
            sys.stdout, sys.stderr = (io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8",
                                                       errors="backslashreplace", write_through=True)
                                      for fd in (1, 2))
            redirected = _redirect_handlers(saved_logging, saved_streams[1:], (sys.stdout, sys.stderr))
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(environment)
            sys.argv = argv
            with warnings.catch_warnings():
                warnings.showwarning = _show_warning  # printed on stderr, as a process prints it
                yield captured
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os.dup2(saved_fds[0], 1)
            os.dup2(saved_fds[1], 2)
            for fd in saved_fds:
                os.close(fd)
            sys.stdin, sys.stdout, sys.stderr = saved_streams
            sys.argv = saved_argv
            os.chdir(saved_cwd)
            os.environ.clear()
            os.environ.update(saved_environ)
            put_back_signals(saved_signals)
            threads, precision, rng, python_rng, numpy_rng = saved_torch
            torch.set_num_threads(threads)
            torch.set_float32_matmul_precision(precision)
            torch.set_rng_state(rng)
            random.setstate(python_rng)
            numpy.random.set_state(numpy_rng)
            _restore_logging(saved_logging, redirected)
            _restore_hydra(saved_hydra)
            for name, handle in (("stdout", out), ("stderr", err)):
                handle.seek(0)
                captured[name] = handle.read()


@contextlib.contextmanager
def _stdin(data: str | bytes | Path | None) -> Iterator[io.TextIOWrapper]:
    """A stdin with a real file descriptor: empty (a process's /dev/null), ``data``, or the file
    ``data`` names (a Path: ``< file``)."""
    if isinstance(data, Path):
        with open(data, encoding="utf-8") as text:
            yield text
        return
    with tempfile.TemporaryFile() as handle:
        if data is not None:
            handle.write(data if isinstance(data, bytes) else data.encode("utf-8"))
            handle.seek(0)
        with io.TextIOWrapper(io.FileIO(handle.fileno(), "r", closefd=False), encoding="utf-8") as text:
            yield text


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def _loggers() -> list[logging.Logger]:
    return [logging.getLogger(), *(logger for logger in list(logging.root.manager.loggerDict.values())
                                  if isinstance(logger, logging.Logger))]


def _logging_state() -> dict[logging.Logger, tuple]:
    return {logger: (logger.level, list(logger.handlers), logger.propagate, logger.disabled) for logger in _loggers()}


def _redirect_handlers(state: dict[logging.Logger, tuple], old: tuple, new: tuple) -> list[tuple]:
    """Handlers that write to this process's stdout or stderr write to the run's instead (each
    (handler, its stream) returned, to put back); the root logger has none, as in a fresh process."""
    redirected = []
    for _, handlers, _, _ in state.values():
        for handler in handlers:
            if type(handler) is logging.StreamHandler and handler.stream in old:
                redirected.append((handler, handler.stream))
                handler.stream = new[old.index(handler.stream)]
    root = logging.getLogger()
    root.handlers = []
    root.setLevel(logging.WARNING)
    return redirected


def _restore_logging(state: dict[logging.Logger, tuple], redirected: list[tuple]) -> None:
    for logger in _loggers():
        if logger not in state:
            continue
        level, handlers, propagate, disabled = state[logger]
        for handler in logger.handlers:
            if handler not in handlers:
                with contextlib.suppress(Exception):
                    handler.close()  # a FileHandler of the run (Hydra's <job>.log): flushed and closed
        logger.handlers = handlers
        logger.setLevel(level)
        logger.propagate, logger.disabled = propagate, disabled
    for handler, stream in redirected:
        handler.stream = stream


def _hydra_config():
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.instance().cfg


def _restore_hydra(cfg) -> None:
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    HydraConfig.instance().cfg = cfg
    GlobalHydra.instance().clear()
