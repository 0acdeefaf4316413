"""§6.1 at the end of training: the test scores what the paper scored, the average of the window's
checkpoints ("a single model obtained by averaging the last 5 checkpoints"; the big models' last
20), so that a Table 2 row is one command.

Where the recipe has §6.1's window (``checkpoint.average_last``, aiayn.config.checkpointing),
:class:`AverageBeforeTest` loads the average of the window's checkpoints into the model as the test
starts, once the run has trained through the window (its last step, the run's, is saved); the
test line, the summary (``test/*`` and ``test_averaged``) and the loggers say so
(:func:`averaged_steps`). Elsewhere (the small model, Table 3's rows, a run shorter than its
window or stopped before its end) the test scores the last weights, as before;
``python src/evaluate.py ckpt=… average_last=k`` scores any other average.

The average is loaded in the processes that test: in DDP rank zero reads the checkpoints (it wrote
them: another node may not have them) and broadcasts the weights, under ``ddp`` and ``ddp_spawn``
alike.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning as L

from aiayn.checkpoints.averaging import average_checkpoints
from aiayn.checkpoints.trained import model_weights, put_weights
from aiayn.config.checkpointing import window_steps

log = logging.getLogger(__name__)


def window_checkpoints(config: Mapping[str, Any]) -> dict[int, Path] | None:
    """The steps of the run's §6.1 window and their files (``<run>/checkpoints/step<N>.ckpt``),
    oldest first; None for a recipe without one, or a run shorter than it."""
    checkpoint = config["checkpoint"]
    steps = window_steps(config["trainer"]["max_steps"], checkpoint.get("average_last"),
                         checkpoint.get("average_every_n_steps"))
    if steps is None:
        return None
    folder = Path(config["paths"]["output_dir"]) / "checkpoints"
    return {step: folder / f"step{step:07d}.ckpt" for step in steps}


def averaged_steps(config: Mapping[str, Any]) -> list[int] | None:
    """The steps whose average the test scored (read where :class:`AverageBeforeTest` read them), or
    None where it scored the last weights."""
    window = window_checkpoints(config)
    if window is None or not all(path.is_file() for path in window.values()):
        return None
    return list(window)


def average_before_test(config: Mapping[str, Any]) -> list[L.Callback]:
    """[:class:`AverageBeforeTest`] where the recipe has a window and the run tests after training."""
    window = window_checkpoints(config)
    return [AverageBeforeTest(list(window.values()))] if window and config.get("test_after_training", True) else []


class AverageBeforeTest(L.Callback):
    """As the test starts, the average of ``paths`` (the §6.1 window) in the model, in every
    process that tests; nothing where the run has not trained through the window (its last
    checkpoint is not there) or one of them is missing (a warning)."""

    def __init__(self, paths: list[Path]):
        self.paths = paths

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        weights = None
        if trainer.is_global_zero and self.paths[-1].is_file():
            missing = [path.name for path in self.paths if not path.is_file()]
            if missing:
                log.warning("§6.1: %s missing from %s; the test scores the last weights, not the average of the last "
                            "%d checkpoints", ", ".join(missing), self.paths[0].parent, len(self.paths))
            else:
                weights = model_weights(average_checkpoints(self.paths)["state_dict"])
        weights = trainer.strategy.broadcast(weights, src=0)
        if weights is not None:
            put_weights(pl_module.model, weights,
                        f"the average of the last {len(self.paths)} checkpoints in {self.paths[0].parent}")


def described(steps: list[int]) -> str:
    """How the test line names the weights tested: ``§6.1: the average of the last 5 checkpoints,
    steps 94,000–100,000``."""
    return f"§6.1: the average of the last {len(steps)} checkpoints, steps {steps[0]:,}–{steps[-1]:,}"
