"""Metrics: corpus BLEU as sacreBLEU reports it and as the paper computed it (tokenized BLEU),
chrF and the Multi30k literature's lowercased BLEU, EVALB's parsing F1, and the scorers evaluation calls them through (:mod:`aiayn.metrics.scorers`).

Depends on nothing else of aiayn, and on neither Lightning nor Hydra.
"""

from __future__ import annotations

from aiayn.metrics.bleu import (
    BleuResult,
    moses_tokenize,
    sacrebleu_score,
    split_compounds,
    tokenized_bleu,
    tokenized_recipe,
)
from aiayn.metrics.chrf import chrf_score, lowercased_bleu
from aiayn.metrics.scorers import CorpusBleu, ParseF1, Scorer

__all__ = ["BleuResult", "CorpusBleu", "ParseF1", "Scorer", "chrf_score", "lowercased_bleu", "moses_tokenize",
           "sacrebleu_score", "split_compounds", "tokenized_bleu", "tokenized_recipe"]
