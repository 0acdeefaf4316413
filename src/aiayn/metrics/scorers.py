"""Scorers: what validation, test and src/evaluate.py score beam-search output with, as objects.

A scorer is called on the hypotheses of an evaluation split and their references, aligned, and
returns its figures by name (``{"bleu": 27.3, "tokenized_bleu": 28.1}``); ``name`` is the
headline figure among them and :meth:`Scorer.describe` the text of a log line.
:meth:`Scorer.report` is the same scoring as an evaluation report: the figures, the lines printed
and what else the report keeps (sacreBLEU's signature, EVALB's files). The data module picks the
scorer of its task (``TranslationDataModule.scorer``) and the references it is given
(``TranslationDataModule.scoring_references``, ``evaluation_data``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiayn.metrics.bleu import sacrebleu_metric, sacrebleu_score, tokenized_bleu, tokenized_recipe
from aiayn.metrics.chrf import chrf_score, lowercased_bleu
from aiayn.metrics.parseval import parseval

__all__ = ["CorpusBleu", "ParseF1", "Report", "Scorer"]


@dataclass
class Report:
    """An evaluation's scores: ``figures`` by name, ``lines`` to print (one figure a line) and
    ``details`` for the JSON report (signatures, the files written)."""

    figures: dict[str, float]
    lines: list[str]
    details: dict[str, Any] = field(default_factory=dict)


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

    @abstractmethod
    def report(self, hypotheses: Sequence[str], references: Sequence[str], out_dir: Path, name: str) -> Report:
        """The scores of an evaluation, its lines and details; files it writes go to ``out_dir``,
        named ``name`` + their suffix."""


class CorpusBleu(Scorer):
    """BLEU both ways (§6.1): ``bleu``, sacreBLEU of the detokenized output with its default
    settings for the target language ``lang`` (the headline: 13a, or sacreBLEU's own tokenizer of
    a Chinese, Japanese or Korean target), and ``tokenized_bleu``, the paper's: Moses-tokenized ``lang`` output
    and references, German's with compounds split, as tensor2tensor's ``get_ende_bleu.sh``; and, to compare
    with what others report (docs/evaluation.md), ``chrf`` (sacreBLEU's chrF2) and
    ``lowercased_bleu`` (Moses-tokenized, lowercased: the Multi30k literature's)."""

    name = "bleu"

    def __init__(self, lang: str = "de"):
        self.lang = lang
        self.details: dict[str, str] = {}
        # Made once, here: a tokenizer whose extras are missing is refused here, not at the first validation.
        self.sacrebleu = sacrebleu_metric(lang)

    def __call__(self, hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
        sacre = sacrebleu_score(hypotheses, references, self.lang, self.sacrebleu)
        tokenized = tokenized_bleu(hypotheses, references, self.lang)
        chrf = chrf_score(hypotheses, references)
        lowercased = lowercased_bleu(hypotheses, references, self.lang)
        self.signature = sacre.signature
        self.details = {"sacrebleu_signature": sacre.signature, "sacrebleu": sacre.details,
                        "tokenized_bleu": tokenized.details, "tokenized_bleu_signature": tokenized.signature,
                        "chrf_signature": chrf.signature, "chrf": chrf.details,
                        "lowercased_bleu_signature": lowercased.signature, "lowercased_bleu": lowercased.details}
        return {"bleu": sacre.score, "tokenized_bleu": tokenized.score, "chrf": chrf.score,
                "lowercased_bleu": lowercased.score}

    def describe(self, scores: dict[str, float], sentences: int) -> str:
        return (f"sacreBLEU on {sentences} sentences: {scores['bleu']:.2f} ({self.signature}); "
                f"tokenized BLEU {scores['tokenized_bleu']:.2f}; chrF2 {scores['chrf']:.2f}; "
                f"lowercased tokenized BLEU {scores['lowercased_bleu']:.2f}")

    def report(self, hypotheses: Sequence[str], references: Sequence[str], out_dir: Path, name: str) -> Report:
        figures = self(hypotheses, references)
        return Report(figures, [
            f"sacreBLEU       {figures['bleu']:6.2f}  ({self.signature})",
            f"tokenized BLEU  {figures['tokenized_bleu']:6.2f}  ({tokenized_recipe(self.details['tokenized_bleu_signature'])})",
            f"chrF2           {figures['chrf']:6.2f}  ({self.details['chrf_signature']})",
            f"lowercased BLEU {figures['lowercased_bleu']:6.2f}  (Moses tokenization, lowercased: as Multi30k papers)",
        ], dict(self.details))


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

    def report(self, hypotheses: Sequence[str], references: Sequence[str], out_dir: Path, name: str) -> Report:
        """EVALB's figures of the outputs read back as trees; the gold and test trees are written
        in EVALB's format (one tree a line) as ``<name>.gold`` and ``<name>.test``."""
        test = self.trees(references, hypotheses)
        gold_file, test_file = out_dir / f"{name}.gold", out_dir / f"{name}.test"
        gold_file.write_text("".join(line + "\n" for line in references), encoding="utf-8")
        test_file.write_text("".join(line + "\n" for line in test), encoding="utf-8")
        scores = parseval(references, test)
        figures = {"f1": scores.f1, "precision": scores.precision, "recall": scores.recall,
                   "exact_match": scores.exact_match}
        return Report(figures, [
            f"F1              {scores.f1:6.2f}  (EVALB, COLLINS.prm: labelled brackets, no root, no punctuation)",
            f"precision       {scores.precision:6.2f}  {scores.matched_brackets} of {scores.test_brackets} brackets",
            f"recall          {scores.recall:6.2f}  {scores.matched_brackets} of {scores.gold_brackets} brackets",
            (f"exact match     {scores.exact_match:6.2f}  ({scores.error_sentences} error, "
             f"{scores.skipped_sentences} skipped sentences)"),
            f"EVALB files     {gold_file} {test_file}",
        ], {"evalb_gold": str(gold_file), "evalb_test": str(test_file), "parseval": scores.as_dict()})
