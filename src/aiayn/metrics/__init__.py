"""Metrics: corpus BLEU as sacreBLEU reports it and as the paper computed it (tokenized BLEU).

Depends on nothing else of aiayn, and on neither Lightning nor Hydra.
"""

from __future__ import annotations

from aiayn.metrics.bleu import BleuResult, moses_tokenize, sacrebleu_score, split_compounds, tokenized_bleu

__all__ = ["BleuResult", "moses_tokenize", "sacrebleu_score", "split_compounds", "tokenized_bleu"]
