"""What a prepared data folder (WMT14's, :mod:`aiayn.data.wmt.preparation`; a corpus of one's own,
:mod:`aiayn.data.prepared_text`) records in its ``meta.json`` (written last) and the checks made of
it before it is used: the raw files it was prepared from, by contents, and every file it holds,
by size and SHA-256.

- **Raw files** (:func:`raw_fingerprints`): size, modification time and SHA-256 of each. A raw
  file whose size changed, or whose time changed and whose bytes did too, has the folder prepared
  again; one rewritten with the same bytes (``touch``, ``cp`` without ``-p``, unpacked again) does
  not, and its new time is recorded so that the next check does not hash it again. A raw file no
  longer there does not count: the folder holds everything training and evaluation read.
- **Prepared files** (:func:`damage`): every file's size is checked at every use (a ``stat``);
  the SHA-256 of the small files (subword model, dev and test text) too, and of the token arrays
  when ``hashes`` is true, as ``prepare.py`` asks (at EN-FR scale the arrays are about 5 GB, a few
  seconds to hash on a fast disk). The arrays' SHA-256 is recorded as they are written
  (:func:`folder_files`' ``hashed``), not by reading them back.

The raw files are given as ``{name: path}``, the name being what ``meta.json`` records them by.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path

from aiayn.data.cache import digest, fingerprint, same_contents
from aiayn.data.storage import MappedCorpus
from aiayn.errors import DataError
from aiayn.files import write_json

log = logging.getLogger(__name__)

META = "meta.json"


def raw_fingerprints(raw_files: Mapping[str, Path]) -> dict[str, dict | None]:
    """:func:`aiayn.data.cache.fingerprint` of every raw file a folder is prepared from, by its
    name; None for one not there."""
    prints: dict[str, dict | None] = {}
    for name, path in raw_files.items():
        try:
            prints[name] = fingerprint(path)
        except OSError:  # not there (or not reachable): the folder itself may be gone
            prints[name] = None
    return prints


def folder_files(directory: Path, hashed: Mapping[str, str] | None = None) -> dict[str, dict]:
    """``{name: {"size", "sha256"}}`` of every file of a prepared folder but ``meta.json``;
    ``hashed``: the SHA-256 of files just written, by name, taken of their bytes as they were
    written (the token arrays: :func:`aiayn.data.storage.encode_tsv`), not read back to hash."""
    hashed = hashed or {}
    return {path.name: {"size": path.stat().st_size, "sha256": hashed.get(path.name) or digest(path)}
            for path in sorted(directory.iterdir()) if path.is_file() and path.name != META}


def read_meta(directory: Path) -> dict | None:
    """The folder's ``meta.json``, or None when it has none (never completed); a DataError-free
    ``{}`` when it is unreadable."""
    try:
        return json.loads((directory / META).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}


def outdated(directory: Path, meta: dict, raw_files: Mapping[str, Path]) -> str | None:
    """Why the folder no longer matches the raw files ``{name: path}`` (one sentence), or None
    when it does; raw files rewritten with the same bytes have their new times recorded."""
    try:
        stored, when = meta["raw_files"], meta["prepared_at"]
    except (KeyError, TypeError):
        return f"{directory / META} is unreadable or from an older version"
    gone, refreshed = 0, {}
    for name, path in raw_files.items():
        if not path.is_file():
            gone += 1
            continue
        if stored.get(name) is None:
            return f"raw file {path} appeared since the preparation at {directory} ({when})"
        same, now = same_contents(stored[name], path)
        if not same:
            return f"raw file {path} changed since the preparation at {directory} ({when})"
        if now is not None:
            refreshed[name] = now
    if refreshed:
        log.info("raw files rewritten with the same bytes since the preparation at %s: %s; it stays in use",
                 directory, ", ".join(refreshed))
        write_json(directory / META, {**meta, "raw_files": {**stored, **refreshed}})
    if gone:
        log.info("%d raw files of the preparation at %s are no longer there; the prepared folder does not need them",
                 gone, directory)
    return None


def damage(directory: Path, meta: dict, hashes: bool) -> str | None:
    """Which file of the folder is not as it was written (one sentence), or None. Sizes of all,
    SHA-256 of the small files, and of the token arrays too with ``hashes``. A folder of an older
    version, without the record, is checked by structure and then recorded."""
    files = meta.get("files")
    if files is None:
        return _adopt(directory, meta)
    for name, want in files.items():
        path = directory / name
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return f"prepared file {path} is missing"
        if size != want["size"]:
            return f"prepared file {path} is damaged ({size} bytes, {want['size']} when it was written)"
        if (hashes or path.suffix != ".npy") and digest(path) != want["sha256"]:
            return f"prepared file {path} is damaged (its bytes changed since it was written)"
    return None


def _adopt(directory: Path, meta: dict) -> str | None:
    """Record the files of a folder prepared by an older version, once its arrays and subword
    model read as whole; else why not."""
    from aiayn.data.subwords import Subwords

    try:
        MappedCorpus(directory, "train")
        Subwords(directory / "sentencepiece.model")
    except DataError as error:
        return str(error).split("; ")[0]
    write_json(directory / META, {**meta, "files": folder_files(directory)})
    log.info("recorded the size and SHA-256 of every file of %s (prepared by an older version)", directory)
    return None
