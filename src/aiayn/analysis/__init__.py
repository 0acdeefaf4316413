"""Looking inside a trained Transformer: attention maps (the paper's Figures 3–5) and the
positional encoding, drawn with matplotlib (no Lightning, no Hydra)."""

from aiayn.analysis.attention_maps import (
    AttentionMaps,
    attention_maps,
    draw_attention,
    draw_positional_encoding,
    paper_layer,
)

__all__ = ["AttentionMaps", "attention_maps", "draw_attention", "draw_positional_encoding", "paper_layer"]
