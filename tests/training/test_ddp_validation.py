"""A 2-process CPU DDP run whose dev and test splits are one evaluation batch each — fewer batches
than ranks — validates and tests (the rank without a batch of its own evaluates an empty one), and
its dev metrics are those one process computes with the same weights."""

from __future__ import annotations

import json
import re
from pathlib import Path

import hydra
import lightning as L
import pytest

from aiayn.checkpoints.trained import load_trained
from aiayn.training.module import TranslationModule
from tests.helpers.runs import TINY, TWO_CORES, offline_environment, train

pytestmark = pytest.mark.cli  # an end-to-end run of src/train.py; -m 'not cli' skips it

# The tiny run, 2 steps, on two CPU processes (ddp_spawn); a budget of 100,000 padded tokens holds
# all of Multi30k's dev set (1,014 sentences) or test2016 (1,000) in one batch.
RUN = [
    *TINY, "hardware=cpu2_ddp", "logger=none", "optim.train_steps=2", "task.datamodule.eval_max_tokens=100000",
    "validation.bleu_sentences=100", "visualize_at_end=false",
    "trainer.enable_progress_bar=false",
]


@pytest.mark.slow
@TWO_CORES
def test_two_ranks_one_dev_batch_validate_as_one_process(tmp_path: Path, data_root: Path, subword_cache: Path,
                                                         single_thread) -> None:
    run_dir = tmp_path / "run"
    env = {**offline_environment(), "OMP_NUM_THREADS": "1"}  # each rank one thread, as the reference below
    result = train(run_dir, *RUN, data_root=data_root, cache_dir=subword_cache, env=env, timeout=300)
    # (before the fix: "`DataLoader` within local rank has zero length", exit status 1)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["processes"] == 2 and summary["dev/step"] == 2, summary  # validated after the 2nd step
    tested = re.search(r"^test test_2016_flickr: test/loss=\S+ .*test/bleu=(\S+)", result.stdout, re.MULTILINE)
    assert tested and float(tested[1]) >= 0.0, result.stdout[-2000:]

    # One process, the weights validated (the step-2 checkpoint), the same data module settings.
    checkpoint = run_dir / "checkpoints" / "step0000002.ckpt"
    module = TranslationModule.load_from_checkpoint(checkpoint, map_location="cpu")
    datamodule = hydra.utils.instantiate(load_trained(checkpoint).config["task"]["datamodule"])
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False)
    (alone,) = trainer.validate(module, datamodule=datamodule, verbose=False)
    datamodule.setup("test")
    assert len(datamodule.val_dataloader()) == len(datamodule.test_dataloader()) == 1, "fewer batches than ranks"
    # The rank holding the batch computes what one process does (same batch, weights and thread
    # count); the other adds zero tokens to the loss sums and no hypothesis. Tolerance: the float32
    # kernels' last bits, should the two processes' libraries pick other code paths; BLEU, scored on
    # the same hypotheses, exactly.
    for key in ("loss", "ppl"):
        assert summary[f"dev/{key}"] == pytest.approx(alone[f"val/{key}"], rel=1e-6), key
    assert summary["dev/bleu"] == alone["val/bleu"]
    # The test after training, on the same weights, is the test alone (before: under ddp_spawn its loss and
    # perplexity counted the last validation's sums too, which the test's ranks started with).
    assert summary["test_weights"] == "last" and summary["test_averaged"] == 1
    (tested,) = trainer.test(module, datamodule=datamodule, verbose=False)
    for key in ("loss", "ppl"):
        assert summary[f"test/{key}"] == pytest.approx(tested[f"test/{key}"], rel=1e-6), key
