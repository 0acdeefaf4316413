"""aiayn.decoding.speed: each switch (int8, bf16, compile, onednn, onnxruntime) against the plain fp32 path, on random
models and on the session's tiny trained run (real checkpoint, real sentencepiece)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

from aiayn.checkpoints.trained import TrainedModel, load_trained
from aiayn.decoding.speed import OneDNNLinear, for_decoding
from aiayn.decoding.translator import translate
from aiayn.model import Transformer, beam_search, greedy_search
from tests.helpers.runs import TrainedRun

BOS, EOS, PAD = 1, 2, 0
SENTENCES = ["A dog runs on the beach.", "Two men play football in a park.", "A woman sings.",
             "A little girl in a pink dress climbs the stairs of a wooden house.", "People walk down the street."]


@pytest.fixture(scope="module")
def model(single_thread) -> Transformer:
    torch.manual_seed(0)
    return Transformer(40, 40, n_layers=2, d_model=32, d_ff=64, n_heads=4, d_k=8, d_v=8, dropout=0.0).eval()


@pytest.fixture(scope="module")
def trained(tiny_run: TrainedRun, single_thread) -> TrainedModel:
    return load_trained(tiny_run.last)


def sources() -> torch.Tensor:
    torch.manual_seed(1)
    src = torch.randint(3, 40, (6, 9))
    src[3:, 6:] = PAD  # three shorter sentences
    return src


def relative_error(fast: torch.Tensor, plain: torch.Tensor) -> float:
    return float((fast.float() - plain).norm() / plain.norm())


def test_no_switch_gives_the_model_itself(model: Transformer) -> None:
    assert for_decoding(model) is model


def test_int8_quantises_every_product_keeps_logits_close_and_leaves_the_model_given_alone(model: Transformer) -> None:
    src, tgt_in = sources(), sources()[:, :5]
    int8 = for_decoding(model, int8=True)

    assert not any(type(m) is nn.Linear for m in int8.modules())  # every projection, the tied one too
    assert type(model.decoder_layers[0].self_attention.w_q) is nn.Linear and model.output_projection is None
    with torch.no_grad():
        plain, fast = model(src, tgt_in), int8(src, tgt_in)
    assert 0 < relative_error(fast, plain) < 0.05  # quantised (not the same numbers), but close


def test_onednn_computes_every_product_to_fp32_rounding_and_leaves_the_model_given_alone(model: Transformer) -> None:
    src, tgt_in = sources(), sources()[:, :5]
    fast = for_decoding(model, onednn=True)

    products = [m for m in fast.modules() if isinstance(m, OneDNNLinear)]
    assert not any(type(m) is nn.Linear for m in fast.modules())
    assert len(products) == 2 * (4 + 2) + 2 * (4 + 4 + 2) + 1  # encoder and decoder layers, the projection
    assert fast.output_projection.weight is fast.tgt_embedding.weight  # the projection stays tied (§3.4)
    assert type(model.decoder_layers[0].self_attention.w_q) is nn.Linear and model.output_projection is None
    with torch.no_grad():
        plain, packed = model(src, tgt_in), fast(src, tgt_in)
        # Every product went through oneDNN: packed on its own, or stacked with those reading the same
        # input (W^Q, W^K, W^V of self-attention; W^K, W^V of encoder-decoder attention).
        stacked = {layer for m in products for which, (_, stack) in m._stacks.items() if stack._packed for layer in which}
        assert {id(m) for m in products if m._packed is not None} | stacked == {id(m) for m in products}
        assert len(stacked) == 2 * 3 + 2 * (3 + 2)
        assert relative_error(packed, plain) < 1e-6  # fp32 both: only the kernels' rounding differs
        assert torch.equal(copy.deepcopy(fast)(src, tgt_in), packed)  # a copy packs its own weights again
    with torch.enable_grad():
        fast(src, tgt_in).sum().backward()  # with gradients, nn.Linear's own product: they reach the weights
    assert fast.output_projection.weight.grad is not None and model.tgt_embedding.weight.grad is None
    assert all(fast.decoder_layers[0].self_attention.get_submodule(name).weight.grad is not None
               for name in ("w_q", "w_k", "w_v"))  # through the stack, to each projection


def test_switches_made_ready_inside_inference_mode_decode_there(model: Transformer) -> None:
    src = sources()
    with torch.inference_mode():  # as a script that loads and decodes under one inference_mode might
        fast = for_decoding(model, onednn=True)
        assert not next(fast.parameters()).is_inference()  # versions to check the packed copies against
        assert greedy_search(fast, src, bos_id=BOS, eos_id=EOS, max_len_offset=4) == greedy_search(
            model, src, bos_id=BOS, eos_id=EOS, max_len_offset=4)


def test_onednn_products_follow_weights_changed_in_place(model: Transformer) -> None:
    src, tgt_in = sources(), sources()[:, :5]
    fast = for_decoding(model, onednn=True)
    changed = Transformer(40, 40, n_layers=2, d_model=32, d_ff=64, n_heads=4, d_k=8, d_v=8, dropout=0.0).eval()
    with torch.no_grad():
        before = fast(src, tgt_in)
        fast.load_state_dict(changed.state_dict(), strict=False)  # in place: same storage, new versions
        after, expected = fast(src, tgt_in), changed(src, tgt_in)
    assert relative_error(after, expected) < 1e-6 and relative_error(before, expected) > 0.1


@pytest.mark.slow
@pytest.mark.parametrize("switches", [{"int8": True}, {"precision": "bf16"}, {"onednn": True}, {"onnxruntime": True}],
                         ids=["int8", "bf16", "onednn", "onnxruntime"])
def test_a_switch_translates_nearly_as_the_plain_model(trained: TrainedModel, switches: dict) -> None:
    # The 4-step model's distributions are flat, so rounding may flip a near tie; most must agree.
    settings = {"beam_size": 2, "alpha": 20.0, "max_len_offset": 5}
    plain = translate(trained.model, trained.vocab, SENTENCES, settings).texts
    fast = translate(for_decoding(trained.model, **switches), trained.vocab, SENTENCES, settings).texts
    assert all(plain) and sum(a == b for a, b in zip(plain, fast)) >= len(SENTENCES) - 1


def test_bf16_keeps_the_search_scores_in_fp32(model: Transformer) -> None:
    bf16 = for_decoding(model, precision="bf16")
    assert next(bf16.parameters()).dtype == torch.bfloat16 and next(model.parameters()).dtype == torch.float32
    hypotheses = beam_search(bf16, sources(), bos_id=BOS, eos_id=EOS, beam_size=4, alpha=0.6, max_len_offset=4)
    assert len(hypotheses) == 6 and all(len(h) <= 9 + 4 for h in hypotheses)


def test_stacked_projections_follow_weights_changed_in_place(model: Transformer) -> None:
    """Decoding keeps W^Q, W^K, W^V stacked between steps; a weight changed in place (an optimizer
    step, a load of averaged weights) must be seen at once."""
    src = sources()
    before = greedy_search(model, src, bos_id=BOS, eos_id=EOS, max_len_offset=4)
    changed = Transformer(40, 40, n_layers=2, d_model=32, d_ff=64, n_heads=4, d_k=8, d_v=8, dropout=0.0).eval()
    expected = greedy_search(changed, src, bos_id=BOS, eos_id=EOS, max_len_offset=4)
    original = {name: value.clone() for name, value in model.state_dict().items()}
    try:
        model.load_state_dict(changed.state_dict())  # copies in place: same storage, new versions
        assert greedy_search(model, src, bos_id=BOS, eos_id=EOS, max_len_offset=4) == expected != before
    finally:
        model.load_state_dict(original)
    assert greedy_search(model, src, bos_id=BOS, eos_id=EOS, max_len_offset=4) == before


def test_switches_that_cannot_go_together_are_refused(model: Transformer) -> None:
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16, fp16"):
        for_decoding(model, precision="int4")
    with pytest.raises(ValueError, match="cannot be combined with precision=bf16"):
        for_decoding(model, precision="bf16", int8=True)
    with pytest.raises(ValueError, match="onednn runs the fp32 products; it cannot be combined with int8=true"):
        for_decoding(model, onednn=True, int8=True)
    with pytest.raises(ValueError, match="onednn runs the fp32 products; it cannot be combined with compile=true"):
        for_decoding(model, onednn=True, compile=True)  # (inductor failed on the packed weights, at the first step)


def test_onednn_without_onednn_kernels_is_refused_in_one_line(model: Transformer, monkeypatch) -> None:
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)  # as a torch built without it
    with pytest.raises(ValueError, match="onednn decoding runs on the CPU, with a torch built with oneDNN"):
        for_decoding(model, onednn=True)


@pytest.mark.slow
def test_a_compiled_decoder_step_is_traced_whole_and_gives_the_eager_outputs(model: Transformer) -> None:
    src = sources()
    compiled = for_decoding(model, compile=True)
    counters.clear()
    for search, settings in ((greedy_search, {}), (beam_search, {"beam_size": 4, "alpha": 0.6})):
        assert search(compiled, src, bos_id=BOS, eos_id=EOS, max_len_offset=4, **settings) == search(
            model, src, bos_id=BOS, eos_id=EOS, max_len_offset=4, **settings)
    # A graph break inside the step's loop over layers sends the whole step back to eager (with
    # compiled pieces between): compile=true would then cost its warm-up and gain nothing.
    # The step compiled once, then once more as the cache's rows stop being the batch's (a sentence
    # finished; the beam's rows): before, five graphs, the first two steps' and beam search's each
    # one of its own (about 20 s of compiling each for the base model on one CPU core).
    assert 0 < counters["stats"]["unique_graphs"] <= 2
    assert not counters["graph_break"], list(counters["graph_break"])
    assert not [name for name, _ in model.named_buffers() if "stacked" in name]  # the model given is not changed
    # int8's projections are not nn.Linear: nothing to stack (before: a TypeError as the copy was made)
    quantised = for_decoding(model, int8=True, compile=True)
    assert not [name for name, _ in quantised.named_buffers() if "stacked" in name]
