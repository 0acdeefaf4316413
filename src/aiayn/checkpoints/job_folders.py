"""Where a run's earlier attempts are, for ``resume=auto`` (:mod:`aiayn.checkpoints.resume`) and
``init_from`` (:mod:`aiayn.checkpoints.init_from`): the run's own folder, then the earlier folders of the
same job: ``outputs/<run name>/<date>_<time>`` for a single run; for a sweep's job, the job folders of
earlier sweeps, ``multirun/*/*``, of a job with its overrides (its length aside)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from aiayn.checkpoints.io import list_checkpoints
from aiayn.checkpoints.layout import checkpoint_folder
from aiayn.config.identity import LENGTH_KEYS, STAMPED_FOLDER, own_overrides


def job_dirs(output_dir: Path, multirun: bool, job: Sequence[str] | None = None,
             left_out: Sequence[str] = ()) -> list[Path]:
    """This run's directory, then earlier directories of the same job, newest first: the job folders
    of earlier sweeps whose job had the same overrides (``job``: the sweep job's, those that set one of
    ``left_out`` aside: ``resume`` …, which its folder's name leaves out too; compared with what each
    folder's ``.hydra/overrides.yaml`` says, not by the job's number, which a job added to or taken
    from the sweep shifts; by the folder's name where ``job`` is None or a folder has no record), or the earlier
    ``<date>_<time>`` folders of the same run name. A folder named otherwise (``hydra.run.dir=``
    given: a table row's of ``experiments/tables.py run``) is its run's only one; the folders beside
    it are other runs.

    A sweep's job asked to train for longer (``optim.train_steps``, LENGTH_KEYS: in its overrides and
    so in its folder's name) is the same job: after the folders of its very overrides come those that
    differ from them in its length alone, the one trained furthest first (before: none, and a sweep
    extended with ``resume=auto optim.train_steps=N`` trained every job again from scratch)."""
    if multirun:  # multirun/<date>/<job subdir>
        found = [(match, folder) for sweep in output_dir.parent.parent.iterdir() if sweep != output_dir.parent and sweep.is_dir()
                 for folder in sweep.iterdir() if checkpoint_folder(folder).is_dir()
                 for match in [_job_match(folder, output_dir.name, job, left_out)] if match is not None]
        found.sort(key=lambda found: (found[0], _furthest_step(found[1]) if found[0] else 0, found[1].parent.name),
                   reverse=True)
        return [output_dir, *(folder for _, folder in found)]
    if STAMPED_FOLDER.fullmatch(output_dir.name):  # outputs/<run name>/<date>_<time>
        siblings = [d for d in output_dir.parent.iterdir() if d != output_dir and STAMPED_FOLDER.fullmatch(d.name)]
    else:
        siblings = []
    earlier = sorted((d for d in siblings if checkpoint_folder(d).is_dir()), key=lambda d: d.name, reverse=True)
    return [output_dir, *earlier]


def _job_match(folder: Path, name: str, job: Sequence[str] | None, left_out: Sequence[str]) -> int | None:
    """How the sweep job folder ``folder`` is of the job ``job`` (see :func:`job_dirs`): 2 by its very
    overrides (or its name), 1 by its overrides but its length, None not at all."""
    recorded = folder / ".hydra" / "overrides.yaml"
    if job is None or not recorded.is_file():
        return 2 if folder.name == name else None
    import yaml

    try:
        theirs = [str(o) for o in yaml.safe_load(recorded.read_text(encoding="utf-8")) or []]
    except (OSError, yaml.YAMLError):
        return None
    if sorted(own_overrides(theirs, left_out)) == sorted(own_overrides(job, left_out)):
        return 2
    lengthless = [*left_out, *LENGTH_KEYS]
    return 1 if sorted(own_overrides(theirs, lengthless)) == sorted(own_overrides(job, lengthless)) else None


def _furthest_step(run_dir: Path) -> int:
    """The step of ``run_dir``'s newest checkpoint by its file's name (0 where it has none)."""
    return max((step for step, _ in list_checkpoints(run_dir)), default=0)
