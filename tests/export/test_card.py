"""The model card states what the exported weights are and scored: fp32 scores on held-out data,
each with its decoding settings and metric signature; a parser's card says that it parses."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from aiayn.checkpoints.digest import digest_path
from aiayn.checkpoints.trained import load_trained
from aiayn.export.card import CardFacts, measured_scores, model_card
from aiayn.export.huggingface import card_facts
from tests.helpers.inprocess import run_tool
from tests.helpers.runs import TrainedRun


def _front_matter(card: str) -> dict:
    return yaml.safe_load(card.split("---\n")[1])


@pytest.mark.slow
def test_the_card_lists_the_fp32_held_out_scores_each_with_decoding_and_signature(tiny_run: TrainedRun,
                                                                                  data_root: Path, tmp_path: Path):
    checkpoints = tmp_path / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    last = tiny_run.checkpoints / "last.ckpt"  # a link to the newest: its bytes, and their digest
    shutil.copy(last, checkpoints / "last.ckpt")
    shutil.copy(digest_path(last, follow=True), checkpoints / "last.ckpt.blake2b")
    ckpt = checkpoints / "last.ckpt"
    # the same split in fp32, int8, bf16 and by ONNX Runtime
    for switch in ([], ["int8=true"], ["precision=bf16"], ["onnxruntime=true"]):
        run_tool("src/evaluate.py", f"ckpt={ckpt}", "split=test_2017_mscoco", "decoding.max_len_offset=2",
                 "wandb=disabled", *switch, data_root=data_root, cache_dir=tiny_run.cache_dir)
    reports = sorted((tmp_path / "run" / "eval").glob("*.json"))
    assert len(reports) == 4  # before: the int8 and bf16 scores were listed too, alike
    fp32 = json.loads((tmp_path / "run" / "eval" / "test_2017_mscoco.step4.beam4.alpha0.6.len+2.json").read_text())

    lines = measured_scores(ckpt, [4])
    assert len(lines) == 1, lines
    assert lines[0].startswith("test_2017_mscoco (461 sentences; beam 4, α 0.6, +2, stop paper): "
                               f"sacreBLEU {fp32['test_2017_mscoco/bleu']:.2f} (`{fp32['sacrebleu_signature']}`); "
                               f"tokenized BLEU {fp32['test_2017_mscoco/tokenized_bleu']:.2f} (Moses tokenization + "
                               "compound splitting, as the paper's EN-DE"), lines[0]  # a German target: split
    assert f"chrF2 {fp32['test_2017_mscoco/chrf']:.2f} (`{fp32['chrf_signature']}`)" in lines[0]
    # A score on the training split describes no held-out quality: left out.
    assert measured_scores(ckpt, [4], train_split="test_2017_mscoco") == []

    card = model_card(card_facts(load_trained(ckpt), ckpt, [4]))
    assert f"- {lines[0]}\n" in card and card.count("sacreBLEU") == 1
    assert "Measured for these weights in fp32, on held-out data" in card
    # The configuration is the export's own decoding (generate's: one maximum a batch, so max_len_offset null), said
    # as such beside scores measured with +2 (before: a yaml block alone, as if the scores' settings).
    configuration = card.split("## Configuration\n", 1)[1]
    assert configuration.startswith("\nThe network, the data, and the decoding settings this export decodes with")
    assert "the scores\nabove name the settings each was measured with" in configuration


def test_a_parsers_card_says_that_it_parses():
    facts = CardFacts(name="run/checkpoints/last.ckpt", task="wsj", src_lang="words", tgt_lang="linear", steps=[100],
                      model={"d_model": 32, "vocab_size": 500}, decoding={"beam_size": 21, "alpha": 0.3,
                                                                          "max_len_offset": 300},
                      data={"_target_": "aiayn.data.parsing.datamodule.ParsingDataModule"}, parses=True)
    card = model_card(facts)
    front = _front_matter(card)
    assert front["language"] == ["en"] and "translation" not in front["tags"] and "constituency-parsing" in front["tags"]
    assert front["pipeline_tag"] == "text2text-generation"
    assert "# wsj: English constituency parsing Transformer" in card
    assert "parsing English sentences into linearised constituency trees" in card
    assert "translation translation" not in card and "words→linear" not in card
    assert "`decoding.constrained`" in card  # what generate does not do that aiayn's parser does

    translator = model_card(CardFacts(**{**facts.__dict__, "task": "multi30k_en_de", "src_lang": "en",
                                         "tgt_lang": "de", "parses": False}))
    assert _front_matter(translator)["language"] == ["en", "de"] and "en→de translation" in translator
