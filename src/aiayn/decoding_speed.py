"""Switches that make a trained model decode faster, each leaving the search (§6.1) as it is:

* ``int8``: dynamic int8 quantisation (CPU). Every linear layer and the pre-softmax projection
  (tied to the embeddings, §3.4) get int8 weights, one scale per matrix; activations are quantised
  batch by batch as they come (torch's ``quantize_dynamic``, fbgemm/x86 kernels). The outputs
  change a little; docs/performance.md gives the measured speed and BLEU.
* ``precision="bf16"`` or ``"fp16"``: weights and activations in that type (GPU; a CPU without
  bf16 units emulates it, many times slower). The beam scores stay fp32 (the log-softmax is taken
  in fp32). Outputs may differ from fp32 where two hypotheses are within rounding of each other.
* ``compile``: the decoder step through ``torch.compile`` with dynamic shapes (GPU; on a CPU it is
  slower than eager, see docs/performance.md). Same outputs as eager up to kernel rounding.

Each switch works on a copy: the model given is never changed.
"""

from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

from aiayn.errors import ConfigError
from aiayn.model import Ensemble, Transformer

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def switches_of(cfg) -> dict:
    """The switches set in a translate/evaluate config (``precision``, ``int8``, ``compile``),
    checked: a ConfigError (a ValueError) names a wrong one."""
    switches = {"precision": cfg.get("precision", "fp32"), "int8": cfg.get("int8", False),
                "compile": cfg.get("compile", False)}
    if switches["precision"] not in PRECISIONS:
        raise ConfigError(f"precision must be one of {', '.join(PRECISIONS)}, got {switches['precision']!r}")
    for key in ("int8", "compile"):
        if type(switches[key]) is not bool:
            raise ConfigError(f"{key} must be true or false, got {switches[key]!r}")
    if switches["int8"] and switches["precision"] != "fp32":
        raise ConfigError(f"int8 quantises fp32 weights; it cannot be combined with precision={switches['precision']}")
    return switches


def for_decoding(model: Transformer, *, precision: str = "fp32", int8: bool = False,
                 compile: bool = False) -> Transformer:
    """``model`` ready to decode with the switches asked for (see the module docstring): the
    model itself when none is, else a copy in eval mode."""
    switches_of({"precision": precision, "int8": int8, "compile": compile})
    if precision == "fp32" and not int8 and not compile:
        return model
    if isinstance(model, Ensemble):  # each of its models made ready alike
        return Ensemble([for_decoding(member, precision=precision, int8=int8, compile=compile)
                         for member in model.models])
    fast = copy.deepcopy(model).eval()
    if precision != "fp32":
        fast = fast.to(PRECISIONS[precision])
    if int8:
        fast = quantize_int8(fast)
    if compile:
        fast.decode = torch.compile(fast.decode, dynamic=True)
    return fast


def quantize_int8(model: Transformer) -> Transformer:
    """``model`` (on the CPU, changed in place and returned) with int8 dynamic quantisation of its
    linear layers and of the pre-softmax projection."""
    if next(model.parameters()).device.type != "cpu":
        raise ConfigError("int8 decoding runs on the CPU (torch's dynamic quantisation has CPU kernels only); "
                         "use device=cpu, or precision=bf16 on a GPU")
    if model.output_projection is None:
        # The tied projection is F.linear with the embedding matrix: give it a Linear of its own
        # holding the same weight, so that it is quantised too (it is most of a step's products).
        vocab, d_model = model.tgt_embedding.weight.shape
        model.output_projection = nn.Linear(d_model, vocab, bias=False)
        model.output_projection.weight = model.tgt_embedding.weight
    with warnings.catch_warnings():  # torch.ao's notice that the API is moving to torchao
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
