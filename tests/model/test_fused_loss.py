"""The fused label-smoothed loss (``loss.fused``, aiayn.model.loss): the plain loss, its
negative log-likelihood, its token count and its gradient with respect to the logits, in fp32 and
from bf16 logits, across the blocks of rows it takes at a time, with padding anywhere; nothing read
back from the device; and the training module's step with it."""

from __future__ import annotations

import pytest
import torch

from aiayn.model import loss as loss_module
from aiayn.model.loss import label_smoothed_loss
from tests.helpers.devices import count_host_syncs

PAD = 0


def _case(rows: int, vocab: int, seed: int, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(rows // 4, 4, vocab, generator=generator)).to(dtype)
    target = torch.randint(1, vocab, (rows // 4, 4), generator=generator)
    target[torch.rand(target.shape, generator=generator) < 0.2] = PAD  # padding scattered, whole rows too
    target[-1] = PAD
    return logits, target


def _loss_and_gradient(logits: torch.Tensor, target: torch.Tensor, eps: float, fused: bool):
    logits = logits.detach().clone().requires_grad_(True)
    loss, nll, count = label_smoothed_loss(logits, target, eps, PAD, fused=fused)
    (3.0 * loss).backward()  # a scale on the way back, as Lightning's accumulation and fp16's scaler put one
    return loss.detach(), nll, count, logits.grad


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_the_fused_loss_is_the_plain_loss_and_gradient_in_fp32(eps: float, monkeypatch) -> None:
    monkeypatch.setattr(loss_module, "FUSED_ROWS", 7)  # blocks that do not divide the rows
    logits, target = _case(rows=40, vocab=33, seed=1)
    plain, fused = (_loss_and_gradient(logits, target, eps, fused) for fused in (False, True))
    torch.testing.assert_close(fused[0], plain[0], rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(fused[1], plain[1], rtol=1e-6, atol=1e-5)
    assert int(fused[2]) == int(plain[2]) == int((target != PAD).sum())
    torch.testing.assert_close(fused[3], plain[3], rtol=1e-5, atol=1e-6)
    assert fused[3].dtype == torch.float32 and (fused[3][target == PAD] == 0).all()


def test_from_bf16_logits_the_gradient_is_the_plain_ones_rounded_to_bf16() -> None:
    logits, target = _case(rows=64, vocab=50, seed=2, dtype=torch.bfloat16)
    plain, fused = (_loss_and_gradient(logits, target, 0.1, fused) for fused in (False, True))
    assert fused[0].dtype == torch.float32 and fused[3].dtype == torch.bfloat16
    torch.testing.assert_close(fused[0], plain[0], rtol=1e-6, atol=1e-4)
    torch.testing.assert_close(fused[3].float(), plain[3].float(), rtol=1e-2, atol=1e-4)  # both rounded to bf16


def test_the_fused_loss_reads_nothing_back() -> None:
    logits, target = _case(rows=32, vocab=20, seed=3)
    logits.requires_grad_(True)
    with count_host_syncs() as syncs:
        loss, _, _ = label_smoothed_loss(logits, target, 0.1, PAD, fused=True)
        loss.backward()
    assert syncs.total == 0, dict(syncs.kinds)


def test_the_training_module_steps_the_same_with_the_fused_loss() -> None:
    from aiayn.training.module import TranslationModule

    model = {"n_layers": 1, "d_model": 32, "d_ff": 64, "n_heads": 2, "d_k": 16, "d_v": 16, "dropout": 0.0}
    optim = {"betas": [0.9, 0.98], "eps": 1e-9, "warmup_steps": 4}
    batch = {"src": torch.randint(4, 60, (3, 7)), "tgt_in": torch.randint(4, 60, (3, 6)),
             "tgt_out": torch.randint(4, 60, (3, 6))}
    batch["tgt_out"][0, 4:] = PAD
    results = []
    for fused in (False, True):
        torch.manual_seed(0)
        module = TranslationModule(model, 60, optim, {}, label_smoothing=0.1, fused_loss=fused)
        loss, count = module.training_loss(batch)
        loss.backward()
        results.append((loss.detach(), int(count), [p.grad.clone() for p in module.parameters()]))
    (plain_loss, plain_count, plain_grads), (fused_loss, fused_count, fused_grads) = results
    torch.testing.assert_close(fused_loss, plain_loss, rtol=1e-6, atol=0)
    assert plain_count == fused_count == 16
    for a, b in zip(plain_grads, fused_grads, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
