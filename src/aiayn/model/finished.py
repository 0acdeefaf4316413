"""The finished hypotheses a beam search keeps for each sentence (aiayn.model.search): the best
``nbest`` so far, ranked by score (log-probability / length penalty), on the device, so that the
search never waits on the host to keep them."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Hypothesis:
    """One output of a search: its token ids (without BOS/EOS), ``log_prob`` = log P(Y|X) (EOS
    included where it ended with one) and ``score``, what it is ranked by: log_prob / lp(|Y|)."""

    tokens: list[int]
    score: float
    log_prob: float


class FinishedHypotheses:
    """Each sentence's ``nbest`` best finished hypotheses so far, best first: ``scores`` and
    ``log_probs`` (batch, nbest), ``tokens`` (batch, nbest, longest) without BOS/EOS and
    ``lengths`` (batch, nbest); a place not yet filled scores -inf."""

    def __init__(self, batch: int, nbest: int, longest: int, device: torch.device):
        self.scores = torch.full((batch, nbest), float("-inf"), device=device)
        self.log_probs = torch.full((batch, nbest), float("-inf"), device=device)
        self.tokens = torch.zeros(batch, nbest, longest, dtype=torch.long, device=device)
        self.lengths = torch.zeros(batch, nbest, dtype=torch.long, device=device)

    def record(self, active: Tensor, new_scores: Tensor, new_log_probs: Tensor, hypotheses: Tensor) -> None:
        """Offer the sentences ``active`` (n,) the hypotheses ``hypotheses`` (n, m, length) with
        their scores and log-probabilities (n, m; -inf: not finished): each sentence keeps its
        ``nbest`` best of the old and the new, an old one first where scores tie."""
        if self.scores.size(1) == 1:  # the 1-best, without a sort: the first of the best new ones, if better
            new, position = new_scores.max(-1)  # (n,) each
            improved = new > self.scores[active, 0]  # (n,)
            self.scores[active, 0] = torch.where(improved, new, self.scores[active, 0])
            new_log_prob = new_log_probs.gather(1, position[:, None])[:, 0]  # (n,)
            self.log_probs[active, 0] = torch.where(improved, new_log_prob, self.log_probs[active, 0])
            length = hypotheses.size(2)
            picked = hypotheses[torch.arange(hypotheses.size(0), device=hypotheses.device), position]  # (n, length)
            # (n, length): the new hypothesis where improved, the old tokens elsewhere
            self.tokens[active, 0, :length] = torch.where(improved[:, None], picked, self.tokens[active, 0, :length])
            self.lengths[active, 0] = torch.where(improved, length, self.lengths[active, 0])
            return
        n, m, length = hypotheses.shape
        nbest, longest = self.scores.size(1), self.tokens.size(2)
        padded = hypotheses.new_zeros(n, m, longest)
        padded[:, :, :length] = hypotheses
        scores = torch.cat([self.scores[active], new_scores], 1)  # (n, nbest + m)
        order = scores.sort(dim=1, descending=True, stable=True).indices[:, :nbest]  # (n, nbest)
        self.scores[active] = scores.gather(1, order)
        self.log_probs[active] = torch.cat([self.log_probs[active], new_log_probs], 1).gather(1, order)
        tokens = torch.cat([self.tokens[active], padded], 1)  # (n, nbest + m, longest)
        self.tokens[active] = tokens.gather(1, order[:, :, None].expand(n, nbest, longest))
        lengths = torch.cat([self.lengths[active], self.lengths.new_full((n, m), length)], 1)  # (n, nbest + m)
        self.lengths[active] = lengths.gather(1, order)

    def hypotheses(self) -> list[list[Hypothesis]]:
        """Each sentence's hypotheses, best first: the first always, the others where found (two
        transfers to the host: the token ids with their lengths, the scores with the log-probabilities)."""
        ids = torch.cat([self.lengths[:, :, None], self.tokens], -1).tolist()  # (batch, nbest, 1 + longest)
        figures = torch.stack([self.scores, self.log_probs], -1).tolist()  # (batch, nbest, 2)
        return [[Hypothesis(row[1:1 + row[0]], score, log_prob)
                 for j, (row, (score, log_prob)) in enumerate(zip(rows, pairs)) if j == 0 or score > float("-inf")]
                for rows, pairs in zip(ids, figures)]
