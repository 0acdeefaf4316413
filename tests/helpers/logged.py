"""What a run logged of its training loss: metrics.csv's ``train/loss`` and the progress lines'."""

from __future__ import annotations

import csv
import re
from pathlib import Path


def logged_losses(run: Path) -> dict[int, float]:
    """metrics.csv's train/loss by step (``logger=csv``)."""
    (metrics,) = run.glob("csv/version_*/metrics.csv")
    return {int(row["step"]): float(row["train/loss"]) for row in csv.DictReader(metrics.open()) if row["train/loss"]}


def progress_losses(run: Path) -> dict[int, float]:
    """The progress lines' loss by the step the line is at (train.log)."""
    lines = re.findall(r"step (\d+)/\d+ \| loss ([0-9.]+)", (run / "train.log").read_text())
    return {int(step): float(loss) for step, loss in lines}
