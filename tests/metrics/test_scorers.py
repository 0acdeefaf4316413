"""The scorers evaluation calls: sacreBLEU's corpus BLEU and EVALB's F1, with their log lines."""

from __future__ import annotations

import pytest
from sacrebleu.metrics import BLEU, CHRF

from aiayn.metrics import CorpusBleu, ParseF1, Scorer
from aiayn.metrics.bleu import sacrebleu_score, tokenized_bleu
from aiayn.metrics.chrf import lowercased_bleu
from aiayn.metrics.parseval import parseval

HYPOTHESES = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest ein Buch."]
REFERENCES = ["Ein Mann fährt ein Fahrrad.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest."]
GOLD = ["(TOP (S (NP (DT The) (NN dog)) (VP (VBD ran)) (. .)))", "(TOP (S (NP (PRP It)) (VP (VBD rained))))"]
FLAT = ["(TOP (S (DT The) (NN dog) (VBD ran) (. .)))", "(TOP (S (NP (PRP It)) (VP (VBD rained))))"]


def test_corpus_bleu_is_sacrebleu_with_its_signature_and_the_papers_tokenized_bleu() -> None:
    scorer = CorpusBleu("de")
    assert isinstance(scorer, Scorer) and scorer.name == "bleu" and scorer.signature is None
    bleu = BLEU()
    expected = bleu.corpus_score(HYPOTHESES, [REFERENCES]).score
    tokenized = tokenized_bleu(HYPOTHESES, REFERENCES, "de").score
    chrf = CHRF().corpus_score(HYPOTHESES, [REFERENCES]).score
    lowercased = lowercased_bleu(HYPOTHESES, REFERENCES, "de").score
    assert scorer(HYPOTHESES, REFERENCES) == {"bleu": pytest.approx(expected), "tokenized_bleu": pytest.approx(tokenized),
                                              "chrf": pytest.approx(chrf), "lowercased_bleu": pytest.approx(lowercased)}
    assert scorer.signature == str(bleu.get_signature())
    assert scorer.describe({"bleu": 27.345, "tokenized_bleu": 28.0, "chrf": 55.5, "lowercased_bleu": 29.0}, 3) == (
        f"sacreBLEU on 3 sentences: 27.34 ({scorer.signature}); tokenized BLEU 28.00; chrF2 55.50; "
        "lowercased tokenized BLEU 29.00")


def test_corpus_bleu_makes_sacrebleus_metric_once_and_scores_as_a_new_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """sacreBLEU's BLEU of the target language (with its tokenizer: MeCab's, for Japanese, loaded as it
    is made) is made as the scorer is, and that one scores every validation (before: once more at every
    call). Scored again and on other sentences, the figures are a new metric's: it keeps nothing."""
    made = []
    real = BLEU.__init__

    def counted(self, *args, **kwargs) -> None:  # sacreBLEU's own constructor, counted
        made.append(kwargs)
        real(self, *args, **kwargs)

    monkeypatch.setattr(BLEU, "__init__", counted)
    scorer = CorpusBleu("de")
    first = [scorer(HYPOTHESES, REFERENCES) for _ in range(2)]
    other = scorer(HYPOTHESES[:2], REFERENCES[1:])
    assert [kwargs for kwargs in made if "trg_lang" in kwargs] == [{"trg_lang": "de"}]
    monkeypatch.undo()
    assert first == [CorpusBleu("de")(HYPOTHESES, REFERENCES)] * 2
    assert other == CorpusBleu("de")(HYPOTHESES[:2], REFERENCES[1:]) != first[0]
    assert scorer.signature == sacrebleu_score(HYPOTHESES, REFERENCES, "de").signature


def test_an_evaluation_report_has_the_figures_of_validation_its_lines_and_files(tmp_path) -> None:
    """What src/evaluate.py prints and keeps comes from the scorer validation uses."""
    translation = CorpusBleu("de").report(HYPOTHESES, REFERENCES, tmp_path, "test.step4")
    assert translation.figures == CorpusBleu("de")(HYPOTHESES, REFERENCES)
    assert translation.lines[0].startswith("sacreBLEU") and translation.lines[1].startswith("tokenized BLEU")
    assert translation.details["sacrebleu_signature"].startswith("nrefs:1")
    parsing = ParseF1().report(FLAT, GOLD, tmp_path, "test.step4")
    assert parsing.figures == ParseF1()(FLAT, GOLD)
    assert (tmp_path / "test.step4.gold").read_text().splitlines() == GOLD
    assert (tmp_path / "test.step4.test").read_text().splitlines() == FLAT
    assert parsing.details["evalb_gold"] == str(tmp_path / "test.step4.gold") and parsing.lines[0].startswith("F1")


def test_parse_f1_scores_trees_as_parseval() -> None:
    scorer = ParseF1()
    assert scorer.name == "f1" and scorer.signature is None
    result = parseval(GOLD, FLAT)
    assert scorer(FLAT, GOLD) == {"f1": result.f1, "precision": result.precision, "recall": result.recall,
                                  "exact_match": result.exact_match}
    assert scorer.describe({"f1": 85.714, "precision": 100.0, "recall": 75.0, "exact_match": 50.0}, 2) == \
        "F1 on 2 sentences: 85.71 (P 100.00, R 75.00, exact 50.00)"


def test_parse_f1_reads_outputs_back_with_to_trees() -> None:
    seen = []

    def to_trees(gold, outputs):
        seen.append((list(gold), list(outputs)))
        return list(gold)  # every output read back as its gold tree

    scorer = ParseF1(to_trees=to_trees)
    assert scorer(["x", "y"], GOLD)["f1"] == 100.0
    assert seen == [(GOLD, ["x", "y"])]
