"""Checks of a training config before anything is built, so that a bad setting is reported as
one line saying what to change, not as a traceback from deep inside torch or Lightning."""

from __future__ import annotations

import inspect
from typing import Any

from aiayn.model import Transformer
from aiayn.training.flops import sustained_tflops
from aiayn.training.model_config import TRAINING_KEYS, network_arguments


class ConfigError(ValueError):
    """A setting that cannot work; the message names it and what to do."""


def check_train_config(config: dict[str, Any]) -> None:
    """Raise ConfigError for the first impossible setting of a resolved training config."""
    model = config.get("model") or {}
    known = set(inspect.signature(Transformer).parameters) - {"src_vocab_size", "tgt_vocab_size", "pad_id"}
    unknown = sorted(set(model) - known - set(TRAINING_KEYS))
    if unknown:
        raise ConfigError(
            f"model.{unknown[0]} is not a model setting; the settings are {', '.join(sorted(known | set(TRAINING_KEYS)))}"
        )
    _range(model, "label_smoothing", 0.0, 1.0)
    try:
        network_arguments(model)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    optim = config.get("optim") or {}
    for section, values in (("model", model), ("optim", optim)):
        for key in ("train_steps", "warmup_steps"):
            if key in values and (isinstance(values[key], bool) or not isinstance(values[key], int) or values[key] < 1):
                raise ConfigError(f"{section}.{key} must be a positive whole number, got {values[key]!r}")
        if "lr_factor" in values and not (isinstance(values["lr_factor"], (int, float)) and values["lr_factor"] > 0):
            raise ConfigError(f"{section}.lr_factor must be positive, got {values['lr_factor']!r}")

    task = config.get("task") or {}
    if not isinstance(task.get("vocab_size"), int) or task["vocab_size"] < 8:
        raise ConfigError(f"task.vocab_size must be a whole number of at least 8, got {task.get('vocab_size')!r}")
    data = task.get("datamodule") or {}
    max_tokens, max_length = data.get("max_tokens"), data.get("max_length")
    if isinstance(max_tokens, int) and isinstance(max_length, int) and max_tokens < max_length + 2:
        raise ConfigError(
            f"task.datamodule.max_tokens={max_tokens} cannot hold one pair of max_length={max_length} subwords "
            f"plus BOS/EOS; raise max_tokens to at least {max_length + 2} or lower max_length"
        )
    gpu = (config.get("cost") or {}).get("gpu", "P100")
    try:
        sustained_tflops(gpu)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    if (config.get("nonfinite") or {}).get("max_in_a_row", 1) < 1:
        raise ConfigError(f"nonfinite.max_in_a_row must be at least 1, got {config['nonfinite']['max_in_a_row']}")


def _range(section: dict[str, Any], key: str, low: float, high: float) -> None:
    if key in section and not (isinstance(section[key], (int, float)) and low <= section[key] < high):
        raise ConfigError(f"model.{key} must be in [{low}, {high}), got {section[key]!r}")
