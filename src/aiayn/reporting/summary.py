"""The run summary: what a training run reached and what it cost, in the figures of the paper's
tables — dev perplexity and BLEU (Table 3), parameter count (Table 3), training time, tokens seen
and training FLOPs, counted and the paper's estimate (Table 2, §6.1 footnote).

:class:`aiayn.training.callbacks.RunSummaryCallback` gathers the figures during training and
writes them with :func:`write_summary`; the tables (:mod:`aiayn.tables.runs`) read them back
with :func:`read_summary`.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

import torch

from aiayn.files import atomic_write_text

SUMMARY_FILE = "summary.json"


def write_summary(run_dir: str | os.PathLike, summary: dict[str, Any]) -> Path:
    """``<run_dir>/summary.json``, written atomically."""
    return atomic_write_text(Path(run_dir) / SUMMARY_FILE, json.dumps(summary, indent=2) + "\n")


def read_summary(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The summary a finished run wrote, or None when it has none (not finished, or killed)."""
    path = Path(run_dir) / SUMMARY_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def device_name(device: torch.device) -> str:
    """The accelerator's name, else the CPU's model name and core count."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            name = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), name)
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} CPUs" if device.type == "cpu" else f"{name} ({device.type})"
