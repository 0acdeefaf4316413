"""How an attempt's runs end in W&B (offline, its file's exit record) and MLflow (a real SQLite
store), as Lightning and train end them: finished; failed, where Lightning finalizes a run that
raised (a user error in training or its test, a full disk, non-finite losses); preempted, closed by
the stop before Lightning finalizes it as failed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aiayn.reporting.loggers import WandbRunLogger, close_runs
from aiayn.reporting.mlflow_logger import MLflowRunLogger
from aiayn.training.preemption import EXIT_STATUS
from tests.helpers.wandb_offline import read_run


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No W&B key and an empty home, as on a fresh machine: W&B runs offline."""
    for name in [name for name in os.environ if name.startswith("WANDB_")]:
        monkeypatch.delenv(name)
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WANDB_SILENT", "true")


@pytest.mark.slow
def test_an_attempt_ends_its_runs_as_it_ended(tmp_path: Path, offline: None) -> None:
    """Finished: exit code 0, FINISHED; failed: 1, FAILED; preempted: 75, KILLED. Before: a failed
    attempt's W&B run was finished by wandb as the process exited, exit code 0 (a run that stopped on
    a full disk showed as finished), and a preempted one's MLflow run, KILLED by the stop, was made
    FAILED by Lightning's finalize after it."""
    import mlflow
    import wandb

    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    endings = {"finished": (0, "FINISHED"), "failed": (1, "FAILED"), "preempted": (EXIT_STATUS, "KILLED")}
    runs = {}
    for ending in endings:
        loggers = [WandbRunLogger(project="aiayn", save_dir=str(tmp_path / ending), mode="auto", name=ending),
                   MLflowRunLogger(experiment_name="endings", run_name=ending, tracking_uri=store)]
        for logger in loggers:
            logger.log_metrics({"train/loss": 1.0}, step=1)
        if ending == "preempted":  # the stop closes them (aiayn.training.preemption, after_training)
            close_runs(loggers, preempted_exit=EXIT_STATUS)
        if ending != "finished":  # Lightning's _interrupt, as the stop's or the error's exception leaves fit or test
            for logger in loggers:
                logger.finalize("failed")
        close_runs(loggers)  # train's own close at the end (a closed run stays as it ended)
        runs[ending] = loggers[1].run_id
    wandb.teardown()
    client = mlflow.MlflowClient(store)
    ended = {ending: (read_run(tmp_path / ending, strict=True).exit_code, client.get_run(runs[ending]).info.status)
             for ending in endings}
    assert ended == endings
