"""The checkpoints a tool's ``ckpt=`` names: one file, or (evaluate, translate) several that
decode together as an ensemble.

A path is one checkpoint whatever it holds: the folder of a ``--multirun`` job is named after its
overrides (``0_debug=tiny,seed=7``), so a path that exists is never split at its commas. Several
checkpoints are a list, ``ckpt=[a.ckpt,b.ckpt]`` (each element quoted when it holds a comma:
``ckpt='["runs/0_a=1,b=2/last.ckpt","runs/1_a=1,b=3/last.ckpt"]'``), or, for paths without
commas, ``ckpt=a.ckpt,b.ckpt``. Nothing here imports torch: the tools check ``ckpt=`` first.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from aiayn.errors import ConfigError

# How to write an ensemble of paths that hold commas, for the messages below.
LIST_FORM = """ckpt='["<first>","<second>"]'"""


def checkpoint_list(ckpt: Any) -> list[str]:
    """The checkpoints of ``ckpt=``: a list's elements; a string that names a path that exists as
    it is; else the string's comma-separated names (an ensemble)."""
    _check_given(ckpt)
    if _is_list(ckpt):
        paths = [str(path).strip() for path in ckpt]
        if not paths or any(not path for path in paths):
            raise ConfigError(f"ckpt={list(ckpt)}: an empty name in the list; give one checkpoint, or a list of several "
                              "(an ensemble)")
        return paths
    text = str(ckpt).strip()
    if os.path.lexists(text) or "," not in text:
        return [text]
    paths = [path.strip() for path in text.split(",")]
    if any(not path for path in paths):
        raise ConfigError(f"ckpt={text}: an empty name in the list; give one checkpoint, or several separated by "
                          f"commas (an ensemble; paths that hold commas as {LIST_FORM})")
    return paths


def one_checkpoint(ckpt: Any, what: str = "one checkpoint") -> str:
    """``ckpt=`` of a tool that takes one checkpoint (average, export, visualize): the path; a list,
    or commas in a path that is not there, is refused in one line saying that ensembles are for
    evaluate and translate."""
    _check_given(ckpt)
    ensembles = "decoding several checkpoints together (an ensemble) is for evaluate and translate"
    if _is_list(ckpt):
        raise ConfigError(f"ckpt=[{','.join(map(str, ckpt))}]: this tool takes {what}, not a list; {ensembles}")
    text = str(ckpt).strip()
    if "," in text and not os.path.lexists(text):
        raise ConfigError(f"ckpt={text}: no such file or folder, and this tool takes {what}, not several; {ensembles}")
    return text


def averaged_count(average_last: int | None, members: int = 1) -> int:
    """How many checkpoints ``average_last`` averages (§6.1; evaluate, translate, export): k, or 1
    (the checkpoint alone) for null; a ConfigError below 1, or above 1 for an ensemble of
    ``members`` checkpoints, before anything is loaded."""
    if average_last is None:
        return 1
    if isinstance(average_last, bool) or not isinstance(average_last, int) or average_last < 1:  # aiayn.load's too
        raise ConfigError(f"average_last must be a whole number of checkpoints, 1 or more (null: the checkpoint "
                          f"alone), got {average_last!r}")
    if average_last > 1 and members > 1:
        raise ConfigError(f"average_last={average_last} averages one checkpoint with those before it; give one "
                          "checkpoint, or average each first (src/average.py) and give the averages as "
                          "ckpt=a.ckpt,b.ckpt")
    return average_last


def _check_given(ckpt: Any) -> None:
    """``ckpt=null`` or ``ckpt=`` (before: "None: checkpoint not found", or the working folder taken
    for a run's): refused, naming what to give."""
    if ckpt is None or (not _is_list(ckpt) and not str(ckpt).strip()):
        raise ConfigError(f"ckpt={'null' if ckpt is None else ''} names no checkpoint; give one file, e.g. "
                          "ckpt=<run folder>/checkpoints/last.ckpt")


def _is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))  # a list, or Hydra's ListConfig
