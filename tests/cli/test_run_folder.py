"""Run folders never collide: two jobs started in the same second get folders of their own, the
processes of one job share theirs, and a live run holds its folder against a second run of it
(two ``resume=auto`` at once) while the ranks of its own job are let in."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from aiayn.cli import run_folder
from aiayn.errors import DataError, UserError
from tests.helpers.runs import REPO, TINY, popen, run_command

_LAUNCH_VARIABLES = ("SLURM_JOB_ID", "SLURM_STEP_ID", "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT",
                     "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "RANK", "SLURM_PROCID")


@pytest.fixture
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in _LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_jobs_of_one_second_get_folders_of_their_own_and_a_jobs_processes_share_its(
        tmp_path: Path, no_launcher: pytest.MonkeyPatch) -> None:
    no_launcher.setenv("MASTER_ADDR", "node1")
    no_launcher.setenv("MASTER_PORT", "29500")
    first = Path(run_folder.new_run_dir(str(tmp_path / "run")))
    assert (first / run_folder.JOB_NOTE).read_text().strip() == "ddp:node1:29500"
    no_launcher.setenv("MASTER_PORT", "29501")  # another job, in the same second
    other = Path(run_folder.new_run_dir(str(tmp_path / "run")))
    assert other != first and other.parent == first.parent
    no_launcher.setenv("MASTER_PORT", "29500")
    no_launcher.setenv("NODE_RANK", "1")  # the first job's second node: its job's folder, in whatever second
    assert Path(run_folder.new_run_dir(str(tmp_path / "run"))) == first
    no_launcher.delenv("NODE_RANK")


def test_a_later_node_joins_its_jobs_folder_made_seconds_before_and_waits_for_it(
        tmp_path: Path, no_launcher: pytest.MonkeyPatch) -> None:
    """Before: a node (or a torchrun rank) that resolved the folder in another second than its
    job's first process made one of its own, and wrote its logs, config and metrics there."""
    base = tmp_path / "run"
    no_launcher.setenv("TORCHELASTIC_RUN_ID", "abc")
    no_launcher.setenv("RANK", "1")
    made = base / "2026-01-01_00-00-00"  # made by the job's first process, some seconds earlier
    made.mkdir(parents=True)
    (made / run_folder.JOB_NOTE).write_text("torchrun:abc\n")
    (base / "2026-01-01_00-00-05").mkdir()
    (base / "2026-01-01_00-00-05" / run_folder.JOB_NOTE).write_text("torchrun:xyz\n")  # another job's
    assert Path(run_folder.new_run_dir(str(base))) == made
    old = time.time() - 2 * run_folder.JOIN_S  # the same identity's folder of a job long gone: not joined
    os.utime(made / run_folder.JOB_NOTE, (old, old))
    no_launcher.setattr(run_folder, "JOIN_S", 0.3)
    with pytest.raises(UserError, match=rf"^{base}: no folder of this job \(torchrun:abc\) was made by its first "
                                        r"process \(rank 0 of node 0\) within 0 minutes; start that process too"):
        run_folder.new_run_dir(str(base))
    assert sorted(path.name for path in base.iterdir()) == ["2026-01-01_00-00-00", "2026-01-01_00-00-05"]  # none made


_HOLDER = """
import sys, time
from aiayn.cli import run_folder
with run_folder.hold(sys.argv[1]):
    print("held", flush=True)
    time.sleep(600)
"""


def test_a_held_folder_refuses_a_second_run_until_its_holder_dies(tmp_path: Path, no_launcher) -> None:
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=rf"in use by another run \(PID {holder.pid} on "), run_folder.hold(tmp_path):
            pass
        no_launcher.setenv("LOCAL_RANK", "1")  # a rank of the holder's job is let in
        with run_folder.hold(tmp_path):
            pass
        no_launcher.delenv("LOCAL_RANK")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with run_folder.hold(tmp_path):  # a dead process keeps no lock
        pass


@pytest.mark.cli
@pytest.mark.slow
def test_two_runs_started_together_get_two_folders_and_two_resumes_of_one_run_do_not_both_run(
        tmp_path: Path, data_root: Path, subword_cache: Path) -> None:
    env = {**os.environ, "WANDB_MODE": "offline", "AIAYN_DATA_ROOT": str(data_root),
           "AIAYN_CACHE_DIR": str(subword_cache), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(REPO / "src/train.py"), *TINY, "logger=csv", "test_after_training=false",
               "visualize_at_end=false", "trainer.enable_progress_bar=false", "run_name=together"]
    started = [popen([*command, f"seed={seed}"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                     stderr=subprocess.PIPE, text=True) for seed in (1, 2)]
    for process in started:
        assert process.wait(timeout=300) == 0, process.stderr.read()[-2000:]
    folders = sorted((tmp_path / "outputs" / "together").iterdir())
    assert len(folders) == 2, folders
    seeds = {}
    for folder in folders:
        names = sorted(p.name for p in (folder / "checkpoints").glob("*.ckpt"))
        assert names == ["last.ckpt", "step0000002.ckpt", "step0000004.ckpt"], names  # never a "-v1"
        seed = torch.load(folder / "checkpoints" / "last.ckpt", weights_only=False)["hyper_parameters"]["run_config"]
        seeds[seed["seed"]] = folder
    assert sorted(seeds) == [1, 2]

    # Two resume=auto of one run at once: the second is refused in one line naming the first.
    run = seeds[1]
    longer = [*command, "seed=1", f"hydra.run.dir={run}", "resume=auto", "optim.train_steps=400"]
    first = popen(longer, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while f'"pid": {first.pid}' not in _read(run / run_folder.LOCK):
            assert first.poll() is None and time.monotonic() < deadline, "the first resume never held its folder"
            time.sleep(0.05)
        second = run_command([*command, "seed=1", f"hydra.run.dir={run}", "resume=auto"], cwd=tmp_path, env=env,
                             check=False)
        assert second.returncode == 2
        last = second.stderr.strip().splitlines()[-1]
        assert last.startswith(f"train.py: {run} is in use by another run (PID {first.pid} on {os.uname().nodename}, "
                               "since "), second.stderr
        assert "Traceback" not in second.stderr
    finally:
        first.kill()
        first.wait()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


@pytest.mark.cli
@pytest.mark.slow
def test_a_run_refused_for_a_held_folder_writes_nothing_into_it(tmp_path: Path, data_root: Path,
                                                                 subword_cache: Path) -> None:
    env = {**os.environ, "WANDB_MODE": "offline", "AIAYN_DATA_ROOT": str(data_root),
           "AIAYN_CACHE_DIR": str(subword_cache), "OMP_NUM_THREADS": "1"}
    run = tmp_path / "run"
    command = [sys.executable, str(REPO / "src/train.py"), *TINY, "logger=csv", "visualize_at_end=false",
               "trainer.enable_progress_bar=false", f"hydra.run.dir={run}"]
    live = popen([*command, "seed=1", "optim.train_steps=100000"], cwd=tmp_path, env=env,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while f'"pid": {live.pid}' not in _read(run / run_folder.LOCK) or not (
                run / "checkpoints" / "step0000002.ckpt").exists():
            assert live.poll() is None and time.monotonic() < deadline, "the live run never held its folder"
            time.sleep(0.05)
        record = {path: path.read_bytes() for path in (run / ".hydra").iterdir()}
        # Another run into the same folder, and a second resume=auto of the live run.
        for extra in (["seed=2"], ["seed=1", "resume=auto"]):
            refused = run_command([*command, *extra], cwd=tmp_path, env=env, check=False)
            assert refused.returncode == 2, refused.stderr[-2000:]
            assert refused.stderr.count("\n") == 1 and f"is in use by another run (PID {live.pid} " in refused.stderr
        assert {path: path.read_bytes() for path in (run / ".hydra").iterdir()} == record  # still says seed: 1
        log = (run / "train.log").read_text()
        assert "resuming from" not in log and "seed=2" not in log
        assert live.poll() is None
    finally:
        live.kill()
        live.wait()


def test_a_fresh_run_is_refused_a_folder_with_another_runs_checkpoints_but_that_runs_job_is_not(
        tmp_path: Path, no_launcher: pytest.MonkeyPatch) -> None:
    run_folder.refuse_another_runs(tmp_path, None)  # no checkpoints: a fresh run may start there
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "step0000002.ckpt").write_bytes(b"weights")
    for resume in (None, "null", "none", "false"):
        with pytest.raises(UserError, match=r"holds another run's checkpoints \(step0000002\.ckpt\).*resume=auto.*"
                                            r"another hydra\.run\.dir"):
            run_folder.refuse_another_runs(tmp_path, resume)
    for resume in ("auto", str(tmp_path)):  # continuing that run (a SLURM requeue, a sweep job resumed)
        run_folder.refuse_another_runs(tmp_path, resume)
    for rank in ("LOCAL_RANK", "NODE_RANK", "RANK"):  # the job's other processes: its first one checked
        no_launcher.setenv(rank, "1")
        run_folder.refuse_another_runs(tmp_path, None)
        no_launcher.delenv(rank)


@pytest.mark.cli
@pytest.mark.slow
def test_a_fresh_run_in_another_runs_folder_is_refused_before_it_writes_anything(tmp_path: Path, data_root: Path,
                                                                                 subword_cache: Path) -> None:
    """Before: the second run wrote its checkpoints over the first's, and train.log and
    summary.json mixed both runs, with only Lightning's warning that the folder was not empty."""
    env = {**os.environ, "WANDB_MODE": "offline", "AIAYN_DATA_ROOT": str(data_root),
           "AIAYN_CACHE_DIR": str(subword_cache), "OMP_NUM_THREADS": "1"}
    run = tmp_path / "run"
    command = [sys.executable, str(REPO / "src/train.py"), *TINY, "logger=csv", "visualize_at_end=false",
               "test_after_training=false", "optim.train_steps=2", "trainer.enable_progress_bar=false",
               f"hydra.run.dir={run}"]
    run_command(command, cwd=tmp_path, env=env)
    before = {path: path.read_bytes() for path in run.rglob("*") if path.is_file() and path.name != run_folder.LOCK}
    refused = run_command([*command, "model.n_heads=4", "seed=9"], cwd=tmp_path, env=env, check=False)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert refused.stderr == (
        f"train.py: {run} holds another run's checkpoints (last.ckpt, step0000002.ckpt), which a fresh run would write "
        "over: continue that run with resume=auto, or start this one in a folder of its own (another hydra.run.dir)\n")
    after = {path: path.read_bytes() for path in run.rglob("*") if path.is_file() and path.name != run_folder.LOCK}
    assert after == before, "the refused run wrote nothing there"


def test_a_folder_with_a_checkpoint_this_attempt_made_is_never_removed_as_unstarted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run that trained and then failed (its test refused a damaged split, say) whose caller
    counted no step (before: ddp_spawn's launching process, whose count stayed 0): its checkpoints,
    and everything else this attempt made, stay. A run that saved none still leaves no folder."""
    monkeypatch.chdir(tmp_path)  # the folders above the run's go as far as the working directory
    for name, saved in (("trained", True), ("unstarted", False)):
        run = tmp_path / "outputs" / name / "2026-11-30_12-00-00"
        (run / ".hydra").mkdir(parents=True)
        (run / "train.log").write_text("the run's log\n")
        before = set(run.iterdir())
        (run / "csv" / "version_0").mkdir(parents=True)
        (run / "csv" / "version_0" / "metrics.csv").write_text("epoch,step,train/loss\n0,0,6.8\n")
        if saved:
            (run / "checkpoints").mkdir()
            (run / "checkpoints" / "step0000004.ckpt").write_bytes(b"weights")
            (run / "checkpoints" / "last.ckpt").symlink_to("step0000004.ckpt")
            (run / "summary.json").write_text("{}")
        made = {path: path.read_bytes() for path in run.rglob("*") if path.is_file()}
        run_folder.remove_unstarted(run, made_since=before)
        if saved:
            assert {path: path.read_bytes() for path in run.rglob("*") if path.is_file()} == made
        else:
            assert not (tmp_path / "outputs" / name).exists()


def test_a_user_error_after_this_attempt_saved_says_to_continue_with_resume_auto(tmp_path: Path) -> None:
    """A user error once this attempt has saved a checkpoint (its test refused a split damaged
    meanwhile) says how to go on, resume=auto, in one process and under ddp_spawn alike (end to end:
    tests/training/test_ranks_step.py); refused before a save (a resumed run's earlier checkpoints
    untouched), or not the user's error, it is as it was."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "step0000002.ckpt").write_bytes(b"an earlier attempt's")
    before = run_folder.checkpoints_saved(run)
    refused, crashed = DataError("test.en.gz: not gzip"), RuntimeError("a bug")
    assert run_folder.said_how_to_continue(refused, run, before) is refused
    (run / "checkpoints" / "step0000004.ckpt").write_bytes(b"this attempt's")
    told = run_folder.said_how_to_continue(refused, run, before)
    assert type(told) is DataError and told.__cause__ is refused
    assert str(told) == (f"test.en.gz: not gzip; the run's training is saved in {run / 'checkpoints'}: once that is put "
                         "right, continue with the same command and resume=auto")
    assert run_folder.said_how_to_continue(crashed, run, before) is crashed
    assert run_folder.said_how_to_continue(refused, tmp_path / "no run", {}) is refused
    # One that says how to go on already (a full disk as a later checkpoint is saved): as it is (before: said twice).
    full = DataError("checkpoints: No space left on device while saving checkpoint step0000006.ckpt; it was not "
                     "written (the checkpoints before it are whole). Free space there and continue with the same "
                     "command and resume=auto")
    assert run_folder.said_how_to_continue(full, run, before) is full
