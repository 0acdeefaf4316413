"""The preloaded interpreter of tests/helpers/preloaded.py, run as a script by each test process
that starts a tool: ``python tests/helpers/preloaded_interpreter.py <socket> <room>``. It imports
PRELOAD, says "ready" on stdout, then for each request on the socket (the command, its working
folder, environment, session, and file descriptors 0-2 passed along) forks a child that becomes
``python <script> <args>`` and runs it; the child's pid, then its exit status, go back over the
request's connection. It ends when its stdin closes (the test process has ended). ``<room>``, a
long blank argument, is where each child writes its own command line (``/proc/<pid>/cmdline``).

A child first forks its copy (tests/helpers/preloaded_children.py), which makes the Python
processes the child starts itself the same way, from requests that also name their descriptors'
numbers, ``python -c`` code (multiprocessing's spawn), and the signals the child ignores and blocks.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import importlib.machinery
import io
import json
import os
import selectors
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Callable

import preloaded_children  # this folder's: the processes a tool starts, forked from a copy of this one

# What it imports before it forks: the libraries every tool imports first; sacremoses (with
# joblib), which a run's or evaluate's first score imports: 0.4 s a process otherwise; and what a
# run logging to W&B imports as it starts and logs: wandb, its launch inputs (read by every
# wandb.init) and pandas (its check of each logged value): about 3 s of a 2-core CPU's time for each
# such process otherwise, half of a tiny train.py's. None starts a thread as it is imported; what
# they read of the environment then (PANDAS_*, WANDB_HTTP_TIMEOUT) is in preloaded.STARTUP, and the
# folders wandb makes then are made afresh in each child (_fresh_wandb_folders).
PRELOAD = ("torch", "lightning", "hydra", "omegaconf", "sacrebleu", "sentencepiece", "sacremoses",
           "wandb", "wandb.sdk.launch.inputs.internal", "pandas")
# The environment it started with (tests/helpers/preloaded.py's _SERVER_ENVIRONMENT).
_OWN_ENVIRONMENT = dict(os.environ)
# The handlers a fresh interpreter sets for a signal it was not given ignored.
_PYTHONS = {signal.SIGINT: signal.default_int_handler, signal.SIGPIPE: signal.SIG_IGN, signal.SIGXFSZ: signal.SIG_IGN}


def _serve(address: str) -> None:
    """Import PRELOAD, say "ready", then fork a child for each request until stdin closes."""
    fresh_signals = {number: signal.getsignal(number) for number in signal.valid_signals()
                     if signal.getsignal(number) is not None}
    for module in PRELOAD:
        __import__(module)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(64)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_write)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    selector.register(sys.stdin, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}
    print("ready", flush=True)
    while True:
        for key, _ in selector.select():
            if key.fileobj is sys.stdin:
                return
            if key.fileobj is wake_read:
                os.read(wake_read, 4096)
                _reap(children)
                continue
            connection, _ = listener.accept()
            message, fds, _, _ = socket.recv_fds(connection, 1 << 22, 3)
            pid = os.fork()
            if pid == 0:
                for open_socket in (listener, connection, *children.values()):
                    open_socket.close()
                selector.close()
                signal.set_wakeup_fd(-1)
                os.close(wake_read)
                os.close(wake_write)
                try:
                    _become(json.loads(message), fds, fresh_signals)
                finally:
                    os._exit(1)  # _become failed before the script ran (its traceback is on stderr)
            for fd in fds:
                os.close(fd)
            children[pid] = connection
            connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        _reap(children)


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        connection = children.pop(pid, None)
        if connection is not None:
            try:
                connection.sendall(json.dumps({"status": status}).encode() + b"\n")
            except OSError:
                pass  # the test has gone
            connection.close()


def _fresh_wandb_folders() -> None:
    """wandb makes two temporary folders as it is imported (the staging of its media and of its
    artifacts), removed at exit: a child would share them with this interpreter, and the first to
    exit would remove them from under the rest. Each child makes its own, as a fresh start does,
    and leaves this interpreter's alone."""
    media = sys.modules.get("wandb.sdk.data_types._private")
    artifact = sys.modules.get("wandb.sdk.artifacts.artifact")
    for folder, suffix in ((getattr(media, "MEDIA_TMP", None), "wandb-media"),
                           (getattr(getattr(artifact, "Artifact", None), "_TMP_DIR", None), "wandb-artifacts")):
        if isinstance(folder, tempfile.TemporaryDirectory):
            folder._finalizer.detach()  # this interpreter's folder: not removed when the child ends
            folder.__init__(suffix)  # the child's own, removed by its own exit (wandb registered its cleanup)


def _become(request: dict, fds: list[int], fresh_signals: dict) -> None:
    """In the forked child: become ``python <script> <args>`` and run it; never returns."""
    import random

    import numpy
    import torch

    if request["new_session"]:
        os.setsid()
    elif "pgid" in request:  # the process group of the process that started it
        with contextlib.suppress(OSError):
            os.setpgid(0, request["pgid"])
    _descriptors(fds, request.get("fd_numbers") or list(range(len(fds))))
    preloaded_children.start_copy(lambda request, fds: _become(request, fds, fresh_signals))
    if "ignored" in request:  # what a fresh interpreter has, but what its starter ignores
        fresh_signals = {number: signal.SIG_IGN if number in request["ignored"] else
                         _PYTHONS.get(number, signal.SIG_DFL) for number in signal.valid_signals()}
        signal.pthread_sigmask(signal.SIG_SETMASK, request["mask"])
    elif request["foreground"]:
        fresh_signals = {**fresh_signals, signal.SIGINT: signal.default_int_handler}
    for number, handler in fresh_signals.items():
        with contextlib.suppress(OSError, ValueError):  # SIGKILL, SIGSTOP and the C library's own
            signal.signal(number, handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    preloaded_children.show_command(request["argv"])
    code = request.get("code")
    script, *_ = sys.argv = ["-c", *request["argv"][request["argv"].index("-c") + 2:]] if code else request["argv"][1:]
    sys.orig_argv = request["argv"]
    sys.executable = request["executable"]
    sys.path[0] = "" if code else os.path.dirname(os.path.realpath(script))
    # PYTHONPATH's folders come next, as the interpreter puts them (made absolute by site).
    theirs, ours = (_folders(environment.get("PYTHONPATH")) for environment in (request["env"], _OWN_ENVIRONMENT))
    sys.path[1:] = [*dict.fromkeys(theirs), *(folder for folder in sys.path[1:] if folder not in ours + theirs)]
    _fresh_streams()
    _fresh_wandb_folders()
    random.seed()
    numpy.random.seed()
    if "OMP_NUM_THREADS" in os.environ:  # read when torch was loaded: set as a fresh start sets it
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    _ranks_from_environment()
    os._exit(_run(lambda: _run_code(code) if code else _run_as_main(script)))


def _ranks_from_environment() -> None:
    """The process's rank, which Lightning's and torchmetrics' ``rank_zero_only`` take from the
    environment as they are imported (lightning.fabric.utilities.rank_zero: RANK, LOCAL_RANK,
    SLURM_PROCID or JSM_NAMESPACE_RANK; torchmetrics.utilities.prints: LOCAL_RANK), taken again
    from this process's environment as a fresh start takes it (the preloaded interpreter took its own)."""
    from lightning.fabric.utilities.rank_zero import _get_rank, rank_zero_only

    rank_zero_only.rank = _get_rank() or 0
    prints = sys.modules.get("torchmetrics.utilities.prints")
    if prints is not None:
        prints.rank_zero_only.rank = int(os.environ.get("LOCAL_RANK", "0"))


def _descriptors(fds: list[int], numbers: list[int]) -> None:
    """The received ``fds`` as descriptors ``numbers`` (moved out of their way first)."""
    if not fds:
        return
    above = max(max(numbers), max(fds)) + 1
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, above) for fd in fds]
    for fd in fds:
        os.close(fd)
    for fd, number in zip(moved, numbers):
        os.dup2(fd, number)
        os.close(fd)


def _folders(pythonpath: str | None) -> list[str]:
    return [os.path.abspath(folder) for folder in (pythonpath or "").split(os.pathsep) if folder]


def _fresh_streams() -> None:
    """sys.stdin, stdout and stderr on the new descriptors, made as the interpreter makes them at
    start: stdout and stderr unbuffered under PYTHONUNBUFFERED (the command's environment, now
    this process's), else buffered, by lines where they are a terminal (stderr always)."""
    buffered = not os.environ.get("PYTHONUNBUFFERED")
    made = []
    for fd, (name, mode) in enumerate((("stdin", "r"), ("stdout", "w"), ("stderr", "w"))):
        old = getattr(sys, name)
        raw = io.FileIO(fd, mode, closefd=False)
        binary = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw) if buffered else raw
        lines = mode == "w" and buffered and (name == "stderr" or raw.isatty())
        made.append(io.TextIOWrapper(binary, encoding=old.encoding, errors=old.errors, newline="\n",
                                     line_buffering=lines, write_through=not buffered))
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__ = made


def _run(main: Callable[[], None]) -> int:
    """Run ``main`` (the script or ``-c`` code as ``__main__``) and end as the interpreter ends;
    the exit status."""
    interrupted = False
    try:
        main()
        status = 0
    except SystemExit as stop:
        status = _exit_status(stop.code)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        status, interrupted = 1, True
    except BaseException:  # noqa: BLE001  as the interpreter ends on an uncaught exception
        sys.excepthook(*sys.exc_info())
        status = 1
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001  a closed pipe: the interpreter's status for it
            status = 120
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return status


def _run_as_main(script: str) -> None:
    """``script`` as the interpreter runs a script: the module ``__main__``, its ``__file__`` the
    absolute path, ``sys.argv[0]`` as given."""
    import builtins
    import types

    path = os.path.abspath(script)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __builtins__=builtins, __cached__=None, __spec__=None,
                         __loader__=importlib.machinery.SourceFileLoader("__main__", path))
    sys.modules["__main__"] = main
    with io.open_code(path) as source:
        code = compile(source.read(), path, "exec")
    exec(code, main.__dict__)  # noqa: S102  the script, as python runs it


def _run_code(code: str) -> None:
    """``python -c code``: a ``__main__`` of no file."""
    import builtins
    import types

    main = types.ModuleType("__main__")
    main.__dict__.update(__builtins__=builtins, __spec__=None, __loader__=importlib.machinery.BuiltinImporter)
    sys.modules["__main__"] = main
    exec(compile(code, "<string>", "exec"), main.__dict__)  # noqa: S102  the code, as python -c runs it


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    _serve(sys.argv[1])
