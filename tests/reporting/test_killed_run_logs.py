"""A run killed with SIGKILL, resumed with resume=auto and then extended with more steps, as each
logger shows it: every step's metrics once across the attempts (W&B's offline files as ``wandb
sync`` uploads them all, MLflow's store, the attempts' metrics.csv), the summary the finished
attempt's, and what the extended attempt ran with."""

from __future__ import annotations

import csv
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from tests.helpers.runs import REPO, TINY_MODEL, popen, run_command
from tests.helpers.wandb_offline import read_run

# 12 steps, a checkpoint every 4, a validation every 6 and at the last step; then 4 steps more.
RUN = [
    *TINY_MODEL, "task.datamodule.max_tokens=512", "decoding.max_len_offset=5", "optim.warmup_steps=4",
    "optim.train_steps=12", "trainer.val_check_interval=6", "trainer.limit_val_batches=1",
    "trainer.limit_test_batches=1", "trainer.num_sanity_val_steps=0", "checkpoint.every_n_train_steps=4",
    "visualize_at_end=false", "trainer.enable_progress_bar=false", "logger=[wandb,mlflow,csv]", "run_name=logs",
]
BOOKKEEPING = {"epoch", "step", "trainer/global_step"}
STEP_FILE = re.compile(r"step(\d+)\.ckpt")


def _command(run_dir: Path, *overrides: str) -> list[str]:
    return [sys.executable, "src/train.py", *RUN, f"hydra.run.dir={run_dir}", *overrides]


def _csv_points(run_dir: Path) -> list[tuple[str, int]]:
    """(metric, step) of every value in every attempt's metrics.csv."""
    points = []
    for metrics in sorted((run_dir / "csv").glob("version_*/metrics.csv")):
        with open(metrics, newline="") as file:
            for row in csv.DictReader(file):
                points += [(key, int(row["step"])) for key, value in row.items() if value and key not in BOOKKEEPING]
    return points


def _kill_after_a_step_past_its_checkpoint(command: list[str], env: dict[str, str], run_dir: Path) -> int:
    """SIGKILL the run once it has logged the loss of a step it trained after its newest checkpoint
    (a step the resumed attempt trains again), checked with the process stopped (SIGSTOP). Returns
    that checkpoint's step."""
    process = popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while True:
        assert process.poll() is None, f"the run ended before it could be killed:\n{process.stderr.read()[-3000:]}"
        assert time.monotonic() < deadline, "no step logged past a checkpoint within 5 minutes"
        if any((run_dir / "checkpoints").glob("step*.ckpt")):
            process.send_signal(signal.SIGSTOP)
            saved = max(int(STEP_FILE.fullmatch(path.name).group(1))
                        for path in (run_dir / "checkpoints").glob("step*.ckpt"))
            logged = max((step for key, step in _csv_points(run_dir) if key == "train/loss"), default=-1)
            if logged >= saved and saved < 12:  # the loss of step `saved` + 1 is at `saved`
                process.send_signal(signal.SIGKILL)
                assert process.wait() == -signal.SIGKILL
                return saved
            process.send_signal(signal.SIGCONT)
        time.sleep(0.01)


@pytest.fixture
def environment(tmp_path: Path, data_root: Path, subword_cache: Path) -> dict[str, str]:
    home = tmp_path / "home"  # no ~/.netrc: W&B runs offline
    home.mkdir()
    env = {key: value for key, value in os.environ.items() if not key.startswith(("WANDB_", "MLFLOW_"))}
    return {**env, "HOME": str(home), "WANDB_SILENT": "true", "AIAYN_DATA_ROOT": str(data_root),
            "AIAYN_CACHE_DIR": str(subword_cache), "OMP_NUM_THREADS": "1",
            "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"}


@pytest.mark.cli
@pytest.mark.slow
def test_a_killed_then_extended_run_logs_every_step_once_with_each_logger(tmp_path: Path, environment) -> None:
    """Before: the killed attempt's W&B file held none of its rows (wandb-core writes 32 KiB blocks,
    and every 15 s), so steps 0 to the checkpoint never reached W&B; MLflow and metrics.csv held the
    steps trained after the checkpoint twice, once from each attempt; MLflow kept `optim.train_steps=12`
    for the extended run, with no sign of its 16, and spelt its params `None`, `['SIGTERM', ...]`."""
    run_dir = tmp_path / "run"
    saved = _kill_after_a_step_past_its_checkpoint(_command(run_dir), environment, run_dir)
    resumed = run_command(_command(run_dir, "resume=auto"), env=environment)
    assert "test test_2016_flickr:" in resumed.stdout
    run_command(_command(run_dir, "resume=auto", "optim.train_steps=16"), env=environment)

    # W&B: the attempts' files, read as `wandb sync` of them all uploads them (oldest first).
    folders = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(folders) == 3 and len({folder.name.rsplit("-", 1)[1] for folder in folders}) == 1, "one W&B run"
    attempts = [read_run(folder, strict=False) for folder in folders]  # (the killed one's may hold nothing)
    rows = [row for attempt in attempts for row in attempt.history]
    points = [(key, int(row["trainer/global_step"])) for row in rows for key in row
              if not key.startswith("_") and key not in BOOKKEEPING]
    assert not [point for point, count in Counter(points).items() if count > 1], "a step's metric logged twice"
    losses = [step for key, step in points if key == "train/loss"]
    assert losses == list(range(16)), "every step's loss once, in order"
    assert sorted(step for key, step in points if key == "val/loss") == [6, 12, 16]
    last = attempts[-1]
    assert last.summary["steps"] == 16 and "test/bleu" in last.summary and last.exit_code == 0
    assert last.config["optim"]["train_steps"] == 16  # what the extended attempt ran with

    # MLflow: each metric once at each step; the params as first logged, spelt as the YAML spells
    # them, and the setting the extension changed a tag.
    from mlflow import MlflowClient

    client = MlflowClient(environment["MLFLOW_TRACKING_URI"])
    (run,) = client.search_runs([client.get_experiment_by_name("aiayn").experiment_id])
    assert run.info.status == "FINISHED"
    for key in run.data.metrics:
        steps = [metric.step for metric in client.get_metric_history(run.info.run_id, key)]
        assert len(steps) == len(set(steps)), f"MLflow's {key} logged twice at a step: {sorted(steps)}"
    assert [metric.step for metric in client.get_metric_history(run.info.run_id, "train/loss")] == list(range(16))
    params, tags = run.data.params, run.data.tags
    assert params["optim.train_steps"] == "12" and tags["changed.optim.train_steps"] == "16"
    assert "changed.resume" not in tags  # how each resumed attempt starts: no setting it changed
    assert params["init_from"] == "null" and params["callbacks.preemption.signals"] == "[SIGTERM, SIGINT, SIGUSR1, SIGUSR2]"
    assert run.data.metrics["steps"] == 16

    # metrics.csv: one file an attempt, each step's metrics in one of them.
    points = _csv_points(run_dir)
    assert not [point for point, count in Counter(points).items() if count > 1], "a step's metric in two files"
    assert sorted(step for key, step in points if key == "train/loss") == list(range(16))
    newest = max((run_dir / "csv").glob("version_*"), key=lambda folder: int(folder.name.split("_")[1]))
    assert yaml.safe_load((newest / "hparams.yaml").read_text())["optim"]["train_steps"] == 16
    assert saved < 12
