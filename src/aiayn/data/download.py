"""Fetching one file over HTTP(S) into place, for the corpora that download their files
(:mod:`aiayn.data.multi30k`, :mod:`aiayn.data.wmt.archives`); each keeps its own addresses,
mirror and timeout."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiayn.files import atomic_path

log = logging.getLogger(__name__)


def download_file(
    url: str, path: str | os.PathLike, timeout: float, *, resume: bool = False, check: Callable[[Path], Any] | None = None
) -> Path:
    """Fetch ``url`` into ``path`` through a temporary file beside it, renamed to ``path`` only
    once complete: as long as the server's Content-Length said, and ``check(temporary)`` (say,
    that it decompresses) returned. Failures raise (network ones as :class:`OSError`).

    Without ``resume`` the temporary ends like ``path`` (``.gz``, for ``check``) and is removed
    when the download fails. With it, the bytes go to ``<path>.part``, which is kept when the
    download fails and which a later call continues with an HTTP Range request (a server that
    ignores Range sends the whole file again, which replaces it)."""
    path = Path(path)
    made = [folder for folder in (path.parent, *path.parent.parents) if not folder.exists()]  # deepest first
    try:
        return _download(url, path, timeout, resume, check)
    except BaseException:
        for folder in made:  # a failed download leaves no empty folders of its own (a data root mistyped)
            with contextlib.suppress(OSError):  # not empty: a resumable .part, or another's file
                folder.rmdir()
        raise


def _download(url: str, path: Path, timeout: float, resume: bool, check: Callable[[Path], Any] | None) -> Path:
    with atomic_path(path, "" if resume else path.suffix, resumable=resume) as partial:
        have = partial.stat().st_size if resume and partial.is_file() else 0
        request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
        log.info("downloading %s to %s%s", url, path, f" (resuming at byte {have})" if have else "")
        with urllib.request.urlopen(request, timeout=timeout) as response:
            resumed = have and response.status == 206
            expected = response.headers.get("Content-Length")
            expected = int(expected) + (have if resumed else 0) if expected is not None else None
            with open(partial, "ab" if resumed else "wb") as out:
                shutil.copyfileobj(response, out, 1 << 20)
        size = partial.stat().st_size
        if expected is not None and size != expected:
            raise OSError(f"{url}: got {size} bytes of {expected}" + ("; run again to resume" if resume else ""))
        if check is not None:
            check(partial)
    return path
