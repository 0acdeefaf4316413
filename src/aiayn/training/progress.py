"""The progress bar of a training run: Lightning's, saying what a step-bounded run is doing.

Lightning's bars describe epochs ("Epoch 0/-2" when ``max_epochs=-1``, as every run here trains
for ``trainer.max_steps`` steps), print the learning rate as ``0.000`` and show the logger's
version (``v_num``). This one names the epoch and the step the run trains to, writes the rate in
scientific notation and the other values to four significant digits, and leaves the version out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning.pytorch.callbacks import RichProgressBar, TQDMProgressBar
from lightning.pytorch.callbacks.progress.rich_progress import _RICH_AVAILABLE


def progress_bar(trainer: Mapping[str, Any]) -> RichProgressBar | TQDMProgressBar | None:
    """The bar (Rich's when rich is installed, as Lightning chooses), or None when
    ``trainer.enable_progress_bar`` is false."""
    if trainer.get("enable_progress_bar") is False:
        return None
    return StepRichProgressBar() if _RICH_AVAILABLE else StepTQDMProgressBar()


def describe_values(metrics: dict[str, Any]) -> dict[str, Any]:
    """The bar's values: no ``v_num``; learning rates (``*lr``) as ``1.23e-04``; other numbers to
    four significant digits."""
    shown = {}
    for key, value in metrics.items():
        if key == "v_num":
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = f"{value:.2e}" if key.endswith("lr") else f"{value:.4g}"
        shown[key] = value
    return shown


def describe_training(trainer: Any) -> str:
    """``Epoch 3`` and, for a run bounded by steps, the step it trains to: ``Epoch 3 (to step 100000)``."""
    text = f"Epoch {trainer.current_epoch}"
    if trainer.max_epochs is not None and trainer.max_epochs > 0:
        text += f"/{trainer.max_epochs - 1}"
    if trainer.max_steps is not None and trainer.max_steps > 0:
        text += f" (to step {trainer.max_steps})"
    return text


class StepRichProgressBar(RichProgressBar):
    def _get_train_description(self, current_epoch: int) -> str:
        return f"{describe_training(self.trainer):{len(self.validation_description)}}"

    def get_metrics(self, trainer: Any, pl_module: Any) -> dict[str, Any]:
        return describe_values(super().get_metrics(trainer, pl_module))


class StepTQDMProgressBar(TQDMProgressBar):
    def on_train_epoch_start(self, trainer: Any, *args: Any) -> None:
        super().on_train_epoch_start(trainer, *args)
        self.train_progress_bar.set_description(describe_training(trainer))

    def get_metrics(self, trainer: Any, pl_module: Any) -> dict[str, Any]:
        return describe_values(super().get_metrics(trainer, pl_module))
