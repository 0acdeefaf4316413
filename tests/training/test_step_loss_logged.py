"""The logged ``train/loss`` of a step is the step's loss: the label-smoothed loss summed over all
its target tokens — every accumulated batch — over their number, as its gradient is normalised;
not the last batch's mean. The progress line says the same figure. Through train.py itself, in
process (1 process × 2 accumulated batches); 2 DDP processes × 1 batch logging the same figures is
tests/training/test_recipe_on_any_hardware.py's."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest

import aiayn.cli.train_run
from tests.helpers.inprocess import train
from tests.helpers.logged import logged_losses, progress_losses
from tests.helpers.runs import TINY, offline_environment


class BatchLosses(L.Callback):
    """Each training batch's label-smoothed loss summed over its target tokens, and their number,
    with the weights the batch trains with (no dropout: the same as the step's own forward; with
    the gradient on, as the step's: without it the attention would reuse its stacked weights of
    step 0, which fused Adam's in-place update does not mark as changed)."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, float, int]] = []  # (step, loss summed, tokens)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        loss_sum, tokens = pl_module.summed_loss(batch)
        self.batches.append((trainer.global_step, float(loss_sum.detach()), int(tokens)))


@pytest.mark.slow
def test_the_logged_loss_of_an_accumulated_step_is_the_mean_over_all_its_tokens(
        tmp_path: Path, data_root: Path, subword_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = BatchLosses()
    build = aiayn.cli.train_run.build_callbacks
    monkeypatch.setattr(aiayn.cli.train_run, "build_callbacks", lambda *args: [seen, *build(*args)])
    run = tmp_path / "run"
    train(run, *TINY, "logger=csv", "optim.tokens_per_step=2048", "model.dropout=0.0", "trainer.limit_val_batches=0",
          "test_after_training=false", "visualize_at_end=false", env=offline_environment(), data_root=data_root,
          cache_dir=subword_cache)
    steps = sorted({step for step, _, _ in seen.batches})
    assert steps == [0, 1, 2, 3] and len(seen.batches) == 8  # 2 batches a step
    expected = {}
    for step in steps:
        batches = [(loss, tokens) for each, loss, tokens in seen.batches if each == step]
        expected[step] = sum(loss for loss, _ in batches) / sum(tokens for _, tokens in batches)
        means = [loss / tokens for loss, tokens in batches]
        # the batches differ: neither batch's mean, nor their plain average, is the step's loss
        assert min(abs(mean - expected[step]) for mean in means) > 1e-4, (means, expected[step])
    logged = logged_losses(run)
    assert logged.keys() == expected.keys()
    for step in steps:
        assert logged[step] == pytest.approx(expected[step], rel=1e-5), (step, logged[step], expected[step])
    shown = progress_losses(run)
    # the line after step k says step k + 1, to 3 decimals
    assert shown == {step + 1: pytest.approx(logged[step], abs=5.01e-4) for step in steps}
