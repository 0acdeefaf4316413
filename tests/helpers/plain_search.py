"""The step of a plain beam search that the tests check aiayn's search against: written out, no
cache (every step re-runs the whole prefix), Python lists."""

from __future__ import annotations

import torch


def top_candidates(model, src: torch.Tensor, live: list[tuple[float, list[int]]], k: int, bos: int,
                   dtype: torch.dtype = torch.float64) -> list[tuple[float, list[int], int]]:
    """Every live ``(score, hypothesis)`` extended by every token, the best ``2k`` as
    ``(score, hypothesis, token)``, best first; log-probabilities computed in ``dtype``."""
    candidates = []
    for score, hyp in live:
        logits = model.decode(torch.tensor([[bos] + hyp]), model.start_decoding(*model.encode(src)[:2]))[0]
        log_probs = logits[0, -1].to(dtype).log_softmax(-1).tolist()
        candidates += [(score + lp, hyp, token) for token, lp in enumerate(log_probs)]
    candidates.sort(key=lambda c: -c[0])
    return candidates[: 2 * k]
