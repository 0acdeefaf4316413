"""The Transformer in plain torch.nn (no Lightning, no Hydra): lift this package alone to reuse it."""

from aiayn.model.search import beam_search, greedy_search, length_penalty
from aiayn.model.transformer import DecoderState, Transformer

__all__ = ["DecoderState", "Transformer", "beam_search", "greedy_search", "length_penalty"]
