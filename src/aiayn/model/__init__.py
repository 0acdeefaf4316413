"""The Transformer in plain torch.nn (no Lightning, no Hydra): lift this package alone to reuse it."""

from aiayn.model.ensemble import Ensemble
from aiayn.model.finished import Hypothesis
from aiayn.model.sampling import sample
from aiayn.model.search import beam_search, beam_search_nbest, greedy_search, length_penalty
from aiayn.model.transformer import DecoderState, Transformer

__all__ = ["DecoderState", "Ensemble", "Hypothesis", "Transformer", "beam_search", "beam_search_nbest",
           "greedy_search", "length_penalty", "sample"]
