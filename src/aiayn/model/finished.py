"""The finished hypotheses a beam search keeps for each sentence (aiayn.model.search): the best
``nbest`` so far, ranked by score (log-probability / length penalty), and at the length limit the
live ones in the places left, after them; on the device, so that the search never waits on the
host to keep them."""

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
    ``log_probs`` (n, nbest), ``tokens`` (n, nbest, longest) without BOS/EOS and ``lengths``
    (n, nbest); a place not yet filled scores -inf. Row i holds sentence ``sentences[i]``: only
    the n sentences still searched have rows, in the order of the search's own, so that a step
    offers them their hypotheses without indexing; a sentence that leaves the search is kept in
    the results, of all the batch's sentences (``keep``)."""

    def __init__(self, batch: int, nbest: int, longest: int, device: torch.device):
        # scores in float32 whatever torch's default dtype (trainer.precision=bf16-true makes it bf16)
        self.scores = torch.full((batch, nbest), float("-inf"), device=device, dtype=torch.float32)
        self.log_probs = torch.full((batch, nbest), float("-inf"), device=device, dtype=torch.float32)
        self.tokens = torch.zeros(batch, nbest, longest, dtype=torch.long, device=device)
        self.lengths = torch.zeros(batch, nbest, dtype=torch.long, device=device)
        self.sentences = torch.arange(batch, device=device)  # (n,): the sentence of each row
        self._results = [self.scores, self.log_probs, self.tokens, self.lengths]  # every sentence's, (batch, …)

    def record(self, new_scores: Tensor, new_log_probs: Tensor, hypotheses: Tensor) -> None:
        """Offer each row's sentence the hypotheses ``hypotheses`` (n, m, length) with their scores
        and log-probabilities (n, m; -inf: not finished): each keeps its ``nbest`` best of the old
        and the new, an old one first where scores tie."""
        if self.scores.size(1) == 1:  # the 1-best, without a sort: the first of the best new ones, if better
            if new_scores.size(1) == 1:  # (one candidate each: the search's own 1-best)
                new, new_log_prob, picked = new_scores[:, 0], new_log_probs[:, 0], hypotheses[:, 0]  # (n,), (n,), (n, length)
            else:
                new, position = new_scores.max(-1)  # (n,) each
                new_log_prob = new_log_probs.gather(1, position[:, None])[:, 0]  # (n,)
                picked = hypotheses[torch.arange(hypotheses.size(0), device=hypotheses.device), position]  # (n, length)
            improved = new > self.scores[:, 0]  # (n,)
            self.scores[:, 0] = torch.where(improved, new, self.scores[:, 0])
            self.log_probs[:, 0] = torch.where(improved, new_log_prob, self.log_probs[:, 0])
            length = hypotheses.size(2)
            # (n, length): the new hypothesis where improved, the old tokens elsewhere
            self.tokens[:, 0, :length] = torch.where(improved[:, None], picked, self.tokens[:, 0, :length])
            self.lengths[:, 0] = torch.where(improved, length, self.lengths[:, 0])
            return
        n, m, length = hypotheses.shape
        nbest, longest = self.scores.size(1), self.tokens.size(2)
        padded = hypotheses.new_zeros(n, m, longest)
        padded[:, :, :length] = hypotheses
        scores = torch.cat([self.scores, new_scores], 1)  # (n, nbest + m)
        order = scores.sort(dim=1, descending=True, stable=True).indices[:, :nbest]  # (n, nbest)
        self.scores = scores.gather(1, order)
        self.log_probs = torch.cat([self.log_probs, new_log_probs], 1).gather(1, order)
        tokens = torch.cat([self.tokens, padded], 1)  # (n, nbest + m, longest)
        self.tokens = tokens.gather(1, order[:, :, None].expand(n, nbest, longest))
        lengths = torch.cat([self.lengths, self.lengths.new_full((n, m), length)], 1)  # (n, nbest + m)
        self.lengths = lengths.gather(1, order)

    def fill(self, rows: Tensor, new_scores: Tensor, new_log_probs: Tensor, hypotheses: Tensor) -> None:
        """The places still empty of the sentences of ``rows`` (n,) bool, taken by ``hypotheses``
        (n, nbest, length) in their order, after every hypothesis already kept whatever its score:
        the live hypotheses of a sentence out of length, which never ended (tensor2tensor returns a
        finished hypothesis wherever there is one)."""
        n, nbest, length = hypotheses.shape
        place = torch.arange(nbest, device=rows.device)
        # (n, nbest): which of the new ones each place takes; < 0 where a kept one holds it
        source = place[None, :] - (self.scores > float("-inf")).sum(-1, keepdim=True)
        taken = source.clamp(min=0)
        offered = new_scores.gather(1, taken)
        take = rows[:, None] & (source >= 0) & (offered > float("-inf"))  # (n, nbest)
        self.scores = torch.where(take, offered, self.scores)
        self.log_probs = torch.where(take, new_log_probs.gather(1, taken), self.log_probs)
        picked = hypotheses.gather(1, taken[:, :, None].expand(n, nbest, length))  # (n, nbest, length)
        self.tokens[:, :, :length] = torch.where(take[:, :, None], picked, self.tokens[:, :, :length])
        self.lengths = torch.where(take, length, self.lengths)

    def keep(self, rows: Tensor) -> None:
        """Only the sentences of ``rows`` (n_kept,) go on being searched; the others' hypotheses
        are final. (Every row is written to the results: those kept are written again later.)"""
        self._store()
        self.scores, self.log_probs, self.tokens, self.lengths, self.sentences = (
            t.index_select(0, rows) for t in (self.scores, self.log_probs, self.tokens, self.lengths, self.sentences))

    def _store(self) -> None:
        """Write the rows' hypotheses into the results, at their sentences."""
        for result, rows in zip(self._results, (self.scores, self.log_probs, self.tokens, self.lengths)):
            if result is not rows:
                result.index_copy_(0, self.sentences, rows)

    def hypotheses(self) -> list[list[Hypothesis]]:
        """Each sentence's hypotheses, best first: the first always, the others where found (two
        transfers to the host: the token ids with their lengths, the scores with the log-probabilities)."""
        self._store()
        scores, log_probs, tokens, lengths = self._results
        ids = torch.cat([lengths[:, :, None], tokens], -1).tolist()  # (batch, nbest, 1 + longest)
        figures = torch.stack([scores, log_probs], -1).tolist()  # (batch, nbest, 2)
        return [[Hypothesis(row[1:1 + row[0]], score, log_prob)
                 for j, (row, (score, log_prob)) in enumerate(zip(rows, pairs)) if j == 0 or score > float("-inf")]
                for rows, pairs in zip(ids, figures)]
