"""An ensemble of Transformers decoding as one model: at every step the mean of its models'
log-probabilities of the next token.

The paper reports ensembles of other systems (Table 2) and builds none itself. How to combine the
models is ours: the mean of the log-probabilities (a normalised geometric mean's log, up to a
constant per step), as OpenNMT-py and Marian do; fairseq averages the probabilities instead. An
ensemble of one model, or of one model with itself, decodes exactly as that model (the mean of
equal float tensors is that tensor). The searches of aiayn.model.search take an :class:`Ensemble`
wherever they take a Transformer (``start_search``, ``next_log_probs``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from aiayn.model.search import _next_logits, _reorder_beams, start_search
from aiayn.model.transformer import Transformer


@dataclass
class EnsembleState:
    """Each model's decoder state, rows in the same order."""

    states: list[Any]

    def select(self, rows: Tensor) -> EnsembleState:
        return EnsembleState([state.select(rows) for state in self.states])

    def reorder_beams(self, rows: Tensor) -> EnsembleState:
        return EnsembleState([_reorder_beams(state, rows) for state in self.states])


class Ensemble(nn.Module):
    """Several Transformers over the same vocabulary, decoding together."""

    def __init__(self, models: Sequence[Transformer]):
        super().__init__()
        if not models:
            raise ValueError("an ensemble needs at least one model")
        self.models = nn.ModuleList(models)
        pads = {model.pad_id for model in models}
        if len(pads) > 1:
            raise ValueError(f"the models' padding ids differ: {sorted(pads)}")
        # the longest output every model can position
        self.max_positions = min(model.max_positions for model in models)

    @property
    def pad_id(self) -> int:
        return self.models[0].pad_id

    def start_search(self, src: Tensor, rows: Tensor | None = None) -> tuple[EnsembleState, Tensor]:
        """Each model's start (aiayn.model.search.start_search); the sources' mask is the same for all."""
        started = [start_search(model, src, rows) for model in self.models]
        return EnsembleState([state for state, _ in started]), started[0][1]

    def next_log_probs(self, tokens: Tensor, state: EnsembleState, kv_cache: bool) -> tuple[Tensor, EnsembleState]:
        """The mean over the models of log P(next token) (rows, vocab), float32, and the states after the step."""
        log_probs, states = [], []
        for model, model_state in zip(self.models, state.states):
            logits, model_state = _next_logits(model, tokens, model_state, kv_cache)  # (rows, vocab)
            log_probs.append(logits.float().log_softmax(-1))
            states.append(model_state)
        return torch.stack(log_probs).mean(0), EnsembleState(states)  # (models, rows, vocab) → (rows, vocab)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher forcing: the mean of the models' log-probabilities (batch, tgt_len, vocab), which a
        loss takes as logits (its log-softmax normalises the mean: a perplexity of the ensemble)."""
        return torch.stack([model(src, tgt_in).float().log_softmax(-1) for model in self.models]).mean(0)
