"""aiayn.decoding.onnx_step (``onnxruntime=true``): the incremental decoder step exported to ONNX and run by
ONNX Runtime, against the model's own torch step; real exporter, real runtime."""

from __future__ import annotations

import builtins
import copy

import pytest
import torch

from aiayn.decoding.onnx_step import OnnxRuntimeDecode, _Step
from aiayn.decoding.speed import for_decoding
from aiayn.model import Transformer, beam_search, greedy_search
from aiayn.model.search import start_search

BOS, EOS, PAD = 1, 2, 0


@pytest.fixture(scope="module")
def model(single_thread) -> Transformer:
    torch.manual_seed(0)
    return Transformer(40, 40, n_layers=2, d_model=32, d_ff=64, n_heads=4, d_k=8, d_v=8, dropout=0.0).eval()


def sources() -> torch.Tensor:
    torch.manual_seed(1)
    src = torch.randint(3, 40, (6, 9))
    src[3:, 6:] = PAD  # three shorter sentences: a source mask that masks
    return src


def relative_error(fast: torch.Tensor, plain: torch.Tensor) -> float:
    return float((fast - plain).norm() / plain.norm())


@pytest.mark.slow
def test_each_step_gives_the_torch_step_logits_and_cache_with_beams_reordered(model: Transformer) -> None:
    fast = for_decoding(model, onnxruntime=True)
    assert isinstance(fast.decode, OnnxRuntimeDecode) and model.decode.__func__ is Transformer.decode
    with torch.inference_mode():  # as the searches run
        steps_agree(model, fast)


def steps_agree(model: Transformer, fast: Transformer) -> None:
    src = sources()
    rows = torch.arange(6).repeat_interleave(2)  # two hypotheses a sentence
    plain_state, _ = start_search(model, src, rows)
    fast_state, _ = start_search(fast, src, rows)
    tokens = torch.full((12, 1), BOS)
    generator = torch.Generator().manual_seed(2)
    for step in range(5):  # the first step is torch's (an empty cache); the others ONNX Runtime's, from a cache of 1
        plain_logits, plain_state, _ = model.decode(tokens, plain_state)
        fast_logits, fast_state, _ = fast.decode(tokens, fast_state)
        assert fast_logits.shape == plain_logits.shape == (12, 1, 40)
        assert relative_error(fast_logits, plain_logits) < 1e-5
        for (plain_k, plain_v), (fast_k, fast_v) in zip(plain_state.self_kv, fast_state.self_kv):
            assert fast_k.shape == plain_k.shape == (12, 4, step + 1, 8)
            assert relative_error(fast_k, plain_k) < 1e-5 and relative_error(fast_v, plain_v) < 1e-5
        # beam search's reordering: each hypothesis continues one of its sentence's two
        reorder = (rows * 2 + torch.randint(0, 2, (12,), generator=generator))
        plain_state, fast_state = plain_state.reorder_beams(reorder), fast_state.reorder_beams(reorder)
        tokens = plain_logits[:, -1].argmax(-1, keepdim=True)
    assert fast.decode._session is not None  # the steps after the first went through ONNX Runtime


@pytest.mark.slow
def test_searches_find_the_plain_outputs_one_row_or_many(model: Transformer) -> None:
    fast = for_decoding(model, onnxruntime=True)
    src = sources()
    settings = {"bos_id": BOS, "eos_id": EOS, "max_len_offset": 6}
    assert beam_search(fast, src, beam_size=3, alpha=0.6, **settings) == beam_search(model, src, beam_size=3, alpha=0.6,
                                                                                    **settings)
    one = src[:1]  # one row a step: greedy search on one sentence
    assert greedy_search(fast, one, **settings) == greedy_search(model, one, **settings)
    copied = copy.deepcopy(fast)  # a copy exports its own step again
    assert copied.decode.model is copied and copied.decode._session is None
    assert greedy_search(copied, src, **settings) == greedy_search(model, src, **settings)


def test_without_its_packages_it_is_refused_in_one_line(model: Transformer, monkeypatch) -> None:
    real_import = builtins.__import__

    def no_onnxruntime(name, *args, **kwargs):
        if name == "onnxruntime":
            raise ImportError("No module named 'onnxruntime'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_onnxruntime)
    with pytest.raises(ValueError, match=r"onnxruntime=true needs ONNX Runtime .*pip install 'aiayn\[onnx\]'"):
        for_decoding(model, onnxruntime=True)


@pytest.mark.parametrize("other, named", [({"onednn": True}, "onednn=true"), ({"int8": True}, "int8=true"),
                                          ({"compile": True}, "compile=true"), ({"precision": "bf16"}, "precision=bf16")])
def test_it_goes_with_no_other_switch(model: Transformer, other: dict, named: str) -> None:
    with pytest.raises(ValueError, match=f"onnxruntime runs the fp32 decoder step itself; it cannot be combined with {named}"):
        for_decoding(model, onnxruntime=True, **other)


class Biased(Transformer):
    """A subclass with a decoder step of its own: its logits moved by one."""

    def decode(self, tgt_in, state, return_weights=False):
        logits, state, weights = super().decode(tgt_in, state, return_weights)
        return logits + 1.0, state, weights


def test_a_subclass_keeps_its_own_decoder_step_in_torch_and_in_the_exported_step() -> None:
    torch.manual_seed(0)
    biased = Biased(40, 40, n_layers=1, d_model=16, d_ff=32, n_heads=2, dropout=0.0).eval()
    fast = for_decoding(biased, onnxruntime=True)
    src = sources()
    rows = torch.arange(6)
    tokens = torch.full((6, 1), BOS)
    with torch.inference_mode():
        state, _ = start_search(biased, src, rows)
        plain_logits, plain_state, _ = Transformer.decode(biased, tokens, state)
        # the first step (an empty cache) is torch's: the subclass's, not Transformer's
        first, _, _ = fast.decode(tokens, state)
        assert torch.allclose(first, plain_logits + 1.0) and fast.decode._session is None
        # what is exported for the later steps runs the subclass's step too (checked eagerly, no export)
        kv = [t for memory, cache in zip(plain_state.memory_kv, plain_state.self_kv) for t in (*memory, *cache)]
        exported_logits = _Step(fast)(tokens, plain_state.src_mask, *kv)[0]
        second, _, _ = Transformer.decode(biased, tokens, plain_state)
    assert torch.allclose(exported_logits, second + 1.0)
