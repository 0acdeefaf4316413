"""The weights the test after training scores: §6.1's average where the recipe has its window, the
best validation's model where the run stops early, else the last weights.

§6.1: the test scores what the paper scored, the average of the window's checkpoints ("a single
model obtained by averaging the last 5 checkpoints"; the big models' last 20), so that a Table 2 row
is one command. Where the recipe has the window (``checkpoint.average_last``,
aiayn.config.checkpointing), :class:`WeightsBeforeTest` loads their average into the model as the
test starts, once the run has trained through the window (its last step, the run's, is saved).
Elsewhere (the small model, Table 3's rows, a run shorter than its window or stopped before its
end) the test scores the last weights; ``python src/evaluate.py ckpt=… average_last=k`` scores any
other average.

Stopping early (``callbacks.early_stopping``): the test scores ``checkpoints/best.ckpt``, the model
of the validation with the best figure (aiayn.training.early_stopping), not the one ``patience``
validations past it where training stopped; as fairseq's users test ``checkpoint_best.pt`` and
lightning-hydra-template tests its best checkpoint. The run is no row of the paper's then, and its
§6.1 window, after the stop, is never reached.

The test line, the summary (``test/*``, ``test_weights``: last, average or best, and
``test_averaged``: how many checkpoints) and the loggers say which (:func:`tested`). The weights are
loaded in the processes that test: in DDP rank zero reads the files (it wrote them: another node may
not have them) and broadcasts the weights, under ``ddp`` and ``ddp_spawn`` alike.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch

from aiayn.checkpoints.averaging import average_checkpoints
from aiayn.checkpoints.io import checkpoint_step, read_checkpoint
from aiayn.checkpoints.layout import checkpoint_folder, step_file
from aiayn.checkpoints.trained import model_weights, put_weights
from aiayn.config.checkpointing import window_steps
from aiayn.training.early_stopping import best_checkpoint

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Tested:
    """Weights the test scores instead of the last: ``kind`` ``average`` (§6.1's window: ``paths``,
    oldest first) or ``best`` (``paths``: best.ckpt)."""

    kind: str
    paths: list[Path]

    def there(self) -> bool:
        """Whether its files are all there (else the test scores the last weights)."""
        return all(path.is_file() for path in self.paths)

    def weights(self) -> dict[str, torch.Tensor]:
        """The Transformer's weights of its files (their average, for a window)."""
        if self.kind == "best":
            return model_weights(read_checkpoint(self.paths[0])["state_dict"])
        return model_weights(average_checkpoints(self.paths)["state_dict"])

    def described(self) -> str:
        """How the test line names it: ``§6.1: the average of the last 5 checkpoints, steps
        94,000–100,000``, or ``the best validation's model, step 2,000: <run>/checkpoints/best.ckpt``."""
        if self.kind == "best":
            step = torch.load(self.paths[0], map_location="cpu", mmap=True, weights_only=False).get("global_step")
            return f"the best validation's model, step {step:,}: {self.paths[0]}"
        steps = [checkpoint_step(path) for path in self.paths]
        return f"§6.1: the average of the last {len(steps)} checkpoints, steps {steps[0]:,}–{steps[-1]:,}"


def window_checkpoints(config: Mapping[str, Any]) -> dict[int, Path] | None:
    """The steps of the run's §6.1 window and their files (``<run>/checkpoints/step<N>.ckpt``),
    oldest first; None for a recipe without one, or a run shorter than it."""
    checkpoint = config["checkpoint"]
    steps = window_steps(config["trainer"]["max_steps"], checkpoint.get("average_last"),
                         checkpoint.get("average_every_n_steps"))
    if steps is None:
        return None
    folder = checkpoint_folder(config["paths"]["output_dir"])
    return {step: step_file(folder, step) for step in steps}


def to_test(config: Mapping[str, Any]) -> Tested | None:
    """The weights the run's test scores instead of the last, by its settings: the best
    validation's where it stops early, else §6.1's window where its recipe has one."""
    best = best_checkpoint(config)
    if best is not None:
        return Tested("best", [best])
    window = window_checkpoints(config)
    return Tested("average", list(window.values())) if window is not None else None


def tested(config: Mapping[str, Any]) -> Tested | None:
    """The weights the test scored, read where :class:`WeightsBeforeTest` read them; None where it
    scored the last weights."""
    weights = to_test(config)
    return weights if weights is not None and weights.there() else None


def weights_before_test(config: Mapping[str, Any]) -> list[L.Callback]:
    """[:class:`WeightsBeforeTest`] where the run tests after training other weights than the last."""
    weights = to_test(config)
    return [WeightsBeforeTest(weights)] if weights is not None and config.get("test_after_training", True) else []


class WeightsBeforeTest(L.Callback):
    """As the test starts, the weights of ``weights`` in the model, in every process that tests;
    nothing where the run has not trained through §6.1's window (its last checkpoint is not there)
    or has no best model, and a warning where one of the window's checkpoints is missing."""

    def __init__(self, weights: Tested):
        self.tested = weights

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        weights = None
        paths = self.tested.paths
        if trainer.is_global_zero and paths[-1].is_file():
            missing = [path.name for path in paths if not path.is_file()]
            if missing:
                log.warning("§6.1: %s missing from %s; the test scores the last weights, not the average of the last "
                            "%d checkpoints", ", ".join(missing), paths[0].parent, len(paths))
            else:
                weights = self.tested.weights()
        elif trainer.is_global_zero and self.tested.kind == "best":
            log.warning("%s: not there; the test scores the last weights, not the best validation's", paths[0])
        weights = trainer.strategy.broadcast(weights, src=0)
        if weights is not None:
            put_weights(pl_module.model, weights, str(paths[0]) if self.tested.kind == "best" else
                        f"the average of the last {len(paths)} checkpoints in {paths[0].parent}")
