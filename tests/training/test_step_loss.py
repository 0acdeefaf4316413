"""The loss of a step is normalised by the step's tokens, not averaged over its batches: one batch
of a set of sentences and the same sentences in 8 accumulated batches of unequal token counts give
the same gradient (fp32, CPU), so that a GPU that takes the whole 25,000-token step in one batch
and one that accumulates 8 pieces of it train the same recipe (aiayn.config.plan). Through a real
Lightning Trainer and the real module's step; the gradient is read after the module's own
``on_before_optimizer_step`` has made it the per-token mean."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from aiayn.data.corpus import TranslationCollator
from aiayn.data.multi30k import Multi30kDataModule
from aiayn.training.module import TranslationModule

MODEL = {"n_layers": 1, "d_model": 32, "d_ff": 64, "n_heads": 2, "d_k": 16, "d_v": 16, "dropout": 0.0,
         "max_positions": 256}
OPTIM = {"betas": [0.9, 0.98], "eps": 1e-9, "warmup_steps": 4, "lr_factor": 1.0}
DECODING = {"beam_size": 1, "alpha": 0.6, "max_len_offset": 5}
PIECES = (1, 2, 3, 4, 5, 6, 8, 11)  # sentences in each of the 8 accumulated batches: 40 in all


class GradientAfterTheStep(TranslationModule):
    """The module as it trains, keeping the gradient its optimizer step is given."""

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        super().on_before_optimizer_step(optimizer)
        self.gradient = {name: p.grad.detach().clone() for name, p in self.named_parameters() if p.grad is not None}


@pytest.fixture(scope="module")
def datamodule(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Multi30kDataModule:
    data = Multi30kDataModule(str(data_root), vocab_size=500, max_tokens=512, cache_dir=str(tmp_path_factory.mktemp("c")),
                              download=False)
    data.setup("fit")
    return data


def _gradient(datamodule: Multi30kDataModule, batches: list[list[int]], tmp_path: Path, fused: bool) -> dict:
    torch.manual_seed(0)
    module = GradientAfterTheStep(MODEL, 500, {**OPTIM, "fused": fused}, DECODING, label_smoothing=0.1, seed=0)
    vocab = datamodule.vocab
    collate = TranslationCollator(vocab.pad_id, vocab.bos_id, vocab.eos_id)
    dataset = datamodule.dataset("train")
    # these batches, in this order (batch_size=None: each item is a batch already)
    loader = DataLoader([collate([dataset[i] for i in batch]) for batch in batches], batch_size=None)
    datamodule.train_dataloader = lambda: loader
    trainer = L.Trainer(max_steps=1, accelerator="cpu", logger=False, enable_checkpointing=False, limit_val_batches=0,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=str(tmp_path),
                        use_distributed_sampler=False, accumulate_grad_batches=len(batches))
    try:
        trainer.fit(module, datamodule=datamodule)
    finally:
        del datamodule.train_dataloader
    assert trainer.global_step == 1
    return module.gradient


def _relative(a: dict, b: dict) -> float:
    """The largest relative difference of two gradients, parameter by parameter (in norm)."""
    return max(float((a[name] - b[name]).norm() / a[name].norm()) for name in a)


@pytest.mark.slow
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "plain"])
def test_one_batch_and_eight_unequal_accumulated_batches_give_the_same_gradient(
        datamodule: Multi30kDataModule, tmp_path: Path, single_thread, fused: bool) -> None:
    lengths = datamodule.dataset("train").tgt_lengths
    # 40 sentences of lengths from short to long, so the pieces' token counts differ several-fold.
    chosen = [int(i) for i in torch.randperm(len(lengths), generator=torch.Generator().manual_seed(3))[:40]]
    chosen.sort(key=lambda i: lengths[i])
    bounds = [sum(PIECES[:k]) for k in range(len(PIECES) + 1)]
    pieces = [chosen[bounds[k]:bounds[k + 1]] for k in range(len(PIECES))]
    tokens = [int(sum(lengths[i] for i in piece)) for piece in pieces]
    assert max(tokens) > 8 * min(tokens), tokens

    whole = _gradient(datamodule, [chosen], tmp_path / "one", fused)
    accumulated = _gradient(datamodule, pieces, tmp_path / "eight", fused)
    assert whole.keys() == accumulated.keys() and len(whole) > 5
    assert _relative(whole, accumulated) < 1e-6

    # What averaging the 8 batches' per-token means would have given: not the same step.
    means = [_gradient(datamodule, [piece], tmp_path / f"piece{k}", fused) for k, piece in enumerate(pieces)]
    averaged = {name: sum(mean[name] for mean in means) / len(means) for name in whole}
    assert _relative(whole, averaged) > 1e-2
