"""What the data caches (``<cache_dir>/sentencepiece/``, ``<cache_dir>/wmt14/``) share to stay whole
when jobs run side by side, get killed, or fill the disk.

- :func:`exclusive`: one job builds a cache entry at a time. An OS lock (``flock``) on
  ``.<key>.lock`` beside the entry, which a killed process does not keep; the file is removed when
  the lock is released, and a job that waited on a file removed meanwhile locks the new one.
- :func:`remove_leftovers`: what a killed job left of the entries it was building (``.<key>.*``
  temporary files and folders, an empty lock file), removed by the next job that uses the folder;
  never those of an entry another job is building (its lock is held).
- :func:`digest` and :func:`fingerprint`: the contents of a file (size and SHA-256), and
  :func:`same_contents`, which says whether a file still has the contents fingerprinted,
  hashing it again when its size is the same and its modification or change time is not (the
  change time too: a file replaced by one of the same size with its time kept, ``cp -p``,
  ``rsync -a``, ``tar -x``, has the old modification time but a new change time).
- :func:`no_room_error`: a write that failed for want of space (a full disk, a quota, a file-size
  limit; :func:`aiayn.files.no_room` tells) as one sentence saying where and what to do.
- :func:`build_once`: all of these around the building of one prepared folder.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from aiayn.errors import ConfigError, DataError
from aiayn.files import file_digest, no_room, release_lock, take_lock

log = logging.getLogger(__name__)

# --- locks and leftovers ----------------------------------------------------------------------


def lock_file(folder: Path, key: str) -> Path:
    return folder / f".{key}.lock"


def _acquire(path: Path, wait: bool, what: str = "") -> int | None:
    """The lock of ``path`` (aiayn.files.take_lock), waiting when ``wait``, logged once."""
    return take_lock(path, wait, lambda: log.info("waiting for another job that is %s (it holds %s)", what, path))


def _release(path: Path, fd: int) -> None:
    release_lock(fd, remove=path)  # removed while still held: a job waiting on this file sees it is gone and retries


@contextlib.contextmanager
def exclusive(folder: Path, key: str, what: str) -> Iterator[None]:
    """Hold the lock of entry ``key`` of ``folder`` (waiting for it, logged once, when another job
    holds it); ``what`` names the work for that log line. The lock file goes with the lock."""
    path = lock_file(folder, key)
    folder.mkdir(parents=True, exist_ok=True)
    fd = _acquire(path, True, what)
    try:
        yield
    finally:
        _release(path, fd)


def remove_leftovers(folder: Path, key: str | None = None, holding: bool = False) -> list[Path]:
    """Remove what killed jobs left in ``folder``: the hidden entries ``.<key>.*`` (temporary
    files and folders, lock files) of every entry (only ``key``'s when given) that no job is
    building (its lock is taken for the removal; a held one is passed over). ``holding``: the
    caller holds ``key``'s lock (its lock file stays). Returns what was removed, logged in one line."""
    if not folder.is_dir():
        return []
    owners: dict[str, list[Path]] = {}
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith(".") and entry.name.count(".") >= 2:
            owner = entry.name[1:].split(".", 1)[0]
            if key is None or owner == key:
                owners.setdefault(owner, []).append(entry)
    removed: list[Path] = []
    for owner, entries in owners.items():
        lock = lock_file(folder, owner)
        ours = holding and owner == key
        fd = None if ours else _acquire(lock, wait=False)
        if fd is None and not ours:
            continue  # another job is building that entry now
        try:
            for entry in entries:
                if entry == lock:
                    if not ours:
                        removed.append(entry)  # goes when the lock taken here is released
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
                removed.append(entry)
        finally:
            if fd is not None:
                _release(lock, fd)
    if removed:
        log.info("removed what an interrupted job left in %s: %s", folder, ", ".join(p.name for p in removed))
    return removed


def build_once(out: Path, unusable: Callable[[], str | None], build: Callable[[str], None], what: str) -> None:
    """Have the prepared folder ``out`` (``what`` names it in the log and errors: "the prepared
    WMT14 en-de data") built once: reused when ``unusable()`` says None (it is complete, whole and
    current), else built by ``build(why)`` (why it is not: ``"absent"`` when never completed) under
    its lock, checked again once the lock is held, since another job may have built it meanwhile.
    What killed jobs left beside it is removed first; a full disk is one line (:func:`no_room_error`)."""
    remove_leftovers(out.parent)
    if unusable() is None:
        log.info("reusing %s in %s", what, out)
        return
    with exclusive(out.parent, out.name, f"preparing {out}"):
        why = unusable()
        if why is None:
            log.info("reusing %s in %s (prepared by another job meanwhile)", what, out)
            return
        if why != "absent":
            log.warning("%s; preparing again", why)
        try:
            build(why)
        except OSError as error:
            if (full := no_room(error)) is not None:
                raise no_room_error(full, out.parent, what) from None
            raise


# --- contents ---------------------------------------------------------------------------------


def digest(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes (about 1 GB/s on a CPU with SHA
    instructions; see docs/wmt.md)."""
    return file_digest(path, "sha256")


def fingerprint(path: str | os.PathLike) -> dict:
    """``{"size", "mtime_ns", "ctime_ns", "sha256"}`` of a file: its contents, and the times that
    let a later check skip hashing a file not written since."""
    status = os.stat(path)
    return {"size": status.st_size, "mtime_ns": status.st_mtime_ns, "ctime_ns": status.st_ctime_ns,
            "sha256": digest(path)}


def same_contents(stored: dict | list, path: Path) -> tuple[bool, dict | None]:
    """Whether ``path`` has the contents ``stored`` (a :func:`fingerprint`; or ``[size, mtime_ns]``
    as older versions recorded, compared as such) and, when it has but was written since (touched,
    copied), its new fingerprint to record so that the next check need not hash it again. A file
    of the same size is hashed unless both its modification and its change time are as recorded:
    the change time cannot be set back, so a file replaced by another of the same size whose
    modification time was kept (``cp -p``, ``rsync -a``, ``tar -x``) is hashed, not trusted (before:
    its stale preparation was reused). A fingerprint without it (older versions) is hashed once."""
    status = path.stat()
    if isinstance(stored, list):
        return stored == [status.st_size, status.st_mtime_ns], None
    if status.st_size != stored["size"]:
        return False, None
    if status.st_mtime_ns == stored["mtime_ns"] and status.st_ctime_ns == stored.get("ctime_ns"):
        return True, None
    now = fingerprint(path)
    return now["sha256"] == stored["sha256"], now


# --- settings and errors ----------------------------------------------------------------------


def given_folder(value: str | os.PathLike | None, setting: str, variable: str | None = None) -> Path | None:
    """``value`` (given as ``setting``, maybe through the environment variable ``variable``) as a
    path, None as None; an empty one is a :class:`ConfigError` (before: taken for the working folder,
    where caches and downloads then landed: ``AIAYN_CACHE_DIR=`` set to nothing)."""
    if value is None or str(value).strip():
        return None if value is None else Path(value)
    unset = variable is not None and os.environ.get(variable) == ""
    raise ConfigError(f"{setting} is empty" + (f" ({variable} is set to nothing)" if unset else "")
                      + ": give it a folder" + (f", or unset {variable} for the default" if unset else ""))


def check_folder(path: str | os.PathLike, setting: str, variable: str | None = None) -> None:
    """A :class:`ConfigError` when ``path`` (given as ``setting``, maybe through the environment
    variable ``variable``) is a file, or lies under one, where a folder is wanted."""
    path = Path(path).expanduser()
    blocking = next((p for p in (path, *path.parents) if p.exists() and not p.is_dir()), None)
    if blocking is None:
        return
    where = "is a file" if blocking == path else f"lies under {blocking}, which is a file"
    given = os.environ.get(variable) if variable else None
    if given and (path == Path(given).expanduser() or Path(given).expanduser() in path.parents):
        raise ConfigError(f"{variable}={given} ({setting}={path}) {where}, not a folder: set {variable} to a folder "
                          "(or unset it for the default)")
    raise ConfigError(f"{setting}={path} {where}, not a folder: give {setting} a folder")


def no_room_error(error: OSError, folder: Path, what: str) -> DataError:
    """The one-line error for :func:`no_room` while writing ``what`` into ``folder``."""
    reason = error.strerror or os.strerror(error.errno or 0)
    return DataError(f"{folder}: {reason} while writing {what}; nothing of it was kept. Free space there, or set "
                     "AIAYN_CACHE_DIR to a folder on a disk with room, and run again")
