"""Steps with a NaN/inf loss or gradient are skipped and counted; too many in a row stop the run
with a clear error and a checkpoint of the state from before them. With fused Adam (the default)
the step is skipped on the device and the counts are read back every ``log_every_n_steps`` steps;
with plain Adam the check reads the step's flag back at once."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch

from aiayn.data.multi30k import Multi30kDataModule
from aiayn.training.module import TranslationModule
from aiayn.training.nonfinite import NonFiniteLossError

MODEL = {"n_layers": 1, "d_model": 32, "d_ff": 64, "n_heads": 2, "d_k": 16, "d_v": 16, "dropout": 0.1, "max_positions": 256}
OPTIM = {"betas": [0.9, 0.98], "eps": 1e-9, "warmup_steps": 4, "lr_factor": 1.0}
DECODING = {"beam_size": 1, "alpha": 0.6, "max_len_offset": 5}


@pytest.fixture(scope="module")
def datamodule(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Multi30kDataModule:
    data = Multi30kDataModule(str(data_root), vocab_size=500, max_tokens=512, cache_dir=str(tmp_path_factory.mktemp("c")),
                              download=False)
    data.setup("fit")
    return data


def _module(max_in_a_row: int = 3, fused: bool = True) -> TranslationModule:
    torch.manual_seed(0)
    return TranslationModule(MODEL, 500, {**OPTIM, "fused": fused}, DECODING, label_smoothing=0.1, seed=0,
                             max_nonfinite_in_a_row=max_in_a_row)


def _trainer(tmp_path: Path, steps: int, log_every_n_steps: int = 1) -> L.Trainer:
    return L.Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                     limit_val_batches=0, enable_progress_bar=False, enable_model_summary=False,
                     default_root_dir=str(tmp_path), use_distributed_sampler=False,
                     log_every_n_steps=log_every_n_steps)


class Poison(L.Callback):
    """Makes the loss (`where="loss"`) or one gradient (`where="grad"`) NaN/inf at the given
    steps, and records the weights before every step."""

    def __init__(self, steps: set[int], where: str):
        self.steps, self.where, self.weights, self._hook = steps, where, {}, None

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.weights[trainer.global_step] = {n: p.detach().clone() for n, p in module.named_parameters()}
        self._poisoned = trainer.global_step in self.steps
        if self._poisoned and self.where == "loss":
            self._hook = module.model.embedding_dropout.register_forward_hook(lambda m, i, out: out * float("nan"))

    def on_after_backward(self, trainer, module):
        if self._poisoned and self.where == "grad":
            next(module.parameters()).grad[0, 0] = float("inf")

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if self._hook is not None:
            self._hook.remove()
            self._hook = None


@pytest.mark.slow
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "plain"])
@pytest.mark.parametrize("where", ["loss", "grad"])
def test_nonfinite_steps_are_skipped_and_counted(tmp_path, datamodule, single_thread, where, fused):
    module, poison = _module(fused=fused), Poison({2, 3}, where)
    trainer = _trainer(tmp_path, steps=6)
    trainer.callbacks.append(poison)
    trainer.fit(module, datamodule=datamodule)
    assert trainer.global_step == 6
    assert module.nonfinite.total == 2 and module.nonfinite.in_a_row == 0, "a good step resets the streak"
    same = lambda a, b: all(torch.equal(a[name], b[name]) for name in a)
    assert same(poison.weights[2], poison.weights[3]) and same(poison.weights[3], poison.weights[4]), \
        "skipped steps leave the weights alone"
    assert not same(poison.weights[1], poison.weights[2]) and not same(poison.weights[4], poison.weights[5])
    assert all(torch.isfinite(p).all() for p in module.parameters())


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "plain"])
@pytest.mark.slow
def test_too_many_in_a_row_stop_with_a_checkpoint_from_before(tmp_path, datamodule, single_thread, fused):
    module, poison = _module(max_in_a_row=3, fused=fused), Poison(set(range(3, 100)), "loss")
    trainer = _trainer(tmp_path, steps=20)
    trainer.callbacks.append(poison)
    with pytest.raises(NonFiniteLossError) as raised:
        trainer.fit(module, datamodule=datamodule)
    message = str(raised.value)
    assert message.startswith("3 steps in a row had a non-finite loss (last at step 5)")
    assert "optim.lr_factor" in message and "resume=" in message
    saved = torch.load(tmp_path / "checkpoints" / "nonfinite-step0000005.ckpt", weights_only=False)
    before = poison.weights[3]  # the weights the first poisoned step started from
    for name, weight in before.items():
        assert torch.equal(saved["state_dict"][name], weight), name
    assert saved["nonfinite_steps"] == {"in_a_row": 3, "total": 3}


def test_counts_read_back_every_few_steps_stop_at_the_first_read_after_the_limit(tmp_path, datamodule, single_thread):
    """Read back every 4 steps: steps 3, 4, 5 … poisoned, 3 allowed in a row; the read after step 7
    (the 8th) finds 5 in a row and stops there, with the state from before step 3."""
    module, poison = _module(max_in_a_row=3), Poison(set(range(3, 100)), "grad")
    trainer = _trainer(tmp_path, steps=20, log_every_n_steps=4)
    trainer.callbacks.append(poison)
    with pytest.raises(NonFiniteLossError, match=r"^5 steps in a row had a non-finite gradient \(last at step 7\)"):
        trainer.fit(module, datamodule=datamodule)
    saved = torch.load(tmp_path / "checkpoints" / "nonfinite-step0000007.ckpt", weights_only=False)
    for name, weight in poison.weights[3].items():
        assert torch.equal(saved["state_dict"][name], weight), name


@pytest.mark.slow
def test_fp16_loss_scale_overflows_are_the_scalers_to_skip_not_a_stop(tmp_path, datamodule, single_thread):
    """16-mixed with dynamic loss scaling (what hardware=auto picks on GPUs without bf16): a scale
    so large that the first dozens of steps overflow. The scaler skips those updates and halves the
    scale each time; they are not non-finite steps of the model, so training goes on past
    nonfinite.max_in_a_row and learns once the scale fits. Run on the CPU with torch's CPU scaler
    (Lightning gives CUDA's on a GPU; the hook is the same)."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    module = _module(max_in_a_row=3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**60)
    trainer = L.Trainer(max_steps=70, accelerator="cpu", logger=False, enable_checkpointing=False,
                        limit_val_batches=0, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=str(tmp_path), use_distributed_sampler=False,
                        plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)])
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    trainer.fit(module, datamodule=datamodule)
    assert trainer.global_step == 70 and module.nonfinite.total == 0
    assert scaler.get_scale() < 2.0**30, "overflows lowered the scale"
    assert any(not torch.equal(p.detach(), before[n]) for n, p in module.named_parameters()), "updates were made"
    assert all(torch.isfinite(p).all() for p in module.parameters())
