"""A table's sweep run in resumable parts, several jobs at once (``experiments/tables.py run``).

:func:`plan` expands a Hydra multirun's overrides into jobs (:func:`expand_sweep`: Hydra's own
expansion), each with a fixed directory ``<root>/<name>`` named
by its overrides that differ between the sweep's jobs, so that the same command run again finds
the same directories: a job whose directory has ``summary.json`` is done and skipped, one whose
directory exists without it goes on from its newest checkpoint (``resume=auto``), and the rest
start fresh. The jobs share one W&B group, the root's own (``<root>/group.txt``), kept by every
later run into that root. :func:`select_part` keeps one part ``K/M`` of the jobs (for several machines, or
several sittings); :func:`run` trains the jobs that are not done, at most ``parallel`` at a time,
each on its own share of the CPUs.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from aiayn.config.identity import kept_group, new_group, override_key, own_overrides, recorded_group
from aiayn.files import release_lock, take_lock
from aiayn.reporting.summary import SUMMARY_FILE

REPO = Path(__file__).resolve().parents[3]

DONE, PARTIAL, NEW = "done", "partial", "new"
# Overrides the runner sets itself on every job.
RESERVED_KEYS = ("hydra.run.dir", "hydra.sweep.dir", "hydra.sweep.subdir", "resume", "run_group")
_UNSAFE = re.compile(r"[^A-Za-z0-9._=-]")
_PART = re.compile(r"\s*(\d+)\s*/\s*(\d+)\s*")
# A value Hydra's override grammar takes unquoted (else it is single-quoted).
_PLAIN_VALUE = re.compile(r"[A-Za-z0-9_/.:+-]+")
_TERMINATE_WAIT_S = 30.0


@dataclass
class RowJob:
    """One job of a sweep: its overrides and its fixed directory ``<root>/<name>``."""

    index: int  # its place in the sweep's expansion
    name: str
    overrides: tuple[str, ...]
    dir: Path
    # The W&B group of the sweep's jobs (``run_group``): the one their root recorded (``<root>/group.txt``),
    # else a new one (the root's last two parts and a random suffix), recorded as the first job starts.
    group: str
    returncode: int | None = None  # once run

    @property
    def log(self) -> Path:
        """Where its output goes (appended on every attempt): ``<root>/<name>.log``."""
        return self.dir.parent / f"{self.name}.log"

    @property
    def lock(self) -> Path:
        """Held by the runner that trains the job (``<root>/.<name>.lock``, :func:`aiayn.files.take_lock`):
        two runners on one root — two parts, or the same command twice — never train one job at once."""
        return self.dir.parent / f".{self.name}.lock"

    @property
    def state(self) -> str:
        """``done`` (summary.json written), ``partial`` (started, will resume) or ``new``."""
        if (self.dir / SUMMARY_FILE).is_file():
            return DONE
        return PARTIAL if self.dir.exists() else NEW

    def trained_otherwise(self) -> list[str] | None:
        """A done job's run trained with overrides other than this job's: those overrides (its
        ``.hydra/overrides.yaml``, less what the runner sets itself), so that a command of other
        settings on the same root (``width_divisor=8`` where the table was run at 4) never takes that
        run for its own; None when they are the job's, or the folder has no record of them."""
        recorded = self.dir / ".hydra" / "overrides.yaml"
        if self.state != DONE or not recorded.is_file():
            return None
        import yaml

        theirs = own_overrides(yaml.safe_load(recorded.read_text()) or [], RESERVED_KEYS)
        return None if sorted(theirs) == sorted(self.overrides) else theirs

    def command(self, python: str | os.PathLike = sys.executable, repo: str | os.PathLike = REPO) -> list[str]:
        """``python <repo>/src/train.py <overrides> hydra.run.dir=<dir> resume=auto run_group=<group>``."""
        return [str(python), str(Path(repo) / "src" / "train.py"), *self.overrides,
                f"hydra.run.dir={_quoted(str(self.dir))}", "resume=auto", f"run_group={_quoted(self.group)}"]


def _value(override: str) -> str:
    return override.split("=", 1)[1] if "=" in override else ""


def _quoted(value: str) -> str:
    if _PLAIN_VALUE.fullmatch(value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def job_names(jobs: Sequence[Sequence[str]]) -> list[str]:
    """Each job's directory name: its experiment (the value of ``experiment=``) and its seed
    (``seed<N>``), whenever the job sets them, then ``<key><value>`` for each other override that
    differs between the jobs, joined by ``-``, characters outside ``[A-Za-z0-9._=-]`` made ``_``
    (``table3_base-seed1235``). So one run of a row and seed has one directory, whichever sweep
    names it: base's repeats (``experiment=table3_base seed=1234,1235,1236``) and the whole table
    (``'experiment=glob(table3_*)' seed=1234``) share ``table3_base-seed1234``. A job with none of
    these is named ``job``. Raises ValueError when two jobs would share a name."""
    values = [{override_key(override): _value(override) for override in job} for job in jobs]
    keys = {key for job in values for key in job}
    varying = {key for key in keys if len({job.get(key) for job in values}) > 1}
    names = []
    for job, settings in zip(jobs, values):
        parts = []
        for override in job:
            key = override_key(override)
            if key == "experiment":
                parts.insert(0, settings[key])
            elif key == "seed":
                parts.insert(1 if "experiment" in settings else 0, f"seed{settings[key]}")
            elif key in varying:
                parts.append(f"{key}{settings[key]}")
        if not parts:
            parts = ["job"]
        name = _UNSAFE.sub("_", "-".join(parts))
        names.append("_" + name if name.startswith(".") else name)
    seen: dict[str, int] = {}
    for number, name in enumerate(names):
        if name in seen:
            first = seen[name]
            raise ValueError(f"jobs #{first} ({' '.join(jobs[first])}) and #{number} ({' '.join(jobs[number])}) "
                             f"would share the directory name {name!r}; make their overrides differ")
        seen[name] = number
    return names


def expand_sweep(conf_dir: Path | str, overrides: list[str]) -> list[list[str]]:
    """The jobs ``python src/train.py --multirun <overrides>`` launches, each as its list of
    overrides, expanded by Hydra's own basic sweeper (globs, ranges, comma lists). Their configs
    are not checked here: ``experiments/tables.py sweep`` checks them as the multirun does."""
    from hydra import initialize_config_dir
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    with initialize_config_dir(config_dir=str(Path(conf_dir).resolve()), version_base="1.3"):
        parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
        batches = BasicSweeper.split_arguments(parser.parse_overrides(overrides), max_batch_size=None)
    return [list(job) for batch in batches for job in batch]


def plan(conf_dir: str | os.PathLike, overrides: Sequence[str], root: str | os.PathLike) -> list[RowJob]:
    """The jobs of ``python src/train.py --multirun <overrides>``, in Hydra's order, each with its
    directory ``<root>/<name>`` (see :func:`job_names`). Raises ValueError for an override the
    runner sets itself (hydra.run.dir, resume, ...) and for colliding names."""
    for override in overrides:
        if override_key(override) in RESERVED_KEYS:
            raise ValueError(f"{override!r}: the sweep runner sets {override_key(override)} itself; leave it out")
    expanded = expand_sweep(conf_dir, list(overrides))
    root = Path(root).resolve()
    group = recorded_group(root) or new_group(root)  # recorded only once a job starts: a dry run writes nothing
    return [RowJob(index, name, tuple(job), root / name, group)
            for index, (job, name) in enumerate(zip(expanded, job_names(expanded)))]


def parse_part(part: str) -> tuple[int, int]:
    """``"K/M"`` → (K, M), 1 <= K <= M; else ValueError with a one-line message."""
    match = _PART.fullmatch(str(part))
    k, m = (int(match.group(1)), int(match.group(2))) if match else (0, 0)
    if not match or m < 1 or not 1 <= k <= m:
        raise ValueError(f"part {part!r}: expected K/M with 1 <= K <= M, e.g. 1/3 (the first of three parts)")
    return k, m


def select_part(jobs: Sequence[RowJob], part: str | None) -> list[RowJob]:
    """Part ``K/M`` of the jobs: those whose place i in the expansion has i % M == K - 1
    (all of them for None)."""
    if part is None:
        return list(jobs)
    k, m = parse_part(part)
    return [job for job in jobs if job.index % m == k - 1]


def cpu_shares(parallel: int, cpus: Sequence[int] | None = None) -> list[list[int] | None]:
    """The CPUs of each of ``parallel`` slots: this process's CPUs (``os.sched_getaffinity``) in
    ``parallel`` disjoint, contiguous sets. None for each slot where affinity is left alone: one
    slot, or a system without sched_setaffinity. With more slots than CPUs, slots share one CPU each."""
    if parallel <= 1 or (cpus is None and not hasattr(os, "sched_setaffinity")):
        return [None] * max(parallel, 1)
    cpus = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    shares = []
    for slot in range(parallel):
        share = cpus[slot * len(cpus) // parallel:(slot + 1) * len(cpus) // parallel]
        shares.append(share or [cpus[slot % len(cpus)]])
    return shares


def _describe(cpus: Sequence[int]) -> str:
    ranges, start = [], None
    for position, cpu in enumerate(cpus):
        if start is None:
            start = cpu
        if position + 1 == len(cpus) or cpus[position + 1] != cpu + 1:
            ranges.append(f"{start}" if start == cpu else f"{start}-{cpu}")
            start = None
    return ",".join(ranges)


@dataclass
class _Running:
    job: RowJob
    process: subprocess.Popen
    slot: int
    started: float
    lock: int  # the job's lock, held (a descriptor of take_lock)


def _claim(job: RowJob) -> int | None:
    """The job's lock, held, when no other runner trains it and it is not done; else None."""
    job.group = kept_group(job.dir.parent, job.group)  # the root's, whichever runner of it started first
    job.lock.parent.mkdir(parents=True, exist_ok=True)
    lock = take_lock(job.lock, wait=False)
    if lock is None:
        print(f"skip {job.name}: another runner is training it", flush=True)
        return None
    if job.state == DONE:  # finished by another runner since this one planned
        release_lock(lock)
        print(f"skip {job.name}: done ({job.dir / SUMMARY_FILE})", flush=True)
        return None
    return lock


def _start(job: RowJob, slot: int, share: list[int] | None, python: str, repo: Path,
           env: Mapping[str, str] | None, lock: int) -> _Running:
    command = job.command(python, repo)
    environment = dict(os.environ if env is None else env)
    preexec = None
    if share is not None:
        environment["OMP_NUM_THREADS"] = environment["MKL_NUM_THREADS"] = str(len(share))
        preexec = lambda: os.sched_setaffinity(0, share)  # in the child, before exec
    with open(job.log, "a") as log:  # the root exists: _claim made it for the job's lock
        log.write(f"\n=== {datetime.now():%Y-%m-%d %H:%M:%S} {shlex.join(command)}"
                  f"{f'  [cpus {_describe(share)}]' if share else ''}\n")
        log.flush()
        # preexec_fn only calls sched_setaffinity, and the runner starts no threads of its own.
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   env=environment, preexec_fn=preexec)  # noqa: PLW1509
    where = f" on cpus {_describe(share)}" if share else ""
    print(f"start {job.name} ({job.state}){where} -> {job.log}", flush=True)
    return _Running(job, process, slot, time.monotonic(), lock)


def _terminate(running: Sequence[_Running]) -> None:
    """SIGTERM to each child, then SIGKILL to those still there after a while."""
    for entry in running:
        if entry.process.poll() is None:
            entry.process.terminate()
    deadline = time.monotonic() + _TERMINATE_WAIT_S
    for entry in running:
        try:
            entry.process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            entry.process.kill()
            entry.process.wait()
        print(f"stopped {entry.job.name} (exit {entry.process.returncode}); run again to resume it", flush=True)


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def run(jobs: Sequence[RowJob], parallel: int = 1, python: str | os.PathLike = sys.executable,
        repo: str | os.PathLike = REPO, env: Mapping[str, str] | None = None, poll_s: float = 0.5) -> list[RowJob]:
    """Train the jobs that are not done, at most ``parallel`` at a time, each as
    ``python <repo>/src/train.py <overrides> hydra.run.dir=<dir> resume=auto`` with its output
    appended to ``<root>/<name>.log``. With ``parallel`` > 1 each slot runs on its own share of
    the CPUs (:func:`cpu_shares`) with OMP/MKL threads to match. Prints a line as each job starts
    and ends. Returns the jobs that failed (non-zero exit, or no summary.json); a failure does not
    stop the others. Ctrl-C or SIGTERM stops the running jobs (their checkpoints stay, for a
    later run to resume) and raises KeyboardInterrupt."""
    if parallel < 1:
        raise ValueError(f"parallel must be at least 1, not {parallel}")
    pending = [job for job in jobs if job.state != DONE]
    for job in jobs:
        if job.state == DONE:
            print(f"skip {job.name}: done ({job.dir / SUMMARY_FILE})", flush=True)
    shares = cpu_shares(parallel)
    repo, python = Path(repo), str(python)
    running: list[_Running] = []
    failed: list[RowJob] = []
    free = list(range(parallel))
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        while pending or running:
            while pending and free:
                job = pending.pop(0)
                lock = _claim(job)
                if lock is not None:
                    slot = free.pop(0)
                    running.append(_start(job, slot, shares[slot], python, repo, env, lock))
            time.sleep(poll_s)
            for entry in [entry for entry in running if entry.process.poll() is not None]:
                running.remove(entry)
                release_lock(entry.lock)
                free.append(entry.slot)
                free.sort()
                job, code = entry.job, entry.process.returncode
                job.returncode = code
                minutes = (time.monotonic() - entry.started) / 60
                finished = code == 0 and job.state == DONE
                note = "" if finished or code != 0 else f", but no {SUMMARY_FILE}"
                print(f"end {job.name}: exit {code}{note} after {minutes:.1f} min", flush=True)
                if not finished:
                    failed.append(job)
    except KeyboardInterrupt:
        _terminate(running)
        for entry in running:
            release_lock(entry.lock)
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return sorted(failed, key=lambda job: job.index)
