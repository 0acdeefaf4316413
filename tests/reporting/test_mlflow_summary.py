"""A trained and tested run's MLflow record: the ``summary.json`` artifact is the run folder's
whole summary, test figures included (before: the test's figures alone replaced it), and each
figure is in its metric's history once, at the run's last step (before: the summary's figures a
second time, and the test's at step 0)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.inprocess import run_tool
from tests.helpers.runs import TINY, offline_environment


@pytest.mark.slow
def test_the_mlflow_run_keeps_the_whole_summary_and_each_figure_once(tmp_path: Path, data_root: Path,
                                                                     subword_cache: Path) -> None:
    from mlflow.tracking import MlflowClient

    store, run_dir = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}", tmp_path / "run"
    env = {**offline_environment(), "MLFLOW_TRACKING_URI": store}
    run_tool("src/train.py", *TINY, "logger=mlflow", "visualize_at_end=false", "trainer.limit_test_batches=1",
             f"hydra.run.dir={run_dir}", env=env, data_root=data_root, cache_dir=subword_cache)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert {"dev/bleu", "test/bleu", "test_weights", "steps"} <= set(summary)

    client = MlflowClient(tracking_uri=store)
    (run,) = client.search_runs([experiment.experiment_id for experiment in client.search_experiments()])
    artifact = client.download_artifacts(run.info.run_id, "summary.json", str(tmp_path))
    assert json.loads(Path(artifact).read_text()) == summary
    for key in ("dev/bleu", "test/bleu", "train_flops"):
        history = [(point.step, point.value) for point in client.get_metric_history(run.info.run_id, key)]
        assert history == [(summary["steps"], pytest.approx(summary[key]))], key
