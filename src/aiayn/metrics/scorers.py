"""Scorers: what validation and test score beam-search output with, as objects.

A scorer is called on the hypotheses of an evaluation split and their references, aligned, and
returns its figures by name (``{"bleu": 27.3}``); ``name`` is the headline figure among them and
:meth:`Scorer.describe` the text of a log line. The data module picks the scorer of its task
(``TranslationDataModule.scorer``) and the references it is given
(``TranslationDataModule.scoring_references``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

from aiayn.metrics.bleu import sacrebleu_score
from aiayn.metrics.parseval import parseval

__all__ = ["CorpusBleu", "ParseF1", "Scorer"]


class Scorer(ABC):
    """Scores a corpus of hypotheses against one reference each."""

    name: str
    """The key of the headline figure (shown on the progress bar)."""
    signature: str | None = None
    """sacreBLEU's signature of the last call, for a sacreBLEU metric; None otherwise."""

    @abstractmethod
    def __call__(self, hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
        """The figures of ``hypotheses`` against ``references`` (aligned), by name."""

    @abstractmethod
    def describe(self, scores: dict[str, float], sentences: int) -> str:
        """One log line's text for ``scores`` of ``sentences`` sentences."""


class CorpusBleu(Scorer):
    """sacreBLEU of detokenized output (§6.1): ``bleu``, with sacreBLEU's default settings."""

    name = "bleu"

    def __call__(self, hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
        result = sacrebleu_score(hypotheses, references)
        self.signature = result.signature
        return {"bleu": result.score}

    def describe(self, scores: dict[str, float], sentences: int) -> str:
        return f"sacreBLEU on {sentences} sentences: {scores['bleu']:.2f} ({self.signature})"


class ParseF1(Scorer):
    """EVALB's labelled-bracket figures (COLLINS.prm, §6.3): ``f1``, ``precision``, ``recall`` and
    ``exact_match``, in percent, of output trees against gold trees.

    ``to_trees(gold, outputs)`` reads each output back as a one-line tree given its gold tree
    (a parser's output may leave the words out); None: the outputs are trees already.
    """

    name = "f1"

    def __init__(self, to_trees: Callable[[Sequence[str], Sequence[str]], list[str]] | None = None):
        self.to_trees = to_trees

    def trees(self, gold: Sequence[str], outputs: Sequence[str]) -> list[str]:
        """The outputs as trees (EVALB's format), aligned with ``gold``."""
        return self.to_trees(gold, outputs) if self.to_trees is not None else list(outputs)

    def __call__(self, hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
        result = parseval(references, self.trees(references, hypotheses))
        return {"f1": result.f1, "precision": result.precision, "recall": result.recall,
                "exact_match": result.exact_match}

    def describe(self, scores: dict[str, float], sentences: int) -> str:
        return (f"F1 on {sentences} sentences: {scores['f1']:.2f} (P {scores['precision']:.2f}, "
                f"R {scores['recall']:.2f}, exact {scores['exact_match']:.2f})")
