"""Decoding by sampling: each output token drawn from the model's distribution (ancestral
sampling), as fairseq's ``--sampling``; not in the paper, which decodes by beam search (§6.1).

At every step the next token's log-probabilities are divided by ``temperature`` (below 1: sharper,
above: flatter), cut to the ``top_k`` most probable tokens (0: no cut; Fan et al., 2018) and to the
fewest most probable tokens whose probabilities add up to ``top_p`` (1.0: no cut; nucleus sampling,
Holtzman et al., 2020), and a token is drawn from what is left, renormalised. Each sample ends at
EOS or at its maximum length (input length + ``max_len_offset``, as beam search).

Draws come from ``generator``: the same seed, sources and batch give the same samples. A sample's
``log_prob`` is under the model's own distribution (temperature 1, no cut), and its ``score``
log_prob / lp(|Y|) with the GNMT length penalty, as beam search ranks; ``top_k=1`` always takes
the most probable token: greedy search.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from aiayn.model.finished import Hypothesis
from aiayn.model.search import OutputConstraint, _max_lengths, length_penalty, next_log_probs, start_search


def filtered(log_probs: Tensor, temperature: float, top_k: int, top_p: float) -> Tensor:
    """``log_probs`` (rows, vocab) divided by ``temperature``, with every token outside the
    ``top_k`` most probable and outside the nucleus of ``top_p`` set to -inf (the most probable
    token always stays)."""
    scores = log_probs / temperature if temperature != 1.0 else log_probs
    if 0 < top_k < scores.size(-1):
        kth = scores.topk(top_k, dim=-1).values[:, -1:]  # (rows, 1): the k-th best score
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = scores.sort(dim=-1, descending=True)  # (rows, vocab) each
        probs = sorted_scores.softmax(-1)
        # a token is cut when the tokens before it already add up to top_p
        cut = (probs.cumsum(-1) - probs) >= top_p  # (rows, vocab), never the first
        scores = scores.scatter(-1, order, sorted_scores.masked_fill(cut, float("-inf")))
    return scores


@torch.inference_mode()
def sample(
    model: Any, src: Tensor, *, bos_id: int, eos_id: int, max_len_offset: int, alpha: float = 0.0,
    samples: int = 1, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
    generator: torch.Generator | None = None, kv_cache: bool = True, constraint: OutputConstraint | None = None,
    min_len: int = 0,
) -> list[list[Hypothesis]]:
    """``samples`` outputs drawn for each source of ``src`` (batch, src_len), each sentence's
    best-scoring first (ties: in the order drawn); tokens without BOS/EOS, at least ``min_len`` of
    them where the maximum length allows (EOS is not drawn before). The settings are taken
    as given (temperature > 0, 0 < top_p ≤ 1, top_k ≥ 0, samples ≥ 1): aiayn.decoding.settings
    checks them, once, where they are made."""
    batch, device = src.size(0), src.device
    rows = torch.arange(batch, device=device).repeat_interleave(samples)  # (batch·samples,): each sample's source
    state, src_mask = start_search(model, src, rows)
    max_lengths = _max_lengths(model, src_mask, max_len_offset).index_select(0, rows)  # (batch·samples,)
    total, longest = rows.numel(), int(max_lengths.max())
    outputs = torch.full((total, longest), eos_id, dtype=torch.long, device=device)  # EOS after each end
    lengths = max_lengths.clone()  # (total,): tokens before EOS (the maximum where none came)
    log_prob = torch.zeros(total, device=device, dtype=torch.float32)  # (total,): log P of each sample so far
    ended = torch.zeros(total, dtype=torch.bool, device=device)  # (total,): ended with EOS
    active = torch.arange(total, device=device)  # (n,): the samples still being drawn
    tokens = torch.full((total, 1), bos_id, dtype=torch.long, device=device)  # (n, 1): BOS
    constrained = constraint.start(src, max_lengths[::samples]).select(rows) if constraint is not None else None
    for step in range(1, longest + 1):
        log_probs, state = next_log_probs(model, tokens, state, kv_cache)  # (n, vocab)
        if constrained is not None:
            log_probs = log_probs.masked_fill(~constrained.allowed(), float("-inf"))
        if step <= min_len:  # EOS now would end a sample of step - 1 < min_len tokens
            log_probs[:, eos_id] = float("-inf")
        probs = filtered(log_probs, temperature, top_k, top_p).softmax(-1)  # (n, vocab)
        next_token = torch.multinomial(probs, 1, generator=generator)[:, 0]  # (n,)
        log_prob[active] += log_probs.gather(1, next_token[:, None])[:, 0]
        if constrained is not None:
            constrained = constrained.advance(next_token)
        outputs[active, step - 1] = next_token
        is_eos = next_token == eos_id  # (n,)
        lengths[active] = torch.where(is_eos, step - 1, lengths[active])
        ended[active] |= is_eos
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)  # (n, step + 1)
        going = (~is_eos & (step < max_lengths[active])).nonzero().squeeze(1)  # (n_going,)
        if going.numel() == 0:
            break
        if going.numel() < active.numel():  # ended samples leave the batch
            active, tokens, state = active[going], tokens[going], state.select(going)
            constrained = constrained.select(going) if constrained is not None else None
    # |Y| counts EOS where the sample ended with one, as beam search's lp
    scores = log_prob / length_penalty((lengths + ended.long()).float(), alpha)  # (total,)
    drawn = [Hypothesis(row[:length], score, lp) for row, length, score, lp in
             zip(outputs.tolist(), lengths.tolist(), scores.tolist(), log_prob.tolist())]
    return [sorted(drawn[i * samples:(i + 1) * samples], key=lambda h: -h.score) for i in range(batch)]
