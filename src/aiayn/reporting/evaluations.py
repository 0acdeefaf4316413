"""evaluate.py's reports: one JSON object an evaluation, ``<folder>/<stem>.json`` (the folder a
run's ``eval/`` unless ``out=`` names another; the stem as :func:`aiayn.cli.evaluate.file_stem`
makes it), written whole and read back by the tables (Tables 2 and 4) and the model card."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiayn.files import atomic_write_text

log = logging.getLogger(__name__)


def write_report(folder: str | os.PathLike, stem: str, report: Mapping[str, Any]) -> Path:
    """``report`` as ``<folder>/<stem>.json``, written whole (a temporary renamed over it)."""
    path = Path(folder) / f"{stem}.json"
    atomic_write_text(path, json.dumps(report, indent=2) + "\n")
    return path


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
