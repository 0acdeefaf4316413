"""Training's speed switches on CUDA give the plain fp32 path's results: bf16 autocast (what
trainer.precision=bf16-mixed runs), torch.compile of the Transformer (compile=true) and torch's
fused Adam (optim.fused=true), each through TranslationModule as training uses it."""

from __future__ import annotations

import copy

import pytest
import torch
from torch._dynamo.utils import counters

from aiayn.training.module import TranslationModule
from tests.helpers.batches import cosine, flat, padded_batch, relative_error

pytestmark = pytest.mark.gpu

VOCAB = 64
TINY = {"n_layers": 2, "d_model": 32, "d_ff": 64, "n_heads": 2, "d_k": 16, "d_v": 16, "dropout": 0.0,
        "max_positions": 64}
OPTIM = {"betas": [0.9, 0.98], "eps": 1e-9, "warmup_steps": 4, "lr_factor": 1.0}


def _module(device: torch.device, seed: int, fused: bool = False, **model) -> TranslationModule:
    """A tiny module (label smoothing 0.1, no dropout: every run of a batch is the same), its
    weights drawn on the CPU from ``seed`` and moved to ``device``."""
    torch.manual_seed(seed)
    return TranslationModule(model={**TINY, **model}, vocab_size=VOCAB, optim={**OPTIM, "fused": fused},
                             decoding={}).to(device)


def _gradients(module: TranslationModule) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().clone() for name, p in module.named_parameters()}


# -- bf16 autocast vs fp32 --------------------------------------------------------------------------
def test_bf16_autocast_training_step_is_within_bf16_tolerance_of_fp32(cuda):
    """The same weights and batch give, under torch.autocast("cuda", bfloat16), the fp32 loss and
    gradients up to bf16 rounding; the parameters, their gradients and the loss stay fp32."""
    module = _module(cuda, seed=1)
    batch = padded_batch(VOCAB, (9, 5, 1, 7), (6, 8, 2, 3), seed=101, device=cuda)
    fp32, n_tokens = module.training_loss(batch)
    fp32.backward()
    fp32_grads = _gradients(module)
    module.zero_grad(set_to_none=True)

    with torch.autocast("cuda", dtype=torch.bfloat16):
        bf16, n_bf16 = module.training_loss(batch)
        with torch.no_grad():
            logits = module.model(batch["src"], batch["tgt_in"])
    bf16.backward()
    bf16_grads = _gradients(module)

    assert logits.dtype == torch.bfloat16  # autocast really ran the products in bf16
    assert bf16.dtype == torch.float32  # label_smoothed_loss takes the log-softmax in fp32
    assert all(p.dtype == torch.float32 for p in module.parameters())
    assert all(g.dtype == torch.float32 for g in bf16_grads.values())
    assert n_bf16 == n_tokens == 6 + 8 + 2 + 3 + 4  # target tokens + EOS, padding not counted
    # Tolerances from the CPU under bf16 autocast (bf16 keeps 8 bits of mantissa, 2^-8 ≈ 0.004 per
    # operation), over five seeds of weights and batch: the loss within 4.3e-4 of fp32 (relative),
    # the whole gradient within 0.088 (cosine ≥ 0.996), any one parameter's within 0.17. About 2-10×
    # that is allowed here; a gradient lost or wrong (relative error ~1 or more) is far outside.
    torch.testing.assert_close(bf16, fp32, rtol=5e-3, atol=0)
    assert bf16 != fp32  # bf16 rounding did happen
    whole_bf16, whole_fp32 = flat(bf16_grads.values()), flat(fp32_grads.values())
    assert cosine(whole_bf16, whole_fp32) > 0.99
    assert relative_error(whole_bf16, whole_fp32) < 0.15
    errors = {name: relative_error(bf16_grads[name], fp32_grads[name]) for name in fp32_grads}
    assert max(errors.values()) < 0.4, errors


# -- torch.compile vs eager -------------------------------------------------------------------------
# Two batches of other shapes (source and target lengths): the second recompiles, with the lengths
# dynamic from then on.
BATCHES = (((9, 5, 1, 7), (6, 8, 2, 3)), ((3, 12), (10, 2)))
COMPILE_OPTIONS: dict = {}  # as compile=true runs it: TranslationModule.compile_transformer() with torch's defaults


def test_compiled_transformer_gives_the_eager_loss_and_gradients(cuda):
    """TranslationModule.compile_transformer (inductor's CUDA kernels) gives the eager loss and
    gradients, batch by batch, for two batches of different shapes; parameter names (checkpoints)
    stay as they are."""
    torch._dynamo.reset()
    counters.clear()
    eager = _module(cuda, seed=5, n_layers=1)  # one layer: the compilation is most of this test's time
    compiled = copy.deepcopy(eager)
    compiled.compile_transformer(**COMPILE_OPTIONS)
    assert compiled.model._compiled_call_impl is not None
    assert compiled.state_dict().keys() == eager.state_dict().keys()
    for seed, lengths in enumerate(BATCHES):
        batch = padded_batch(VOCAB, *lengths, seed=200 + seed, device=cuda)
        results = []
        for module in (eager, compiled):
            module.zero_grad(set_to_none=True)
            loss, n_tokens = module.training_loss(batch)
            loss.backward()
            results.append((loss.detach(), n_tokens, _gradients(module)))
        (eager_loss, eager_tokens, eager_grads), (compiled_loss, compiled_tokens, compiled_grads) = results
        assert compiled_tokens == eager_tokens == sum(lengths[1]) + len(lengths[1])
        # Inductor fuses the softmaxes, norms and the loss into its own kernels, which sum in
        # another order than eager's: fp32 rounding, ~1e-7 relative (TF32 is off, see the fixture).
        torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-5, atol=0)
        assert compiled_grads.keys() == eager_grads.keys()
        errors = {name: relative_error(compiled_grads[name], eager_grads[name]) for name in eager_grads}
        assert max(errors.values()) < 1e-4, errors
    # TorchDynamo really captured the forward (at least one graph; a second for the new shapes), whole:
    # a graph break sends the layers' loop back to eager (SDPA's is_causal once lengths were dynamic did).
    assert counters["stats"]["unique_graphs"] >= 1
    assert not counters["graph_break"], list(counters["graph_break"])


# -- fused vs plain Adam ----------------------------------------------------------------------------
def test_fused_adam_makes_the_plain_adam_updates(cuda):
    """A few steps of TranslationModule's optimizer and schedule from the same weights and batches
    give the same parameters with optim.fused=true (one fused CUDA kernel) as with plain Adam."""
    parameters, start = {}, None
    for fused in (False, True):
        module = _module(cuda, seed=7, fused=fused)
        if start is None:
            start = {name: p.detach().clone() for name, p in module.named_parameters()}
        optimizers = module.configure_optimizers()
        optimizer, scheduler = optimizers["optimizer"], optimizers["lr_scheduler"]["scheduler"]
        assert bool(optimizer.defaults["fused"]) is fused
        for step in range(3):
            loss, _ = module.training_loss(padded_batch(VOCAB, (9, 5, 1, 7), (6, 8, 2, 3), seed=300 + step,
                                                        device=cuda))
            loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
        assert all(state["exp_avg"].device.type == "cuda" for state in optimizer.state.values())
        parameters[fused] = {name: p.detach() for name, p in module.named_parameters()}
    # fp32, as training runs: the two kernels round differently, and Adam's division by √v turns a
    # rounding-sized difference in a near-zero gradient into a larger one in its update. On the CPU
    # fused and plain Adam end 2.9e-6 to 1.8e-5 apart over five seeds, after moves of ~0.12; 2e-4
    # (under 0.2% of a move) is allowed here.
    for name, plain in parameters[False].items():
        torch.testing.assert_close(parameters[True][name], plain, rtol=0, atol=2e-4, msg=name)
    moves = {name: float((plain - start[name]).abs().max()) for name, plain in parameters[False].items()}
    assert min(moves.values()) > 1e-2, moves  # every parameter tensor was updated
