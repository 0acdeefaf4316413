"""A checkpoint's digest: the BLAKE2b of its bytes, written beside it (``<name>.blake2b``) when it
is saved and compared whenever it is read, so that a file whose bytes changed since (a bad disk,
a copy cut short or damaged, bytes flipped in transit) is never used without a word: resume takes
the newest checkpoint that is whole, the tools refuse a damaged one in one line.

A checkpoint without a digest (written elsewhere, or before digests existed) is read as it is; so
is one whose digest file holds no digest (emptied, cut short), with a warning.
Hashing reads the file once more, from the page cache just after a save: about a second per GB,
beside a save that writes the same bytes to disk.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from aiayn import files
from aiayn.files import atomic_write_text

SUFFIX = ".blake2b"
_DIGEST = re.compile(r"[0-9a-f]{64}")  # BLAKE2b of 32 bytes, as hexdigest() writes it

log = logging.getLogger(__name__)


def digest_path(path: Path, follow: bool = False) -> Path:
    """Where the digest of the checkpoint at ``path`` is; ``follow``: of its target, for a link
    (``last.ckpt`` pointing at a step's file). A file written over a link replaces the link, so
    writing never follows one."""
    path = Path(path).resolve() if follow else Path(path)
    return path.with_name(path.name + SUFFIX)


def file_digest(path: str | os.PathLike) -> str:
    return files.file_digest(path, "blake2b", digest_size=32)


def recorded_digest(path: str | os.PathLike) -> str | None:
    """The digest recorded beside the checkpoint at ``path``, or None: no digest file, or one that
    holds no digest (emptied or cut short: the checkpoint is then read as one without a digest,
    with a warning, not refused for the digest file's fault)."""
    recorded = digest_path(Path(path), follow=True)
    try:
        text = recorded.read_text(errors="replace").strip()
    except OSError:
        return None
    if not _DIGEST.fullmatch(text):
        log.warning("%s holds no BLAKE2b digest (%s), so %s is read unchecked", recorded,
                    "it is empty" if not text else "not 64 hexadecimal digits", path)
        return None
    return text


def identity(path: str | os.PathLike) -> str:
    """What identifies the checkpoint at ``path``: the digest of its bytes, as recorded beside it
    (else computed), so that a copy of it is the same checkpoint and a retrained one is not."""
    return recorded_digest(path) or file_digest(path)


def write_digest(path: Path, digest: str) -> None:
    """``digest`` (:func:`file_digest` of ``path``'s bytes) into ``path``'s digest file."""
    atomic_write_text(digest_path(path), digest + "\n")


def remove_digest(path: Path) -> None:
    digest_path(path).unlink(missing_ok=True)


def damaged(path: str | os.PathLike) -> str | None:
    """One line saying how ``path`` is damaged, or None when its bytes are those written (or it has
    no digest to compare with)."""
    expected = recorded_digest(path)
    if expected is None:
        return None
    try:
        actual = file_digest(path)
    except OSError as error:
        return f"{path}: cannot be read ({error.strerror})"
    if actual != expected:
        return (f"{path}: damaged: its bytes are not those written (BLAKE2b {actual[:12]}… against {expected[:12]}… "
                f"in {digest_path(Path(path), follow=True).name}); use another checkpoint of the run")
    return None
