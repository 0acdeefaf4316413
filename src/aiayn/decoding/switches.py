"""The speed switches of evaluate and translate (aiayn.decoding.speed applies them): their
defaults, which go together, and how each names itself; light to import, so that a tool checks
them before torch is loaded."""

from __future__ import annotations

import re

from aiayn.decoding.packages import require_onnxruntime
from aiayn.errors import ConfigError

PRECISIONS = ("fp32", "bf16", "fp16")
# The switches and their defaults (the plain model: for_decoding gives the model itself).
DEFAULTS = {"precision": "fp32", "int8": False, "compile": False, "onednn": False, "onnxruntime": False}
# Switches that run the fp32 arithmetic their own way, and so go with no other: what each does.
SOLE = {"onnxruntime": "runs the fp32 decoder step itself", "onednn": "runs the fp32 products"}
# How each switch names itself in a report's file name and in words, when on (aiayn.decoding.settings).
SPELLING = {"precision": lambda v: None if v == "fp32" else v, "int8": lambda v: "int8" if v else None,
            "compile": lambda v: "compile" if v else None, "onednn": lambda v: "onednn" if v else None,
            "onnxruntime": lambda v: "onnxruntime" if v else None}


def own_arithmetic(switches: dict) -> bool:
    """Whether ``switches`` leave the plain model's fp32 arithmetic, by torch's own kernels, as it is
    (a compiled step computes the same up to rounding)."""
    return switches.get("precision", "fp32") == "fp32" and not any(switches.get(key) for key in ("int8", *SOLE))


def switches_of(cfg) -> dict:
    """The switches set in a translate/evaluate config (DEFAULTS' keys), checked: a ConfigError
    (a ValueError) names a wrong one."""
    switches = {key: cfg.get(key, default) for key, default in DEFAULTS.items()}
    if switches["precision"] not in PRECISIONS:
        raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {switches['precision']!r}")
    for key in ("int8", "compile", "onednn", "onnxruntime"):
        if type(switches[key]) is not bool:
            raise ConfigError(f"{key} must be true or false, got {switches[key]!r}")
    if switches["int8"] and switches["precision"] != "fp32":
        raise ConfigError(f"int8 quantises fp32 weights; it cannot be combined with precision={switches['precision']}")
    # (onednn with compile: inductor cannot lower oneDNN's packed weights.)
    for key, what in SOLE.items():
        others = [f"{other}=true" for other in ("int8", "compile", "onednn") if other != key and switches[other]]
        others += [f"precision={switches['precision']}"] if switches["precision"] != "fp32" else []
        if switches[key] and others:
            raise ConfigError(f"{key} {what}; it cannot be combined with {others[0]}")
    if switches["onnxruntime"]:
        require_onnxruntime()
    return switches


def check_device(device: object) -> None:
    """A ConfigError unless ``device`` is one the tools decode on: auto (a GPU where there is one),
    cpu, cuda or cuda:<index> (whether the machine has it is asked when the model is placed)."""
    if not (isinstance(device, str) and re.fullmatch(r"auto|cpu|cuda(:\d+)?", device)):
        raise ConfigError(f"device must be auto (a GPU where there is one), cpu, cuda or cuda:<index>, got {device!r}")
