"""In a process the preloaded interpreter started (a tool, or a process that tool started): the
Python processes it starts itself — ``python <script>`` by ``subprocess``, DDP's ranks by
multiprocessing's spawn — forked from a copy of the preloaded interpreter, not started afresh.

As the process begins, before its script runs, it forks that copy: a child that waits on a socket.
A start that a fresh interpreter would make the same way (tests/helpers/preloaded.py's rule) is
sent there with the descriptors the new process gets; the copy forks a process in the middle,
which forks the new one and ends, so that the new process — an orphan — is taken in by the process
that asked for it (a child subreaper from its first such start). It is that process's own child,
as a started one is: ``waitpid``, its exit status, signals and ``/proc`` say so, and
``/proc/<pid>/cmdline`` shows the command. It then becomes that command
(tests/helpers/preloaded_interpreter.py), with the signals the starting process ignores ignored and
its signal mask, in its process group. Anything else starts as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing import util

import preloaded  # tests/helpers/preloaded.py: the rule for what may be preloaded

PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36
_LIBC = ctypes.CDLL(None, use_errno=True)
_SPAWN = "from multiprocessing.spawn import spawn_main; spawn_main("  # multiprocessing's own command
_ORIGINAL_SPAWN = util.spawnv_passfds
_ORIGINAL_EXECUTE = subprocess.Popen._execute_child


def start_copy(become: Callable[[dict, list[int]], None]) -> None:
    """Fork this process's copy (``become(request, fds)`` makes each process it starts the command
    asked for, never returning) and send this process's Python starts there."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    parent = os.getpid()
    if os.fork() == 0:
        ours.close()
        try:
            _serve_copy(theirs, parent, become)
        finally:
            os._exit(0)
    theirs.close()
    _COPY[:] = [_Copy(ours, parent)]
    util.spawnv_passfds = _spawnv_passfds
    subprocess.Popen._execute_child = _execute_child


def show_command(argv: list[str]) -> None:
    """Make ``/proc/<pid>/cmdline`` (``ps``, ``pgrep``) say ``argv``, as far as this process's own
    arguments reach: written over them, as setproctitle does."""
    try:
        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start and arg_end, fields 48 and 49
    except (OSError, IndexError, ValueError):
        return
    data = b"\0".join(os.fsencode(str(part)) for part in argv)[: end - start - 1]
    ctypes.memmove(start, data.ljust(end - start, b"\0"), end - start)


class _Copy:
    """The tool's side of its copy's socket."""

    def __init__(self, connection: socket.socket, owner: int) -> None:
        self.connection, self.owner, self.lock, self.subreaper = connection, owner, threading.Lock(), False

    def start(self, argv: list[str], cwd: str, env: dict, fds: list[int], numbers: list[int],
              new_session: bool = False, code: str | None = None) -> int | None:
        """The pid of a child of this process that becomes ``argv`` (with ``fds`` as descriptors
        ``numbers``); None where the copy is gone."""
        request = {"argv": argv, "cwd": cwd, "env": env, "new_session": new_session, "executable": sys.executable,
                   "fd_numbers": numbers, "code": code, "pgid": os.getpgrp(),
                   "ignored": [int(number) for number in signal.valid_signals()
                               if signal.getsignal(number) == signal.SIG_IGN],
                   "mask": [int(number) for number in signal.pthread_sigmask(signal.SIG_BLOCK, [])]}
        with self.lock:
            try:
                if not self.subreaper:
                    _LIBC.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
                    self.subreaper = True
                socket.send_fds(self.connection, [json.dumps(request).encode()], fds)
                reply = self.connection.recv(4096)
            except OSError:
                return None
        return json.loads(reply)["pid"] if reply else None


_COPY: list[_Copy] = []


def _copy() -> _Copy | None:
    """This process's copy; None in a process forked from its owner (whose children it would start)."""
    return _COPY[0] if _COPY and _COPY[0].owner == os.getpid() else None


def _spawnv_passfds(path, args, passfds):
    """multiprocessing's start of a spawned process (``python -c 'spawn_main(...)' --multiprocessing-fork``)."""
    args = [os.fsdecode(part) for part in args]
    passfds = sorted(map(int, passfds))
    copy = _copy()
    # The interpreter's options come from its own flags, which a fresh one started so has too.
    if (copy and os.fsdecode(path) == sys.executable and args[1:-3] == util._args_from_interpreter_flags()
            and args[-3] == "-c" and args[-2].startswith(_SPAWN) and args[-1] == "--multiprocessing-fork"
            and preloaded._startup_matches(os.environ)):
        pid = copy.start(args, os.getcwd(), dict(os.environ), [0, 1, 2, *passfds], [0, 1, 2, *passfds], code=args[-2])
        if pid is not None:
            return pid
    return _ORIGINAL_SPAWN(path, args, passfds)


def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo, creationflags,
                   shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite, restore_signals, gid, gids, uid,
                   umask, start_new_session, process_group):
    """``subprocess.Popen``'s start of a child, for ``python <script> ...`` that may be preloaded."""
    copy = _copy()
    plain = (copy and isinstance(args, (list, tuple)) and executable is None and close_fds and gid is None
             and gids is None and uid is None and umask < 0 and process_group in (None, -1))
    command = [os.fsdecode(part) for part in args] if plain else []
    if plain and preloaded._preloadable(command, {"preexec_fn": preexec_fn, "shell": shell, "cwd": cwd, "env": env}):
        numbers = [0, 1, 2, *sorted(pass_fds)]
        fds = [p2cread if p2cread != -1 else 0, c2pwrite if c2pwrite != -1 else 1,
               errwrite if errwrite != -1 else 2, *sorted(pass_fds)]
        pid = copy.start(command, os.fsdecode(cwd) if cwd else os.getcwd(), dict(os.environ if env is None else env),
                         fds, numbers, new_session=bool(start_new_session))
        if pid is not None:
            self.pid, self._child_created = pid, True
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)
            return
    _ORIGINAL_EXECUTE(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo, creationflags,
                      shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite, restore_signals, gid, gids,
                      uid, umask, start_new_session, process_group)


def _serve_copy(connection: socket.socket, parent: int, become: Callable[[dict, list[int]], None]) -> None:
    """The copy: for each request, a process in the middle forks the new one and ends."""
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # gone with the process it copies
    if os.getppid() != parent:
        return
    for number in signal.valid_signals():  # a signal to the process group is not for the copy
        if number not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            with contextlib.suppress(OSError, ValueError):  # the C library's own
                signal.signal(number, signal.SIG_IGN)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # the descriptors of the process it copies are not held open by the copy
        os.dup2(null, fd)
    os.closerange(3, connection.fileno())
    os.closerange(connection.fileno() + 1, os.sysconf("SC_OPEN_MAX"))
    show_command([sys.executable, str(preloaded.INTERPRETER), f"(the copy of process {parent})"])
    while True:
        try:
            message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 256)
        except OSError:
            return
        if not message:
            return  # the process it copies has ended
        read, write = os.pipe()
        middle = os.fork()
        if middle == 0:
            middle = os.getpid()  # (read here: the new process, run late, could find the asker its parent already)
            child = os.fork()
            if child == 0:
                connection.close()
                os.close(read)
                os.close(write)
                while os.getppid() == middle:  # until the middle has ended and the asker took it in
                    time.sleep(0.0002)  # (else, on a loaded machine, it could start as the middle's child)
                become(json.loads(message), fds)
            os.write(write, str(child).encode())
            os._exit(0)
        os.close(write)
        for fd in fds:
            os.close(fd)
        os.waitpid(middle, 0)
        child = os.read(read, 64)
        os.close(read)
        connection.send(json.dumps({"pid": int(child)}).encode())
