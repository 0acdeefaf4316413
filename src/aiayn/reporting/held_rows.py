"""What a resumed run's loggers hold already, so that no step's metrics are logged twice.

A run killed after its last checkpoint has logged rows of the steps its resumed attempt trains
again: Lightning's loggers write each row as it is logged (metrics.csv, MLflow's store) or soon
after (W&B's file). A resumed logger is given, from what its run holds, the newest step logged of
each metric, and leaves out a metric at a step no newer: the resumed attempt repeats the killed
one's steps exactly, so the figure held is the one it would log. A row left with nothing new is
not logged at all. Within a metric a run logs its steps in order, so the newest step held says
which are held. The run's summary is not a row: each attempt gives its own.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Mapping
from typing import Any

# Keys every row carries beside its metrics (Lightning's epoch, W&B's x-axis): never a row alone.
BOOKKEEPING = frozenset({"epoch", "step", "trainer/global_step"})


class HeldRows:
    """The newest step held of each metric (``{"train/loss": 19, "val/loss": 12}``); see the module."""

    def __init__(self, newest: Mapping[str, int] | None = None):
        self.newest: dict[str, int] = dict(newest or {})

    def add(self, metrics: Iterable[str], step: int) -> None:
        """``metrics`` held at ``step`` too."""
        for key in metrics:
            if key not in BOOKKEEPING:
                self.newest[key] = max(self.newest.get(key, step), step)

    def fresh(self, metrics: Mapping[str, Any], step: int | None) -> dict[str, Any]:
        """The part of the row ``metrics`` at ``step`` not held yet (with its bookkeeping), or {}."""
        if step is None or not self.newest:
            return dict(metrics)
        new = {key: value for key, value in metrics.items()
               if key not in BOOKKEEPING and step > self.newest.get(key, -1)}
        if not new:
            return {}
        return {**{key: value for key, value in metrics.items() if key in BOOKKEEPING}, **new}

    def __len__(self) -> int:
        return len(self.newest)


def numbers_of(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a row (not its pictures or tables), as a run's own record keeps them."""
    return {key: float(value) for key, value in metrics.items()
            if isinstance(value, numbers.Real) and not isinstance(value, bool)}
