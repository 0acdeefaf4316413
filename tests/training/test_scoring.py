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
    assert logged.pop(0) == ("step", 7.0, False)  # logged at the step evaluated (aiayn.training.logged_step)
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


# Dev trees whose words hold characters the sample's vocabulary has not got.
UNKNOWN_WORDS = """\
( (S (NP-SBJ (DT The) (NN café)) (VP (VBD opened) (PP-LOC (IN in) (NP (NNP Zürich)))) (. .)) )
( (S (NP-SBJ (NNP Müller)) (VP (VBD paid) (NP (CD €) (CD 5))) (. .)) )
"""


@pytest.mark.slow
def test_a_parsers_validation_reads_each_word_as_one_leaf(tmp_path, data_root, single_thread) -> None:
    """Validation of a parser (the words linearisation) on dev trees with characters its vocabulary
    has not got: each output is scored as the text evaluate.py writes, one leaf a word (`caf⁇`, not
    `caf ⁇`, which would put every gold word after it in the wrong leaf)."""
    import lightning as L

    from aiayn.data.parsing.datamodule import ParsingDataModule
    from aiayn.data.parsing.treebank import parse_trees
    from aiayn.data.readers import read_lines

    wsj = tmp_path / "treebank" / "parsed" / "mrg" / "wsj"  # the sample's training files and a dev file of our own
    (wsj / "01").mkdir(parents=True)
    (wsj / "00").symlink_to(data_root / "ptb_sample" / "parsed" / "mrg" / "wsj" / "00")
    for path in sorted((data_root / "ptb_sample" / "parsed" / "mrg" / "wsj" / "01").glob("wsj_01[0-5]?.mrg")):
        (wsj / "01" / path.name).symlink_to(path)
    (wsj / "01" / "wsj_0160.mrg").write_text(UNKNOWN_WORDS, encoding="utf-8")
    datamodule = ParsingDataModule(data_root=str(data_root), treebank=str(tmp_path / "treebank"), vocab_size=600,
                                   max_tokens=4096, max_length=600, cache_dir=str(tmp_path / "cache"),
                                   linearization="words", train_split="wsj_0001-wsj_0159", val_split="wsj_0160",
                                   test_split="wsj_0160")
    torch.manual_seed(0)
    module = TranslationModule({**NETWORK, "max_positions": 256}, 600, OPTIM,
                               {"beam_size": 1, "alpha": 0.0, "max_len_offset": 20, "constrained": True})
    scored = []

    class Hypotheses(L.Callback):  # what validation scores, before it is scored
        def on_validation_epoch_end(self, trainer, pl_module) -> None:
            scored.extend(pl_module.hypotheses)

    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[Hypotheses()])
    trainer.validate(module, datamodule=datamodule, verbose=False)
    gold = read_lines(datamodule.gold_file("val"))
    assert sorted(index for index, _ in scored) == [0, 1]
    for index, text in scored:  # constrained decoding: one leaf a gold word
        assert len([token for token in text.split() if token[0] not in "()"]) == len(parse_trees(gold[index])[0].leaves())
    assert any("⁇" in text for _, text in scored)
