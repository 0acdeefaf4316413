"""What the module logs at the end of validation and test: each of the data module's scorer's
figures as ``{stage}/{key}``, the headline one on the progress bar, and one log line."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from aiayn.metrics import CorpusBleu, ParseF1
from aiayn.training.module import TranslationModule

NETWORK = {"n_layers": 1, "d_model": 32, "d_ff": 64, "n_heads": 2, "d_k": 16, "d_v": 16, "dropout": 0.1,
           "max_positions": 64}
OPTIM = {"betas": [0.9, 0.98], "eps": 1e-9, "warmup_steps": 4, "lr_factor": 1.0}
GOLD = ["(TOP (S (NP (DT The) (NN dog)) (VP (VBD ran))))", "(TOP (S (NP (PRP It)) (VP (VBD rained))))",
        "(TOP (S (NP (DT A) (NN cat)) (VP (VBD sat))))"]


def evaluated(scorer, references: list[str], hypotheses: list[tuple[int, str]], stage: str, caplog):
    """(name, value, prog_bar) of what ``_log_evaluation`` logs for ``hypotheses``."""
    module = TranslationModule(NETWORK, 100, OPTIM, {})
    datamodule = SimpleNamespace(scorer=lambda: scorer, scoring_references=lambda split: references)
    module._trainer = SimpleNamespace(datamodule=datamodule, sanity_checking=False, global_step=7)
    module.scorer = datamodule.scorer()
    logged = []
    module.log = lambda name, value, prog_bar=False, **_: logged.append((name, float(value), prog_bar))
    module.eval_loss.update(torch.tensor(2.0), 10)
    module.eval_nll.update(torch.tensor(1.0), 10)
    module.hypotheses = list(hypotheses)
    with caplog.at_level(logging.INFO, logger="aiayn.training.module"):
        module._log_evaluation(stage)
    if stage == "val":  # logged at the step validated (tests/training/test_run_log.py)
        assert logged.pop(0) == ("step", 7.0, False)
    assert [name for name, _, _ in logged[:3]] == [f"{stage}/loss", f"{stage}/nll", f"{stage}/ppl"]
    return logged[3:], [record.getMessage() for record in caplog.records]


def test_bleu_is_logged_with_its_signature(caplog) -> None:
    references = ["a man rides a bike", "two dogs play in the snow", "a woman reads"]
    scorer = CorpusBleu()
    logged, lines = evaluated(scorer, references, [(2, "a woman reads"), (0, "a man rides a bike")], "val", caplog)
    expected = CorpusBleu()(["a man rides a bike", "a woman reads"], [references[0], references[2]])
    assert logged == [("val/bleu", pytest.approx(expected["bleu"]), True),
                      ("val/tokenized_bleu", pytest.approx(expected["tokenized_bleu"]), False),
                      ("val/chrf", pytest.approx(expected["chrf"]), False),
                      ("val/lowercased_bleu", pytest.approx(expected["lowercased_bleu"]), False)]
    assert lines == [(f"val sacreBLEU on 2 sentences: {expected['bleu']:.2f} ({scorer.signature}); "
                      f"tokenized BLEU {expected['tokenized_bleu']:.2f}; chrF2 {expected['chrf']:.2f}; "
                      f"lowercased tokenized BLEU {expected['lowercased_bleu']:.2f}")]


def test_parse_f1_logs_its_four_figures(caplog) -> None:
    logged, lines = evaluated(ParseF1(), GOLD, [(1, GOLD[1]), (0, GOLD[0])], "test", caplog)
    assert logged == [("test/f1", 100.0, True), ("test/precision", 100.0, False), ("test/recall", 100.0, False),
                      ("test/exact_match", 100.0, False), ("test/sentences", 2.0, False)]  # the test says its count
    assert lines == ["test F1 on 2 sentences: 100.00 (P 100.00, R 100.00, exact 100.00)"]


def test_a_checkpoint_naming_its_metric_still_loads() -> None:
    """Checkpoints written while the module took ``metric="bleu"|"parse_f1"`` keep it in their
    hyper-parameters; loading them for inference leaves it out (the data module picks the scorer)."""
    from aiayn.checkpoints.trained import module_arguments

    saved = {"model": NETWORK, "vocab_size": 100, "optim": OPTIM, "decoding": {}, "label_smoothing": 0.1,
             "metric": "parse_f1"}
    arguments = module_arguments(saved)
    assert "metric" not in arguments and "metric" in saved
    with torch.device("meta"):
        module = TranslationModule(**arguments)
    assert module.scorer is None and module.model.d_model == 32
