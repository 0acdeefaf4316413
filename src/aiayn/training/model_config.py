"""From a model config (conf/model/*.yaml) to the Transformer's arguments.

A model config holds the network's sizes (the Transformer's keyword arguments), the training
recipe (``TRAINING_KEYS``) and ``width_divisor``: every width — d_model, d_ff, d_k, d_v — is
divided by it, while N and h stay. It is 1 for every paper setting; the CPU-sized Table 3
(conf/scale/multi30k_cpu.yaml) sets 4 so that each row keeps its shape (the ratios between
rows, N and h) at 1/16 of the cost. Not a paper setting.
"""

from __future__ import annotations

from typing import Any, Mapping

# Keys of the model config that configure training rather than the network.
TRAINING_KEYS = ("name", "label_smoothing", "train_steps", "warmup_steps", "lr_factor",
                 "validate_every_n_steps", "width_divisor")
WIDTHS = ("d_model", "d_ff", "d_k", "d_v")


def network_arguments(model: Mapping[str, Any]) -> dict[str, Any]:
    """The Transformer's keyword arguments a model config asks for, widths divided by
    ``width_divisor`` (which must divide each of them)."""
    network = {k: v for k, v in model.items() if k not in TRAINING_KEYS}
    divisor = model.get("width_divisor", 1)
    if isinstance(divisor, bool) or not isinstance(divisor, int) or divisor < 1:
        raise ValueError(f"model.width_divisor must be a positive whole number, got {divisor!r}")
    for key in WIDTHS:
        if key in network and divisor != 1:
            if network[key] % divisor:
                raise ValueError(f"model.width_divisor={divisor} does not divide model.{key}={network[key]}")
            network[key] //= divisor
    return network
