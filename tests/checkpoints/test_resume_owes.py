"""A resumed run owes exactly the work the killed one had not done: the validations after the
checkpoint it resumes from, the last step's validation, the run summary and the test. A kill -9
just as a validated step's checkpoint appears (during that validation before, now after it) and
just as the last step's checkpoint appears (before the summary) costs nothing but time. Every
attempt logs its rows at the steps the uninterrupted run logs them at."""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.runs import REPO, TINY, popen, run_command

STEPS = [*TINY, "logger=csv", "optim.train_steps=30", "optim.warmup_steps=10", "checkpoint.every_n_train_steps=20",
         "trainer.val_check_interval=20", "trainer.enable_progress_bar=false", "visualize_at_end=false",
         "run_name=owed"]


def _command(run_dir: Path, *overrides: str) -> list[str]:
    return [sys.executable, "src/train.py", *STEPS, f"hydra.run.dir={run_dir}", *overrides]


def _kill_when(command: list[str], env: dict[str, str], path: Path) -> None:
    """Start ``command`` and SIGKILL it the moment ``path`` appears."""
    process = popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not path.exists():
        assert process.poll() is None, f"the run ended before {path.name}:\n{process.stderr.read()[-3000:]}"
        assert time.monotonic() < deadline, f"no {path.name} within 5 minutes"
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL


# A row's columns that measure the machine, not the training: left out of the comparisons.
TIMED = ("train/tgt_tokens_per_sec",)


def _rows(run_dir: Path) -> dict[tuple[str, int], dict[str, str]]:
    """Every row of every attempt's metrics.csv by (stage, step): train, val or test, by the loss it
    holds; a step the attempts both logged (trained again after a kill) must be the same row."""
    rows: dict[tuple[str, int], dict[str, str]] = {}
    for metrics in sorted((run_dir / "csv").glob("version_*/metrics.csv")):
        for row in csv.DictReader(metrics.open()):
            stage = next(stage for stage in ("train", "val", "test") if row.get(f"{stage}/loss"))
            kept = {key: value for key, value in row.items() if value and key not in TIMED}
            key = (stage, int(row["step"]))
            assert rows.setdefault(key, kept) == kept, f"{key} logged twice, {rows[key]} and {kept}"
    return rows


def _dev_points(run_dir: Path) -> dict[int, str]:
    """Every validation logged, by step, over all the attempts' CSV files (a step logged twice fails)."""
    points: dict[int, str] = {}
    for metrics in sorted((run_dir / "csv").glob("version_*/metrics.csv")):
        for row in csv.DictReader(metrics.open()):
            if row.get("val/ppl"):
                step = int(row["step"])
                assert step not in points, f"the validation of step {step} logged twice"
                points[step] = row["val/ppl"]
    return points


@pytest.fixture(scope="module")
def env(data_root: Path, subword_cache: Path) -> dict[str, str]:
    import os

    return {**os.environ, "WANDB_MODE": "offline", "AIAYN_DATA_ROOT": str(data_root),
            "AIAYN_CACHE_DIR": str(subword_cache), "OMP_NUM_THREADS": "1"}


@pytest.mark.cli
@pytest.mark.slow
def test_kills_at_a_validated_step_and_after_the_last_checkpoint_lose_no_validation_summary_or_test(
        tmp_path: Path, env) -> None:
    whole = tmp_path / "whole"
    expected = run_command(_command(whole), env=env)
    expected_points = _dev_points(whole)
    assert sorted(expected_points) == [20, 30], "a validation after steps 20 and 30, logged at the step validated"
    expected_summary = json.loads((whole / "summary.json").read_text())
    assert expected_summary["dev/step"] == 30

    killed = tmp_path / "killed"
    _kill_when(_command(killed), env, killed / "checkpoints" / "step0000020.ckpt")
    _kill_when(_command(killed, "resume=auto"), env, killed / "checkpoints" / "step0000030.ckpt")
    resumed = run_command(_command(killed, "resume=auto"), env=env)

    assert _dev_points(killed) == expected_points, "every validation logged once, as in the uninterrupted run"
    summary = json.loads((killed / "summary.json").read_text())
    for key in ("dev/step", "dev/ppl", "dev/bleu", "steps", "tokens_seen", "train_flops"):
        assert summary[key] == expected_summary[key], key
    test_line = next(line for line in resumed.stdout.splitlines() if line.startswith("test "))
    assert test_line == next(line for line in expected.stdout.splitlines() if line.startswith("test "))
    # The attempts' rows are the uninterrupted run's, each at its step: the test's of the attempt
    # with nothing left to train too (before: at step 29, Lightning's count restored one below).
    assert _rows(killed) == _rows(whole)

    # A finished run extended (more steps, resume=auto): its summary is the new last step's, and
    # its rows are those of a run of that length. Its last step, 30, was validated as the last,
    # not on trainer.val_check_interval (before: every row of the extension a step early, from 29).
    run_command(_command(killed, "resume=auto", "optim.train_steps=40"), env=env)
    extended = json.loads((killed / "summary.json").read_text())
    assert extended["dev/step"] == extended["steps"] == 40
    assert sorted(_dev_points(killed)) == [20, 30, 40]
    longer = tmp_path / "longer"
    run_command(_command(longer, "optim.train_steps=40"), env=env)
    after = {key: row for key, row in _rows(killed).items() if key[1] >= 30 and key not in (("val", 30), ("test", 30))}
    assert after == {key: row for key, row in _rows(longer).items() if key[1] >= 30}
    assert sorted(step for stage, step in after if stage == "train") == list(range(30, 40))
