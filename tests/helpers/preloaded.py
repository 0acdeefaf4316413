"""A tool's process started from an interpreter that has already imported torch, Lightning and
Hydra: the same process a user's ``python src/<tool>.py ...`` is, without its ~6 s of imports.

Each test process (each pytest-xdist worker) starts one preloaded interpreter, this file run as a
script, the first time a test starts a tool. For each run it forks a child that becomes the
process ``python <script> <args>`` would be: the file descriptors 0, 1 and 2, working folder,
environment, ``sys.argv`` and ``sys.path[0]`` as the command gives them, the signal dispositions
and standard streams a fresh interpreter starts with, fresh random seeds, a new session if asked;
then the script runs as ``__main__`` and the child ends as an interpreter ends (non-daemon
threads joined, ``atexit`` run, the streams flushed, exit status from ``SystemExit``, the
traceback and status 1 for an uncaught exception, killed by SIGINT after an uncaught Ctrl-C).
Signals, kills, exit statuses, process groups and DDP's own processes are those of real processes.

:class:`Process` is ``subprocess.Popen`` for such a child (pid, poll, wait, communicate,
send_signal, pipes); :func:`popen` gives one where the command is ``python <script> ...`` and a
fresh interpreter would start the same way (no interpreter options, no ``preexec_fn``, the same
``PYTHON*`` but PYTHONPATH, ``LD_*``, locale and rank settings), else a plain ``subprocess.Popen``. With
``AIAYN_TESTS_FRESH_PROCESSES=1`` every process is a fresh interpreter, as a check that the two
agree.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import selectors
import signal
import site
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# What the preloaded interpreter imports before it forks: the libraries every tool imports first.
PRELOAD = ("torch", "lightning", "hydra", "omegaconf", "sacrebleu", "sentencepiece")
# Environment variables read when an interpreter or a preloaded library starts: a command whose
# environment differs from the preloaded interpreter's in one of these gets a fresh interpreter.
STARTUP = ("PYTHON", "LD_", "LC_", "LANG", "HOME", "XDG_", "TMP", "TEMP", "MKL_", "KMP_", "GOMP_", "TORCH", "PYTORCH",
           "CUDA", "MPL", "HF_", "TRANSFORMERS", "AIAYN_CONFIG_DIR",
           # the process's rank, which Lightning's and torchmetrics' rank_zero_only take as they are imported
           "RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")
# ... except these, which torch and Lightning set in a test's process as they run (and so pass on
# to the processes it starts), and which are read only when used.
RUNTIME = ("PYTORCH_NVML_BASED_CUDA_CHECK", "TORCHINDUCTOR_CACHE_DIR")
REPO = Path(__file__).resolve().parents[2]
# ``python`` as a shell starts a command in the foreground: SIGINT not ignored (a test started in
# the background inherits it ignored, and Python then raises no KeyboardInterrupt); exec keeps the
# default. Followed by the script and its arguments.
IN_THE_FOREGROUND = [sys.executable, "-c", ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                     "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")]
FRESH = "AIAYN_TESTS_FRESH_PROCESSES"


# ---- the test's side -------------------------------------------------------------------------

class Process(subprocess.Popen):
    """``subprocess.Popen`` whose child is forked by the preloaded interpreter: the same pipes,
    pid, signals and exit status; its status comes back over the interpreter's socket, as it is
    that interpreter's child, not this process's. ``foreground``: SIGINT at its default."""

    def __init__(self, args, *, foreground: bool = False, **options) -> None:
        self._foreground = foreground
        super().__init__(args, **options)

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
                       creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite,
                       *rest) -> None:
        new_session = bool(rest[5])  # restore_signals, gid, gids, uid, umask, start_new_session, ...
        fds = [fd if fd != -1 else inherited for fd, inherited in ((p2cread, 0), (c2pwrite, 1), (errwrite, 2))]
        self._replies = b""
        try:
            request = {"argv": [str(part) for part in args], "cwd": str(cwd or os.getcwd()),
                       "env": dict(os.environ if env is None else env), "new_session": new_session,
                       "foreground": self._foreground}
            self._server = _server().connect()
            socket.send_fds(self._server, [json.dumps(request).encode()], fds)
            reply = self._reply(None) or {}
        finally:
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)
        if "pid" not in reply:
            raise OSError(f"the preloaded interpreter did not start {args}")
        self.pid = reply["pid"]

    def _internal_poll(self, _deadstate=None, **_ignored) -> int | None:
        if self.returncode is None:
            self._status(0)
        return self.returncode

    def _wait(self, timeout: float | None) -> int:
        if self.returncode is None and not self._status(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def _status(self, timeout: float | None) -> bool:
        """Take the child's exit status if it comes within ``timeout`` seconds (None: wait); whether it came."""
        reply = self._reply(timeout)
        if reply is None:
            return False
        self._handle_exitstatus(reply["status"])
        self._server.close()
        return True

    def _reply(self, timeout: float | None) -> dict | None:
        """The preloaded interpreter's next line about this child, or None after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._replies:
            self._server.settimeout(None if deadline is None else max(0.0, deadline - time.monotonic()))
            try:
                data = self._server.recv(4096)
            except (TimeoutError, BlockingIOError):  # past the deadline (0: nothing there yet)
                return None
            if not data:
                raise OSError(f"the preloaded interpreter ended before its child {getattr(self, 'pid', '')} did")
            self._replies += data
        line, self._replies = self._replies.split(b"\n", 1)
        return json.loads(line)


def popen(command, *, fresh: bool = False, **options) -> subprocess.Popen:
    """``subprocess.Popen(command, **options)``; a :class:`Process` where the preloaded interpreter
    starts the same process, unless ``fresh`` (a test of the interpreter's start itself).
    ``[*IN_THE_FOREGROUND, script, ...]`` is ``python script ...`` with SIGINT at its default."""
    command = list(command)
    foreground = command[:len(IN_THE_FOREGROUND)] == IN_THE_FOREGROUND
    plain = [sys.executable, *command[len(IN_THE_FOREGROUND):]] if foreground else command
    if fresh or not _preloadable(plain, options):
        return subprocess.Popen(command, **options)
    return Process(plain, foreground=foreground, **options)


def _preloadable(command: list, popen: dict) -> bool:
    if os.environ.get(FRESH) == "1" or popen.get("preexec_fn") is not None or popen.get("shell"):
        return False
    if len(command) < 2 or str(command[0]) != sys.executable or not str(command[1]).endswith(".py"):
        return False
    if not Path(popen.get("cwd") or os.getcwd(), command[1]).is_file():
        return False
    env = popen.get("env")
    env = os.environ if env is None else env
    startup = lambda variables: {k: v for k, v in variables.items() if k.startswith(STARTUP) and k not in RUNTIME
                                 and k != "PYTHONPATH"  # the child puts its folders on sys.path
                                 and not (k == "HOME" and not _home_read_at_start(variables))}
    # OMP_NUM_THREADS is read when torch is loaded: the child sets torch's threads from it where it
    # is set; unset, it takes the preloaded interpreter's, right only where that had none either.
    threads = "OMP_NUM_THREADS" in env or "OMP_NUM_THREADS" not in _SERVER_ENVIRONMENT
    return threads and startup(env) == startup(_SERVER_ENVIRONMENT)


def _home_read_at_start(variables) -> bool:
    """Whether the interpreter or a preloaded library reads anything under HOME as it starts: the
    user's site-packages (never in a virtual environment), matplotlib's matplotlibrc."""
    home = variables.get("HOME", "")
    config = variables.get("MPLCONFIGDIR") or os.path.join(variables.get("XDG_CONFIG_HOME") or
                                                         os.path.join(home, ".config"), "matplotlib")
    return site.ENABLE_USER_SITE or os.path.exists(os.path.join(config, "matplotlibrc"))


class _Server:
    """This process's preloaded interpreter: started on first use, ended with this process."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="aiayn-preloaded-")
        self.address = os.path.join(self.folder, "socket")
        self.process = subprocess.Popen([sys.executable, __file__, self.address], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, env=_SERVER_ENVIRONMENT, cwd=REPO, text=True)
        if self.process.stdout.readline().strip() != "ready":
            raise OSError(f"the preloaded interpreter did not start (exit status {self.process.wait()})")
        atexit.register(self.close)

    def connect(self) -> socket.socket:
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.connect(self.address)
        return connection

    def close(self) -> None:
        self.process.stdin.close()  # its sign to end
        self.process.wait(timeout=60)
        for name in os.listdir(self.folder):
            os.remove(os.path.join(self.folder, name))
        os.rmdir(self.folder)


_SERVER_ENVIRONMENT = dict(os.environ)
_SERVER: list[_Server] = []
_LOCK = threading.Lock()


def _server() -> _Server:
    with _LOCK:
        if not _SERVER:
            _SERVER.append(_Server())
        return _SERVER[0]


# ---- the preloaded interpreter --------------------------------------------------------------

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


def _become(request: dict, fds: list[int], fresh_signals: dict) -> None:
    """In the forked child: become ``python <script> <args>`` and run it; never returns."""
    import random

    import numpy
    import torch

    if request["new_session"]:
        os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        if fd > 2:
            os.close(fd)
    if request["foreground"]:
        fresh_signals = {**fresh_signals, signal.SIGINT: signal.default_int_handler}
    for number, handler in fresh_signals.items():
        with contextlib.suppress(OSError, ValueError):  # SIGKILL, SIGSTOP and the C library's own
            signal.signal(number, handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    script, *_ = sys.argv = request["argv"][1:]
    sys.orig_argv = request["argv"]
    sys.path[0] = os.path.dirname(os.path.realpath(script))
    # PYTHONPATH's folders come next, as the interpreter puts them (made absolute by site).
    theirs, ours = (_folders(environment.get("PYTHONPATH")) for environment in (request["env"], _SERVER_ENVIRONMENT))
    sys.path[1:] = [*dict.fromkeys(theirs), *(folder for folder in sys.path[1:] if folder not in ours + theirs)]
    _fresh_streams()
    random.seed()
    numpy.random.seed()
    if "OMP_NUM_THREADS" in os.environ:  # read when torch was loaded: set as a fresh start sets it
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    os._exit(_run(script))


def _folders(pythonpath: str | None) -> list[str]:
    return [os.path.abspath(folder) for folder in (pythonpath or "").split(os.pathsep) if folder]


def _fresh_streams() -> None:
    """sys.stdin, stdout and stderr on the new descriptors, made as the interpreter makes them at
    start: stdout and stderr unbuffered under ``-u``/PYTHONUNBUFFERED, else buffered, by lines
    where they are a terminal (stderr always)."""
    buffered = not sys.__stdout__.write_through  # as this interpreter's own were made
    made = []
    for fd, (name, mode) in enumerate((("stdin", "r"), ("stdout", "w"), ("stderr", "w"))):
        old = getattr(sys, name)
        raw = io.FileIO(fd, mode, closefd=False)
        binary = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw) if buffered else raw
        lines = mode == "w" and buffered and (name == "stderr" or raw.isatty())
        made.append(io.TextIOWrapper(binary, encoding=old.encoding, errors=old.errors, newline="\n",
                                     line_buffering=lines, write_through=not buffered))
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__ = made


def _run(script: str) -> int:
    """Run ``script`` as ``__main__`` and end as the interpreter ends; the exit status."""
    interrupted = False
    try:
        _run_as_main(script)
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
    import importlib.machinery
    import types

    path = os.path.abspath(script)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __builtins__=builtins, __cached__=None, __spec__=None,
                         __loader__=importlib.machinery.SourceFileLoader("__main__", path))
    sys.modules["__main__"] = main
    with io.open_code(path) as source:
        code = compile(source.read(), path, "exec")
    exec(code, main.__dict__)  # noqa: S102  the script, as python runs it


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    _serve(sys.argv[1])
