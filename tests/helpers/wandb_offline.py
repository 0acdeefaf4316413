"""Read W&B offline runs (``<save_dir>/wandb/offline-run-*/run-*.wandb``) back into Python: the
run's config, history, summary and exit code, over the project's reader of the file's records
(:mod:`aiayn.reporting.wandb_file`, which says what the format is). Read a run written by this
process after ``wandb.teardown()``; a live or killed run's file with ``strict=False``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiayn.reporting.wandb_file import BLOCK_SIZE, TruncatedWandbFile, WandbFileError, iter_records

__all__ = [
    "BLOCK_SIZE",
    "OfflineRun",
    "TruncatedWandbFile",
    "WandbFileError",
    "find_run_file",
    "iter_records",
    "read_run",
]


def find_run_file(path: Path | str) -> Path:
    """The ``.wandb`` file for ``path``: the file itself, an ``offline-run-*`` directory, a
    ``wandb`` directory or a save_dir holding exactly one ``wandb/offline-run-*``."""
    path = Path(path)
    if path.is_file():
        return path
    if not path.is_dir():
        raise FileNotFoundError(f"no such file or directory: {path}")
    files = sorted(path.glob("run-*.wandb"))
    if len(files) == 1:
        return files[0]
    if len(files) > 1:
        raise ValueError(f"{path} holds several .wandb files: {[str(p) for p in files]}")
    runs = sorted(p for p in (*path.glob("offline-run-*"), *path.glob("wandb/offline-run-*"))
                  if p.is_dir() and not p.is_symlink())
    if len(runs) > 1:
        raise ValueError(f"{path} holds several offline runs; pass one of: "
                         f"{[str(p) for p in runs]}")
    if not runs:
        raise FileNotFoundError(f"no run-*.wandb, offline-run-* or wandb/offline-run-* in {path}")
    return find_run_file(runs[0])


@dataclass
class OfflineRun:
    """What a W&B offline run recorded. ``history`` has one dict per ``run.log`` step (with
    ``_step``, ``_timestamp``, ``_runtime``); logged dicts come back nested as they were
    logged. ``config`` leaves out wandb's internal ``_wandb`` entry. ``exit_code`` is None
    when the run never finished (no exit record)."""

    path: Path
    run_id: str = ""
    project: str = ""
    entity: str = ""
    name: str = ""
    group: str = ""
    job_type: str = ""
    tags: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None


def _item_path(item: Any) -> list[str]:
    return list(item.nested_key) or [item.key]


def _set(target: dict, path: list[str], value: Any) -> None:
    for key in path[:-1]:
        child = target.get(key)
        if not isinstance(child, dict):
            child = target[key] = {}
        target = child
    target[path[-1]] = value


def _remove(target: dict, path: list[str]) -> None:
    for key in path[:-1]:
        target = target.get(key)
        if not isinstance(target, dict):
            return
    target.pop(path[-1], None)


def _apply(target: dict, updates: Any, removes: Any = ()) -> None:
    for item in updates:
        _set(target, _item_path(item), json.loads(item.value_json))
    for item in removes:
        _remove(target, _item_path(item))


def read_run(path: Path | str, strict: bool = True) -> OfflineRun:
    """Read an offline run: a ``.wandb`` file, its ``offline-run-*`` directory, or a save_dir
    holding one (see ``find_run_file``). ``strict`` as in ``iter_records``."""
    file = find_run_file(path)
    run = OfflineRun(path=file)
    for record in iter_records(file, strict=strict):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            r = record.run
            run.run_id, run.project, run.entity = r.run_id, r.project, r.entity
            run.name, run.group, run.job_type = r.display_name, r.run_group, r.job_type
            run.tags = list(r.tags)
            _apply(run.config, r.config.update, r.config.remove)
            _apply(run.summary, r.summary.update, r.summary.remove)
        elif kind == "config":
            _apply(run.config, record.config.update, record.config.remove)
        elif kind == "history":
            row: dict[str, Any] = {}
            _apply(row, record.history.item)
            if "_step" not in row and record.history.HasField("step"):
                row["_step"] = record.history.step.num
            run.history.append(row)
        elif kind == "summary":
            _apply(run.summary, record.summary.update, record.summary.remove)
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    run.config.pop("_wandb", None)
    return run
