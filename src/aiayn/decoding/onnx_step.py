"""``onnxruntime=true``: a decoding step through ONNX Runtime (CPU).

Incremental decoding (§6.1 with tensor2tensor's key/value cache, aiayn.model.search) runs the
decoder on one new token per hypothesis at every step: a few rows through every weight of the
decoder and the 8,000-to-37,000-wide pre-softmax projection, and some 130 small torch operator
calls around them, each paying its own dispatch. Here that step, the model's own
``Transformer.decode`` code, is exported once to ONNX (``torch.onnx.export`` through
``torch.export``, with the rows, the source length and the cache length left free) and run by
ONNX Runtime's CPU executor, which plans the graph once and runs it without a framework call per
operator. The encoder, the first step (an empty cache) and everything a search does between steps
stay torch's, so the searches and their settings are unchanged.

Still fp32, by other kernels (MLAS): the logits differ from torch's in their last bits, so a near
tie may go the other way. The step's graph holds the weights as they are when it is exported (at
the first step); ``for_decoding`` gives it a copy of the model of its own. Measured in
docs/performance.md.
"""

from __future__ import annotations

import copy
import logging
import warnings
from typing import Any

import torch
from torch import Tensor, nn

from aiayn.model.transformer import DecoderState, Transformer

log = logging.getLogger(__name__)

class _Step(nn.Module):
    """One incremental decoder step as a module of tensors only (what the exporter takes): the new
    token (rows, 1), the source mask (rows, 1, 1, src_len) and, per layer, the encoder-decoder keys
    and values (rows, h, src_len, d) and the self-attention cache (rows, h, length, d) →
    the logits (rows, 1, vocab) and, per layer, the cache extended by the new position."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def forward(self, token: Tensor, src_mask: Tensor, *keys_values: Tensor) -> tuple[Tensor, ...]:
        layers = len(keys_values) // 4
        memory = [(keys_values[4 * i], keys_values[4 * i + 1]) for i in range(layers)]
        cache = [(keys_values[4 * i + 2], keys_values[4 * i + 3]) for i in range(layers)]
        state = DecoderState(src_mask, memory, cache, cache[0][0].size(2))
        # Its class's own code (a subclass's override, as CompiledDecode), not the patched attribute.
        logits, state, _ = type(self.model).decode(self.model, token, state)
        return (logits, *[t for kv in state.self_kv for t in kv])


class OnnxRuntimeDecode:
    """``model.decode`` with its incremental steps through ONNX Runtime (see the module
    docstring); any other call (a whole target, the first step, attention weights asked for, a
    model of no layers, a tensor not on the CPU or not fp32) goes to the model's own ``decode``."""

    def __init__(self, model: Transformer):
        self.model = model  # (its packages checked by aiayn.decoding.switches.switches_of)
        self._session: Any = None  # and self._names, its inputs' names: made at the first step (_start)

    def __deepcopy__(self, memo: dict) -> OnnxRuntimeDecode:
        return OnnxRuntimeDecode(copy.deepcopy(self.model, memo))  # a session is not copied: exported again on use

    def __call__(self, tgt_in: Tensor, state: DecoderState, return_weights: bool = False):
        if (return_weights or tgt_in.size(1) != 1 or state.length == 0 or not state.self_kv or state.self_kv[0] is None
                or tgt_in.device.type != "cpu" or state.memory_kv[0][0].dtype != torch.float32):
            return type(self.model).decode(self.model, tgt_in, state, return_weights)
        rows = state.cache_rows
        inputs = [tgt_in, state.src_mask]
        for (memory_k, memory_v), (cache_k, cache_v) in zip(state.memory_kv, state.self_kv):
            if rows is not None:  # beam search's reordering, taken before the step (as extend_cache does)
                cache_k, cache_v = cache_k.index_select(0, rows), cache_v.index_select(0, rows)
            inputs += [memory_k, memory_v, cache_k, cache_v]
        session = self._session or self._start(inputs)
        feeds = {name: tensor.contiguous().numpy() for name, tensor in zip(self._names, inputs)}
        logits, *caches = (torch.from_numpy(array) for array in session.run(None, feeds))
        self_kv = [(caches[2 * i], caches[2 * i + 1]) for i in range(len(caches) // 2)]
        return logits, DecoderState(state.src_mask, state.memory_kv, self_kv, state.length + 1), []

    def _start(self, inputs: list[Tensor]):
        """Export the step (at sizes of 2 or more, so that no size is taken as fixed) and open a
        session on it, with as many threads as torch uses."""
        import onnxruntime

        dims = {name: torch.export.Dim(name) for name in ("rows", "src_len", "length")}
        examples, shapes = [], []
        for i, tensor in enumerate(inputs):
            sizes = list(tensor.shape)
            free = ({0: "rows"} if i == 0 else {0: "rows", 3: "src_len"} if i == 1
                    else {0: "rows", 2: "src_len" if (i - 2) % 4 < 2 else "length"})
            for axis, name in free.items():
                sizes[axis] = {"rows": 2, "src_len": 3, "length": 2}[name]
            examples.append(torch.zeros(sizes, dtype=tensor.dtype) if tensor.dtype != torch.bool
                            else torch.ones(sizes, dtype=torch.bool))
            shapes.append({axis: dims[name] for axis, name in free.items()})
        log.info("exporting the decoder step to ONNX for ONNX Runtime (once per model)")
        exporter_log = logging.getLogger("torch.onnx")  # its notes on packages it need not have (torchvision)
        level = exporter_log.level
        exporter_log.setLevel(logging.ERROR)
        try:
            with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
                warnings.simplefilter("ignore")
                program = torch.onnx.export(_Step(self.model), tuple(examples), dynamo=True, optimize=True, verbose=False,
                                            dynamic_shapes=(shapes[0], shapes[1], tuple(shapes[2:])))
        finally:
            exporter_log.setLevel(level)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = torch.get_num_threads()
        self._session = onnxruntime.InferenceSession(program.model_proto.SerializeToString(), options,
                                                     providers=["CPUExecutionProvider"])
        self._names = [node.name for node in self._session.get_inputs()]
        return self._session
