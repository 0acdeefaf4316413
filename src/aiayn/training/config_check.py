"""Checks of a training config before anything is built, so that a bad setting is reported as
one line saying what to change, not as a traceback from deep inside torch or Lightning.

Keys and types are the schemas' business (aiayn.training.config); what they cannot say — ranges,
one setting against another — is checked here."""

from __future__ import annotations

from typing import Any

from aiayn.errors import ConfigError
from aiayn.reporting.flops import sustained_tflops
from aiayn.training.config import check_against_schemas, network_arguments


def check_train_config(config: dict[str, Any]) -> None:
    """Raise ConfigError for the first impossible setting of a resolved training config."""
    typed = check_against_schemas(config)
    smoothing = typed["loss"]["label_smoothing"]
    if not 0.0 <= smoothing < 1.0:
        raise ConfigError(f"loss.label_smoothing must be in [0.0, 1.0), got {smoothing!r}")
    try:
        network_arguments(typed["model"], config.get("width_divisor", 1))
    except ValueError as error:
        raise ConfigError(str(error)) from None
    optim = typed["optim"]
    for key in ("train_steps", "warmup_steps"):
        if optim[key] < 1:
            raise ConfigError(f"optim.{key} must be a positive whole number, got {optim[key]!r}")
    if not optim["lr_factor"] > 0:
        raise ConfigError(f"optim.lr_factor must be positive, got {optim['lr_factor']!r}")

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

