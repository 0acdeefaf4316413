"""Fetching one file over HTTP(S) into place, for the corpora that download their files
(:mod:`aiayn.data.multi30k`, :mod:`aiayn.data.wmt.archives`); each keeps its own addresses,
mirror and timeout. Also what both ask of a download before it takes a file's name: what the
server sent (:func:`sent`, :func:`refuse_unless`), and compressed data read to its end so that its
checksum is checked (:func:`open_compressed`, :func:`read_through`)."""

from __future__ import annotations

import bz2
import gzip
import http.client
import logging
import lzma
import os
import re
import shutil
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from aiayn.data.readers import GZIP_MAGIC, other_compression
from aiayn.errors import DataError
from aiayn.files import atomic_path, new_folders_removed

log = logging.getLogger(__name__)


class CutShort(OSError):
    """A transfer that ended before the whole file came (the connection closed, a chunked body cut
    off): running again resumes it (or, without a .part, starts it again)."""


class NotTheFile(DataError):
    """What a server sent is not the file asked for (an HTML page, other data, a damaged copy, another
    file under its name); nothing of it was kept. The message names the URL and what it sent."""


def download_file(
    url: str, path: str | os.PathLike, timeout: float, *, resume: bool = False, check: Callable[[Path], Any] | None = None
) -> Path:
    """Fetch ``url`` into ``path`` through a temporary file beside it, renamed to ``path`` only
    once complete: as long as the server's Content-Length said, and ``check(temporary)`` (say,
    :func:`refuse_unless`) returned; a check that raises removes it. Failures raise: network ones
    as :class:`OSError` (a transfer cut short as :class:`CutShort`, also where http.client says so
    with an HTTPException), what is not the file as :class:`NotTheFile` (from ``check``).

    Without ``resume`` the temporary ends like ``path`` (``.gz``, for ``check``) and is removed
    when the download fails. With it, the bytes go to ``<path>.part``, which is kept when the
    transfer fails and which a later call continues with an HTTP Range request (a server that
    ignores Range sends the whole file again, which replaces it; one that refuses it with HTTP 416,
    the .part as long as the file or longer, has the download start again from byte 0). Two
    processes must not resume one .part at once: the caller holds a lock (as
    :func:`aiayn.data.wmt.archives.fetch_archive` does)."""
    path = Path(path)
    with new_folders_removed(path.parent):
        try:
            return _download(url, path, timeout, resume, check)
        except urllib.error.HTTPError as error:
            if not (resume and error.code == 416):
                raise
        part = _part(path)  # refused: as long as the file, or longer (another file's, a server's changed file)
        log.warning("%s refused to resume %s (HTTP 416: it holds %d bytes, no fewer than the file); downloading it "
                    "again from the start", url, part, part.stat().st_size if part.is_file() else 0)
        part.unlink(missing_ok=True)
        try:
            return _download(url, path, timeout, resume, check)
        except OSError as error:
            kind = CutShort if isinstance(error, CutShort) else OSError
            raise kind(f"{error}; the download was started again after HTTP 416, for {part}: delete {part} if this "
                       "goes on") from error


def _part(path: Path) -> Path:
    return path.with_name(f"{path.name}.part")  # atomic_path's resumable temporary


def _download(url: str, path: Path, timeout: float, resume: bool, check: Callable[[Path], Any] | None) -> Path:
    with atomic_path(path, "" if resume else path.suffix, resumable=resume) as partial:
        have = partial.stat().st_size if resume and partial.is_file() else 0
        request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                resumed = have and response.status == 206
                log.info("downloading %s to %s%s", url, path, "" if not have else f" (resuming at byte {have})"
                         if resumed else f" from the start (the server ignored the request to resume at byte {have})")
                expected = response.headers.get("Content-Length")
                expected = int(expected) + (have if resumed else 0) if expected is not None else None
                with open(partial, "ab" if resumed else "wb") as out:
                    shutil.copyfileobj(response, out, 1 << 20)
        except http.client.HTTPException as error:  # IncompleteRead (a chunked body cut off): not an OSError
            raise CutShort(f"{url}: the transfer was cut short ({error!r})" + _again(resume)) from error
        size = partial.stat().st_size
        if expected is not None and size != expected:
            raise CutShort(f"{url}: got {size} bytes of {expected}" + _again(resume))
        if check is not None:
            try:
                check(partial)
            except BaseException:
                partial.unlink(missing_ok=True)  # not the file: nothing of it is kept, not even a .part to resume
                raise
    return path


def _again(resume: bool) -> str:
    return "; run again to resume" if resume else "; run again"


def sent(path: str | os.PathLike) -> str:
    """What the file ``path`` holds, by its first bytes, as a message names it: ``gzip data``, ``a tar
    archive``, ``bzip2-compressed data`` …, ``an HTML page`` (a login or error page served with 200),
    ``nothing``, else the bytes it begins with."""
    with open(path, "rb") as file:
        head = file.read(512)
    if not head:
        return "nothing (an empty body)"
    if head.startswith(GZIP_MAGIC):
        return "gzip data"
    other = other_compression(head)
    if other is not None:
        return f"{other[0]}-compressed data"
    if head[257:262] == b"ustar":
        return "a tar archive"
    if re.match(rb"\s*<(!doctype\s+html|html|head|body)\b", head, re.IGNORECASE):
        return "an HTML page"
    return f"something else (it begins {head[:24]!r})"


def refuse_unless(path: str | os.PathLike, url: str, kinds: tuple[str, ...], wanted: str) -> str:
    """:func:`sent` for ``path``, downloaded from ``url``, when it is one of ``kinds``; else a
    :class:`NotTheFile` saying what ``url`` sent instead of ``wanted`` (``a .tgz archive``)."""
    what = sent(path)
    if what not in kinds:
        raise NotTheFile(f"{url} sent {what}, not {wanted}")
    return what


ARCHIVE_KINDS = ("gzip data", "bzip2-compressed data", "xz-compressed data", "a tar archive")
"""What a tar archive may be, compressed or not (:func:`open_compressed` opens each)."""
_OPENERS = {"gzip data": gzip.open, "bzip2-compressed data": bz2.open, "xz-compressed data": lzma.open}


def open_compressed(path: str | os.PathLike) -> IO[bytes]:
    """``path`` opened for reading its data decompressed (gzip, bzip2 or xz, by its first bytes; any
    other file as it is)."""
    return _OPENERS.get(sent(path), open)(path, "rb")


def read_through(stream: IO[bytes]) -> None:
    """Read ``stream`` (of :func:`open_compressed`) to its end: a gzip member's CRC and length (a
    bzip2 block's CRC, xz's check) are checked only there, and a reader that stops early (tarfile,
    at a tar's end blocks) never sees a damaged copy. Damage raises (``gzip.BadGzipFile``, an
    OSError without errno; ``EOFError`` where the data is cut short; ``zlib.error``; ``LZMAError``)."""
    while stream.read(1 << 20):
        pass
