"""Where a run keeps its checkpoints, and what their files are called: the one place that says it.

train.py writes into ``<run>/checkpoints/``: ``step0001000.ckpt`` at the steps it saves (aiayn.config.checkpointing),
``last.ckpt``, a link to the newest, ``best.ckpt`` where it stops early (its best validation's model,
weights alone), and ``nonfinite-step0000999.ckpt`` where it stops on too many non-finite steps.
Runs of earlier releases also wrote ``time-step0001000.ckpt``; Lightning appends ``-v1``, ``-v2`` …
to a name that is taken. The standard library alone: the tools that only name a file import no torch.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

FOLDER = "checkpoints"  # <run>/checkpoints/
LAST = "last.ckpt"  # a link to the newest step's file (a copy where no link can be made)
BEST = "best.ckpt"  # the best validation's model of a run that stops early: no step to resume or average
STEP_STEM = "step{step:07d}"  # a step's file without ".ckpt", as Lightning's ModelCheckpoint fills it in
# Our two naming schemes (Lightning appends -v1, -v2 ... when a name is taken).
STEP_NAME = re.compile(r"^(?:time-)?step(\d+)(?:-v\d+)?\.ckpt$")


def checkpoint_folder(run_dir: str | os.PathLike) -> Path:
    """``<run_dir>/checkpoints``: where a run's checkpoints are."""
    return Path(run_dir) / FOLDER


def step_file(folder: str | os.PathLike, step: int, prefix: str = "") -> Path:
    """The file of ``step`` in a checkpoint ``folder``: ``step0001000.ckpt`` (``prefix="nonfinite-"``:
    the step a run stopped on, kept apart from the steps it resumes or averages)."""
    return Path(folder) / f"{prefix}{STEP_STEM.format(step=step)}.ckpt"


def run_dir_of(checkpoint: str | os.PathLike) -> Path:
    """The run folder of ``checkpoint``: ``<run>`` for ``<run>/checkpoints/<file>``, else the folder
    the file is in (a checkpoint kept apart, ``/tmp/model.ckpt``: never the folder above it). The
    path as given: resolve it first to follow a link (``last.ckpt``) to its file."""
    checkpoint = Path(checkpoint)
    return checkpoint.parent.parent if checkpoint.parent.name == FOLDER else checkpoint.parent
