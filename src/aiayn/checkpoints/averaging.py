"""Checkpoint averaging (§6.1): "For the base models, we used a single model obtained by averaging
the last 5 checkpoints, which were written at 10-minute intervals. For the big models, we averaged
the last 20 checkpoints."

``last_checkpoints`` picks a run's newest checkpoints by global step (see
:mod:`aiayn.checkpoints.io` for the names), ``average_checkpoints`` averages their weights into a
checkpoint that loads like any other (:func:`aiayn.checkpoints.trained.load_trained`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from aiayn.checkpoints.io import checkpoint_step, checkpoints_dir, list_checkpoints, read_checkpoint
from aiayn.errors import ConfigError, DataError


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
                        raise ValueError(  # noqa: TRY004  one kind for every mismatch of the checkpoints (caught below)
                            f"{key!r} is a tensor in the first state dict but a {type(value).__name__}"
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


def recipe_window(ckpt: str | os.PathLike) -> int:
    """How many checkpoints §6.1's average takes for the run of ``ckpt`` (a checkpoint, or a run dir
    or its checkpoints/ folder: its newest): the ``checkpoint.average_last`` it trained with (base 5,
    big 20). ConfigError where it set none (``null``: the small model) or does not say; 1 where the
    folder holds no checkpoint, for :func:`last_checkpoints` to say so."""
    path = Path(ckpt)
    newest = path if path.is_file() else next((found for _, found in reversed(list_checkpoints(path))), None)
    if newest is None:
        return 1
    config = read_checkpoint(newest, lazily=True)["hyper_parameters"].get("run_config") or {}
    count = (config.get("checkpoint") or {}).get("average_last")
    if not count:
        raise ConfigError(f"give average_last=<k>, how many checkpoints to average: {newest}'s run sets none "
                          "(its checkpoint.average_last is null; the base models average 5, the big ones 20)")
    return int(count)


def last_checkpoints(directory: str | os.PathLike, k: int, ending_at: str | os.PathLike | None = None) -> list[Path]:
    """The ``k`` newest step checkpoints of ``directory`` (a run dir or its checkpoints/ folder),
    oldest first. With ``ending_at`` (a checkpoint file, ``last.ckpt`` too) the ``k`` end there
    instead: that file itself and the ``k`` - 1 newest of ``directory`` before its global step.
    Raises DataError (one line naming the folder) when it holds fewer than ``k``."""
    if k < 1:
        raise ValueError(f"the number of checkpoints to average must be at least 1, not {k}")
    found = list_checkpoints(directory)
    folder = checkpoints_dir(directory)
    if ending_at is not None:
        end = Path(ending_at)
        step = checkpoint_step(end)
        if step is None:  # last.ckpt or a name of someone else's (average.py's): ask the file itself
            head = read_checkpoint(end)
            step, averaged = int(head.get("global_step", 0)), list(head.get("averaged_steps") or [])
            if k > 1 and len(averaged) > 1:  # its average with those before it would not be §6.1's window
                raise DataError(
                    f"{end}: an average already (average.py's, of steps {', '.join(map(str, averaged))}); averaging "
                    f"it again with the {k - 1} before step {step} would mix an average into an average under the "
                    f"steps of neither: give average_last=1 to use it as it is, or ckpt=<the run's last.ckpt or a "
                    f"step checkpoint> to average {k}")
        before = [(s, path) for s, path in found if s < step]
        if len(before) < k - 1:
            there = [str(s) for s, _ in [*before, (step, end)]]
            raise DataError(f"{folder}: asked for the {k} checkpoints ending at {end.name} (step {step}) but "
                            + ("it is the first" if len(there) == 1 else
                               f"there are only {len(there)} up to it (steps {', '.join(there)})"))
        return [path for _, path in before[len(before) - (k - 1):]] + [end]
    if not found:
        raise DataError(f"{folder}: no checkpoints (*.ckpt other than last.ckpt) found")
    if len(found) < k:
        steps = ", ".join(str(step) for step, _ in found)
        raise DataError(f"{folder}: asked for the last {k} checkpoints but "
                        + (f"there is only one (step {steps})" if len(found) == 1 else
                           f"there are only {len(found)} (steps {steps})"))
    return [path for _, path in found[-k:]]


def window_ending_at(ckpt: Path, k: int) -> list[Path]:
    """§6.1's checkpoints to average for ``average_last=k``: ``ckpt`` and the k - 1 before it by
    step (:func:`last_checkpoints`; DataError when there are fewer), or ``ckpt`` alone."""
    return last_checkpoints(ckpt.parent, k, ending_at=ckpt) if k > 1 else [Path(ckpt)]


def average_into(trained: Any, window: list[Path]) -> list[int]:
    """Put the average of ``window`` (:func:`window_ending_at`) into ``trained`` (a loaded
    :class:`~aiayn.checkpoints.trained.TrainedModel` of its last) and return the steps averaged;
    a window of one leaves the model as loaded: its steps are those average.py averaged into it
    (``averaged_steps``), else its own."""
    if len(window) == 1:
        return list(trained.averaged_steps) or [trained.step]
    average = average_checkpoints(window)
    trained.load_weights(average["state_dict"])
    return list(average["averaged_steps"])


# What tells a run apart in its checkpoints: its settings (seed, task, network, recipe), its
# subword model, its logger runs (W&B, MLflow; wandb_run_id in checkpoints written before).
_RUN_KEYS = ("hyper_parameters", "subwords", "logger_runs", "wandb_run_id")


def _same_run(first: dict[str, Any], checkpoint: dict[str, Any], path: Path) -> None:
    """DataError unless ``checkpoint`` (at ``path``) is of the run ``first`` is: the same identity
    settings (aiayn.checkpoints.resume.IDENTITY_KEYS), subword model and W&B run."""
    from aiayn.checkpoints.resume import config_differences

    config = (checkpoint.get("hyper_parameters") or {}).get("run_config") or {}
    differences = config_differences({"hyper_parameters": first["hyper_parameters"]}, config, advice=False) if config else []
    if checkpoint.get("subwords") != first["subwords"]:
        differences.append("its subword model")
    runs = [{**({"wandb": c["wandb_run_id"]} if c.get("wandb_run_id") else {}), **(c.get("logger_runs") or {})}
            for c in (first, checkpoint)]
    for logger in sorted(set(runs[0]) & set(runs[1])):
        if runs[0][logger] != runs[1][logger]:
            differences.append(f"{logger} run {runs[0][logger]} → {runs[1][logger]}")
    if differences:
        raise DataError(f"{path} is not of the run of {first['path']} ({'; '.join(differences)}); average the "
                        "checkpoints of one run")


def average_checkpoints(paths: Iterable[str | os.PathLike]) -> dict[str, Any]:
    """The newest of ``paths`` (by ``global_step``; the last given on a tie) as a whole checkpoint
    dict, with ``state_dict`` replaced by the average over all of them, and ``averaged_from`` (the
    paths, in the order given) and ``averaged_steps`` (their global steps) added; ``torch.save`` it and it loads with ``load_trained``.
    Checkpoints are read one at a time, so memory stays at about two of them. Checkpoints of
    different runs (seed, task, network, subword model) are refused: DataError naming both."""
    paths = [Path(path) for path in paths]
    if not paths:
        raise ValueError("nothing to average: no checkpoint paths")
    accumulator = _Accumulator()
    newest: dict[str, Any] | None = None
    steps = []
    first: dict[str, Any] | None = None
    for path in paths:
        checkpoint = read_checkpoint(path)
        if first is None:
            first = {"path": path, **{key: checkpoint.get(key) for key in _RUN_KEYS}}
        else:
            _same_run(first, checkpoint, path)
        try:
            accumulator.add(checkpoint["state_dict"], source=str(path))
        except ValueError as error:  # checkpoints of different models: the message names the file and key
            raise DataError(str(error)) from None
        steps.append(int(checkpoint.get("global_step", 0)))
        if newest is None or int(checkpoint.get("global_step", 0)) >= int(newest.get("global_step", 0)):
            newest = checkpoint
        del checkpoint
    assert newest is not None
    newest["state_dict"] = accumulator.mean()
    newest["averaged_from"] = [str(path) for path in paths]
    newest["averaged_steps"] = steps
    return newest


