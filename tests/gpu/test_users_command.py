"""The user's command on one GPU, as a user runs it: ``src/train.py model=base task=wmt_en_de``
with nothing about the hardware, on real WMT data (the shared 10,000-pair slice in the archives'
layout), for 20 steps. hardware=auto must put it on the GPU in bf16 mixed precision, accumulate 8
batches of 3,125 tokens into the paper's ~25,000-token step, and train."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch

from tests.helpers.runs import offline_environment, train
from tests.helpers.wmt import build_raw_tree

pytestmark = pytest.mark.gpu


def test_the_base_model_on_wmt_trains_on_one_gpu_in_bf16_with_the_papers_step(tmp_path: Path, data_root: Path) -> None:
    raw = build_raw_tree(data_root, tmp_path / "raw")
    run = tmp_path / "run"
    env = {**offline_environment(), "CUDA_VISIBLE_DEVICES": "0"}  # one GPU, whatever the machine has
    result = train(run, "model=base", "task=wmt_en_de", f"task.raw_dir={raw}", "task.datamodule.download=false",
                   "task.vocab_size=8000",  # the slice cannot hold 37k subwords; the model's shape is base's
                   "optim.train_steps=20", "trainer.val_check_interval=20", "trainer.limit_val_batches=2",
                   "validation.bleu_sentences=16", "test_after_training=false", "visualize_at_end=false",
                   "checkpoint.every_n_train_steps=20", "checkpoint.every_n_minutes=null", "logger=csv",
                   data_root=data_root, cache_dir=tmp_path / "cache", env=env, timeout=480)
    plan = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)[
        "hyper_parameters"]["run_config"]["plan"]
    assert plan["trainer"]["accelerator"] == "gpu" and plan["trainer"]["devices"] == 1
    assert plan["trainer"]["precision"] == ("bf16-mixed" if torch.cuda.get_device_capability() >= (8, 0) else "16-mixed")
    assert (plan["trainer"]["accumulate_grad_batches"], plan["tokens_per_batch"], plan["tokens_per_step"]) == (
        8, 3125, 25_000)
    assert "plan: 1 GPU (" in result.stdout + result.stderr
    rows = list(csv.DictReader(next(run.glob("csv/version_*/metrics.csv")).read_text().splitlines()))
    losses = [float(row["train/loss"]) for row in rows if row.get("train/loss")]
    assert losses and all(math.isfinite(loss) for loss in losses)
    assert min(losses[-5:]) < losses[0], "20 steps of the paper's recipe lower the loss"
    assert any(row.get("val/ppl") for row in rows), "validated at step 20"
