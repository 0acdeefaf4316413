"""Switches that make a trained model decode faster, each leaving the search (§6.1) as it is:

* ``int8``: dynamic int8 quantisation (CPU). Every linear layer and the pre-softmax projection
  (tied to the embeddings, §3.4) get int8 weights, one scale per matrix; activations are quantised
  batch by batch as they come (torch's ``quantize_dynamic``, fbgemm/x86 kernels). The outputs
  change a little; docs/performance.md gives the measured speed and BLEU.
* ``precision="bf16"`` or ``"fp16"``: weights and activations in that type (GPU; a CPU without
  bf16 units emulates it, many times slower). The beam scores stay fp32 (the log-softmax is taken
  in fp32). Outputs may differ from fp32 where two hypotheses are within rounding of each other.
* ``compile``: the decoder step through ``torch.compile`` with dynamic shapes, traced whole and
  compiled at most twice (:class:`CompiledDecode`), W^Q, W^K and W^V stacked once as the
  copy is made (so weights loaded into the copy afterwards would not reach them: load them into
  the model, then make the copy) (GPU; on a CPU a little faster than eager after a minute or more
  of compiling, see docs/performance/decoding.md). Same outputs as eager up to kernel rounding.
* ``onednn``: every fp32 matrix product of the network (the pre-softmax projection too) through
  oneDNN, each weight packed once into oneDNN's blocked layout (CPU); W^Q, W^K and W^V stacked
  into one product, as the plain model stacks them. Still fp32, but a different
  kernel from torch's default (MKL), so the logits differ in their last bits and a near tie may
  go the other way; on an AMD EPYC it decodes 1.1× (batches of 128) to 1.4× (one sentence) faster,
  because MKL runs a generic path there (docs/performance.md). Off by default, so that fp32
  outputs stay bit for bit those of the plain model.
* ``onnxruntime``: the incremental decoder step exported to ONNX once and run by ONNX Runtime
  (CPU; aiayn.decoding.onnx_step): one planned graph instead of some 130 torch calls a step. fp32 by other
  kernels, so the last bits differ, as with ``onednn``; the extra ``onnx`` installs it.

Each switch works on a copy: the model given is never changed.
"""

from __future__ import annotations

import copy
import functools
import warnings
from collections.abc import Callable
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from aiayn.decoding.onnx_step import OnnxRuntimeDecode
from aiayn.decoding.switches import DEFAULTS, switches_of
from aiayn.errors import ConfigError
from aiayn.model import DecoderState, Ensemble, Transformer
from aiayn.model.kept_weights import kept_key

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}  # of switches.PRECISIONS


def for_decoding(model: Transformer, *, precision: str = "fp32", int8: bool = False,
                 compile: bool = False, onednn: bool = False, onnxruntime: bool = False) -> Transformer:
    """``model`` ready to decode with the switches asked for (see the module docstring): the
    model itself when none is, else a copy in eval mode."""
    switches = switches_of({"precision": precision, "int8": int8, "compile": compile, "onednn": onednn,
                            "onnxruntime": onnxruntime})
    if switches == DEFAULTS:
        return model
    if isinstance(model, Ensemble):  # each of its models made ready alike
        return Ensemble([for_decoding(member, **switches) for member in model.models])
    with torch.inference_mode(False):  # weights with versions (packed copies follow them), even when called in inference mode
        fast = copy.deepcopy(model).eval()
    if precision != "fp32":
        fast = fast.to(DTYPES[precision])
    if int8:
        fast = quantize_int8(fast)
    if onednn:
        fast = with_onednn_products(fast)
    if compile:
        for layer in fast.decoder_layers:  # a step traced whole: W^Q, W^K, W^V stacked for good
            layer.self_attention.stack_once("w_q", "w_k", "w_v")
        fast.decode = CompiledDecode(fast)
    if onnxruntime:
        if next(fast.parameters()).device.type != "cpu":
            raise ConfigError("onnxruntime decoding runs on the CPU; use device=cpu, or leave onnxruntime=false")
        fast.decode = OnnxRuntimeDecode(fast)
    return fast


class CompiledDecode:
    """``model.decode`` with its incremental steps from the third on through ``torch.compile``
    (dynamic shapes): the step compiled once, and once more as the cache's rows stop being the
    batch's (a sentence finished, or beam search's rows), where it was compiled up to six times
    (about 20 s each for the base model on one CPU core, docs/performance/decoding.md). The first
    two steps run eagerly: without a cache, and with a cache of one position, each would be a graph
    of its own (torch takes a size of 0 or 1 as fixed). Every compiled step gathers its cache
    through ``cache_rows`` (the identity where no row was reordered or dropped), so that greedy and
    beam search share the graph. A whole target, or attention weights asked for, go to the model's
    own ``decode``."""

    def __init__(self, model: Transformer):
        self.model = model
        self._decode = functools.partial(type(model).decode, model)  # its class's (a subclass's own, say)
        self._compiled = torch.compile(self._decode, dynamic=True)

    def __deepcopy__(self, memo: dict) -> CompiledDecode:
        return CompiledDecode(copy.deepcopy(self.model, memo))  # compiled again on use

    def __call__(self, tgt_in: torch.Tensor, state: DecoderState, return_weights: bool = False):
        if return_weights or tgt_in.size(1) != 1 or state.length < 2:
            return self._decode(tgt_in, state, return_weights)
        if state.cache_rows is None:  # (rows,): row i continues row i
            state = replace(state, cache_rows=torch.arange(tgt_in.size(0), device=tgt_in.device))
        return self._compiled(tgt_in, state)


def _untie_output_projection(model: Transformer) -> None:
    """The tied pre-softmax projection is F.linear with the embedding matrix (§3.4): give it a
    Linear of its own holding the same weight, so that a switch that replaces the linear layers
    reaches it too (it is most of a decoder step's products)."""
    if model.output_projection is None:
        vocab, d_model = model.tgt_embedding.weight.shape
        model.output_projection = nn.Linear(d_model, vocab, bias=False)
        model.output_projection.weight = model.tgt_embedding.weight


class OneDNNLinear(nn.Module):
    """y = x Wᵀ + b as nn.Linear computes it, by oneDNN's fp32 product on ``weight`` packed into
    oneDNN's layout. The packed copy is made at the first product and again whenever the weight
    changes (aiayn.model.kept_weights), so a copied, reloaded or trained model never uses a stale one. For
    decoding only: with gradients enabled it is nn.Linear's own product."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias  # the same parameters (a tied weight stays tied)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self._packed: tuple[tuple, torch.Tensor] | None = None  # (kept_key of the weight, packed weight)
        self._stacks: dict[tuple[int, ...], tuple[tuple, OneDNNLinear]] = {}  # see stacked

    def __deepcopy__(self, memo: dict) -> OneDNNLinear:
        copied = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None)
        copied.weight = copy.deepcopy(self.weight, memo)
        copied.bias = copy.deepcopy(self.bias, memo)
        return OneDNNLinear(copied)  # oneDNN's packed tensors cannot be copied; packed again on use

    @classmethod
    def stacked(cls, layers: list[OneDNNLinear]) -> Callable[[torch.Tensor], torch.Tensor]:
        """One product for ``layers`` that read the same input (W^Q, W^K and W^V, stacked as
        aiayn.model.attention stacks plain layers): their outputs side by side. At a decoding
        step's few rows a product costs little more for being three times as wide, each product
        fetching its kernel and input afresh (docs/performance.md). The stacked weight is packed
        once and kept on the first layer until one of the weights changes. With gradients
        enabled, the weights are stacked in the graph, so that gradients reach each of them."""
        def stack() -> tuple[torch.Tensor, torch.Tensor | None]:
            weight = torch.cat([layer.weight for layer in layers])
            if all(layer.bias is None for layer in layers):
                return weight, None
            return weight, torch.cat([layer.bias if layer.bias is not None else layer.weight.new_zeros(layer.out_features)
                                      for layer in layers])

        if torch.is_grad_enabled():
            return lambda x: F.linear(x, *stack())
        key = kept_key(*(t for layer in layers for t in (layer.weight, layer.bias) if t is not None))
        which = tuple(id(layer) for layer in layers)
        cached = layers[0]._stacks.get(which)
        if cached is None or cached[0] != key:
            with torch.inference_mode(False):  # a tensor made under inference mode keeps no version to check
                weight, bias = stack()
                linear = nn.Linear(weight.size(1), weight.size(0), bias=bias is not None)
                linear.weight = nn.Parameter(weight.detach(), requires_grad=False)
                linear.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)
                cached = layers[0]._stacks[which] = (key, cls(linear))
        return cached[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or x.dtype != torch.float32 or x.device.type != "cpu":
            return F.linear(x, self.weight, self.bias)
        key = kept_key(self.weight)
        if self._packed is None or self._packed[0] != key:
            self._packed = (key, torch.ops.mkldnn._reorder_linear_weight(self.weight.detach().contiguous()))
        shape = x.shape  # (…, in_features) → (rows, in_features) → (…, out_features)
        y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, shape[-1]), self._packed[1], self.bias, "none", [], "")
        return y.view(*shape[:-1], self.out_features)


def _has_onednn_products() -> bool:
    """Whether this torch has oneDNN's packed fp32 products (x86 builds do; some others lack them)."""
    return torch.backends.mkldnn.is_available() and _packed_products_run()


@functools.cache
def _packed_products_run() -> bool:
    """Whether a packed product runs here: tried once per process."""
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(torch.ones(2, 2))
        torch.ops.mkldnn._linear_pointwise(torch.ones(1, 2), packed, None, "none", [], "")
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
    return True


def with_onednn_products(model: Transformer) -> Transformer:
    """``model`` (on the CPU, changed in place and returned) with each linear layer, the tied
    pre-softmax projection too, computing through oneDNN (:class:`OneDNNLinear`)."""
    if next(model.parameters()).device.type != "cpu" or not _has_onednn_products():
        raise ConfigError("onednn decoding runs on the CPU, with a torch built with oneDNN (mkldnn); "
                          "use device=cpu, or leave onednn=false")
    _untie_output_projection(model)
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, OneDNNLinear(child))
    return model


def quantize_int8(model: Transformer) -> Transformer:
    """``model`` (on the CPU, changed in place and returned) with int8 dynamic quantisation of its
    linear layers and of the pre-softmax projection."""
    if next(model.parameters()).device.type != "cpu":
        raise ConfigError("int8 decoding runs on the CPU (torch's dynamic quantisation has CPU kernels only); "
                         "use device=cpu, or precision=bf16 on a GPU")
    _untie_output_projection(model)  # so that the tied projection is quantised too
    with warnings.catch_warnings():  # torch.ao's notice that the API is moving to torchao
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
