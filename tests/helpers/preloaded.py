"""A tool's process started from an interpreter that has already imported torch, Lightning and
Hydra: the same process a user's ``python src/<tool>.py ...`` is, without its ~6 s of imports.

Each test process (each pytest-xdist worker) starts one preloaded interpreter
(tests/helpers/preloaded_interpreter.py) the first time a test starts a tool. For each run it forks
a child that becomes the process ``python <script> <args>`` would be: the file descriptors 0, 1 and
2, working folder, environment, ``sys.argv`` and ``sys.path[0]`` as the command gives them, the
signal dispositions and standard streams a fresh interpreter starts with, fresh random seeds, a new
session if asked; then the script runs as ``__main__`` and the child ends as an interpreter ends
(non-daemon threads joined, ``atexit`` run, the streams flushed, exit status from ``SystemExit``,
the traceback and status 1 for an uncaught exception, killed by SIGINT after an uncaught Ctrl-C).
Signals, kills, exit statuses and process groups are those of real processes. The Python
processes such a child starts itself (DDP's spawned ranks, ``python <script>`` by subprocess) are
forked the same way, as its own children (tests/helpers/preloaded_children.py).

:class:`Process` is ``subprocess.Popen`` for such a child (pid, poll, wait, communicate,
send_signal, pipes); :func:`popen` gives one where the command is ``python <script> ...`` and a
fresh interpreter would start the same way (no interpreter options, no ``preexec_fn``, the same
``PYTHON*`` but PYTHONPATH and PYTHONUNBUFFERED, ``LD_*``, locale and rank settings), else a plain
``subprocess.Popen``; :func:`python_starts_preloaded` does the same for the processes a tool run in
this process starts. With ``AIAYN_TESTS_FRESH_PROCESSES=1`` every process is a fresh interpreter,
as a check that the two agree.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import site
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

# Environment variables read when an interpreter or a preloaded library starts: a command whose
# environment differs from the preloaded interpreter's in one of these gets a fresh interpreter.
STARTUP = ("PYTHON", "LD_", "LC_", "LANG", "HOME", "XDG_", "TMP", "TEMP", "MKL_", "KMP_", "GOMP_", "TORCH", "PYTORCH",
           "CUDA", "MPL", "HF_", "TRANSFORMERS", "AIAYN_CONFIG_DIR", "PANDAS_", "WANDB_HTTP_TIMEOUT")
# (The process's rank, which Lightning's and torchmetrics' rank_zero_only take as they are imported,
# is not among them: a child takes it again from its own environment, as a fresh start would:
# tests/helpers/preloaded_interpreter.py. So ddp's later ranks, started with LOCAL_RANK set, are
# preloaded too.)
# ... except these, which libraries set in a test's process as they run (and so pass on to the
# processes it starts): torch and Lightning's, read only when used; joblib's (as it is imported),
# read only by Intel's OpenMP, which this torch does not load (it has GNU's libgomp).
RUNTIME = ("PYTORCH_NVML_BASED_CUDA_CHECK", "TORCHINDUCTOR_CACHE_DIR", "KMP_INIT_AT_FORK")
REPO = Path(__file__).resolve().parents[2]
INTERPRETER = Path(__file__).with_name("preloaded_interpreter.py")
# ``python`` as a shell starts a command in the foreground: SIGINT not ignored (a test started in
# the background inherits it ignored, and Python then raises no KeyboardInterrupt); exec keeps the
# default. Followed by the script and its arguments.
IN_THE_FOREGROUND = [sys.executable, "-c", ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                     "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")]
FRESH = "AIAYN_TESTS_FRESH_PROCESSES"
_POPEN = subprocess.Popen  # the class, also while python_starts_preloaded() stands in for it


# ---- the test's side -------------------------------------------------------------------------

class Process(subprocess.Popen):
    """``subprocess.Popen`` whose child is forked by the preloaded interpreter: the same pipes,
    pid, signals and exit status; its status comes back over the interpreter's socket, as it is
    that interpreter's child, not this process's. ``foreground``: SIGINT at its default;
    ``executable_name``: the child's ``sys.executable``."""

    def __init__(self, args, *, foreground: bool = False, executable_name: str = sys.executable, **options) -> None:
        self._foreground, self._executable_name = foreground, executable_name
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
                       "foreground": self._foreground, "executable": self._executable_name}
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
    ``[*IN_THE_FOREGROUND, script, ...]`` is ``python script ...`` with SIGINT at its default; a
    console script of this environment (``aiayn-train``) is ``python <its path> ...`` as its first
    line says, ``sys.executable`` the interpreter that line names."""
    command = list(command)
    foreground = command[:len(IN_THE_FOREGROUND)] == IN_THE_FOREGROUND
    interpreter = None if foreground or not command else _interpreter_of(command[0])
    plain = ([sys.executable, *command[len(IN_THE_FOREGROUND):]] if foreground else
             [sys.executable, *command] if interpreter else command)
    if fresh or not _preloadable(plain, options):
        return _POPEN(command, **options)
    return Process(plain, foreground=foreground, executable_name=interpreter or sys.executable, **options)


@contextlib.contextmanager
def python_starts_preloaded() -> Iterator[None]:
    """Within it, this process's ``subprocess.Popen([sys.executable, script, ...])`` — a tool run in
    this process starting one: the table runner's jobs, gpu-check's parts — is a :class:`Process`
    wherever :func:`popen` would give one (a preloaded tool's own starts are already preloaded:
    tests/helpers/preloaded_children.py)."""
    def start(args, *rest, **options):
        if not rest and isinstance(args, (list, tuple)) and _preloadable([str(part) for part in args], options):
            return Process(args, **options)
        return _POPEN(args, *rest, **options)

    subprocess.Popen = start
    try:
        yield
    finally:
        subprocess.Popen = _POPEN


def _interpreter_of(program) -> str | None:
    """The interpreter a script's ``#!`` line names, where it is this environment's python (the
    same folder, the same file once links are followed); else None."""
    try:
        with open(program, "rb") as file:
            line = file.readline(4096)
    except OSError:
        return None
    named = line[2:].strip().decode(errors="replace") if line.startswith(b"#!") else ""
    mine = sys.executable
    same = (" " not in named and os.path.dirname(named) == os.path.dirname(mine)
            and os.path.realpath(named) == os.path.realpath(mine))
    return named if same else None


def _preloadable(command: list, popen: dict) -> bool:
    if os.environ.get(FRESH) == "1" or popen.get("preexec_fn") is not None or popen.get("shell"):
        return False
    if len(command) < 2 or str(command[0]) != sys.executable or str(command[1]).startswith("-"):
        return False
    if not Path(popen.get("cwd") or os.getcwd(), command[1]).is_file():
        return False
    env = popen.get("env")
    return _startup_matches(os.environ if env is None else env)


def _startup_matches(env) -> bool:
    """Whether an interpreter started with ``env`` starts as the preloaded one did."""
    # OMP_NUM_THREADS is read when torch is loaded: the child sets torch's threads from it where it
    # is set; unset, it takes the preloaded interpreter's, right only where that had none either.
    threads = "OMP_NUM_THREADS" in env or "OMP_NUM_THREADS" not in _SERVER_ENVIRONMENT
    return threads and _startup(env) == _SERVERS_STARTUP


def _startup(variables) -> dict[str, str]:
    """What of ``variables`` an interpreter or a preloaded library reads as it starts."""
    return {k: v for k, v in variables.items() if k.startswith(STARTUP) and k not in RUNTIME
            and k not in ("PYTHONPATH", "PYTHONUNBUFFERED")  # the child puts its folders on sys.path, makes its streams
            and not (k == "HOME" and not _home_read_at_start(variables))}


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
        # The last argument is room for each child's command line, written over the arguments.
        self.process = _POPEN([sys.executable, str(INTERPRETER), self.address, " " * 8192], stdin=subprocess.PIPE,
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
        shutil.rmtree(self.folder)


_SERVER_ENVIRONMENT = dict(os.environ)
_SERVERS_STARTUP = _startup(_SERVER_ENVIRONMENT)
_SERVER: list[_Server] = []
_LOCK = threading.Lock()


def _server() -> _Server:
    with _LOCK:
        if not _SERVER:
            _SERVER.append(_Server())
        return _SERVER[0]
