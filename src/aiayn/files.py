"""Writing files so that a reader never sees half of one: everything aiayn writes that another
process (or a later run) reads back goes through a temporary file renamed over the target.

A kill or crash during the write leaves the previous file whole (or no file), and the temporary
is removed when the write fails. A temporary is named after its target, its machine and its
process (``.<name>.<host>-<pid>.tmp``): what a killed process left is removed by the next write
into that folder (:func:`remove_dead_temporaries`), never what a live one is writing, here or on
another machine sharing the folder.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


@contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "", *, resumable: bool = False) -> Iterator[Path]:
    """A temporary path beside ``path`` to write (a file, or a folder when ``path`` does not
    exist yet); renamed over ``path`` when the block ends without error, removed when it fails.
    A block that removes the temporary itself leaves ``path`` as it was (another process wrote
    it first, say).

    ``suffix`` ends the temporary's name, for readers that go by it (``.gz``). ``resumable``: the
    temporary is ``<path>.part``, the same for every process and call, and is kept when the block
    fails, so that a later block carries on from what it holds (an interrupted download)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if resumable:
        temporary = path.with_name(f"{path.name}.part{suffix}")
    else:
        temporary = path.with_name(f".{path.name}.{_HOST}-{os.getpid()}.tmp{suffix}")
        _remove(temporary)  # left by a killed process that had the same id
        remove_dead_temporaries(path.parent)
    try:
        yield temporary
        if os.path.lexists(temporary):
            os.replace(temporary, path)
    except BaseException as error:
        if not resumable:
            _remove(temporary)
        if isinstance(error, OSError) and error.errno in _NO_ROOM and error.filename is None:
            error.filename = str(path)  # a write() refused for want of room names no file: this one
        raise


@contextmanager
def new_folders_removed(folder: str | os.PathLike) -> Iterator[Path]:
    """``folder``; when the block fails, the folders up to it that did not exist before it (and that
    it left empty) are removed: a failed download leaves no empty folders of its own behind (under a
    data root mistyped, say). A folder that holds something (a resumable .part) is kept."""
    folder = Path(folder)
    made = [path for path in (folder, *folder.parents) if not path.exists()]  # deepest first
    try:
        yield folder
    except BaseException:
        for path in made:
            with contextlib.suppress(OSError):  # not empty: a resumable .part, or another's file
                path.rmdir()
        raise


# This machine, as the temporaries name it (no dots: the name is split at them).
_HOST = socket.gethostname().replace(".", "_") or "host"
_TEMPORARY = re.compile(r"^\..+\.(?P<host>[^.]+)-(?P<pid>\d+)\.tmp")


def remove_dead_temporaries(folder: str | os.PathLike) -> list[Path]:
    """Remove the temporaries (:func:`atomic_path`) in ``folder`` whose process, on this machine,
    has died: what a killed writer left. Returns them."""
    removed = []
    with contextlib.suppress(OSError):
        for entry in Path(folder).iterdir():
            match = _TEMPORARY.match(entry.name)
            if match and match["host"] == _HOST and not _alive(int(match["pid"])):
                _remove(entry)
                removed.append(entry)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        pass
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], Any]) -> Path:
    """``write(file)`` into a temporary binary file, flushed to disk, then renamed over ``path``."""
    with atomic_path(path) as temporary, open(temporary, "wb") as file:
        write(file)
        file.flush()
        os.fsync(file.fileno())  # on disk before the rename makes it the file
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """``text`` as UTF-8 into ``path``, atomically."""
    return atomic_write(path, lambda file: file.write(text.encode("utf-8")))


def write_json(path: str | os.PathLike, data: dict) -> Path:
    """``data`` as indented JSON (keys sorted) into ``path``, atomically."""
    return atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True))


def file_digest(path: str | os.PathLike, algorithm: str = "sha256", **options: Any) -> str:
    """The hex digest of a file's bytes by ``hashlib.new(algorithm, **options)``, read in 4 MiB blocks."""
    hasher = hashlib.new(algorithm, **options)
    with open(path, "rb") as file:
        while block := file.read(1 << 22):
            hasher.update(block)
    return hasher.hexdigest()


# A write refused for want of room: a full disk, a quota, a file-size limit (``ulimit -f``).
_NO_ROOM = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def no_room(error: BaseException) -> OSError | None:
    """The OSError for want of room behind ``error`` (itself, or what it was raised from: torch's
    writer reports a failed write as a RuntimeError raised while handling it); else None."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, OSError) and cause.errno in _NO_ROOM:
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


def take_lock(path: str | os.PathLike, wait: bool = True, waiting: Callable[[], Any] | None = None) -> int | None:
    """An open descriptor of ``path`` (made if missing) holding its OS lock (``flock``: released
    when the process dies, however it dies), or None when another process holds it and ``wait``
    is false; ``waiting`` is called once before waiting. A file removed while this process waited
    for it is not held: the lock is taken on the file at ``path`` now instead. The lock between the
    project's processes: the caches' entries (aiayn.data.cache), the run folders
    (aiayn.cli.run_folder), the table runner's jobs (aiayn.tables.runner); one process's uses of
    an MLflow store, which nest and may come from threads, take filelock's, which is reentrant."""
    import fcntl  # POSIX only, as the fork-based encoding workers

    path, told = Path(path), False
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not wait:
                    os.close(descriptor)
                    return None
                if waiting is not None and not told:
                    waiting()
                    told = True
                fcntl.flock(descriptor, fcntl.LOCK_EX)
            try:
                same = os.path.samestat(os.fstat(descriptor), os.stat(path))
            except FileNotFoundError:
                same = False
        except BaseException:
            os.close(descriptor)
            raise
        if same:
            return descriptor
        os.close(descriptor)  # removed by the process that held it: lock the file there now


def release_lock(descriptor: int, remove: str | os.PathLike | None = None) -> None:
    """Let go of a lock of :func:`take_lock`; ``remove``: its file, removed first, while still held
    (a process waiting on it then sees it gone and locks the next)."""
    if remove is not None:
        with contextlib.suppress(FileNotFoundError):
            Path(remove).unlink()
    os.close(descriptor)
