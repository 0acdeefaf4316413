"""The learning-rate schedule (§5.3, Eq. 3) and label-smoothed cross-entropy (§5.4)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from aiayn.model.loss import label_smoothed_loss
from aiayn.training.schedule import transformer_lr, transformer_scheduler

pytestmark = pytest.mark.usefixtures("single_thread")


# ------------------------------------------------------------------------------- Eq. 3


def test_transformer_lr_hand_values():
    d, warmup = 512, 4000
    assert transformer_lr(1, d, warmup) == pytest.approx(512**-0.5 * 1 * 4000**-1.5, rel=1e-12)
    assert transformer_lr(4000, d, warmup) == pytest.approx(512**-0.5 * 4000**-0.5, rel=1e-12)
    assert transformer_lr(100_000, d, warmup) == pytest.approx(512**-0.5 * 100_000**-0.5, rel=1e-12)
    # The same numbers written out.
    assert transformer_lr(1, d, warmup) == pytest.approx(1.7469e-7, rel=1e-4)
    assert transformer_lr(4000, d, warmup) == pytest.approx(6.9877e-4, rel=1e-4)
    assert transformer_lr(100_000, d, warmup) == pytest.approx(1.3975e-4, rel=1e-4)
    # Linear warm-up: doubling the step doubles the rate before the peak.
    assert transformer_lr(2000, d, warmup) == pytest.approx(2 * transformer_lr(1000, d, warmup), rel=1e-12)
    # Inverse square root afterwards: 4× the step halves the rate.
    assert transformer_lr(40_000, d, warmup) == pytest.approx(transformer_lr(10_000, d, warmup) / 2, rel=1e-12)
    # factor scales the whole curve.
    assert transformer_lr(123, d, warmup, factor=2.0) == pytest.approx(2 * transformer_lr(123, d, warmup), rel=1e-12)


def test_transformer_lr_peaks_at_warmup():
    lrs = [transformer_lr(step, 512, 4000) for step in range(1, 12_001)]
    peak_step = max(range(len(lrs)), key=lrs.__getitem__) + 1
    assert peak_step == 4000
    assert transformer_lr(3999, 512, 4000) < transformer_lr(4000, 512, 4000) > transformer_lr(4001, 512, 4000)
    assert all(a < b for a, b in itertools.pairwise(lrs[:4000]))  # strictly rising in warm-up
    assert all(a > b for a, b in itertools.pairwise(lrs[3999:]))  # strictly falling after


def test_scheduler_gives_eq3_at_each_optimizer_step():
    """The lr used by the n-th optimizer.step() is Eq. 3 at n."""
    d, warmup = 512, 4000
    param = torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.Adam([param], lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    scheduler = transformer_scheduler(optimizer, d, warmup)
    used = []
    for _ in range(4001):
        used.append(optimizer.param_groups[0]["lr"])
        optimizer.zero_grad()
        (param * torch.tensor([1.0, -2.0, 3.0])).sum().backward()
        optimizer.step()
        scheduler.step()
    assert used[0] == pytest.approx(transformer_lr(1, d, warmup), rel=1e-12)
    assert used[0] == pytest.approx(512**-0.5 * 4000**-1.5, rel=1e-12)
    assert used[1] == pytest.approx(transformer_lr(2, d, warmup), rel=1e-12)
    assert used[3999] == pytest.approx(512**-0.5 * 4000**-0.5, rel=1e-12)
    assert used[4000] == pytest.approx(transformer_lr(4001, d, warmup), rel=1e-12)
    for n in (1, 10, 2500, 4000, 4001):
        assert used[n - 1] == pytest.approx(transformer_lr(n, d, warmup), rel=1e-12)


def test_first_adam_step_moves_by_the_eq3_rate():
    """Adam's first update is lr · sign(g) (up to eps): checks the rate really reaches the optimizer."""
    param = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    optimizer = torch.optim.Adam([param], lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    transformer_scheduler(optimizer, 512, 4000)
    (param * torch.tensor([2.0, -5.0], dtype=torch.float64)).sum().backward()
    optimizer.step()
    expected = 512**-0.5 * 4000**-1.5
    torch.testing.assert_close(param.detach(), torch.tensor([-expected, expected], dtype=torch.float64),
                               rtol=1e-6, atol=0)


# ----------------------------------------------------------------------- label smoothing


LOGITS = [
    [[1.0, 2.0, 0.5, -1.0, 0.0], [0.3, -0.2, 2.5, 1.0, -3.0], [4.0, 4.0, -2.0, 0.0, 1.0]],
]
TARGET = [[3, 2, 0]]  # the last position is padding (pad_id = 0)


def _hand_loss(logits, target, eps, pad_id):
    total, nll_total, count = 0.0, 0.0, 0
    for row, y in zip(logits, target):
        if y == pad_id:
            continue
        log_z = math.log(sum(math.exp(v) for v in row))
        neg_log_p = [log_z - v for v in row]
        total += (1 - eps) * neg_log_p[y] + eps * sum(neg_log_p) / len(row)
        nll_total += neg_log_p[y]
        count += 1
    return total, nll_total, count


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_label_smoothed_loss_by_hand(eps):
    logits = torch.tensor(LOGITS, requires_grad=True)
    target = torch.tensor(TARGET)
    loss, nll, n_tokens = label_smoothed_loss(logits, target, eps, pad_id=0)
    want_loss, want_nll, want_count = _hand_loss(LOGITS[0], TARGET[0], eps, 0)
    assert n_tokens == want_count == 2
    assert loss.item() == pytest.approx(want_loss, rel=1e-6)
    assert nll.item() == pytest.approx(want_nll, rel=1e-6)
    assert not nll.requires_grad
    loss.backward()
    assert torch.all(logits.grad[0, 2] == 0)  # no gradient from the padded position
    assert logits.grad[0, :2].abs().sum() > 0


def test_label_smoothing_changes_the_loss():
    logits = torch.tensor(LOGITS)
    target = torch.tensor(TARGET)
    plain, nll_plain, _ = label_smoothed_loss(logits, target, 0.0, pad_id=0)
    smooth, nll_smooth, _ = label_smoothed_loss(logits, target, 0.1, pad_id=0)
    assert nll_plain.item() == pytest.approx(nll_smooth.item(), rel=1e-7)  # NLL is reported unsmoothed
    assert plain.item() == pytest.approx(nll_plain.item(), rel=1e-7)
    assert abs(smooth.item() - plain.item()) > 1e-2


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("pad_id", [0, 3])
def test_label_smoothed_loss_matches_torch_cross_entropy(eps, pad_id):
    torch.manual_seed(0)
    logits = torch.randn(4, 6, 11) * 3
    target = torch.randint(0, 11, (4, 6))
    target[target == pad_id] = (pad_id + 1) % 11
    target[0, 4:] = pad_id
    target[2, 1:] = pad_id
    loss, nll, n_tokens = label_smoothed_loss(logits, target, eps, pad_id=pad_id)
    want = F.cross_entropy(logits.view(-1, 11), target.view(-1), label_smoothing=eps, ignore_index=pad_id,
                           reduction="sum")
    want_nll = F.cross_entropy(logits.view(-1, 11), target.view(-1), ignore_index=pad_id, reduction="sum")
    assert n_tokens == 24 - 2 - 5
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(nll, want_nll, rtol=1e-5, atol=1e-5)


def test_label_smoothed_loss_half_precision_logits_are_upcast():
    torch.manual_seed(1)
    logits = torch.randn(2, 3, 7)
    target = torch.tensor([[1, 2, 0], [4, 0, 0]])
    loss32, _, _ = label_smoothed_loss(logits, target, 0.1, pad_id=0)
    loss16, _, n = label_smoothed_loss(logits.to(torch.bfloat16), target, 0.1, pad_id=0)
    assert loss16.dtype == torch.float32 and n == 3
    torch.testing.assert_close(loss16, loss32, rtol=2e-2, atol=2e-2)
