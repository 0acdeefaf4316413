"""Checkpoint averaging (§6.1): "For the base models, we used a single model obtained by averaging
the last 5 checkpoints, which were written at 10-minute intervals. For the big models, we averaged
the last 20 checkpoints."

src/train.py writes two kinds of checkpoints into ``<run>/checkpoints/``: ``step0001000.ckpt``
every ``checkpoint.every_n_train_steps`` steps and ``time-step0001000.ckpt`` every
``checkpoint.every_n_minutes`` minutes of training (plus ``last.ckpt``, a copy of or link to the
newest). ``last_checkpoints`` picks the newest ones by global step, ``average_checkpoints`` averages
their weights into a checkpoint that loads like any other (``checkpoint.load_trained``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from aiayn.data.readers import DataError

# Our two naming schemes (Lightning appends -v1, -v2 ... when a name is taken).
CHECKPOINT_NAME = re.compile(r"^(?:time-)?step(\d+)(?:-v\d+)?\.ckpt$")


class _Accumulator:
    """Running sum of state dicts: floating tensors summed in float64, everything else must equal
    the first state dict's value. Holds one state dict's worth of memory, whatever the count."""

    def __init__(self) -> None:
        self.count = 0
        self.sums: dict[str, Any] = {}
        self.dtypes: dict[str, torch.dtype] = {}

    def add(self, state_dict: Mapping[str, Any], source: str = "") -> None:
        where = f" in {source}" if source else f" in state dict {self.count}"
        if self.count == 0:
            for key, value in state_dict.items():
                if isinstance(value, torch.Tensor) and value.is_floating_point():
                    self.sums[key] = value.detach().to("cpu", torch.float64, copy=True)
                    self.dtypes[key] = value.dtype
                else:
                    self.sums[key] = value.detach().cpu().clone() if isinstance(value, torch.Tensor) else value
        else:
            missing, extra = sorted(set(self.sums) - set(state_dict)), sorted(set(state_dict) - set(self.sums))
            if missing or extra:
                key = (missing or extra)[0]
                raise ValueError(f"state dicts differ in keys: {key!r} is {'missing' if missing else 'extra'}{where}"
                                 + (f" ({len(missing) + len(extra)} keys differ)" if len(missing) + len(extra) > 1
                                    else ""))
            for key, value in state_dict.items():
                first = self.sums[key]
                if isinstance(first, torch.Tensor):
                    if not isinstance(value, torch.Tensor):
                        raise ValueError(f"{key!r} is a tensor in the first state dict but a {type(value).__name__}"
                                         f"{where}")
                    if value.shape != first.shape:
                        raise ValueError(f"{key!r} has shape {tuple(value.shape)}{where} but "
                                         f"{tuple(first.shape)} in the first state dict")
                    if key in self.dtypes:
                        if not value.is_floating_point():
                            raise ValueError(f"{key!r} is {value.dtype}{where} but {self.dtypes[key]} in the first "
                                             "state dict")
                        first.add_(value.detach().to("cpu", torch.float64))
                    elif value.dtype != first.dtype or not torch.equal(value.detach().cpu(), first):
                        raise ValueError(f"{key!r} is a {first.dtype} tensor (not averaged) that differs{where} "
                                         "from the first state dict")
                elif value != first:
                    raise ValueError(f"{key!r} (a {type(first).__name__}) differs{where} from the first state dict")
        self.count += 1

    def mean(self) -> dict[str, Any]:
        if self.count == 0:
            raise ValueError("nothing to average: no state dicts")
        return {key: (value / self.count).to(self.dtypes[key]) if key in self.dtypes else value
                for key, value in self.sums.items()}


def average_state_dicts(state_dicts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """The element-wise mean of ``state_dicts``: floating tensors are averaged in float64 and cast
    back to their dtype; other tensors (integer buffers) and values must be equal in all of them
    and are taken from the first. Different key sets, shapes or unequal integer buffers raise
    ValueError naming the key."""
    accumulator = _Accumulator()
    for state_dict in state_dicts:
        accumulator.add(state_dict)
    return accumulator.mean()


def checkpoint_step(path: str | os.PathLike) -> int | None:
    """The global step in a checkpoint's file name (``step0001000.ckpt``, ``time-step0001000.ckpt``),
    or None for other names."""
    match = CHECKPOINT_NAME.match(Path(path).name)
    return int(match.group(1)) if match else None


def checkpoints_dir(directory: str | os.PathLike) -> Path:
    """``directory`` itself if it holds checkpoints, else its ``checkpoints/`` folder (a run dir)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DataError(f"{directory}: no such directory")
    if (directory / "checkpoints").is_dir() and not any(directory.glob("*.ckpt")):
        return directory / "checkpoints"
    return directory


def list_checkpoints(directory: str | os.PathLike) -> list[tuple[int, Path]]:
    """(global step, path) of every step checkpoint in ``directory`` (a run dir or its
    checkpoints/ folder), oldest first, one per step. The step comes from the file name, else from
    the file's ``global_step``; ``last*.ckpt`` (a copy of the newest) and averaged checkpoints are
    left out. When several files hold the same step (a step and a time checkpoint written after
    the same batch) the one named ``step...`` is kept, so no weights count twice."""
    folder = checkpoints_dir(directory)
    by_step: dict[int, Path] = {}
    for path in sorted(folder.glob("*.ckpt")):
        if path.name.startswith("last") or not path.is_file():
            continue
        step = checkpoint_step(path)
        if step is None:  # a name of someone else's: ask the file itself
            checkpoint = load_lazily(path)
            if not isinstance(checkpoint, dict) or "global_step" not in checkpoint or "averaged_from" in checkpoint:
                continue
            step = int(checkpoint["global_step"])
            del checkpoint
        kept = by_step.get(step)
        if kept is None or _preference(path) < _preference(kept):
            by_step[step] = path
    return sorted(by_step.items())


def load_lazily(path: Path) -> Any:
    """The checkpoint at ``path`` (memory-mapped where the format allows), or None if unreadable."""
    for mmap in (True, False):
        try:
            return torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)
        except Exception:
            continue
    return None


def _preference(path: Path) -> tuple[int, str]:
    return (0 if path.name.startswith("step") else 1 if path.name.startswith("time-") else 2, path.name)


def last_checkpoints(directory: str | os.PathLike, k: int) -> list[Path]:
    """The ``k`` newest step checkpoints of ``directory`` (a run dir or its checkpoints/ folder),
    oldest first. Raises DataError (one line naming the folder) when it holds fewer than ``k``."""
    if k < 1:
        raise ValueError(f"the number of checkpoints to average must be at least 1, not {k}")
    found = list_checkpoints(directory)
    folder = checkpoints_dir(directory)
    if not found:
        raise DataError(f"{folder}: no checkpoints (*.ckpt other than last.ckpt) found")
    if len(found) < k:
        raise DataError(f"{folder}: asked for the last {k} checkpoints but there are only {len(found)} "
                        f"(steps {', '.join(str(step) for step, _ in found)})")
    return [path for _, path in found[-k:]]


def average_checkpoints(paths: Iterable[str | os.PathLike]) -> dict[str, Any]:
    """The newest of ``paths`` (by ``global_step``; the last given on a tie) as a whole checkpoint
    dict, with ``state_dict`` replaced by the average over all of them, and ``averaged_from`` (the
    paths, in the order given) and ``averaged_steps`` (their global steps) added; ``torch.save`` it and it loads with ``load_trained``.
    Checkpoints are read one at a time, so memory stays at about two of them."""
    from aiayn.training.checkpoint import read_checkpoint  # imports Lightning: only when needed

    paths = [Path(path) for path in paths]
    if not paths:
        raise ValueError("nothing to average: no checkpoint paths")
    accumulator = _Accumulator()
    newest: dict[str, Any] | None = None
    steps = []
    for path in paths:
        checkpoint = read_checkpoint(path)
        accumulator.add(checkpoint["state_dict"], source=str(path))
        steps.append(int(checkpoint.get("global_step", 0)))
        if newest is None or int(checkpoint.get("global_step", 0)) >= int(newest.get("global_step", 0)):
            newest = checkpoint
        del checkpoint
    assert newest is not None
    newest["state_dict"] = accumulator.mean()
    newest["averaged_from"] = [str(path) for path in paths]
    newest["averaged_steps"] = steps
    return newest


def save_checkpoint_atomically(checkpoint: dict[str, Any], out: str | os.PathLike) -> Path:
    """``torch.save`` to a temporary file beside ``out``, then rename it over ``out``: a reader
    never sees half a file, and a crash leaves any earlier ``out`` whole."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    temporary = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        with open(temporary, "wb") as file:
            torch.save(checkpoint, file)
            file.flush()
            os.fsync(file.fileno())  # on disk before the rename makes it the checkpoint
        os.replace(temporary, out)
    finally:
        temporary.unlink(missing_ok=True)
    return out
