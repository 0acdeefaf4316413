"""The first use of an MLflow store by several jobs at once (a sweep's jobs, ``experiments/tables.py
run --parallel``): each gets its run, none dies in MLflow's migration of the new store or in making
the experiment, as real processes on a real SQLite store."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.runs import REPO

# One job's use of the store: imports done, it says so and waits for the word to start.
_JOB = """
import sys, time
from pathlib import Path
from aiayn.reporting.mlflow_logger import MLflowRunLogger
import mlflow
print("ready", flush=True)
while not Path(sys.argv[2]).exists():
    time.sleep(0.001)
logger = MLflowRunLogger(experiment_name="together", run_name=sys.argv[3], tracking_uri=sys.argv[1])
logger.log_metrics({"loss": 1.0}, step=1)
logger.close()
"""


@pytest.mark.cli
@pytest.mark.slow
def test_jobs_that_start_together_on_a_new_store_each_get_their_run(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    go = tmp_path / "go"
    jobs = [subprocess.Popen([sys.executable, "-c", _JOB, store, str(go), f"job{n}"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=REPO) for n in range(3)]
    try:
        for job in jobs:
            assert job.stdout.readline().strip() == "ready", job.stderr.read()[-2000:]
        go.touch()  # all at once
        for job in jobs:
            assert job.wait(timeout=300) == 0, job.stderr.read()[-3000:]
    finally:
        for job in jobs:
            if job.poll() is None:
                job.kill()
    from mlflow import MlflowClient

    client = MlflowClient(store)
    (experiment,) = [e for e in client.search_experiments() if e.name == "together"]
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(run.info.run_name for run in runs) == [f"job{n}" for n in range(3)]
    assert all(run.data.metrics == {"loss": 1.0} for run in runs)
