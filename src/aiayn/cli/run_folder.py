"""A training run's folder: a new one for each job, and held by the job while it runs.

* ``${aiayn.new_run_dir:outputs/<run name>}`` (conf/train.yaml's ``hydra.run.dir``) is
  ``outputs/<run name>/<date>_<time>``, made at once by the job's first process with a note of
  the job. Two jobs started in the same second get ``<date>_<time>``, ``<date>_<time>-2``, ...; the
  other processes of one job (DDP ranks started by srun or torchrun, the nodes of a multi-node run)
  find the folder their job's first process made, in whatever second each starts, and share it.
* :func:`hold` locks the folder a run writes its checkpoints to, for as long as the run lives
  (an OS lock, which a dead process does not keep). A second run of the same folder (two
  ``resume=auto`` at once, say) is refused in one line naming the holder; the other ranks and
  nodes of the holder's job are let in.
* :class:`HoldsTheRunFolder`, a Hydra callback (conf/train.yaml), holds ``hydra.run.dir`` before
  Hydra writes its record of the config (``.hydra/``) or its log into it: a run refused there
  touches nothing of the live run. The lock lasts until the command ends (:func:`until_the_end`).
* A run that resumes nothing (no ``resume=``) is refused a folder that holds another run's
  checkpoints (:func:`refuse_another_runs`), there too, before anything is written: it would
  write its own over them and mix its log and summary with that run's. The job's other processes
  (ranks, later nodes) are let in: their first process has checked.
* A run refused or stopped before its first step leaves no folder (:func:`remove_unstarted`); one
  that saved a checkpoint is never taken for one, and its user error says how to continue it
  (:func:`said_how_to_continue`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from aiayn.checkpoints.layout import checkpoint_folder
from aiayn.cli.errors import fail
from aiayn.config.hardware import first_process
from aiayn.config.identity import FOLDER_STAMP
from aiayn.config.resolvers import only_shown
from aiayn.errors import UserError
from aiayn.files import release_lock, take_lock
from aiayn.reporting.summary import CONTINUED_FILE

JOB_NOTE = ".job"  # who made the folder: the job's identity
LOCK = ".lock"  # held by the live run; its text names the holder


def job_identity() -> str:
    """What every process of one job shares and no other job does: SLURM's job (and step), a
    torchrun run id, the address a multi-node DDP job meets at, else this process."""
    if os.environ.get("SLURM_JOB_ID"):
        return f"slurm:{os.environ['SLURM_JOB_ID']}.{os.environ.get('SLURM_STEP_ID', '')}"
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        return f"torchrun:{os.environ['TORCHELASTIC_RUN_ID']}"
    if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        return f"ddp:{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    return f"process:{socket.gethostname()}:{os.getpid()}"


def new_run_dir(base: str) -> str:
    """``<base>/<date>_<time>``, or with ``-2``, ``-3``, ... when another job made that folder; made
    at once, but for a config only shown (``--cfg all``), where it is named alone."""
    stamp = datetime.now().strftime(FOLDER_STAMP)
    if only_shown():
        return str(Path(base) / stamp)
    me = job_identity()
    if not first_process() and not me.startswith("process:"):  # a later rank or node: the folder its first made
        return str(_jobs_folder(Path(base), me))
    for number in range(1, 1000):
        folder = Path(base) / (stamp if number == 1 else f"{stamp}-{number}")
        try:
            folder.mkdir(parents=True)
        except FileExistsError:
            if _maker(folder) == me:
                return str(folder)  # another process of this job made it
            continue
        (folder / JOB_NOTE).write_text(me + "\n")
        return str(folder)
    raise UserError(f"{base}: a thousand runs started in second {stamp}; set hydra.run.dir")


JOIN_S = 600.0  # how far apart in time a job's processes may start (the nodes of a job started by hand)


def _jobs_folder(base: Path, me: str) -> Path:
    """The newest folder under ``base`` that job ``me``'s first process made in the last
    :data:`JOIN_S` seconds, waiting up to as long for it to appear (that process may start later).
    UserError if none does."""
    deadline = time.monotonic() + JOIN_S
    while True:
        made = []
        with contextlib.suppress(OSError):
            since = time.time() - JOIN_S
            for note in base.glob(f"*/{JOB_NOTE}"):
                with contextlib.suppress(OSError):
                    if (when := note.stat().st_mtime) >= since and note.read_text().strip() == me:
                        made.append((when, note.parent))
        if made:
            return max(made)[1]
        if time.monotonic() >= deadline:
            raise UserError(f"{base}: no folder of this job ({me}) was made by its first process (rank 0 of node 0) "
                            f"within {JOIN_S / 60:.0f} minutes; start that process too, or give every process of the "
                            "job the same hydra.run.dir")
        time.sleep(0.2)


def _maker(folder: Path, wait_s: float = 2.0) -> str | None:
    """The identity in ``folder``'s note (waiting a moment for the job that has just made it)."""
    deadline = time.monotonic() + wait_s
    while True:
        with contextlib.suppress(OSError):
            text = (folder / JOB_NOTE).read_text().strip()
            if text:
                return text
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


_held: dict[Path, int] = {}  # the folders this process holds, and how many holds of each are open
_command: list[contextlib.ExitStack] = []  # the command under way (until_the_end): what it holds


@contextlib.contextmanager
def until_the_end() -> Iterator[None]:
    """Around a command (train's ``main``): what :class:`HoldsTheRunFolder` holds is let go as it
    ends, however it ends (a one-line error is a SystemExit, which Hydra lets through)."""
    with contextlib.ExitStack() as stack:
        _command.append(stack)
        try:
            yield
        finally:
            _command.remove(stack)


class HoldsTheRunFolder(Callback):
    """Hydra's ``on_run_start`` comes before it makes ``hydra.run.dir`` or writes ``.hydra/`` and
    the log there: the folder is held (:func:`hold`) from then on, so a refused run writes nothing."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        if not _command:
            return
        try:
            folder = str(config.hydra.run.dir)
        except Exception:  # noqa: BLE001  a folder it cannot resolve: Hydra says so in a moment, as ever
            return
        try:
            _command[-1].enter_context(hold(folder))  # a live run's folder: refused as in use, first
            refuse_another_runs(folder, config.get("resume"))
        except UserError as error:  # raised, Hydra would make a warning of it and go on
            fail(str(error))
        except OSError:  # a folder that cannot be made (a file of that name): Hydra says so in a moment, as ever
            return


def refuse_another_runs(run_dir: str | os.PathLike, resume: str | None, setting: str = "hydra.run.dir") -> None:
    """UserError when a run that resumes nothing (``resume`` unset: null, none, false) would
    start in ``run_dir`` while it holds another run's checkpoints (``checkpoints/*.ckpt``), in the
    job's first process; the others share the folder their first process was let into.
    ``setting``: what names the folder (a sweep's jobs': ``hydra.sweep.dir``)."""
    from aiayn.checkpoints.resume import resumes_nothing  # torch: only once a run is under way

    if not resumes_nothing(resume) or not first_process():
        return
    folder = Path(run_dir).absolute()
    found = sorted(path.name for path in checkpoint_folder(folder).glob("*.ckpt"))
    if found:
        raise UserError(f"{folder} holds another run's checkpoints ({', '.join(found[:3])}"
                        f"{f' and {len(found) - 3} more' if len(found) > 3 else ''}), which a fresh run would write "
                        f"over: continue that run with resume=auto, or start this one in a folder of its own "
                        f"(another {setting})")


@contextlib.contextmanager
def hold(run_dir: str | os.PathLike, tool: str = "train.py") -> Iterator[None]:
    """Hold ``run_dir`` while the block runs (the job's first process; the others share it).
    UserError naming the holder when another live run holds it. A folder this process holds
    already is held again at no cost."""
    folder = Path(run_dir).absolute()
    descriptor = None
    if first_process() and folder not in _held:
        folder.mkdir(parents=True, exist_ok=True)
        descriptor = take_lock(folder / LOCK, wait=False)
        if descriptor is None:
            raise UserError(f"{folder} is in use by another run ({holder(folder / LOCK)}); wait for it to end or "
                            "stop it, or start this one afresh in a folder of its own (resume=null, another hydra.run.dir)")
    try:
        if descriptor is not None:
            note_the_holder(descriptor)
        _held[folder] = _held.get(folder, 0) + 1
        try:
            yield
        finally:
            _held[folder] -= 1
            if not _held[folder]:
                del _held[folder]
    finally:
        if descriptor is not None:
            release_lock(descriptor)  # the file stays: it holds the holder's note until the next run's


def note_the_holder(descriptor: int) -> None:
    """Write who holds the lock (this process: its PID, host, job and since when) into its file."""
    note = {"pid": os.getpid(), "host": socket.gethostname(), "job": job_identity(),
            "since": datetime.now().isoformat(timespec="seconds")}
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, (json.dumps(note) + "\n").encode(), 0)


def holder(lock: Path) -> str:
    """Who holds ``lock``, as :func:`note_the_holder` wrote it."""
    try:
        note = json.loads(lock.read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        note = {}
    if not note:
        return "its holder is starting"
    return f"PID {note.get('pid')} on {note.get('host')}, since {note.get('since')}"


OmegaConf.register_new_resolver("aiayn.new_run_dir", new_run_dir, use_cache=True, replace=True)


def remove_unstarted(run_dir: Path, made_since: set[Path] | None = None) -> None:
    """Remove the folder Hydra made for a run that stopped before training (a bad setting): it
    holds only Hydra's record of the config and the log. A folder with anything else — an earlier
    attempt's checkpoints — is kept. ``made_since``: what the folder held before this attempt's
    loggers started; what they added goes first, unless it holds a checkpoint: a run that saved
    one has trained (whatever its caller counted), and nothing of it goes."""
    if made_since is not None and run_dir.is_dir():
        made = set(run_dir.iterdir()) - made_since
        if any(_holds_a_checkpoint(path) for path in made):
            return
        for path in made:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
    kept = (".hydra", JOB_NOTE, LOCK, CONTINUED_FILE)
    if not run_dir.is_dir() or any(p.name not in kept and p.suffix != ".log" for p in run_dir.iterdir()):
        return
    shutil.rmtree(run_dir, ignore_errors=True)
    for parent in run_dir.parents:  # outputs/<run name>/ when it held only this run
        if parent == Path.cwd() or not parent.is_dir() or any(parent.iterdir()):
            break
        parent.rmdir()


def _holds_a_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a checkpoint file (``*.ckpt``: a step's, ``last.ckpt``, ``best.ckpt``) or a
    folder with one in it."""
    if path.suffix == ".ckpt":
        return True
    return path.is_dir() and not path.is_symlink() and any(path.rglob("*.ckpt"))


def checkpoints_saved(output_dir: str | os.PathLike) -> dict[Path, int]:
    """The run's checkpoint files (``last.ckpt``, a link, too) and when each was written, in ns:
    taken before an attempt trains and after it fails, whether it saved one."""
    folder = checkpoint_folder(output_dir)
    return {path: path.lstat().st_mtime_ns for path in folder.glob("*.ckpt")} if folder.is_dir() else {}


def said_how_to_continue(error: BaseException, output_dir: str | os.PathLike, before: dict[Path, int]) -> BaseException:
    """A :class:`UserError` raised once this attempt had saved a checkpoint (``before``: what
    :func:`checkpoints_saved` found as it started; its test refused a split damaged meanwhile, say),
    with how to go on once it is put right: ``resume=auto``, which continues from the newest
    checkpoint rather than training again. Any other error, or one before a save, as it is."""
    after = checkpoints_saved(output_dir)
    if not isinstance(error, UserError) or all(before.get(path) == written for path, written in after.items()):
        return error
    if "resume=auto" in str(error):  # says how to go on already (a full disk as a checkpoint is saved)
        return error
    told = type(error)(f"{error}; the run's training is saved in {Path(output_dir) / 'checkpoints'}: once that is put "
                       "right, continue with the same command and resume=auto")
    told.__cause__ = error
    return told
