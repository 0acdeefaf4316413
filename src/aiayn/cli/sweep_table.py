"""The table a sweep ends with (:mod:`aiayn.cli.sweep`): each job, its overrides, its status and
its folder, written whole to ``<sweep dir>/sweep.tsv`` and printed."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiayn.config.identity import as_written
from aiayn.files import atomic_write_text


def write_table(jobs: Sequence[Any], path: Path, group: str | None = None) -> None:
    """The table of the jobs, written to ``path`` (tab-separated: each job's overrides whole) and
    printed (the overrides that differ between the jobs, a reason cut short; then a line of those
    every job has) after a line that names the sweep's ``group``. Each folder is absolute (a job's
    own and a resumed run's alike); that of a job that left none (never run, or refused at its
    start) is ``-``."""
    folders = [os.path.abspath(job.folder) if job.folder and Path(job.folder).is_dir() else "-" for job in jobs]
    header = ("job", "overrides", "status", "folder")
    table = io.StringIO()
    writer = csv.writer(table, delimiter="\t", lineterminator="\n")
    writer.writerow(header)
    writer.writerows((str(job.number), _one_line(shown(job.overrides)), _one_line(job.status), folder)
                     for job, folder in zip(jobs, folders))
    atomic_write_text(path, table.getvalue())  # whole or not at all: a later tool may read it
    varying = [o for o in {o for job in jobs for o in job.overrides} if not all(o in job.overrides for job in jobs)]
    rows = [(str(job.number), shown([o for o in job.overrides if o in varying] if varying else job.overrides),
             _cut(job.status, 100), folder) for job, folder in zip(jobs, folders)]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(3)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[3]
             for row in [header, *rows]]
    shared = [o for o in jobs[0].overrides if o not in varying] if varying else []
    if shared:  # what the printed rows leave out, as sweep.tsv has it in each row
        lines.append(f"every job also: {shown(shared)}")
    done = sum(job.status == "done" for job in jobs)
    named = f"; its group in W&B and MLflow: {group}" if group else ""
    print(f"sweep: {done} of {len(jobs)} jobs done (the table: {path}{named})", *lines, sep="\n", flush=True)


def shown(overrides: list[str]) -> str:
    """A job's overrides on one line, as the sweep's lines name a job: each as typed on a command line
    (``test_after_training=false``, where Hydra's sweeper gives a job ``=False``)."""
    return " ".join(map(as_written, overrides)) or "(no overrides)"


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())


def _cut(text: str, limit: int) -> str:
    text = _one_line(text)
    return text if len(text) <= limit else text[:limit - 1] + "…"
