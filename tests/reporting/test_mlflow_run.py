"""What a training run puts in its MLflow run (a real SQLite store, src/train.py in this process):
every metric once at the step it belongs to, the test's figures included, and the run's summary
whole in ``summary.json``."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers.inprocess import run_tool
from tests.helpers.runs import offline_environment


@pytest.mark.slow
def test_a_run_logs_each_metric_once_at_its_step_and_its_whole_summary(tmp_path: Path, data_root: Path,
                                                                       subword_cache: Path) -> None:
    """Before: the test's figures were logged twice, at the last step (Lightning) and again at step
    0 (the summary's record of the test, which names no step), ``test_averaged`` at step 0, and
    ``summary.json`` held the test's figures alone (the record of the test replaced the summary)."""
    store = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    run = tmp_path / "run"
    run_tool("src/train.py", "debug=tiny", "logger=mlflow", "visualize_at_end=false", "trainer.limit_test_batches=1",
             f"hydra.run.dir={run}",
             env={**offline_environment(), "MLFLOW_TRACKING_URI": store}, data_root=data_root,
             cache_dir=subword_cache)
    from mlflow import MlflowClient

    client = MlflowClient(store)
    (found,) = client.search_runs([client.get_experiment_by_name("aiayn").experiment_id])
    run_id = found.info.run_id
    summary = json.loads((run / "summary.json").read_text())
    last = summary["steps"]
    points = {key: [(point.step, point.value) for point in client.get_metric_history(run_id, key)]
              for key in found.data.metrics}
    twice = {key: steps for key, history in points.items()
             if (steps := [step for step, count in Counter(step for step, _ in history).items() if count > 1])}
    assert not twice, f"logged more than once at a step: {twice}"
    test = [key for key in points if key.startswith("test/")]
    assert "test/bleu" in test and "test/ppl" in test
    for key in (*test, "test_averaged", "dev/bleu", "parameters", "train_flops"):
        assert [step for step, _ in points[key]] == [last], (key, points[key])
    assert points["test/ppl"][0][1] == pytest.approx(summary["test/ppl"])
    assert [step for step, _ in points["train/loss"]] == list(range(last))  # each step's loss at its step
    stored = json.loads(Path(client.download_artifacts(run_id, "summary.json", str(tmp_path))).read_text())
    assert stored == summary  # the run's summary (dev/bleu, parameters, ...) and the test's figures


@pytest.mark.slow
def test_an_evaluation_goes_where_its_training_run_logged(tmp_path: Path, data_root: Path, subword_cache: Path) -> None:
    """A run trained with logger=mlflow, evaluated with neither mlflow= nor $MLFLOW_TRACKING_URI: its
    evaluation is a run in the training run's store, nested under it, and no W&B run (the training
    run had none). Before: no MLflow run without mlflow=, and an offline W&B run in <run>/eval/wandb."""
    store = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    run = tmp_path / "run"
    run_tool("src/train.py", "debug=tiny", "logger=mlflow", "visualize_at_end=false", "test_after_training=false",
             f"hydra.run.dir={run}", env={**offline_environment(), "MLFLOW_TRACKING_URI": store}, data_root=data_root,
             cache_dir=subword_cache)
    result = run_tool("src/evaluate.py", f"ckpt={run / 'checkpoints' / 'last.ckpt'}", "split=test_2017_mscoco",
                      "decoding.beam_size=1", "decoding.max_len_offset=2", data_root=data_root, cache_dir=subword_cache,
                      env={k: v for k, v in offline_environment().items() if k != "MLFLOW_TRACKING_URI"})
    from mlflow import MlflowClient

    client = MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("aiayn").experiment_id])
    [trained] = [found for found in runs if found.data.tags.get("job_type") != "eval"]
    [evaluation] = [found for found in runs if found.data.tags.get("job_type") == "eval"]
    assert evaluation.data.tags["mlflow.parentRunId"] == trained.info.run_id
    assert evaluation.data.metrics["test_2017_mscoco/bleu"] >= 0
    assert f"MLflow run {evaluation.info.run_id} in {store}" in result.stdout, result.stdout
    assert not (run / "eval" / "wandb").exists() and "W&B" not in result.stdout


def test_a_training_store_that_is_not_here_is_said_and_left_out(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The run's SQLite store as its config names it, relative to the folder it trained in: read from
    here, as MLflow reads one; where no such file is here the evaluation is not logged to a new, empty
    store in this folder, and a warning says what to give."""
    from aiayn.cli.evaluation_runs import trained_store

    monkeypatch.chdir(tmp_path)
    config = {"logger": {"mlflow": {"_target_": "aiayn.reporting.mlflow_logger.MLflowRunLogger",
                                    "tracking_uri": "sqlite:///mlruns/mlflow.db"}}}
    assert trained_store(config) is None
    assert "logger.mlflow.tracking_uri=sqlite:///mlruns/mlflow.db) is not here; give mlflow=<its store>" in caplog.text
    assert not (tmp_path / "mlruns").exists()
    (tmp_path / "mlruns").mkdir()
    (tmp_path / "mlruns" / "mlflow.db").touch()
    assert trained_store(config) == "sqlite:///mlruns/mlflow.db"
    assert trained_store({"logger": {"csv": {"_target_": "aiayn.reporting.loggers.MetricsCSVLogger"}}}) is None
