"""compile_mode: how compile=true compiles (aiayn.training.compiling.compile_options), and a run of
train.py with CUDA graphs asked for (compile_mode=cudagraphs) and length buckets, on the CPU where
torch's CUDA-graph backend runs the traced forward and backward without graphs: the same losses as
the eager run of the same batches (the GPU measures the graphs themselves: make gpu-check)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from aiayn.training.compiling import CUDA_GRAPH_MODES, compile_options
from tests.helpers.inprocess import train
from tests.helpers.runs import TINY, offline_environment


def test_each_mode_is_torch_compiles_own() -> None:
    assert compile_options("default") == {}
    assert compile_options("reduce-overhead") == {"mode": "reduce-overhead"}
    assert compile_options("cudagraphs") == {"backend": "cudagraphs"}
    assert set(CUDA_GRAPH_MODES) == {"reduce-overhead", "max-autotune", "cudagraphs"}


def _losses(run: Path) -> list[float]:
    rows = csv.DictReader(next(run.glob("csv/version_*/metrics.csv")).read_text().splitlines())
    return [float(row["train/loss"]) for row in rows if row.get("train/loss")]


@pytest.mark.slow
def test_cuda_graph_mode_with_length_buckets_trains_the_eager_runs_losses(tmp_path: Path, data_root: Path,
                                                                          subword_cache: Path) -> None:
    common = [*TINY, "logger=csv", "optim.train_steps=4", "task.datamodule.length_buckets=[16,32,64,129]",
              "trainer.limit_val_batches=0", "test_after_training=false", "visualize_at_end=false",
              "model.dropout=0.0"]
    options = {"env": offline_environment(), "data_root": data_root, "cache_dir": subword_cache}
    train(tmp_path / "eager", *common, **options)
    train(tmp_path / "graphs", *common, "compile=true", "compile_mode=cudagraphs", **options)
    eager, graphs = _losses(tmp_path / "eager"), _losses(tmp_path / "graphs")
    assert len(eager) == len(graphs) == 4
    assert graphs == pytest.approx(eager, rel=1e-5)
