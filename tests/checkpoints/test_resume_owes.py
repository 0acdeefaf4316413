"""A resumed run owes exactly the work the killed one had not done: the validations after the
checkpoint it resumes from, the last step's validation, the run summary and the test. A kill -9
just as a validated step's checkpoint appears (during that validation before, now after it) and
just as the last step's checkpoint appears (before the summary) costs nothing but time."""

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

STEPS = [*TINY, "logger=csv", "optim.train_steps=40", "optim.warmup_steps=10", "checkpoint.every_n_train_steps=20",
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
    assert sorted(expected_points) == [20, 40], "a validation after steps 20 and 40, logged at the step validated"
    expected_summary = json.loads((whole / "summary.json").read_text())
    assert expected_summary["dev/step"] == 40

    killed = tmp_path / "killed"
    _kill_when(_command(killed), env, killed / "checkpoints" / "step0000020.ckpt")
    _kill_when(_command(killed, "resume=auto"), env, killed / "checkpoints" / "step0000040.ckpt")
    resumed = run_command(_command(killed, "resume=auto"), env=env)

    assert _dev_points(killed) == expected_points, "every validation logged once, as in the uninterrupted run"
    summary = json.loads((killed / "summary.json").read_text())
    for key in ("dev/step", "dev/ppl", "dev/bleu", "steps", "tokens_seen", "train_flops"):
        assert summary[key] == expected_summary[key], key
    test_line = next(line for line in resumed.stdout.splitlines() if line.startswith("test "))
    assert test_line == next(line for line in expected.stdout.splitlines() if line.startswith("test "))

    # A finished run extended (more steps, resume=auto): its summary is the new last step's.
    run_command(_command(killed, "resume=auto", "optim.train_steps=50"), env=env)
    extended = json.loads((killed / "summary.json").read_text())
    assert extended["dev/step"] == extended["steps"] == 50
    assert sorted(_dev_points(killed)) == [20, 40, 50]
