"""Decoding (§6.1): batched beam search with the GNMT length penalty, and greedy search.

"We used beam search with a beam size of 4 and length penalty α = 0.6 [38]. […] We set the
maximum output length during inference to input length + 50, but terminate early when
possible." The length penalty of reference [38] (Wu et al., 2016) is

    lp(Y) = (5 + |Y|)^α / (5 + 1)^α,

and a hypothesis is ranked by log P(Y|X) / lp(Y). |Y| counts the end-of-sentence token, as in
tensor2tensor.

Both searches decode incrementally: each step feeds only the newest token and reuses the decoder
self-attention keys/values of the earlier positions (``kv_cache=True``, the default). The paper
is silent on this; it is tensor2tensor's fast decoding. ``kv_cache=False`` re-runs the decoder
over the whole prefix at every step instead (the encoder-decoder keys/values are still projected
once per source); it gives the same outputs and exists to measure what the cache saves.

Beam search stops a sentence by one of two rules (``stop``; the paper is silent, ours to offer):
``"paper"``, tensor2tensor's (its ``stop_early`` since late 2018; the paper's 2017 code compared with
the worst finished one, also a sound bound: the same best output): once no live hypothesis, even
given the largest length penalty it could still get, can beat the best finished one (the n-th
best, for n-best lists); ``"first_k"``, fairseq's and CTranslate2's: once ``beam_size``
hypotheses have finished.
``beam_search_nbest`` gives each sentence's ``nbest`` best hypotheses with their scores
(:class:`Hypothesis`); ``beam_search`` the best one's tokens.

Every token of the vocabulary is a candidate at every step, padding and BOS too (the paper is
silent; tensor2tensor's beam search masks neither, fairseq's leaves padding out). The model
never has either as a target (the loss skips padding, BOS is only an input), so label smoothing's
share is all they get, and a trained model does not pick them; ``Subwords.decode`` would leave
them out of the text.

Both take an optional ``constraint`` (:class:`OutputConstraint`): at every step the tokens it
does not allow get log-probability -inf, so only outputs of a given form are found (the parser's
well-formed trees, ``aiayn.data.parsing.constraints``). Without one the search is as above.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Protocol

import torch
from torch import Tensor

from aiayn.model.blocked_topk import top_candidates
from aiayn.model.finished import FinishedHypotheses, Hypothesis
from aiayn.model.transformer import DecoderState, Transformer


class ConstraintState(Protocol):
    """Where each hypothesis (row) stands with respect to an :class:`OutputConstraint`."""

    def allowed(self) -> Tensor:
        """(rows, vocab) bool: the tokens each hypothesis may take next."""

    def select(self, rows: Tensor) -> ConstraintState:
        """The states of the hypotheses ``rows`` (rows,)."""

    def advance(self, tokens: Tensor) -> ConstraintState:
        """The states after each hypothesis takes its token of ``tokens`` (rows,)."""


class OutputConstraint(Protocol):
    """Restricts the outputs a search may produce (e.g. to well-formed trees, §6.3)."""

    def start(self, src: Tensor, max_lengths: Tensor) -> ConstraintState:
        """The state of each source of ``src`` (batch, src_len) before its first output token;
        ``max_lengths`` (batch,) is the most output tokens each may have, EOS included."""


def length_penalty(length: int | Tensor, alpha: float) -> float | Tensor:
    """lp(Y) = ((5 + |Y|) / 6)^α (Wu et al., 2016, Eq. 14)."""
    return ((5.0 + length) / 6.0) ** alpha


def _max_lengths(model: Transformer, src_mask: Tensor, max_len_offset: int) -> Tensor:
    """Input length + offset per sentence, capped by the positions the model can encode.

    §6.1's "input length + 50", where the paper does not say in what: here the sentence's own source
    subwords with its EOS (padding not counted), and the output's tokens with its EOS; tensor2tensor
    took the batch's padded input length. ``src_mask``: (batch, 1, 1, src_len) → (batch,)."""
    src_lengths = src_mask.flatten(1).sum(-1)  # (batch, src_len) → (batch,)
    return (src_lengths + max_len_offset).clamp(max=model.max_positions)  # (batch,)


def start_search(model: Any, src: Tensor, rows: Tensor | None = None) -> tuple[Any, Tensor]:
    """Encode ``src`` (batch, src_len): the decoder's state for each source of ``rows`` (the
    source each hypothesis decodes; None: each source once) and the sources' mask (batch, 1, 1,
    src_len). An ensemble (aiayn.model.ensemble) starts each of its models."""
    if hasattr(model, "start_search"):
        return model.start_search(src, rows)
    memory, src_mask, _ = model.encode(src)  # (batch, src_len, d_model), (batch, 1, 1, src_len)
    if rows is None:
        return model.start_decoding(memory, src_mask), src_mask
    # The encoder-decoder keys/values projected once per source, then copied to its rows: (rows, …)
    return model.start_decoding(memory, src_mask).select(rows), src_mask


def next_log_probs(model: Any, tokens: Tensor, state: Any, kv_cache: bool) -> tuple[Tensor, Any]:
    """log P(next token | ``tokens``, source) (rows, vocab) in float32 and the state after the
    step: the model's logits through a log-softmax; an ensemble gives its own (the mean of its
    models' log-probabilities)."""
    if hasattr(model, "next_log_probs"):
        return model.next_log_probs(tokens, state, kv_cache)
    logits, state = _next_logits(model, tokens, state, kv_cache)  # (rows, vocab)
    logits = logits.float().contiguous()  # (no copy for a step's fp32 logits)
    # In place: the logits are not needed after, and a fresh (rows, vocab) tensor per step costs
    # more than the log-softmax itself on the CPU. Same numbers as out of place.
    return torch.log_softmax(logits, -1, out=logits), state


def _next_logits(model: Transformer, tokens: Tensor, state: DecoderState, kv_cache: bool) -> tuple[Tensor, DecoderState]:
    """Logits (rows, vocab) of the token after ``tokens`` (rows, t), BOS first; rows is batch for
    greedy search, (active sentences)·beam for beam search.

    With the cache, ``state`` holds the self-attention keys/values of ``tokens[:, :-1]`` and only
    the last token is fed; without it, the whole prefix is decoded from a state with no self-
    attention cache, keeping only the last position's logits, and ``state`` is returned unchanged.
    """
    if kv_cache:
        logits, state, _ = model.decode(tokens[:, -1:], state)  # (rows, 1) → (rows, 1, vocab)
        return logits[:, -1], state  # (rows, vocab)
    fresh = replace(state, self_kv=[None] * len(state.memory_kv), length=0, cache_rows=None)
    logits, _, _ = model.decode(tokens, fresh)  # (rows, t, vocab)
    return logits[:, -1], state  # (rows, vocab)


@torch.inference_mode()
def greedy_search(
    model: Transformer, src: Tensor, *, bos_id: int, eos_id: int, max_len_offset: int, kv_cache: bool = True,
    constraint: OutputConstraint | None = None,
) -> list[list[int]]:
    """Pick the most probable token at every step (the most probable allowed one, with a
    ``constraint``). Returns token ids without BOS/EOS, per sentence. A sentence leaves the batch
    when it ends (EOS or its maximum length), so the others do not carry it along.
    ``kv_cache``: reuse the self-attention keys/values of earlier steps (see the module docstring)."""
    state, src_mask = start_search(model, src)  # src_mask (batch, 1, 1, src_len)
    max_lengths = _max_lengths(model, src_mask, max_len_offset)  # (batch,)
    batch, longest = src.size(0), int(max_lengths.max())
    # Each sentence's output so far, EOS after its end: (batch, longest)
    outputs = torch.full((batch, longest), eos_id, dtype=torch.long, device=src.device)
    active = torch.arange(batch, device=src.device)  # (n,): the sentences still being decoded
    tokens = torch.full((batch, 1), bos_id, dtype=torch.long, device=src.device)  # (n, 1): BOS
    constrained = constraint.start(src, max_lengths) if constraint is not None else None
    for step in range(1, longest + 1):
        logits, state = _next_logits(model, tokens, state, kv_cache)  # (n, vocab)
        if constrained is not None:
            logits = logits.masked_fill(~constrained.allowed(), float("-inf"))
        next_token = logits.argmax(-1)  # (n,)
        if constrained is not None:
            constrained = constrained.advance(next_token)
        outputs[active, step - 1] = next_token
        tokens = torch.cat([tokens, next_token[:, None]], dim=1)  # (n, step + 1)
        # The stopping test, the one wait on the device per step: who has neither ended nor run out.
        going = ((next_token != eos_id) & (step < max_lengths[active])).nonzero().squeeze(1)  # (n_going,)
        if going.numel() == 0:
            break
        if going.numel() < active.numel():  # finished sentences leave the batch
            active, tokens, state = active[going], tokens[going], state.select(going)
            constrained = constrained.select(going) if constrained is not None else None
    # each row of outputs (batch, longest): (longest,) cut at its EOS and its limit
    return [_strip(row, eos_id, limit) for row, limit in zip(outputs.tolist(), max_lengths.tolist())]


def _strip(ids: list[int], eos_id: int, limit: int) -> list[int]:
    ids = ids[:limit]
    return ids[: ids.index(eos_id)] if eos_id in ids else ids


def beam_search(model: Any, src: Tensor, **settings: Any) -> list[list[int]]:
    """The best hypothesis per sentence (token ids without BOS/EOS) of :func:`beam_search_nbest`
    with the same settings (``nbest`` 1)."""
    return [hypotheses[0].tokens for hypotheses in beam_search_nbest(model, src, **settings)]


@torch.inference_mode()
def beam_search_nbest(
    model: Any,
    src: Tensor,
    *,
    bos_id: int,
    eos_id: int,
    beam_size: int,
    alpha: float,
    max_len_offset: int,
    kv_cache: bool = True,
    constraint: OutputConstraint | None = None,
    stop: str = "paper",
    nbest: int = 1,
    min_len: int = 0,
) -> list[list[Hypothesis]]:
    """Beam search over a batch of sentences at once; returns the ``nbest`` best hypotheses per
    sentence, best first, ranked by log-probability / lp (fewer only where fewer were found; those
    cut at the length limit after every finished one).
    ``beam_size``, ``alpha`` and ``max_len_offset`` have no defaults here: the paper's (4, 0.6, 50)
    live in the decoding settings of aiayn.config, which this package does not import.

    Each step extends every live hypothesis and ranks the 2·beam best candidates per sentence:
    those among the best ``beam_size`` that end in EOS are finished; the best ``beam_size`` not
    ending in EOS live on.
    A sentence stops when it reaches its maximum length (its live hypotheses then fill the places
    no finished hypothesis took, without EOS, ranked after the finished) or by the rule ``stop``
    (see the module docstring): "paper", when even its best live hypothesis, given the largest
    length penalty it could still get, cannot beat its ``nbest``-th best finished one
    (log-probabilities only fall as a hypothesis grows);
    "first_k", when ``beam_size`` hypotheses have finished. Finished sentences leave the batch.
    ``kv_cache``: reuse the self-attention keys/values of earlier steps (see the module docstring).
    ``constraint``: only the tokens it allows are candidates (the others score -inf); so is EOS
    before ``min_len`` tokens (no hypothesis finishes shorter). The settings
    are taken as given (beam_size ≥ 1, max_len_offset ≥ 0, 1 ≤ nbest ≤ beam_size, stop one of the
    two rules): aiayn.decoding.settings checks them, once, where they are made.
    """
    batch, k = src.size(0), beam_size
    device = src.device
    rows = torch.arange(batch, device=device).repeat_interleave(k)  # (batch·beam,): each hypothesis's sentence
    # All beams start identical (BOS). Under "first_k" the first step runs once per sentence, as
    # CTranslate2 runs it, and its result is copied to the beams: that step costs a beam-th. Under
    # "paper" it runs on every beam's row, as it always has, so that its fp32 outputs stay bit for
    # bit: a matrix product of 1–3 rows rounds differently from one of more (MKL).
    first_step_once = stop == "first_k" and k > 1
    # a state of batch·beam rows (batch rows until the first step: first_step_once); src_mask (batch, 1, 1, src_len)
    state, src_mask = start_search(model, src, None if first_step_once else rows)
    max_lengths = _max_lengths(model, src_mask, max_len_offset)  # (batch,)
    limits = max_lengths.tolist()  # on the host too: a wait on the device, once per search
    # The loop's bound, and the first step at which a sentence may reach its limit.
    longest, shortest = max(limits), min(limits)
    # (batch·beam,) constraint states, or None
    constrained = constraint.start(src, max_lengths).select(rows) if constraint is not None else None

    tokens = torch.full((batch * k, 1), bos_id, dtype=torch.long, device=device)  # (batch·beam, 1): BOS
    scores = torch.full((batch, k), float("-inf"), device=device, dtype=torch.float32)  # (batch, beam)
    scores[:, 0] = 0.0  # all beams start identical: expand only the first at step 1
    # The best `nbest` finished hypotheses of each sentence so far, kept on the device (no host
    # synchronisation per step): their scores, log-probabilities, tokens (without BOS/EOS), lengths.
    # (Its rows, like those of what follows, are the sentences still searched, in the order of `scores`.)
    best = FinishedHypotheses(batch, nbest, longest, device)
    finished = torch.zeros(batch, dtype=torch.long, device=device)  # (n,): hypotheses finished ("first_k")
    sentence_max = max_lengths  # (n,): each sentence's limit
    # (n,): the largest length penalty each could still get ("paper")
    largest_lp = length_penalty(sentence_max.float(), alpha) if stop == "paper" else None
    first_row = torch.arange(batch, device=device)[:, None] * k  # (n, 1): each sentence's first hypothesis
    # (beam indices (n, m) → their rows (n, m) in the n·beam hypotheses: first_row + beam)

    # In the loop, n ≤ batch counts the sentences still searched: tokens is (n·beam, step), scores (n, beam).
    # The loop waits on the device once per step: for the stopping test (which sentences go on).
    for step in range(1, longest + 1):
        n = scores.size(0)
        if step == 1 and first_step_once:  # one row per sentence (BOS), then each row copied to its beams
            log_probs, state = next_log_probs(model, tokens[::k], state, kv_cache)  # (batch, vocab)
            log_probs, state = log_probs.repeat_interleave(k, dim=0), state.select(rows)  # (batch·beam, vocab)
        else:
            log_probs, state = next_log_probs(model, tokens, state, kv_cache)  # (n·beam, vocab)
        if constrained is not None:
            log_probs = log_probs.masked_fill(~constrained.allowed(), float("-inf"))
        if step <= min_len:  # EOS now would end a hypothesis of step - 1 < min_len tokens
            log_probs[:, eos_id] = float("-inf")
        vocab = log_probs.size(-1)
        # (n, beam, vocab) + (n, beam, 1) → (n, beam·vocab), in place: the log-probabilities are not needed after
        candidates = log_probs.view(n, k, vocab).add_(scores.unsqueeze(-1)).view(n, k * vocab)
        top_scores, top_ids = top_candidates(candidates, 2 * k)  # (n, 2·beam) each: candidates.topk's
        origin, token = top_ids // vocab, top_ids % vocab  # (n, 2·beam): beam it extends, token it adds

        # Candidates among the best `k` that end in EOS are finished hypotheses of length `step`
        # (EOS further down is ignored, so a beam of 1 with α = 0 is exactly greedy search; with
        # α > 0 a longer hypothesis may still beat the first one finished. tensor2tensor's search
        # also finished an EOS among the other k of the 2k, to be kept if it ranked among the best
        # k finished so far: the paper is silent; fairseq ignores them, as here.)
        is_eos = token == eos_id  # (n, 2·beam)
        finishes = is_eos[:, :k]  # (n, beam)
        # (n, beam)
        finished_scores = (top_scores[:, :k] / length_penalty(step, alpha)).masked_fill(~finishes, float("-inf"))
        if nbest == 1:  # each sentence's best finished candidate: (n,) each
            step_best, step_pos = finished_scores.max(-1)
            picked = step_pos[:, None]  # (n, 1)
        else:  # every finished candidate among the best k: (n, k)
            step_best, picked = finished_scores, torch.arange(k, device=device).expand(n, k)
        # the hypotheses (n·beam, step) that the picked candidates extend: (n, m, step - 1)
        extended = tokens[(first_row + origin.gather(1, picked)).view(-1), 1:].view(n, picked.size(1), step - 1)
        best.record(step_best.view(n, -1), top_scores.gather(1, picked), extended)
        if stop == "first_k":
            finished += finishes.sum(-1)

        # The best `k` candidates not ending in EOS live on (at most k of the 2k end in EOS).
        # (n, beam) each
        live_scores, live_pos = top_scores.masked_fill(is_eos, float("-inf")).topk(k, dim=-1)
        parent_rows = (first_row + origin.gather(1, live_pos)).view(-1)  # (n, beam) → (n·beam,)
        # (n·beam, step) + (n·beam, 1) → (n·beam, step + 1)
        tokens = torch.cat([tokens.index_select(0, parent_rows), token.gather(1, live_pos).view(-1, 1)], dim=1)
        state = _reorder_beams(state, parent_rows)
        if constrained is not None:
            constrained = constrained.select(parent_rows).advance(tokens[:, -1])
        scores = live_scores  # (n, beam)

        at_max = step >= sentence_max  # (n,)
        if step >= shortest:  # (known on the host: no wait, and no work at the steps before)
            # Out of length: the best live hypotheses, which never ended, fill the places no finished
            # hypothesis took, after every finished one (the paper is silent: tensor2tensor returns a
            # finished hypothesis wherever there is one; before, a cut one competed with the finished
            # on its score, which paid no EOS). (n, nbest) scores; each sentence's first nbest beams
            best.fill(at_max, scores[:, :nbest] / length_penalty(step, alpha), scores[:, :nbest],
                      tokens.view(n, k, step + 1)[:, :nbest, 1:])
        if stop == "paper":
            # (n,): can the best live hypothesis still beat the nbest-th best finished one?
            going = scores[:, 0] / largest_lp > best.scores[:, -1]
        else:
            going = finished < k  # (n,)
        keep = (~at_max & going).nonzero().squeeze(1)  # (n_kept,): indices into the n searched
        if keep.numel() == 0:
            break
        if keep.numel() < n:
            kept_rows = (keep[:, None] * k + torch.arange(k, device=device)).view(-1)  # (n_kept·beam,)
            # tokens (n_kept·beam, step + 1), scores (n_kept, beam), state of n_kept·beam rows
            tokens, scores, state = tokens.index_select(0, kept_rows), scores[keep], state.select(kept_rows)
            constrained = constrained.select(kept_rows) if constrained is not None else None
            # (n_kept,) each
            finished, sentence_max, first_row = finished[keep], sentence_max[keep], first_row[: keep.numel()]
            largest_lp = largest_lp[keep] if largest_lp is not None else None
            best.keep(keep)
    return best.hypotheses()


def _reorder_beams(state: DecoderState, rows: Tensor) -> DecoderState:
    """The state of the hypotheses ``rows``, each taken from a beam of its own sentence: a
    DecoderState (or an ensemble's states) keeps the source mask and the encoder-decoder
    keys/values as they are and reorders the self-attention cache as the next step extends it
    (DecoderState.reorder_beams). Any other state (e.g. a test's stand-in model) is reordered
    whole by its ``select``."""
    return state.reorder_beams(rows) if hasattr(state, "reorder_beams") else state.select(rows)
