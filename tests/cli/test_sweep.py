"""`python src/train.py --multirun ...` (aiayn.cli.sweep): every job checked before the first starts,
the sweep stopped at a failing job or, with hydra.sweeper.keep_going=true, gone on past it, and the
table of the jobs at the end. Refusals and a stop run in this process (tests.helpers.inprocess);
the sweep that goes on past a failure is a real process, its exit status and stderr as a user sees
them, its jobs real tiny runs on Multi30k. The dry run (`experiments/tables.py sweep`) refuses what the
sweep refuses."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import OmegaConf

from aiayn.cli.run_folder import note_the_holder
from aiayn.files import release_lock, take_lock
from tests.helpers import inprocess, runs
from tests.helpers.preloaded import popen
from tests.helpers.runs import TINY
from tests.helpers.signals import signal_at, wait_for_a_stop_at
from tests.helpers.tables import tables_command
from tests.helpers.wandb_offline import read_run

# Tiny jobs that train: 4 steps, no test split, no pictures, metrics in CSV.
JOB = [*TINY, "logger=csv", "test_after_training=false", "visualize_at_end=false", "task.datamodule.download=false"]


def table(sweep_dir: Path) -> list[dict[str, str]]:
    return list(csv.DictReader((sweep_dir / "sweep.tsv").read_text().splitlines(), delimiter="\t"))


@pytest.mark.slow
def test_refused_jobs_are_listed_one_line_each_before_any_runs(tmp_path, data_root, subword_cache):
    result = inprocess.run_tool("src/train.py", "--multirun", *JOB, "loss.label_smoothing=0.1,1.5", "seed=1,2",
                                "optim.warmup_steps=0,2", f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path,
                                data_root=data_root, cache_dir=subword_cache, check=False)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    # 8 jobs: those with warmup 0 or ε_ls 1.5 refused (the first reason of each), in job order.
    assert [line.split(" refused")[0] for line in lines] == [
        f"train.py: sweep job #{n} of 8" for n in (0, 2, 4, 5, 6, 7)], lines
    assert lines[0].startswith("train.py: sweep job #0 of 8 refused, so no job was run (debug=tiny logger=csv ")
    assert lines[0].endswith(" loss.label_smoothing=0.1 seed=1 optim.warmup_steps=0): optim.warmup_steps must be a "
                             "positive whole number, got 0")
    assert lines[2].endswith("loss.label_smoothing=1.5 seed=1 optim.warmup_steps=0): loss.label_smoothing must be in "
                             "[0.0, 1.0), got 1.5")
    assert not (tmp_path / "sweep").exists() and "Launching" not in result.stdout + result.stderr


@pytest.mark.slow
def test_by_default_the_sweep_stops_at_the_first_failing_job(tmp_path, data_root, subword_cache):
    """Job 0's data folder is empty: found at its start (not by the check), so job 1 never runs."""
    sweep = tmp_path / "sweep"
    result = inprocess.run_tool("src/train.py", "--multirun", *JOB, f"paths.data_root={tmp_path / 'empty'},{data_root}",
                                f"hydra.sweep.dir={sweep}", cwd=tmp_path, cache_dir=subword_cache, check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("train.py: Multi30k files missing")
    jobs = table(sweep)
    assert [job["status"].split(":")[0] for job in jobs] == ["failed (exit 2)", "not run"]
    assert jobs[0]["status"].startswith("failed (exit 2): Multi30k files missing or unreadable (download=False): "
                                        f"{tmp_path / 'empty'}")
    assert [job["folder"] for job in jobs] == ["-", "-"]  # a run that never started leaves no folder
    assert f"paths.data_root={data_root}" in jobs[1]["overrides"]
    assert "sweep: 0 of 2 jobs done" in result.stdout
    assert sorted(path.name for path in sweep.iterdir()) == [".lock", "group.txt", "multirun.yaml", "sweep.tsv"]


def test_a_sweep_whose_folder_another_live_sweep_holds_is_refused_in_one_line(tmp_path, subword_cache):
    """Two sweeps started in the same second into one output root share `multirun/<date>_<time>`:
    the second (here: its folder's lock held by this process, as the first sweep holds it) is
    refused before it writes there. Before, it wrote its config, group and table over the first's,
    and its jobs ran as that sweep's."""
    sweep = tmp_path / "multirun" / "2026-11-30_07-00-00"
    sweep.mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("the first sweep's\n")
    held = take_lock(sweep / ".lock")
    note_the_holder(held)
    try:
        result = inprocess.run_tool("src/train.py", "--multirun", *JOB, "seed=1,2", f"paths.data_root={tmp_path / 'empty'}",
                                    f"hydra.sweep.dir={sweep}", cwd=tmp_path, cache_dir=subword_cache, check=False)
    finally:
        release_lock(held)
    assert (sweep / "multirun.yaml").read_text() == "the first sweep's\n"
    assert result.returncode == 2 and "Launching" not in result.stdout + result.stderr
    since = json.loads((sweep / ".lock").read_text())["since"]
    assert result.stderr.strip().splitlines() == [
        (f"train.py: {sweep} is in use by another sweep (PID {os.getpid()} on {socket.gethostname()}, since {since}); "
         "a sweep's folder is its own: give this one another with hydra.sweep.dir=<folder> (with the default "
         "multirun/<date>_<time>, two sweeps started in the same second share one: start it again)")]


@pytest.mark.cli
@pytest.mark.slow
def test_with_keep_going_a_failing_job_does_not_stop_the_others(tmp_path, data_root, subword_cache):
    """Three jobs, the middle one's data folder empty: the others train, the sweep ends with the
    table and the failure's exit status. The jobs' logged hyper-parameters are their config, each
    setting once (the data module's arguments only under task.datamodule)."""
    sweep, link = tmp_path / "sweep", tmp_path / "data-link"
    link.symlink_to(data_root)
    result = runs.run_tool("src/train.py", "--multirun", *JOB, f"paths.data_root={data_root},{tmp_path / 'empty'},{link}",
                           "hydra.sweeper.keep_going=true", f"hydra.sweep.dir={sweep}", cwd=tmp_path,
                           cache_dir=subword_cache, check=False, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("train.py:")]
    assert len(errors) == 1 and errors[0].startswith(f"train.py: Multi30k files missing or unreadable (download=False): "
                                                     f"{tmp_path / 'empty'}"), errors
    jobs = table(sweep)
    assert [job["job"] for job in jobs] == ["0", "1", "2"]
    assert [job["status"].split(":")[0] for job in jobs] == ["done", "failed (exit 2)", "done"]
    assert jobs[1]["folder"] == "-" and f"paths.data_root={tmp_path / 'empty'}" in jobs[1]["overrides"]
    printed = result.stdout[result.stdout.index("sweep: 2 of 3 jobs done"):].splitlines()
    assert printed[1].split() == ["job", "overrides", "status", "folder"]
    cells = re.split(r"\s{2,}", printed[3])  # the printed table: the overrides that differ between the jobs
    assert cells[:2] == ["1", f"paths.data_root={tmp_path / 'empty'}"] and cells[3] == "-"
    assert cells[2].startswith("failed (exit 2): Multi30k files missing") and len(cells[2]) <= 100
    # The overrides all three share, once below the rows (sweep.tsv has them in each row).
    # (Hydra's sweeper writes a job's booleans True and False, here as in sweep.tsv.)
    assert printed[5].lower() == f"every job also: {' '.join(JOB)}".lower(), printed
    for job in (jobs[0], jobs[2]):
        run_dir = Path(job["folder"]) if Path(job["folder"]).is_absolute() else tmp_path / job["folder"]
        assert (run_dir / "summary.json").is_file() and (run_dir / "checkpoints" / "last.ckpt").is_file()
        logged = yaml.safe_load(next((run_dir / "csv").glob("version_*/hparams.yaml")).read_text())
        config = yaml.safe_load((run_dir / ".hydra" / "config.yaml").read_text())
        assert set(logged) == set(config) | {"parameters"}, set(logged) ^ (set(config) | {"parameters"})
        # The plan is computed (${aiayn.plan:}): a leaf in Hydra's record, a section once resolved.
        assert {path for path in leaves(logged) if not path.startswith("plan.")} == (
            {path for path in leaves(config) if path != "plan"} | {"parameters"})
        assert logged["task"]["datamodule"]["data_root"] == config["paths"]["data_root"] != "${paths.data_root}"


def leaves(config: dict, prefix: str = "") -> list[str]:
    """Every setting's dotted path."""
    paths = []
    for key, value in config.items():
        path = f"{prefix}{key}"
        paths += leaves(value, f"{path}.") if isinstance(value, dict) and value else [path]
    return paths


@pytest.mark.cli
@pytest.mark.slow
def test_a_stopped_sweep_given_resume_auto_resumes_each_job_from_its_earlier_folder(tmp_path, data_root, subword_cache):
    """The line a stopped job prints says: the same command and resume=auto. That sweep's job has
    the same folder name as before (resume is not part of it), so it finds its earlier folder and
    its checkpoint of step 2 (before, `resume=auto` in the name made it another job, which began
    again from scratch). Its W&B run stays in the stopped sweep's group (before, the resumed
    attempt moved it to the later sweep's, `<tmp>/B`, apart from the jobs that had finished)."""
    job = [o if o != "logger=csv" else "logger=[csv,wandb]" for o in JOB]
    command = ["--multirun", *job, "seed=5", *signal_at(2, "SIGTERM")]
    environment = {**runs.offline_environment(), "PYTHONPATH": str(runs.REPO)}  # the callback is tests.helpers'
    stopped = runs.run_tool("src/train.py", *command, "hydra.sweep.dir=A", env=environment, cwd=tmp_path,
                            data_root=data_root, cache_dir=subword_cache, check=False, timeout=300)
    assert stopped.returncode == 75, stopped.stderr[-3000:]
    assert "continue with the same command and resume=auto" in stopped.stderr
    # The same sweep again without resume=auto: its job refused before the sweep writes anything (before: it
    # wrote a new group and a table of "failed" over the stopped sweep's, which resume=auto then continued).
    kept = {name: (tmp_path / "A" / name).read_bytes() for name in ("group.txt", "sweep.tsv")}
    again = runs.run_tool("src/train.py", *command, "hydra.sweep.dir=A", env=environment, cwd=tmp_path,
                          data_root=data_root, cache_dir=subword_cache, check=False, timeout=300)
    assert again.returncode == 2 and again.stderr.strip().endswith(
        "continue that run with resume=auto, or start this one in a folder of its own (another hydra.sweep.dir)")
    assert {name: (tmp_path / "A" / name).read_bytes() for name in kept} == kept
    resumed = runs.run_tool("src/train.py", *command, "resume=auto", "hydra.sweep.dir=B", cwd=tmp_path,
                            env=environment, data_root=data_root, cache_dir=subword_cache, timeout=300)
    [earlier] = (tmp_path / "A").glob("0_*")
    assert (tmp_path / "B" / earlier.name).is_dir()
    assert f"resuming from {earlier / 'checkpoints' / 'step0000002.ckpt'} (step 2)" in resumed.stdout + resumed.stderr
    assert "starting from scratch" not in resumed.stdout + resumed.stderr
    assert sorted(path.name for path in (earlier / "checkpoints").glob("*.ckpt")) == [
        "last.ckpt", "step0000002.ckpt", "step0000004.ckpt"]
    # The table names the folder the job trained in, which holds its checkpoints (before: this attempt's),
    # absolute as every folder of the table (before: the sweep's own relative, a resumed run's absolute).
    [job] = table(tmp_path / "B")
    [first] = table(tmp_path / "A")
    for row in (job, first):
        assert Path(row["folder"]).is_absolute() and Path(row["folder"]).resolve() == earlier.resolve(), row
    assert job["status"] == "done"
    attempts = sorted((earlier / "wandb").glob("offline-run-*"))
    groups = [read_run(attempt, strict=False).group for attempt in attempts]
    assert len(groups) == 2 and groups[0] == groups[1], groups
    assert groups[0] == (tmp_path / "A" / "group.txt").read_text().strip()
    assert f"sweep: group {groups[0]}, continuing the sweep of A" in resumed.stdout


@pytest.mark.cli
@pytest.mark.slow
def test_a_sigterm_to_a_sweep_whose_jobs_are_processes_stops_them_as_preempted(tmp_path, data_root, subword_cache):
    """hydra/launcher=submitit_local runs each job as a process of its own, one batch at a time here.
    A SIGTERM to the sweep (as a cluster sends it) is handed on: job #0 saves its step and ends as
    preempted, job #1 never starts, the table says so and the sweep exits 75. Before, the sweep held
    the signal until every job had run, then ended with status 143 after a table of jobs all done."""
    sign, sweep = tmp_path / "at-step-2", tmp_path / "sweep"
    # The jobs' processes import this checkout's aiayn, as the sweep's does, and the callback (tests.helpers).
    environment = {**runs.offline_environment(), "PYTHONPATH": os.pathsep.join([str(runs.REPO / "src"), str(runs.REPO)]),
                   "AIAYN_DATA_ROOT": str(data_root), "AIAYN_CACHE_DIR": str(subword_cache)}
    command = [sys.executable, str(runs.REPO / "src" / "train.py"), "--multirun", *JOB, "seed=1,2",
               *wait_for_a_stop_at(2, str(sign)), "hydra/launcher=submitit_local", "hydra.sweeper.max_batch_size=1",
               f"hydra.launcher.submitit_folder={tmp_path / 'submitit'}", f"hydra.sweep.dir={sweep}"]
    process = popen(command, cwd=tmp_path, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not sign.exists():  # job #0, in its own process, is at step 2 and waits for the signal
            assert process.poll() is None, f"the sweep ended before the signal:\n{process.stderr.read()[-3000:]}"
            assert time.monotonic() < deadline, "job #0 reached no step 2 within 5 minutes"
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 75, stderr[-3000:]
    jobs = table(sweep)
    assert [job["status"].split(":")[0] for job in jobs] == ["preempted (exit 75)", "not run"], jobs
    assert "preempted by SIGTERM at step 2" in jobs[0]["status"] and jobs[1]["folder"] == "-"
    assert (Path(jobs[0]["folder"]) / "checkpoints" / "step0000002.ckpt").is_file()
    assert "sweep: 0 of 2 jobs done" in stdout


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_the_sweep_dry_run_refuses_gpus_this_machine_lacks_as_the_multirun_does(capsys: pytest.CaptureFixture) -> None:
    """`train.py --multirun ... trainer.devices=8`, run here by Hydra's basic launcher, refuses every
    job on a machine without GPUs; the dry run says the same (before: it planned them for an 8-GPU
    node, as for SLURM's launcher, and listed them as checked), and still plans SLURM's jobs."""
    assert tables_command("sweep", "model.dropout=0.0,0.2", "trainer.devices=8") == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 2 and all(
        line.startswith(f"tables.py: sweep job #{n} of 2 refused (model.dropout=0.{2 * n} trainer.devices=8): "
                        "trainer.devices=8 asks for 8 GPUs but no usable CUDA GPU was found on this machine")
        for n, line in enumerate(lines)), lines
    # model=base: a step 8 GPUs can share (the default job's 1,024 tokens cannot: batches of 128, refused)
    assert tables_command("sweep", "model.dropout=0.0,0.2", "trainer.devices=8", "hydra/launcher=slurm", "model=base") == 0
    assert capsys.readouterr().out.splitlines()[-1] == "2 jobs, each config checked as `train.py --multirun` checks it; nothing run"


def test_a_sweep_extended_to_train_longer_keeps_the_group_of_the_sweep_it_continues(tmp_path, capsys):
    """`resume=auto optim.train_steps=<more>`: the same sweep trained for longer, whose jobs go on from
    the earlier sweep's runs (aiayn.checkpoints.job_folders.job_dirs), in its group; another value of
    another setting makes another sweep (before: the longer sweep was another, and its resumed runs
    moved out of their group)."""
    from aiayn.cli.sweep import settle_group

    def sweep_config(*overrides: str) -> dict:
        return {"resume": "auto" if "resume=auto" in overrides else None,
                "hydra": {"overrides": {"task": list(overrides)},
                          "job": {"config": {"override_dirname": {"exclude_keys": ["trainer.devices", "logger", "resume"]}}}}}

    earlier = tmp_path / "multirun" / "2026-01-01_00-00-00"
    earlier.mkdir(parents=True)
    (earlier / "group.txt").write_text("multirun/2026-01-01_00-00-00#abcdef\n")
    OmegaConf.save(sweep_config("debug=tiny", "model.n_layers=1,2", "optim.train_steps=4"), earlier / "multirun.yaml")
    longer = tmp_path / "multirun" / "2026-01-02_00-00-00"
    longer.mkdir()
    config = OmegaConf.create(sweep_config("debug=tiny", "model.n_layers=1,2", "optim.train_steps=8", "resume=auto"))
    assert settle_group(config, longer) == "multirun/2026-01-01_00-00-00#abcdef"
    assert capsys.readouterr().out == f"sweep: group multirun/2026-01-01_00-00-00#abcdef, continuing the sweep of {earlier}\n"
    other = tmp_path / "multirun" / "2026-01-03_00-00-00"
    other.mkdir()
    config = OmegaConf.create(sweep_config("debug=tiny", "model.n_layers=1,3", "optim.train_steps=8", "resume=auto"))
    assert settle_group(config, other).startswith("multirun/2026-01-03_00-00-00#")


def test_the_sweeps_table_gives_each_override_as_typed(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Hydra's sweeper hands a job its values as Python prints them (``=False``, ``=0.10`` as 0.1): the table and
    sweep.tsv say them as a command line takes them (before: ``test_after_training=False``)."""
    from types import SimpleNamespace

    from aiayn.cli.sweep_table import write_table

    jobs = [SimpleNamespace(number=n, overrides=[f"seed={n}", "test_after_training=False", "model.dropout=0.10"],
                            status="done", folder=None) for n in (1, 2)]
    write_table(jobs, tmp_path / "sweep.tsv")
    rows = list(csv.reader((tmp_path / "sweep.tsv").open(), delimiter="\t"))
    assert [row[1] for row in rows[1:]] == [f"seed={n} test_after_training=false model.dropout=0.1" for n in (1, 2)]
    assert "every job also: test_after_training=false model.dropout=0.1" in capsys.readouterr().out
