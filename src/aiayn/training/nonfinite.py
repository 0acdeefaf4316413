"""Steps skipped for a non-finite loss or gradient, counted on the device and read back now and then
(aiayn.training.module): a warning for those skipped since the last read, and after too many in a
row a stop with a checkpoint of the state from before them."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from aiayn.checkpoints.layout import checkpoint_folder, step_file

log = logging.getLogger("aiayn.training.module")  # the module's warnings, as they always were


class NonFiniteLossError(RuntimeError):
    """Training stopped after too many consecutive steps with a non-finite loss or gradient."""


class NonFiniteSteps:
    """The counts of skipped steps: ``in_a_row`` and ``total`` as last read back, and on the device
    [in a row, in all, whether the last skipped step's loss was itself non-finite], kept from the
    last read on without waiting for the device."""

    def __init__(self, max_in_a_row: int, in_a_row: int = 0, total: int = 0):
        self.max_in_a_row, self.in_a_row, self.total = max_in_a_row, in_a_row, total
        self._counts: torch.Tensor | None = None

    def count(self, bad: torch.Tensor, bad_loss: torch.Tensor) -> torch.Tensor:
        """One step, skipped where ``bad`` (a device flag); returns the device's count in all."""
        if self._counts is None:
            self._counts = torch.tensor([self.in_a_row, self.total, 0], device=bad.device)
        counts = self._counts
        counts[0] = torch.where(bad, counts[0] + 1, 0)
        counts[1] += bad.to(counts.dtype)
        counts[2] = torch.where(bad, bad_loss.to(counts.dtype), counts[2])
        return counts[1]

    def read(self, step: int, save: Callable[[str], None], root_dir: str) -> None:
        """The device's counts read back after ``step`` (counted from 1): a warning if steps were
        skipped since the last read, and after ``max_in_a_row`` in a row ``save`` of the state
        (from before them: the skipped steps changed nothing) and NonFiniteLossError."""
        if self._counts is None:
            return
        in_a_row, total, loss = (int(n) for n in self._counts.tolist())
        skipped = total - self.total
        self.in_a_row, self.total = in_a_row, total
        if not skipped:
            return
        what = "loss" if loss else "gradient"
        log.warning("step %d: non-finite %s, update skipped (%d in a row, %d in all%s)", step - 1, what, in_a_row, total,
                    "" if skipped == 1 else f"; {skipped} since the last check")
        if in_a_row >= self.max_in_a_row:
            path = str(step_file(checkpoint_folder(root_dir), step - 1, prefix="nonfinite-"))
            save(path)
            raise NonFiniteLossError(
                f"{in_a_row} steps in a row had a non-finite {what} (last at step {step - 1}); "
                f"the state from before them is in {path}. Lower optim.lr_factor or raise optim.warmup_steps "
                f"and resume with resume={path}, or allow more with nonfinite.max_in_a_row"
            )

    def state(self) -> dict[str, int]:
        """The counts for a checkpoint (a read back: at a save only)."""
        if self._counts is not None:
            self.in_a_row, self.total = (int(n) for n in self._counts.tolist()[:2])
        return {"in_a_row": self.in_a_row, "total": self.total}

    def load(self, state: dict[str, int]) -> None:
        self.in_a_row, self.total = state.get("in_a_row", 0), state.get("total", 0)
        self._counts = None  # made again from these at the next step
