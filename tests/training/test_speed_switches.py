"""Speed switches give the plain path's results: fused vs explicit attention (model.attention),
bf16 autocast vs fp32, torch.compile vs eager (compile), fused vs plain Adam (optim.fused)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch._dynamo.utils import counters

from aiayn.model import Transformer
from aiayn.training.module import TranslationModule

pytestmark = pytest.mark.usefixtures("single_thread")

REPO = Path(__file__).resolve().parents[2]
PAD, BOS, EOS, VOCAB = 0, 2, 3, 50
TINY = {"n_layers": 2, "d_model": 16, "d_ff": 32, "n_heads": 2, "d_k": 8, "d_v": 6, "dropout": 0.0, "max_positions": 64}


def _transformer(attention: str, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(VOCAB, VOCAB, pad_id=PAD, attention=attention, **TINY).double()


def _batch(seed: int = 1, src_lengths=(7, 4, 1), tgt_lengths=(5, 6, 2)) -> dict[str, torch.Tensor]:
    """A padded batch as TranslationCollator makes it: source + EOS, BOS + target, target + EOS."""
    generator = torch.Generator().manual_seed(seed)
    size, src_len, tgt_len = len(src_lengths), max(src_lengths) + 1, max(tgt_lengths) + 1
    src = torch.full((size, src_len), PAD)
    tgt_in, tgt_out = torch.full((size, tgt_len), PAD), torch.full((size, tgt_len), PAD)
    for row, (s, t) in enumerate(zip(src_lengths, tgt_lengths)):
        src[row, :s] = torch.randint(4, VOCAB, (s,), generator=generator)
        src[row, s] = EOS
        target = torch.randint(4, VOCAB, (t,), generator=generator)
        tgt_in[row, 0], tgt_in[row, 1 : t + 1] = BOS, target
        tgt_out[row, :t], tgt_out[row, t] = target, EOS
    return {"src": src, "tgt_in": tgt_in, "tgt_out": tgt_out}


# -- model.attention: sdpa vs explicit ----------------------------------------------------------
def test_sdpa_and_explicit_attention_give_equal_outputs_and_gradients():
    sdpa, explicit = _transformer("sdpa"), _transformer("explicit")
    explicit.load_state_dict(sdpa.state_dict())  # same parameter names: checkpoints are interchangeable
    batch = _batch()
    assert (batch["src"] == PAD).any() and (batch["tgt_in"] == PAD).any()  # padding and causal masks both matter
    outputs = []
    for model in (sdpa, explicit):
        logits = model(batch["src"], batch["tgt_in"])
        logits.sum().backward()
        outputs.append((logits, {name: p.grad for name, p in model.named_parameters()}))
    (logits_a, grads_a), (logits_b, grads_b) = outputs
    torch.testing.assert_close(logits_a, logits_b, rtol=0, atol=1e-10)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=0, atol=1e-10, msg=name)
    assert any(grad.abs().sum() > 0 for grad in grads_a.values())


def test_sdpa_and_explicit_attention_agree_when_decoding_incrementally():
    sdpa, explicit = _transformer("sdpa", seed=2).eval(), _transformer("explicit").eval()
    explicit.load_state_dict(sdpa.state_dict())
    batch = _batch(seed=3)
    steps = []
    for model in (sdpa, explicit):
        memory, src_mask, _ = model.encode(batch["src"])
        state = model.start_decoding(memory, src_mask)
        logits = []
        # One token, then a chunk of two on top of the cache (causal with q_len < k_len), then one.
        for start, end in ((0, 1), (1, 3), (3, 4)):
            step_logits, state, _ = model.decode(batch["tgt_in"][:, start:end], state)
            logits.append(step_logits)
        steps.append(torch.cat(logits, dim=1))
    torch.testing.assert_close(steps[0], steps[1], rtol=0, atol=1e-10)
    teacher_forced = explicit(batch["src"], batch["tgt_in"][:, :4])
    torch.testing.assert_close(steps[1], teacher_forced, rtol=0, atol=1e-10)


def test_attention_setting_is_checked_and_in_the_model_configs():
    with pytest.raises(ValueError, match="attention must be one of sdpa, explicit"):
        Transformer(VOCAB, VOCAB, attention="flash", **TINY)
    for name in ("base", "big", "small", "parsing"):
        config = OmegaConf.load(REPO / "conf" / "model" / f"{name}.yaml")
        base = OmegaConf.load(REPO / "conf" / "model" / "base.yaml")
        assert OmegaConf.merge(base, config).attention == "sdpa"


# -- the training module: bf16 autocast, torch.compile, fused Adam --------------------------------
MODEL_CONFIG = dict(TINY)  # the network's arguments; label smoothing at the module's default, 0.1


def _module(fused: bool = False, seed: int = 0) -> TranslationModule:
    torch.manual_seed(seed)
    optim = {"betas": [0.9, 0.98], "eps": 1e-9, "warmup_steps": 4, "lr_factor": 1.0, "fused": fused}
    return TranslationModule(model=dict(MODEL_CONFIG), vocab_size=VOCAB, optim=optim, decoding={})


def test_bf16_autocast_loss_is_within_bf16_tolerance_of_fp32():
    module = _module()
    batch = _batch(seed=4)
    fp32, n_tokens = module.training_loss(batch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16, n_bf16 = module.training_loss(batch)
        logits = module.model(batch["src"], batch["tgt_in"])
    assert logits.dtype == torch.bfloat16  # autocast really ran the products in bf16
    assert bf16.dtype == torch.float32  # the loss itself is computed in fp32 (label_smoothed_loss)
    assert n_bf16 == n_tokens == 5 + 6 + 2 + 3
    # bf16 keeps 8 bits of mantissa (relative rounding 2^-8 ≈ 0.004 per operation).
    torch.testing.assert_close(bf16, fp32, rtol=2e-2, atol=0)
    assert bf16 != fp32


SHAPES = ((6, ((7, 4, 1), (5, 6, 2))), (7, ((3, 9), (8, 2))))  # (seed, lengths) of two batches


def _compiled_equals_eager(eager: TranslationModule, rtol: float, batches=SHAPES, **options) -> None:
    compiled = copy.deepcopy(eager)
    compiled.compile_transformer(**options)
    counters.clear()
    assert compiled.state_dict().keys() == eager.state_dict().keys()  # checkpoints unchanged
    losses, grads = [], []
    for module in (eager, compiled):
        # Batches of other shapes: the second recompiles (or runs the dynamic-shape graph).
        for seed, lengths in batches:
            loss, _ = module.training_loss(_batch(seed, *lengths))
            loss.backward()
            losses.append(loss.detach())
        grads.append({name: p.grad for name, p in module.named_parameters()})
    torch.testing.assert_close(losses[len(batches):], losses[:len(batches)], rtol=rtol, atol=0)
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=rtol, atol=rtol * 1e-2, msg=name)
    with torch.inference_mode():  # as validation computes its loss, batch after batch
        validated = [[module.summed_loss(_batch(seed, *lengths))[0] for seed, lengths in batches * 2]
                     for module in (eager, compiled)]
    torch.testing.assert_close(validated[1], validated[0], rtol=rtol, atol=0)
    # No graph break in a compiled forward, with gradients or without: one would send the layers'
    # loop back to eager.
    assert not counters["graph_break"], list(counters["graph_break"])


@pytest.mark.slow
def test_compiled_model_traced_without_codegen_gives_the_eager_loss_and_gradients():
    # aot_eager: TorchDynamo's graph capture and AOTAutograd's joint forward/backward graph, run by
    # eager kernels; the codegen of the default backend is the slow test below.
    _compiled_equals_eager(_module(seed=5).double(), rtol=1e-10, batches=SHAPES[:1], backend="aot_eager")


@pytest.mark.slow
def test_compiled_model_gives_the_eager_loss_and_gradients():
    # The default backend (inductor) generates and compiles C++ kernels: minutes on a small CPU.
    torch.manual_seed(5)
    eager = TranslationModule(model={**MODEL_CONFIG, "n_layers": 1}, vocab_size=VOCAB, decoding={},
                              optim={"betas": [0.9, 0.98], "eps": 1e-9, "warmup_steps": 4})
    _compiled_equals_eager(eager, rtol=1e-4)


def test_fused_adam_makes_the_plain_adam_updates():
    # In float64, where the two kernels' different rounding stays far below the tolerance (in
    # float32 Adam's division by √v of tiny gradients makes differences of ~1e-6).
    plain, fused = _module(fused=False, seed=7).double(), _module(fused=True, seed=7).double()
    parameters = {}
    for module in (plain, fused):
        optimizers = module.configure_optimizers()
        optimizer, scheduler = optimizers["optimizer"], optimizers["lr_scheduler"]["scheduler"]
        assert bool(optimizer.defaults["fused"]) == (module is fused)
        for step in range(3):
            loss, _ = module.training_loss(_batch(seed=10 + step))
            loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
        parameters[module is fused] = dict(module.named_parameters())
    start = dict(_module(seed=7).double().named_parameters())
    for name, value in parameters[False].items():
        torch.testing.assert_close(parameters[True][name], value, rtol=0, atol=1e-12, msg=name)
    assert any(not torch.equal(value, start[name]) for name, value in parameters[False].items())


def test_train_config_documents_its_switches_compile_off_and_fused_adam_on():
    """Fused Adam is on by default: the same update, and the one that skips a non-finite step on the
    device (aiayn.training.module); compile is off (slower than eager on CPUs, docs/performance.md)."""
    config = OmegaConf.load(REPO / "conf" / "train.yaml")
    assert config.compile is False and OmegaConf.load(REPO / "conf" / "optim" / "base.yaml").fused is True
    assert "compile: false" in (REPO / "conf" / "train.yaml").read_text()
    assert "fused: true  #" in (REPO / "conf" / "optim" / "base.yaml").read_text()  # every recipe starts from it
    for name in ("small", "big", "parsing"):
        assert "fused" not in OmegaConf.load(REPO / "conf" / "optim" / f"{name}.yaml")
