"""Every step's row in a W&B offline run, once, however many times the run was killed.

W&B cannot resume a run offline: each attempt writes a folder of its own
(``<save_dir>/wandb/offline-run-<time>-<id>``), and ``wandb sync`` of them all puts each attempt's
rows after the earlier ones'. wandb-core writes an attempt's ``.wandb`` file in 32 KiB blocks, and
every ``x_transaction_log_flush_interval`` seconds (15), with no call to flush it: a process killed
with SIGKILL leaves a file without its newest rows, often without any row (a tiny run, the
first minutes of any run). So:

* the run keeps its own record of every row it logged offline, ``<save_dir>/wandb/rows-<id>.jsonl``
  (one JSON line a row, its numbers and its step, written as it is logged);
* a resumed attempt reads what its run's earlier files hold (:func:`held_in_files`, with
  :mod:`aiayn.reporting.wandb_file`), logs again from the record, first, the rows they lack, and
  then leaves out the rows of the steps it trains again that they hold
  (:class:`aiayn.reporting.held_rows.HeldRows`).

After ``wandb sync`` of every attempt (the command train prints) each step's row is in the run once,
in the order of the steps; a row logged again carries the time it was logged again.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from aiayn.reporting.held_rows import BOOKKEEPING, HeldRows, numbers_of
from aiayn.reporting.wandb_file import WandbFileError, iter_records

log = logging.getLogger(__name__)

STEP = "trainer/global_step"  # Lightning's x-axis of a row in W&B (WandbLogger.log_metrics)


def record_path(save_dir: str | os.PathLike, run_id: str) -> Path:
    return Path(save_dir) / "wandb" / f"rows-{run_id}.jsonl"


def record_row(path: Path, metrics: Mapping[str, Any], step: int) -> None:
    """Append the numbers of the row ``metrics`` at ``step`` to the run's record (one write: a
    killed process leaves every row it logged before it)."""
    row = numbers_of(metrics)
    if row:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as file:
            file.write(json.dumps({"step": int(step), "metrics": row}) + "\n")


def recorded_rows(path: Path) -> Iterator[tuple[int, dict[str, float]]]:
    """(step, numbers) of each row of the record, in the order logged; a line a kill cut short is
    left out (its row was being logged as the process died)."""
    for line in _lines(path):
        if "step" in line:
            yield int(line["step"]), dict(line["metrics"])


def _lines(path: Path) -> Iterator[dict[str, Any]]:
    if not path.is_file():
        return
    with open(path) as file:
        for line in file:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def held_in_files(save_dir: str | os.PathLike, run_id: str, besides: Path | None = None) -> HeldRows:
    """The newest step of each metric in the run's offline files (every attempt's, but the folder
    ``besides``: the live attempt's own), read up to their last whole record."""
    held = HeldRows()
    for folder in sorted((Path(save_dir) / "wandb").glob(f"offline-run-*-{run_id}")):
        file = folder / f"run-{run_id}.wandb"
        if besides is not None and folder.resolve() == besides.resolve() or not file.is_file():
            continue
        try:
            for record in iter_records(file, strict=False):
                if record.WhichOneof("record_type") == "history":
                    row = {"/".join(item.nested_key) or item.key: item.value_json for item in record.history.item}
                    if STEP in row:
                        held.add([key for key in row if not key.startswith("_") and key not in BOOKKEEPING],
                                 int(float(json.loads(row[STEP]))))
        except (WandbFileError, OSError) as error:
            log.warning("W&B run %s: %s; its rows after that are logged again", run_id, error)
    return held


def catch_up(log_row: Any, save_dir: str | os.PathLike, run_id: str, attempt: Path) -> HeldRows:
    """What the run's earlier offline files hold, after ``log_row(metrics, step)`` has logged again
    the rows of the record they lack (in the record's order, before any row of this attempt); the
    rows logged again are said in one line. Once an attempt: what it found is noted in the record,
    for the processes it starts later (``ddp_spawn``'s test) to take as it is."""
    record = record_path(save_dir, run_id)
    for line in _lines(record):
        if line.get("attempt") == attempt.name:
            return HeldRows(line["held"])
    held = held_in_files(save_dir, run_id, besides=attempt)
    again: list[int] = []
    for step, metrics in recorded_rows(record):
        missing = held.fresh(metrics, step)
        if missing:
            log_row(missing, step)
            again.append(step)
        held.add(metrics, step)
    if again:
        log.info("W&B run %s: %d rows of steps %d-%d that the earlier attempts' files lack (a killed process "
                 "leaves its newest rows unwritten) logged again from %s", run_id, len(again), again[0], again[-1],
                 record)
    record.parent.mkdir(parents=True, exist_ok=True)
    with open(record, "a") as file:
        file.write(json.dumps({"attempt": attempt.name, "held": held.newest}) + "\n")
    return held
