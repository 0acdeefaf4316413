"""The run summary: what a training run reached and what it cost, in the figures of the paper's
tables — dev perplexity and BLEU (Table 3), parameter count (Table 3), training time, tokens seen
and training FLOPs, counted and the paper's estimate (Table 2, §6.1 footnote).

:class:`aiayn.training.callbacks.RunSummaryCallback` gathers the figures during training and
writes them with :func:`write_summary`; the tables (:mod:`aiayn.tables.runs`) read them back
with :func:`read_summary`.

An attempt that continued a run in another folder (``resume=auto`` finding an earlier sweep's
job, or an earlier ``<date>_<time>`` folder of the run name) trains and writes its summary there:
its own folder keeps its config and log, and a note of the run it continued
(:func:`note_continued`, read by :func:`continued_run`), written relative to it, so that a results
folder moved as a whole still finds it.
"""

from __future__ import annotations

import json
import logging
import os
import platform
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiayn.files import atomic_write_text

if TYPE_CHECKING:
    import torch

SUMMARY_FILE = "summary.json"
CONTINUED_FILE = ".continued"  # in an attempt's folder: the folder of the run it continued, relative to it

log = logging.getLogger(__name__)


def write_summary(run_dir: str | os.PathLike, summary: dict[str, Any]) -> Path:
    """``<run_dir>/summary.json``, written atomically."""
    return atomic_write_text(Path(run_dir) / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")


def read_summary(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The summary a finished run wrote, or None when it has none (not finished, or killed)."""
    path = Path(run_dir) / SUMMARY_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def note_continued(attempt_dir: str | os.PathLike, run_dir: str | os.PathLike) -> None:
    """Say, in the log and in ``attempt_dir``, that this attempt continues the run of ``run_dir``."""
    log.info("continuing run %s (this attempt's config and log stay in %s)", run_dir, attempt_dir)
    attempt_dir = Path(attempt_dir)
    if attempt_dir.is_dir():
        atomic_write_text(attempt_dir / CONTINUED_FILE, os.path.relpath(Path(run_dir).absolute(),
                                                                        attempt_dir.absolute()) + "\n")


def continued_run(folder: str | os.PathLike) -> Path | None:
    """The run folder the attempt of ``folder`` continued (:func:`note_continued`); None for a run
    folder of its own."""
    note = Path(folder) / CONTINUED_FILE
    if not note.is_file():
        return None
    return Path(os.path.normpath(Path(folder).absolute() / note.read_text(encoding="utf-8").strip()))


def device_name(device: torch.device) -> str:
    """The accelerator's name, else the CPU's model name and core count."""
    if device.type == "cuda":
        import torch  # here alone: the tools read and note summaries without it (aiayn.cli.run_folder)

        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            name = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), name)
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} CPUs" if device.type == "cpu" else f"{name} ({device.type})"
