"""A training sweep, ``python src/train.py --multirun ...`` (conf/train.yaml's ``hydra/sweeper:
aiayn``, :mod:`hydra_plugins.aiayn_sweeper`): Hydra's basic sweeper, its jobs expanded the same
way (globs, ranges, comma lists, ``hydra.sweeper.max_batch_size``), and three things more.

1. Before the first job starts, every job's config is composed and checked as train checks its
   own before building anything (:func:`aiayn.cli.train_run.checked_config`). Refused jobs are one
   line each on stderr — the job's number, its overrides, the reason — and the sweep exits with
   status 2 having run nothing and made no folder.
2. ``hydra.sweeper.keep_going=true``: a job that fails (a bad setting found at run time, a run
   that stopped, a bug) does not stop the others; the sweep exits with the first failure's status
   once all have run. Default ``false``, Hydra's way: the sweep stops at the first failure. A
   stop of the sweep itself — preemption (exit 75: the job saved its step) or Ctrl-C (130) — ends
   it whatever keep_going says.
3. The sweep ends with a table, printed and written to ``<sweep dir>/sweep.tsv``: job, overrides,
   status (``done``, ``failed (exit N): reason``, ``preempted (exit 75)``, ``not run``), folder
   (absolute; of a job done that resumed a run elsewhere, that run's, which holds its checkpoints:
   with ``resume=auto`` each job's earlier run is found by its overrides, not its number,
   :func:`aiayn.checkpoints.job_folders.job_dirs`).

Its jobs share one group in W&B (and MLflow's ``sweep`` tag), settled before the first starts and
written to ``<sweep dir>/group.txt`` (:func:`settle_group`), where each job reads it
(:func:`aiayn.config.identity.sweep_group`). The sweep holds its folder while it runs (:func:`_hold`).

With Hydra's basic launcher the jobs run here one after another, each launched alone, so that a
failure is seen as it happens. Another launcher (``hydra/launcher=slurm``) gets the jobs in
batches, as from Hydra's sweeper; the checks and the table hold there too. One that runs them here
as processes of their own (``hydra/launcher=submitit_local``) gets a SIGTERM to the sweep handed on
to them, and their exits back (:mod:`aiayn.cli.sweep_processes`).
"""

from __future__ import annotations

import contextlib
import copy
import os
import sys
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from aiayn.cli.errors import INTERRUPTED, USER_ERROR, composition_message, describe, is_composition_error, say
from aiayn.cli.run_folder import LOCK, holder, note_the_holder, refuse_another_runs
from aiayn.cli.sweep_processes import ExitAsReturn, JobExited, signals_handed_on
from aiayn.cli.sweep_table import shown, write_table
from aiayn.config.identity import GROUP_FILE, LENGTH_KEYS, left_out_of_names, new_group, own_overrides, recorded_group
from aiayn.config.resolvers import runs_as_processes, runs_here, showing_only
from aiayn.files import atomic_write_text, release_lock, take_lock

TABLE = "sweep.tsv"
MULTIRUN_FILE = "multirun.yaml"  # the sweep's config, as Hydra's sweeper writes it
PREEMPTED = 75  # aiayn.training.preemption's exit status: the step is saved, resume=auto continues it
_STOPS_THE_SWEEP = (PREEMPTED, INTERRUPTED)


@dataclass
class Job:
    """One job of the sweep, and what became of it."""

    number: int
    overrides: list[str]
    folder: str = ""
    status: str = "not run"
    exit: int | None = None  # None: done or not run
    results: list[JobReturn] = field(default_factory=list)

    def failed(self, code: int, reason: str | None) -> None:
        self.exit = code
        kind = {PREEMPTED: "preempted", INTERRUPTED: "interrupted"}.get(code, "failed")
        self.status = f"{kind} (exit {code})" + (f": {reason}" if reason else "")


def sweep(sweeper: BasicSweeper, arguments: list[str]) -> list[list[JobReturn]]:
    """What :class:`hydra_plugins.aiayn_sweeper.AiaynSweeper` does for ``--multirun``."""
    sweep_dir = Path(str(sweeper.config.hydra.sweep.dir))  # resolved once: every job shares ${now:}
    batches = _batches(sweeper, arguments)
    jobs = [Job(number, list(overrides)) for number, overrides in
            enumerate(overrides for batch in batches for overrides in batch)]
    refused = check(sweeper, jobs)
    if refused:
        for job, reason in refused:
            say(f"sweep job #{job.number} of {len(jobs)} refused, so no job was run ({shown(job.overrides)}): {reason}")
        sys.exit(USER_ERROR)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    held = _hold(sweep_dir)
    stopped = threading.Event()  # a SIGTERM to a sweep whose jobs are processes of their own
    try:
        group = settle_group(sweeper.config, sweep_dir)
        OmegaConf.save(sweeper.config, sweep_dir / MULTIRUN_FILE)  # as Hydra's sweeper
        try:
            if runs_here(sweeper.config.hydra):
                _run_one_by_one(sweeper, jobs)
            elif runs_as_processes(sweeper.config.hydra):  # a SIGTERM handed on to them, their exits returned
                sweeper.launcher.task_function = ExitAsReturn(sweeper.launcher.task_function)
                with signals_handed_on(stopped):
                    _run_in_batches(sweeper, jobs, [len(batch) for batch in batches], stopped)
            else:
                _run_in_batches(sweeper, jobs, [len(batch) for batch in batches])
        finally:
            write_table(jobs, sweep_dir / TABLE, group)
    finally:
        release_lock(held)
    failures = [job for job in jobs if job.exit is not None]
    if failures:
        sys.exit(failures[0].exit)
    if stopped.is_set():  # stopped before any job did (a SIGTERM as the sweep started): its jobs "not run"
        sys.exit(PREEMPTED)
    return [job.results for job in jobs]


def _hold(sweep_dir: Path) -> int:
    """Hold the sweep's folder while it runs (the OS lock of its ``.lock``). Two sweeps started in
    the same second into one output root get one folder, ``multirun/<date>_<time>``, where each
    would write its config, group and table over the other's: the second is refused in one line."""
    descriptor = take_lock(sweep_dir / LOCK, wait=False)
    if descriptor is None:
        say(f"{sweep_dir} is in use by another sweep ({holder(sweep_dir / LOCK)}); a sweep's folder is its own: give "
            "this one another with hydra.sweep.dir=<folder> (with the default multirun/<date>_<time>, two sweeps "
            "started in the same second share one: start it again)")
        sys.exit(USER_ERROR)
    note_the_holder(descriptor)
    return descriptor


def settle_group(config: DictConfig, sweep_dir: Path) -> str:
    """The sweep's group, written to ``<sweep dir>/group.txt`` before its first job starts and said
    in one line. A new sweep's is its folder's last two parts and six random hex digits
    (``multirun/2026-11-30_07-24-35#1a2b3c``): two sweeps never share one, whatever their folders
    are called. A sweep given ``resume=auto`` keeps the group of the sweep it continues: the newest
    in its own folder or one beside it (``multirun/*``) run with the same command, its overrides
    but those its jobs' folder names leave out (``resume``, ``logger``, ``trainer.devices``) and
    ``optim.train_steps`` (a sweep extended to train longer), so that its resumed runs stay in
    their group. Called before ``config`` is saved in the folder."""
    from aiayn.checkpoints.resume import resumes_nothing  # torch: only once a sweep runs

    command = _command(config)
    continued = None
    if not resumes_nothing(OmegaConf.select(config, "resume")):
        continued = next((earlier for earlier in _sweeps_beside(sweep_dir) if _command_of(earlier) == command), None)
    group = recorded_group(continued) if continued is not None else None
    group = group or new_group(sweep_dir)
    atomic_write_text(sweep_dir / GROUP_FILE, group + "\n")
    print(f"sweep: group {group}" + (f", continuing the sweep of {continued}" if continued is not None else ""),
          flush=True)
    return group


def _command(config: DictConfig) -> list[str]:
    """The sweep's overrides that make its jobs, sorted: those its jobs' folder names leave out
    (``hydra.job.config.override_dirname.exclude_keys``) and their length (``optim.train_steps``:
    a sweep extended to train longer continues the one it extends) left out."""
    return sorted(own_overrides(config.hydra.overrides.task, [*left_out_of_names(config.hydra), *LENGTH_KEYS]))


def _sweeps_beside(sweep_dir: Path) -> list[Path]:
    """The sweeps that recorded a group in ``sweep_dir`` or a folder beside it, the newest first
    (by when each saved its config)."""
    parent = sweep_dir.parent if sweep_dir.parent.is_dir() else None
    found = [folder for folder in {sweep_dir, *(parent.iterdir() if parent else ())}
             if (folder / GROUP_FILE).is_file() and (folder / MULTIRUN_FILE).is_file()]
    return sorted(found, key=lambda folder: (folder / MULTIRUN_FILE).stat().st_mtime_ns, reverse=True)


def _command_of(sweep_dir: Path) -> list[str] | None:
    """The command of the sweep whose config ``sweep_dir`` holds; None where it cannot be read."""
    try:
        return _command(OmegaConf.load(sweep_dir / MULTIRUN_FILE))
    except Exception:  # noqa: BLE001 - a folder that holds no readable sweep continues none
        return None


def dry_run(conf_dir: str | os.PathLike, overrides: list[str]) -> tuple[list[Job], list[tuple[Job, str]]]:
    """The jobs of ``python src/train.py --multirun <overrides>`` and those of them it would refuse,
    each with its reason (:func:`check`): the sweep composed and its sweeper made as Hydra makes
    them for ``--multirun``, its jobs expanded and checked as :func:`sweep` does, none run and no
    folder made (``experiments/tables.py sweep``). What Hydra cannot compose is raised."""
    from hydra import initialize_config_dir
    from hydra._internal.callbacks import Callbacks
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.plugins import Plugins
    from hydra.types import HydraContext, RunMode

    with initialize_config_dir(config_dir=str(Path(conf_dir).resolve()), version_base="1.3"):
        hydra = GlobalHydra.instance().hydra
        # hydra.mode=MULTIRUN, as --multirun adds it: the jobs' plans read it (their ranks started by ddp_spawn)
        config = hydra.compose_config("train", [*overrides, "hydra.mode=MULTIRUN"], run_mode=RunMode.MULTIRUN,
                                      with_log_configuration=False)
        context = HydraContext(config_loader=hydra.config_loader, callbacks=Callbacks())  # none is called
        sweeper = Plugins.instance().instantiate_sweeper(config=config, hydra_context=context,
                                                         task_function=lambda task: None)
        arguments = OmegaConf.to_container(config.hydra.overrides.task, resolve=False)
        jobs = [Job(number, list(job)) for number, job in
                enumerate(job for batch in _batches(sweeper, arguments) for job in batch)]
        return jobs, check(sweeper, jobs)


def _batches(sweeper: BasicSweeper, arguments: list[str]) -> list[list[list[str]]]:
    """The jobs' overrides in the launcher's batches, as Hydra's basic sweeper expands them."""
    params = sweeper._parse_config() + list(arguments)  # hydra.sweeper.params, then the command line
    parser = OverridesParser.create(config_loader=sweeper.hydra_context.config_loader)
    return BasicSweeper.split_arguments(parser.parse_overrides(params), sweeper.max_batch_size)


def check(sweeper: BasicSweeper, jobs: list[Job]) -> list[tuple[Job, str]]:
    """Compose and check every job's config (setting each job's folder); the refused jobs, each
    with the reason in one line. Nothing is built or written."""
    from aiayn.cli.train_run import checked_config  # torch and Lightning: only once a sweep runs

    # Jobs another launcher runs elsewhere (SLURM) are planned for the node they ask for, as
    # --cfg job shows it, not refused for the GPUs this machine (a login node) lacks.
    elsewhere = not runs_here(sweeper.config.hydra) and not runs_as_processes(sweeper.config.hydra)
    refused = []
    before = HydraConfig.instance().cfg
    try:
        for job in jobs:
            try:
                task = _job_config(sweeper, job)
                with showing_only() if elsewhere else contextlib.nullcontext():
                    checked_config(task)
                # A job that would start afresh where another run's checkpoints are (the same sweep run
                # again without resume=auto): refused here, before the sweep's group and table are written.
                refuse_another_runs(job.folder, task.get("resume"), "hydra.sweep.dir")
            except Exception as error:  # each job's reason is reported; a bug's is raised
                reported = describe(error)
                if reported is None and not is_composition_error(error):
                    raise
                refused.append((job, reported[0] if reported else composition_message(error)))
    finally:
        HydraConfig.instance().cfg = before
    return refused


def _job_config(sweeper: BasicSweeper, job: Job) -> DictConfig:
    """The job's config as its run will get it (Hydra's launcher and ``run_job``), its folder
    named but not made; Hydra's config of the job is set, as in the job."""
    config = sweeper.hydra_context.config_loader.load_sweep_config(sweeper.config, list(job.overrides))
    with open_dict(config):
        config.hydra.job.id = config.hydra.job.num = job.number
    HydraConfig.instance().set_config(config)
    folder = os.path.join(str(OmegaConf.select(config, "hydra.sweep.dir")),
                          str(OmegaConf.select(config, "hydra.sweep.subdir")))
    with read_write(config.hydra.runtime), open_dict(config.hydra.runtime):
        config.hydra.runtime.output_dir = os.path.abspath(folder)
    HydraConfig.instance().set_config(config)
    job.folder = folder
    task = copy.deepcopy(config)
    with read_write(task), open_dict(task):
        del task["hydra"]
    return task


def _run_one_by_one(sweeper: BasicSweeper, jobs: list[Job]) -> None:
    for job in jobs:
        try:
            job.results = list(sweeper.launcher.launch([job.overrides], initial_job_idx=job.number))
        except SystemExit as stop:  # the job's one-line error (aiayn.cli.errors.fail), already on stderr
            code = stop.code if isinstance(stop.code, int) else 1
            if code == 0:
                job.status = "done"
                continue
            job.failed(code, getattr(stop, "message", None))
        else:
            _record(job, job.results[0])
        if job.exit is not None and (job.exit in _STOPS_THE_SWEEP or not sweeper.keep_going):
            return


def _run_in_batches(sweeper: BasicSweeper, jobs: list[Job], sizes: list[int],
                    stopped: threading.Event | None = None) -> None:
    start = 0
    for size in sizes:
        if stopped is not None and stopped.is_set():  # a SIGTERM to the sweep: no more jobs start
            return
        batch = jobs[start:start + size]
        results = sweeper.launcher.launch([job.overrides for job in batch], initial_job_idx=start)
        for job, result in zip(batch, results):
            job.results = [result]
            _record(job, result)
        start += size
        if any(job.exit is not None and (job.exit in _STOPS_THE_SWEEP or not sweeper.keep_going) for job in batch):
            return


def _record(job: Job, result: JobReturn) -> None:
    """A job that returned: done, or failed with the exception it raised (its traceback printed)."""
    if result.status == JobStatus.COMPLETED:
        job.status = "done"
        # A job that resumed a run in another folder (resume=auto, an earlier sweep's) trained there:
        # train moved its paths.output_dir, in the config the job returns; this attempt's folder
        # holds its config and log alone. A job that resumed nothing keeps ${hydra:runtime.output_dir},
        # which resolves only inside the job: None here.
        ran_in = (OmegaConf.select(result.cfg, "paths.output_dir", default=None, throw_on_resolution_failure=False)
                  if result.cfg is not None else None)
        if ran_in and job.folder and Path(ran_in).resolve() != Path(job.folder).resolve():
            job.folder = str(ran_in)
        return
    error = result._return_value
    if isinstance(error, JobExited):  # a job run as a process of its own: its one line, already in its log
        job.failed(error.code, error.message)
    elif isinstance(error, BaseException):
        traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)
        first = (str(error).strip().splitlines() or [""])[0][:200]
        job.failed(1, f"{type(error).__name__}: {first} (traceback above)")
    else:
        job.failed(1, None)
