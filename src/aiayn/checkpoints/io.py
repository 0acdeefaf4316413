"""Checkpoint files: reading one with a clear error, listing a run's checkpoints by step, loading
lazily (memory-mapped), and saving atomically (Lightning's writer of them, which train.py plugs in,
is aiayn.checkpoints.background.AtomicCheckpointIO: nothing here imports Lightning, so that the
tools that only read a checkpoint start without it).

train.py (aiayn.training.saving) writes its checkpoints into ``<run>/checkpoints/``: ``step0001000.ckpt`` every
``checkpoint.every_n_train_steps`` steps and at §6.1's steps to average (aiayn.config.checkpointing),
plus ``last.ckpt``, a link to the newest (a copy where no link can be made), and a run that stops
early ``best.ckpt``, its best validation's model, weights alone (aiayn.training.early_stopping). (Runs of earlier
releases also wrote ``time-step0001000.ckpt`` every ten minutes; they are read as the steps they
name.) Every one of them is written to a temporary file and renamed over the target, so a kill
during a save leaves the previous file (or none), never a truncated one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from aiayn.checkpoints.digest import damaged, file_digest, remove_digest, write_digest
from aiayn.checkpoints.layout import BEST, FOLDER, LAST, STEP_NAME
from aiayn.errors import DataError
from aiayn.files import atomic_write, no_room


def read_checkpoint(path: str | os.PathLike, lazily: bool = False) -> dict[str, Any]:
    """The raw checkpoint dict, with a clear error for a missing or foreign file. ``lazily``: its
    tensors memory-mapped, read only where used (for what a checkpoint says of its run)."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"ckpt={folder_given(path)}")
    if not path.is_file():
        raise DataError(not_found(path))
    damage = damaged(path)
    if damage:
        raise DataError(damage)
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False, mmap=lazily)
    except Exception as error:  # noqa: BLE001  torch raises several kinds for a file that is not a checkpoint
        raise DataError(f"{path}: not a readable checkpoint ({type(error).__name__}: {error})") from None
    if not isinstance(checkpoint, dict):  # a tensor or a number saved alone: `in` would raise on it
        raise DataError(f"{path}: not an aiayn training checkpoint (it holds an object of type "
                        f"{type(checkpoint).__name__}, not a checkpoint's dictionary)")
    missing = [key for key in ("state_dict", "hyper_parameters", "subwords") if key not in checkpoint]
    if missing:
        raise DataError(f"{path}: not an aiayn training checkpoint (no {', '.join(missing)})")
    return checkpoint


def not_found(path: Path) -> str:
    """The line for a checkpoint path that names no file, a link's missing target named (a run
    folder copied without the step ``last.ckpt`` points to, say)."""
    if path.is_symlink():
        return f"{path}: checkpoint not found (a link to {os.readlink(path)}, which is not there)"
    return f"{path}: checkpoint not found"


def folder_given(path: Path, hint: str = "", setting: str = "ckpt") -> str:
    """What to say of a folder given where one checkpoint file is asked for: ``<path> is a directory;
    give one checkpoint file, e.g. ckpt=<its last.ckpt>``, its ``best.ckpt`` beside it where it holds
    one, then ``hint`` (``setting``: the setting named, ``init_from`` for train's)."""
    folder = checkpoints_dir(path)
    last, best = folder / LAST, folder / BEST
    found = list_checkpoints(path)
    if not (last.is_file() or found):
        return f"{path} is a directory and holds no checkpoint files; give one checkpoint file"
    example = last if last.is_file() else found[-1][1]
    also = f" or {setting}={best} (the best validation's model)" if best.is_file() else ""
    return f"{path} is a directory; give one checkpoint file, e.g. {setting}={example}{also}{hint}"


def checkpoint_step(path: str | os.PathLike) -> int | None:
    """The global step in a checkpoint's file name (``step0001000.ckpt``, ``time-step0001000.ckpt``),
    or None for other names."""
    match = STEP_NAME.match(Path(path).name)
    return int(match.group(1)) if match else None


def checkpoints_dir(directory: str | os.PathLike) -> Path:
    """``directory`` itself if it holds checkpoints, else its ``checkpoints/`` folder (a run dir)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise DataError(f"{directory}: no such directory; give a run folder, its checkpoints/ folder or a checkpoint")
    if (directory / FOLDER).is_dir() and not any(directory.glob("*.ckpt")):
        return directory / FOLDER
    return directory


def list_checkpoints(directory: str | os.PathLike) -> list[tuple[int, Path]]:
    """(global step, path) of every step checkpoint in ``directory`` (a run dir or its
    checkpoints/ folder), oldest first, one per step. The step comes from the file name, else from
    the file's ``global_step``; ``last*.ckpt`` (a copy of the newest), ``best.ckpt`` (the best
    validation's model, weights alone) and averaged checkpoints are left out. When several files hold the same step (a step and a time checkpoint of an earlier
    release, written after the same batch) the one named ``step...`` is kept, so no weights count twice."""
    folder = checkpoints_dir(directory)
    by_step: dict[int, Path] = {}
    for path in sorted(folder.glob("*.ckpt")):
        if path.name.startswith("last") or path.name == BEST or not path.is_file():
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
    """The checkpoint at ``path`` (memory-mapped where the format allows), or None if unreadable
    or damaged (its bytes are not those written, :func:`aiayn.checkpoints.digest.damaged`)."""
    if damaged(path):
        return None
    for mmap in (True, False):
        try:
            return torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)
        except Exception:  # noqa: BLE001, S112  any failure means unreadable: the caller tries the next older file
            continue
    return None


def _preference(path: Path) -> tuple[int, str]:
    return (0 if path.name.startswith("step") else 1 if path.name.startswith("time-") else 2, path.name)


def save_checkpoint_atomically(checkpoint: dict[str, Any], out: str | os.PathLike) -> Path:
    """``torch.save`` to a temporary file beside ``out``, then rename it over ``out``: a reader
    never sees half a file, and a crash leaves any earlier ``out`` whole. The bytes' digest goes
    beside it (:func:`aiayn.checkpoints.digest.write_digest`), checked whenever it is read. An
    earlier ``out``'s digest is removed before the rename and the new one written after it, so a
    kill at any moment leaves a file under its own digest or under none (read unchecked), never
    a file under another's digest (which would call a whole checkpoint damaged)."""
    digest: list[str] = []

    def save(file) -> None:
        torch.save(checkpoint, file)
        file.flush()
        digest.append(file_digest(file.name))
        remove_digest(Path(out))  # the earlier file, if any: unchecked until it is replaced

    try:
        written = atomic_write(out, save)
        write_digest(written, digest[0])
        return written
    except (OSError, RuntimeError) as error:
        full = no_room(error)
        if full is None:
            raise
        raise DataError(f"{Path(out).parent}: {full.strerror or os.strerror(full.errno)} while saving checkpoint "
                        f"{Path(out).name}; it was not written (the checkpoints before it are whole). Free space "
                        "there and continue with the same command and resume=auto") from None
