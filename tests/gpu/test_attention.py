"""model.attention on CUDA: SDPA's fused kernels (flash / memory-efficient attention) give the
numbers of Eq. 1 written out (``attention="explicit"``), with the padding masks and the causal
decoder mask, in fp32 and under bf16 autocast; and those fused kernels, not the math fallback,
are what serve our masks."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from aiayn.decoding.speed import for_decoding
from aiayn.model import Transformer, beam_search
from tests.helpers.batches import cosine, flat, padded_batch, relative_error

pytestmark = pytest.mark.gpu

PAD, BOS, EOS, VOCAB = 0, 2, 3, 64
# d_k = d_v = 16: a multiple of 8, as both fused kernels want of bf16 heads, and equal, as flash
# attention wants; two layers, so a second layer's inputs carry the first one's rounding.
TINY = {"n_layers": 2, "d_model": 32, "d_ff": 64, "n_heads": 2, "d_k": 16, "d_v": 16, "dropout": 0.0,
        "max_positions": 64}
# Padded sources (the last one a lone token + EOS) and padded targets: padding and causal masks both matter.
LENGTHS = ((9, 5, 1, 7), (6, 8, 2, 3))
FUSED = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]


def _pair(device: torch.device, seed: int = 0) -> tuple[Transformer, Transformer]:
    """An SDPA model and an explicit one holding the same weights (the parameter names are the same)."""
    torch.manual_seed(seed)
    sdpa = Transformer(VOCAB, VOCAB, pad_id=PAD, attention="sdpa", **TINY)
    explicit = Transformer(VOCAB, VOCAB, pad_id=PAD, attention="explicit", **TINY)
    explicit.load_state_dict(sdpa.state_dict())
    return sdpa.to(device), explicit.to(device)


def _logits_and_gradients(model: Transformer, batch: dict, autocast: bool) -> tuple[torch.Tensor, dict]:
    """Teacher-forced logits and each parameter's gradient for a fixed random cotangent of them, with
    SDPA restricted to the fused kernels (an error, not the math fallback, where they cannot serve)."""
    with sdpa_kernel(FUSED), torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        logits = model(batch["src"], batch["tgt_in"])
    cotangent = torch.randn(logits.shape, generator=torch.Generator().manual_seed(5)).to(logits.device)
    with sdpa_kernel(FUSED):
        logits.float().backward(cotangent)
    return logits.detach(), {name: p.grad for name, p in model.named_parameters()}


def test_fused_sdpa_gives_the_explicit_outputs_and_gradients_in_fp32(cuda):
    """In fp32 the memory-efficient kernel (flash has no fp32) gives Eq. 1's outputs and gradients
    to fp32 rounding."""
    sdpa, explicit = _pair(cuda)
    batch = padded_batch(VOCAB, *LENGTHS, seed=1, device=cuda)
    assert (batch["src"] == PAD).any() and (batch["tgt_in"] == PAD).any()
    logits_a, grads_a = _logits_and_gradients(sdpa, batch, autocast=False)
    logits_b, grads_b = _logits_and_gradients(explicit, batch, autocast=False)
    assert logits_a.dtype == torch.float32
    # On the CPU the two agree to 1.5e-6 in logits of size ~3.4 and to 7e-7 in the relative error
    # of any parameter's gradient; the CUDA kernels (the memory-efficient one's fp32 products use
    # 3xTF32, within a few fp32 roundings) are given 100× that.
    torch.testing.assert_close(logits_a, logits_b, rtol=1e-4, atol=1e-4)
    assert grads_a.keys() == grads_b.keys()
    errors = {name: relative_error(grads_a[name], grads_b[name]) for name in grads_b}
    assert max(errors.values()) < 1e-4, errors
    assert all(grad.abs().sum() > 0 for grad in grads_b.values())


def test_fused_sdpa_gives_the_explicit_outputs_and_gradients_under_bf16_autocast(cuda):
    """Under bf16 autocast (trainer.precision=bf16-mixed) the fused kernels and Eq. 1 written out
    round differently, but agree within bf16's precision."""
    sdpa, explicit = _pair(cuda)
    batch = padded_batch(VOCAB, *LENGTHS, seed=1, device=cuda)
    logits_a, grads_a = _logits_and_gradients(sdpa, batch, autocast=True)
    logits_b, grads_b = _logits_and_gradients(explicit, batch, autocast=True)
    assert logits_a.dtype == logits_b.dtype == torch.bfloat16  # the products really ran in bf16
    # Measured on the CPU under bf16 autocast (bf16 keeps 8 bits of mantissa, a relative rounding of
    # 2^-8 ≈ 0.004 per operation): logits 0.007 apart relative to their norm (at most 0.025 in one
    # of size ~3.4), the whole gradient 0.012 (cosine 0.99993), one parameter's at most 0.033.
    # About 4× that is allowed; a wrong mask or a dropped term moves them by far more.
    assert relative_error(logits_a, logits_b) < 0.03
    torch.testing.assert_close(logits_a.float(), logits_b.float(), rtol=0, atol=0.1)
    whole_a, whole_b = flat(grads_a.values()), flat(grads_b.values())
    assert relative_error(whole_a, whole_b) < 0.05 and cosine(whole_a, whole_b) > 0.999
    errors = {name: relative_error(grads_a[name], grads_b[name]) for name in grads_b}
    assert max(errors.values()) < 0.15, errors


def test_incremental_decoding_with_fused_sdpa_gives_the_explicit_teacher_forced_logits(cuda):
    """Decoding step by step on CUDA (one query: SDPA, unlike the CPU's written-out single-query path;
    a chunk of two on the cache: an explicit causal mask) gives the teacher-forced logits of Eq. 1
    written out."""
    sdpa, explicit = _pair(cuda, seed=2)
    sdpa.eval()
    explicit.eval()
    batch = padded_batch(VOCAB, *LENGTHS, seed=3, device=cuda)
    with torch.no_grad(), sdpa_kernel(FUSED):
        memory, src_mask, _ = sdpa.encode(batch["src"])
        state = sdpa.start_decoding(memory, src_mask)
        steps = []
        for start, end in ((0, 1), (1, 2), (2, 4), (4, 5)):
            logits, state, _ = sdpa.decode(batch["tgt_in"][:, start:end], state)
            steps.append(logits)
        teacher_forced = explicit(batch["src"], batch["tgt_in"][:, :5])
    assert state.length == 5
    torch.testing.assert_close(torch.cat(steps, dim=1), teacher_forced, rtol=1e-4, atol=1e-4)


def test_our_masks_leave_the_fused_kernels_usable(cuda):
    """No attention of the model falls back to SDPA's math kernel for bf16 inputs: with SDPA
    restricted to one fused kernel, a kernel that cannot serve a call is an error.

    Flash attention takes no ``attn_mask`` at all, and the encoder's self-attention and every
    encoder-decoder attention pass the source padding mask (even where a batch has no padding), so
    flash can only ever serve the decoder's self-attention (causal, or a single query, unmasked).
    The whole model is therefore held to the memory-efficient kernel, which takes our boolean
    masks; the decoder's self-attention to flash attention."""
    model = _pair(cuda)[0]
    batch = padded_batch(VOCAB, *LENGTHS, seed=4, device=cuda)
    # Training: forward and backward of the whole model under bf16 autocast, memory-efficient kernel only.
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(batch["src"], batch["tgt_in"])
        logits.float().sum().backward()
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()
    assert all(torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0 for p in model.parameters())

    # The decoder's self-attention, as teacher forcing (causal) and as a decoding step (one query on
    # the cache) call it, flash attention only.
    attention = model.decoder_layers[0].self_attention
    x = torch.randn(4, 7, TINY["d_model"], generator=torch.Generator().manual_seed(6)).to(cuda, torch.bfloat16)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.autocast("cuda", dtype=torch.bfloat16):
        q, (k, v) = attention.project_self(x)
        causal, _ = attention.attend(q, (k, v), causal=True)
        step, _ = attention.attend(q[:, :, -1:], (k, v))
    assert causal.dtype == torch.bfloat16 and q.dtype == torch.bfloat16
    torch.testing.assert_close(step, causal[:, -1:], rtol=0, atol=0.05)  # the last query sees every key either way

    # Decoding in bf16 weights (precision=bf16): a beam search on fused kernels only.
    bf16 = for_decoding(model.eval(), precision="bf16")
    with sdpa_kernel(FUSED):
        hypotheses = beam_search(bf16, batch["src"], bos_id=BOS, eos_id=EOS, beam_size=3, alpha=0.6,
                                 max_len_offset=4)
    source_lengths = (batch["src"] != PAD).sum(1).tolist()
    assert len(hypotheses) == len(source_lengths)
    assert all(len(h) <= n + 4 for h, n in zip(hypotheses, source_lengths))
