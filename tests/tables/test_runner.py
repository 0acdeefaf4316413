"""`experiments/tables.py run` and aiayn.tables.runner: a sweep's jobs in fixed, resumable
directories, several at once, with real tiny training runs (src/train.py, debug=tiny): the
sweep's jobs are real processes (marked ``cli``); `tables.py run --dry-run` and its refusal of a
bad --part start none, and run in this process (tests.helpers.inprocess)."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

from aiayn.files import release_lock, take_lock
from aiayn.tables import runner
from tests.helpers.inprocess import run_tool
from tests.helpers.preloaded import python_starts_preloaded
from tests.helpers.runs import REPO, TINY, offline_environment, snapshot
from tests.helpers.tables import tables_command

CONF = REPO / "conf"
# Two tiny jobs; logger=none: nothing to write but the checkpoints and the summary.
OVERRIDES = [*TINY, "logger=none", "seed=1,2"]


def _environment(data_root: Path, cache_dir: Path) -> dict[str, str]:
    return {**offline_environment(), "AIAYN_DATA_ROOT": str(data_root), "AIAYN_CACHE_DIR": str(cache_dir)}


def _run(jobs: list[runner.RowJob], environment: dict[str, str], parallel: int = 1) -> tuple[list[runner.RowJob], str]:
    """runner.run's failed jobs and what it printed."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), python_starts_preloaded():
        failed = runner.run(jobs, parallel=parallel, env=environment, poll_s=0.2)
    return failed, printed.getvalue()


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory, data_root: Path, subword_cache: Path):
    """The two tiny jobs of OVERRIDES run two at a time: (root, jobs, printed lines)."""
    root = tmp_path_factory.mktemp("sweep") / "table"
    jobs = runner.plan(CONF, OVERRIDES, root)
    failed, printed = _run(jobs, _environment(data_root, subword_cache), parallel=2)
    assert not failed, "\n\n".join(job.log.read_text()[-3000:] for job in failed)
    return root, jobs, printed


def test_plan_names_each_job_by_what_differs(tmp_path: Path) -> None:
    jobs = runner.plan(CONF, ["debug=tiny", "seed=1,2"], tmp_path / "root")
    assert [job.name for job in jobs] == ["seed1", "seed2"]
    assert [job.dir for job in jobs] == [tmp_path / "root" / "seed1", tmp_path / "root" / "seed2"]
    assert [job.overrides for job in jobs] == [("debug=tiny", "seed=1"), ("debug=tiny", "seed=2")]
    assert all(job.state == runner.NEW for job in jobs)
    again = runner.plan(CONF, ["debug=tiny", "seed=1,2"], tmp_path / "root")
    assert [(job.name, job.dir) for job in again] == [(job.name, job.dir) for job in jobs]
    command = jobs[0].command("python", REPO)
    group = command[-1].removeprefix("run_group=").strip("'")  # the folder's last two parts and a suffix of its own
    assert re.fullmatch(rf"{re.escape(tmp_path.resolve().name)}/root#[0-9a-f]{{6}}", group), group
    assert command[1:] == [str(REPO / "src" / "train.py"), "debug=tiny", "seed=1",
                           f"hydra.run.dir={tmp_path / 'root' / 'seed1'}", "resume=auto", f"run_group='{group}'"]
    with pytest.raises(ValueError, match="run_group"):  # the runner sets it
        runner.plan(CONF, ["debug=tiny", "seed=1,2", "run_group=mine"], tmp_path / "root")


def test_each_root_has_a_group_of_its_own_kept_by_its_later_runs(tmp_path: Path) -> None:
    """Two roots named alike (`a/x/table`, `b/x/table`) get two groups (before: both `x/table`, their
    runs mixed in one W&B group); a root's group is recorded as its first job starts and kept by the
    next run into it. The jobs here are `true`: the runner's part alone, nothing trained."""
    roots = [tmp_path / "a" / "x" / "table", tmp_path / "b" / "x" / "table"]
    groups = []
    for root in roots:
        jobs = runner.plan(CONF, ["debug=tiny", "seed=1"], root)
        assert not root.exists()  # planning (and so a dry run) writes nothing
        for attempt in range(2):
            with contextlib.redirect_stdout(io.StringIO()):
                runner.run(runner.plan(CONF, ["debug=tiny", "seed=1"], root) if attempt else jobs,
                           python=shutil.which("true"), poll_s=0.05)
        groups.append((root / "group.txt").read_text().strip())
        commands = [line for line in (root / "seed1.log").read_text().splitlines() if line.startswith("===")]
        assert [shlex.split(line)[-1] for line in commands] == [f"run_group='{groups[-1]}'"] * 2, commands
    assert groups[0] != groups[1] and all(re.fullmatch(r"x/table#[0-9a-f]{6}", group) for group in groups), groups


def test_job_names() -> None:
    names = runner.job_names([["experiment=table3_A_h1", "seed=1235", "+scale=x"],
                             ["experiment=table3_A_h4", "seed=1236", "+scale=x"]])
    assert names == ["table3_A_h1-seed1235", "table3_A_h4-seed1236"]
    assert runner.job_names([["experiment=table3_base", "debug=tiny"]]) == ["table3_base"]
    # The experiment and the seed name the job whether or not they vary: base's repeats and the
    # whole table's sweep find the same directory for base at seed 1234.
    repeats = runner.job_names([["experiment=table3_base", "seed=1234"], ["experiment=table3_base", "seed=1235"]])
    table = runner.job_names([["experiment=table3_A_h1", "seed=1234"], ["experiment=table3_base", "seed=1234"]])
    assert repeats == ["table3_base-seed1234", "table3_base-seed1235"]
    assert table == ["table3_A_h1-seed1234", "table3_base-seed1234"]
    assert runner.job_names([["seed=1234", "experiment=table3_base", "x=1"], ["seed=1234", "experiment=table3_base",
                                                                            "x=2"]]) == [
        "table3_base-seed1234-x1", "table3_base-seed1234-x2"]
    assert runner.job_names([["debug=tiny"]]) == ["job"]
    assert runner.job_names([["a.b=x/y z"], ["a.b=1"]]) == ["a.bx_y_z", "a.b1"]
    with pytest.raises(ValueError, match="would share the directory name 'a.bx_y'"):
        runner.job_names([["a.b=x/y"], ["a.b=x y"]])
    with pytest.raises(ValueError, match="sets resume itself"):
        runner.plan(CONF, ["seed=1,2", "resume=none"], "root")


def test_parts_partition_the_jobs(tmp_path: Path) -> None:
    jobs = runner.plan(CONF, ["debug=tiny", "seed=1,2,3,4,5"], tmp_path)
    first, second = runner.select_part(jobs, "1/2"), runner.select_part(jobs, "2/2")
    assert [job.name for job in first] == ["seed1", "seed3", "seed5"]
    assert [job.name for job in second] == ["seed2", "seed4"]
    assert runner.select_part(jobs, None) == jobs and runner.select_part(jobs, "1/1") == jobs
    for bad in ("0/2", "3/2", "x", "1/0", "1/2/3", ""):
        with pytest.raises(ValueError, match=r"expected K/M with 1 <= K <= M") as error:
            runner.select_part(jobs, bad)
        assert "\n" not in str(error.value)


def test_cpu_shares_are_disjoint() -> None:
    assert runner.cpu_shares(1) == [None]
    assert runner.cpu_shares(2, cpus=[0, 1, 2, 3, 4]) == [[0, 1], [2, 3, 4]]
    assert runner.cpu_shares(3, cpus=[4, 5]) == [[4], [4], [5]]  # more slots than CPUs: one each


@pytest.mark.cli
@pytest.mark.slow
def test_run_two_jobs_at_once_then_nothing(swept, data_root: Path, subword_cache: Path) -> None:
    root, jobs, printed = swept
    assert printed.count("start ") == 2 and "end seed1: exit 0" in printed and "end seed2: exit 0" in printed
    for job in jobs:
        assert json.loads((job.dir / "summary.json").read_text())["steps"] == 4
        assert "resume=auto" in job.log.read_text() and "cpus " in job.log.read_text()
    replanned = runner.plan(CONF, OVERRIDES, root)
    assert [job.state for job in replanned] == [runner.DONE, runner.DONE]
    before = snapshot(root)
    failed, again = _run(replanned, _environment(data_root, subword_cache), parallel=2)
    assert not failed and "start " not in again and again.count("skip ") == 2
    assert snapshot(root) == before  # no log line, no file touched


@pytest.mark.cli
@pytest.mark.slow
def test_partial_job_resumes_from_its_checkpoint(swept, tmp_path: Path, data_root: Path, subword_cache: Path) -> None:
    """A job stopped after step 2 (its later checkpoints and summary gone) goes on from step 2."""
    _, jobs, _ = swept
    shutil.copytree(jobs[0].dir, tmp_path / jobs[0].name)
    stopped = tmp_path / jobs[0].name
    for name in ("summary.json", "checkpoints/step0000004.ckpt", "checkpoints/last.ckpt"):
        (stopped / name).unlink()
    planned = runner.plan(CONF, OVERRIDES, tmp_path)
    assert [job.state for job in planned] == [runner.PARTIAL, runner.NEW]
    failed, printed = _run(runner.select_part(planned, "1/2"), _environment(data_root, subword_cache))
    log = planned[0].log.read_text()
    assert not failed, log[-3000:]
    assert "start seed1 (partial)" in printed and "seed2" not in printed
    assert "resuming from" in log and "step0000002.ckpt (step 2)" in log
    assert "cpus " not in log  # one at a time: affinity and threads left alone
    assert json.loads((stopped / "summary.json").read_text())["steps"] == 4
    assert planned[0].state == runner.DONE and not planned[1].dir.exists()


def test_a_job_another_runner_trains_is_left_to_it(tmp_path: Path, data_root: Path, subword_cache: Path) -> None:
    """Two runners on one root (two parts, or the same command twice): a job whose lock another
    runner holds is skipped, not trained twice in the same directory."""
    jobs = runner.plan(CONF, OVERRIDES, tmp_path)
    held = take_lock(jobs[0].lock)  # "another runner" is training seed1 (flock: another descriptor is another holder)
    try:
        failed, printed = _run(jobs[:1], _environment(data_root, subword_cache))
    finally:
        release_lock(held)
    assert not failed and "skip seed1: another runner is training it" in printed and "start " not in printed
    assert not jobs[0].dir.exists()


@pytest.mark.cli
@pytest.mark.slow
def test_cli_dry_run_lists_and_runs_nothing(swept, tmp_path: Path) -> None:
    root, _, _ = swept
    result = run_tool("experiments/tables.py", "run", "--root", str(tmp_path / "new"), "--dry-run", *OVERRIDES)
    assert "seed1  [new]" in result.stdout and "seed2  [new]" in result.stdout
    assert f"hydra.run.dir={tmp_path / 'new' / 'seed1'} resume=auto" in result.stdout
    assert "2 jobs: 0 done, 0 partial, 2 new; dry run" in result.stdout
    assert not (tmp_path / "new").exists()
    done = run_tool("experiments/tables.py", "run", "--root", str(root), "--dry-run", "--part", "2/2", *OVERRIDES)
    assert "seed2  [done]" in done.stdout and "seed1" not in done.stdout
    assert "1 jobs (part 2/2 of 2): 1 done, 0 partial, 0 new" in done.stdout
    bad = run_tool("experiments/tables.py", "run", "--root", str(root), "--part", "3/2", *OVERRIDES, check=False)
    assert bad.returncode == 2 and "part '3/2': expected K/M" in bad.stderr


@pytest.mark.cli
@pytest.mark.slow
def test_a_row_resumes_only_its_own_run(tmp_path: Path, data_root: Path, subword_cache: Path) -> None:
    """Two rows of the same settings (here only their names differ): the second, with no
    checkpoint of its own yet, trains its own run rather than continuing the first's."""
    jobs = runner.plan(CONF, [*TINY, "logger=none", "run_name=first,second"], tmp_path)
    failed, _ = _run(jobs[:1], _environment(data_root, subword_cache))
    assert not failed
    first = {path: path.read_bytes() for path in (jobs[0].dir / "summary.json", jobs[0].dir / "checkpoints" /
                                                  "last.ckpt")}
    failed, printed = _run(jobs, _environment(data_root, subword_cache))
    log = jobs[1].log.read_text()
    assert not failed, log[-3000:]
    assert "skip run_namefirst: done" in printed and "resuming from" not in log
    assert json.loads((jobs[1].dir / "summary.json").read_text())["steps"] == 4
    assert {path: path.read_bytes() for path in first} == first  # the first row's run untouched


@pytest.mark.cli
@pytest.mark.slow
def test_a_finished_run_of_other_settings_is_not_taken_for_a_job(swept, capsys: pytest.CaptureFixture) -> None:
    """The same root given to a command of other settings (here 8 steps where its runs trained 4):
    refused in one line per job naming the folder and what differs, nothing started (before: each
    job `[done]` and skipped, the runs of the other settings taken for this command's)."""
    root, jobs, _ = swept
    before = snapshot(root)
    assert tables_command("run", "--root", str(root), "--dry-run", *OVERRIDES, "optim.train_steps=8") == 2
    said = capsys.readouterr()
    assert not said.out and said.err.count("\n") == 2
    assert (f"tables.py: {jobs[0].dir} holds a finished run of other settings (- where this command has "
            "optim.train_steps=8), which would be taken for its job seed1: give another --root") in said.err
    assert tables_command("run", "--root", str(root), *OVERRIDES, "optim.train_steps=8") == 2
    assert snapshot(root) == before
    assert tables_command("run", "--root", str(root), "--dry-run", *OVERRIDES) == 0  # its own settings: done
    assert "2 jobs: 2 done, 0 partial, 0 new" in capsys.readouterr().out
