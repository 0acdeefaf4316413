"""MLflow stores as jobs meet them: the first use of a store by several jobs at once (a sweep's jobs,
``experiments/tables.py run --parallel``) gives each its run, none dying in MLflow's migration of
the new store or in making the experiment (real processes, a real SQLite store); a server that does
not answer is refused before anything starts."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.inprocess import run_tool
from tests.helpers.preloaded import popen
from tests.helpers.runs import REPO, offline_environment

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
    job = tmp_path / "job.py"
    job.write_text(_JOB)
    # Three processes of their own (started from the preloaded interpreter, tests/helpers/preloaded.py).
    jobs = [popen([sys.executable, str(job), store, str(go), f"job{n}"], stdout=subprocess.PIPE,
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


@pytest.mark.slow
def test_a_server_that_does_not_answer_is_refused_before_the_run_starts(tmp_path: Path, data_root: Path,
                                                                        subword_cache: Path, tiny_run) -> None:
    """Before: MLflow retried for 4.5 minutes, then a traceback, and the run's folder stayed."""
    with socket.socket() as closed:  # a port bound by nobody that listens: the connection is refused
        closed.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{closed.getsockname()[1]}"
        env = {**offline_environment(), "MLFLOW_TRACKING_URI": uri}
        run = tmp_path / "run"
        result = run_tool("src/train.py", "debug=tiny", "logger=mlflow", f"hydra.run.dir={run}", env=env,
                          data_root=data_root, cache_dir=subword_cache, check=False)
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr[-3000:]
        assert result.stderr.startswith(f"train.py: logger.mlflow.tracking_uri={uri} (MLFLOW_TRACKING_URI): no MLflow "
                                        "server answers there (")
        assert "unset MLFLOW_TRACKING_URI" in result.stderr and not run.exists()
        evaluated = run_tool("src/evaluate.py", f"ckpt={tiny_run.last}", "wandb=disabled", f"mlflow={uri}",
                             f"out={tmp_path / 'eval'}", env=env, data_root=data_root, cache_dir=tiny_run.cache_dir,
                             check=False)
        assert evaluated.returncode == 2 and evaluated.stderr.startswith(f"evaluate.py: mlflow={uri} (MLFLOW_TRACKING_URI):")
        assert not (tmp_path / "eval").exists()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["folder", "file URI", "no store"])
def test_a_store_mlflow_would_fail_on_is_refused_before_the_run_starts(kind: str, tmp_path: Path, data_root: Path,
                                                                       subword_cache: Path, tiny_run) -> None:
    """A folder (MLflow's file store, which MLflow 3 refuses to write runs to) or a scheme that names
    no store: before, train.py died in its logger's construction (Hydra's InstantiationException,
    34 frames) and left its folder; evaluate.py decoded the whole split first."""
    uri, said = {"folder": (str(tmp_path / "mlfs"), " is a folder, MLflow's file store"),
                 "file URI": ((tmp_path / "mlfs").as_uri(), " is a folder, MLflow's file store"),
                 "no store": ("nonsense://x", ": nonsense:// names no MLflow store")}[kind]
    env = {**offline_environment(), "MLFLOW_TRACKING_URI": uri}
    run = tmp_path / "run"
    result = run_tool("src/train.py", "debug=tiny", "logger=mlflow", f"hydra.run.dir={run}", env=env,
                      data_root=data_root, cache_dir=subword_cache, check=False)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr[-3000:]
    assert result.stderr.startswith(f"train.py: logger.mlflow.tracking_uri={uri} (MLFLOW_TRACKING_URI){said}")
    assert not run.exists()
    evaluated = run_tool("src/evaluate.py", f"ckpt={tiny_run.last}", "wandb=disabled", f"mlflow={uri}",
                         f"out={tmp_path / 'eval'}", env=env, data_root=data_root, cache_dir=tiny_run.cache_dir,
                         check=False)
    assert evaluated.returncode == 2 and evaluated.stderr.startswith(f"evaluate.py: mlflow={uri} (MLFLOW_TRACKING_URI)")
    assert said in evaluated.stderr and not (tmp_path / "eval").exists()
