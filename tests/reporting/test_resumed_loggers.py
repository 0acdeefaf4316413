"""A resumed run's MLflow and CSV loggers (real SQLite store, real metrics.csv files), as train
builds them for a run that resumes: given the run they continue, they leave out what it holds of
the steps trained again; MLflow's params are spelt as the config's YAML spells them, and a
setting an attempt changed is a tag of its own. (A whole killed run, with W&B too:
tests/reporting/test_killed_run_logs.py.)"""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

import pytest

from aiayn.reporting.loggers import MetricsCSVLogger
from aiayn.reporting.mlflow_logger import MLflowRunLogger
from aiayn.reporting.wandb_history import catch_up, record_path, record_row

CONFIG = {"optim": {"train_steps": 12}, "init_from": None, "compile": False,
          "callbacks": {"preemption": {"signals": ["SIGTERM", "SIGINT"]}}}


def _rows(logger, steps: range) -> None:
    """A training row at each step and a validation at every fourth, as Lightning logs them."""
    for step in steps:
        logger.log_metrics({"train/loss": 10.0 - step, "epoch": 0}, step=step)
        if step % 4 == 0:
            logger.log_metrics({"val/loss": 20.0 - step, "epoch": 0}, step=step)


@pytest.mark.slow
def test_a_resumed_mlflow_run_logs_each_step_once_and_tags_a_changed_setting(tmp_path: Path) -> None:
    """Before: the steps trained again after the checkpoint were logged twice, the extended run's
    `optim.train_steps` stayed 12 with no sign of 16, and params read `None`, `['SIGTERM', 'SIGINT']`."""
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = MLflowRunLogger(tracking_uri=store, run_name="run")
    first.log_hyperparams(CONFIG)
    _rows(first, range(7))  # killed after step 6; its newest checkpoint is step 4's
    resumed = MLflowRunLogger(tracking_uri=store, run_name="run", resume_id=first.run_id)
    resumed.log_hyperparams({**CONFIG, "optim": {"train_steps": 16}})
    _rows(resumed, range(4, 16))
    resumed.log_summary({"steps": 16, "dev/ppl": 3.0})
    resumed.close()

    client = resumed.experiment
    for key in ("train/loss", "val/loss"):
        history = client.get_metric_history(first.run_id, key)
        assert not [step for step, count in Counter(point.step for point in history).items() if count > 1], key
    assert [point.step for point in client.get_metric_history(first.run_id, "train/loss")] == list(range(16))
    assert [point.step for point in client.get_metric_history(first.run_id, "val/loss")] == [0, 4, 8, 12]
    run = client.get_run(first.run_id)
    params, tags = run.data.params, run.data.tags
    assert params["optim.train_steps"] == "12" and tags["changed.optim.train_steps"] == "16"
    assert not [key for key in tags if key.startswith("changed.") and key != "changed.optim.train_steps"]
    assert params["init_from"] == "null" and params["compile"] == "false"
    assert params["callbacks.preemption.signals"] == "[SIGTERM, SIGINT]"
    assert run.data.metrics["steps"] == 16

    # An attempt run with the first attempt's settings again changes nothing: its tag goes.
    again = MLflowRunLogger(tracking_uri=store, run_name="run", resume_id=first.run_id)
    again.log_hyperparams(CONFIG)
    assert not [key for key in client.get_run(first.run_id).data.tags if key.startswith("changed.")]


def test_a_resumed_csv_attempt_leaves_out_the_steps_its_earlier_file_holds(tmp_path: Path) -> None:
    first = MetricsCSVLogger(save_dir=str(tmp_path), name="csv")
    _rows(first, range(7))
    first.save()
    resumed = MetricsCSVLogger(save_dir=str(tmp_path), name="csv", resume_id=first.resumable_run_id())
    _rows(resumed, range(4, 12))
    resumed.close()
    assert resumed.resumable_run_id() == first.resumable_run_id() == "version_0"  # one run in every checkpoint

    points = []
    for metrics in sorted((tmp_path / "csv").glob("version_*/metrics.csv")):
        with open(metrics, newline="") as file:
            points += [(key, int(row["step"])) for row in csv.DictReader(file)
                       for key, value in row.items() if value and key in ("train/loss", "val/loss")]
    assert len(points) == len(set(points)), "a step's metric in two attempts' files"
    assert sorted(step for key, step in points if key == "train/loss") == list(range(12))


def test_an_attempt_logs_again_what_its_earlier_files_lack_once_whichever_of_its_processes_asks(tmp_path: Path) -> None:
    """``ddp_spawn`` tests in processes of their own, each given the attempt's logger as it was
    before training: the test's process must not log the record's rows again (before the note in
    the record, it took this attempt's own rows, absent from the earlier files, for lost ones)."""
    record = record_path(tmp_path, "abc")
    for step in range(3):
        record_row(record, {"train/loss": 1.0 / (step + 1), "epoch": 0}, step)
    attempt = tmp_path / "wandb" / "offline-run-20261130_000001-abc"
    attempt.mkdir(parents=True)  # the killed attempt left no file: nothing of it was written
    logged: list[tuple[dict, int]] = []

    held = catch_up(lambda metrics, step: logged.append((metrics, step)), tmp_path, "abc", attempt)
    assert [step for _, step in logged] == [0, 1, 2] and logged[0][0] == {"train/loss": 1.0, "epoch": 0.0}
    assert held.fresh({"train/loss": 0.5}, 2) == {} and held.fresh({"train/loss": 0.25}, 3) == {"train/loss": 0.25}
    record_row(record, {"train/loss": 0.25}, 3)  # this attempt trains on

    again = catch_up(lambda metrics, step: logged.append((metrics, step)), tmp_path, "abc", attempt)
    assert len(logged) == 3, "the rows logged again once an attempt"
    assert again.newest == held.newest
