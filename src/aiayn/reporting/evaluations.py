"""evaluate.py's reports: one JSON object an evaluation, ``<folder>/<stem>.json`` (the folder a
run's ``eval/`` unless ``out=`` names another; the stem as :func:`aiayn.cli.evaluate.file_stem`
makes it), written whole and read back by the tables (Tables 2 and 4) and the model card."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from aiayn.errors import ConfigError
from aiayn.files import atomic_write_text

log = logging.getLogger(__name__)


def write_report(folder: str | os.PathLike, stem: str, report: Mapping[str, Any]) -> Path:
    """``report`` as ``<folder>/<stem>.json``, written whole (a temporary renamed over it)."""
    path = Path(folder) / f"{stem}.json"
    atomic_write_text(path, json.dumps(report, indent=2) + "\n")
    return path


def data_digest(sources: Sequence[str], references: Sequence[str]) -> str:
    """What an evaluation scored, as its report's ``data``: 16 hex digits of the BLAKE2b of its source
    lines and the references its scorer compared with, in order."""
    digest = hashlib.blake2b(digest_size=8)
    for part in (sources, references):
        for line in part:
            digest.update(str(line).encode("utf-8") + b"\n")
        digest.update(b"\0")
    return digest.hexdigest()


def check_same_data(folder: str | os.PathLike, stem: str, data: str) -> None:
    """A ConfigError, before decoding, where ``<folder>/<stem>.json`` is the report of an evaluation
    of other data (``data``: :func:`data_digest`): the same split name in another corpus (a
    ``task.data_dir`` of one's own), or a split's files changed since, which this one's files would
    replace unsaid. The same data evaluated again overwrites its own; a report from before
    reports named their data is not known to differ."""
    path = Path(folder) / f"{stem}.json"
    try:
        earlier = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(earlier, dict) and earlier.get("data", data) != data:
        raise ConfigError(f"{path} is an evaluation of other {earlier.get('split', 'split')} data than this one's "
                          "(its sources or references differ): give out=<another folder> to keep both, or "
                          "remove its files to score this data in their place")


def read_reports(folder: str | os.PathLike) -> list[tuple[Path, dict[str, Any]]]:
    """Every report in ``folder`` with its path, by name; none where the folder is not there. A
    file that is no JSON object (cut short, another tool's) is left out with a warning naming it."""
    reports = []
    for path in sorted(Path(folder).glob("*.json")):
        try:
            report = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            report, why = None, error
        else:
            why = f"a JSON {type(report).__name__}, not an object"
        if isinstance(report, dict):
            reports.append((path, report))
        else:
            log.warning("%s: not a report src/evaluate.py wrote (%s); left out", path, why)
    return reports
