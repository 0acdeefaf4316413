"""`src/train.py task=wsj` on the real treebank sample and `src/evaluate.py` on its checkpoint
(real sentencepiece, real Lightning, EVALB-format files); the tools run in this process
(tests.helpers.inprocess)."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

import aiayn
from aiayn.data.parsing.linearize import LEAF, delinearize, linearize
from aiayn.data.parsing.treebank import escaped, parse_trees
from aiayn.metrics.parseval import parseval
from tests.helpers.inprocess import run_tool
from tests.helpers.runs import REPO, TINY

# The sample split, as a user runs it (its max_length fits the small model's 256 positions).
PARSING = ["task=wsj", "task.split=sample"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> tuple[Path, Path, Path]:
    root = tmp_path_factory.mktemp("parsing")
    run_tool("src/train.py", *TINY, *PARSING, "logger=csv", "visualize_at_end=false",
             f"hydra.run.dir={root / 'run'}", data_root=data_root, cache_dir=root / "cache")
    return root / "run", root / "run" / "checkpoints" / "last.ckpt", root / "cache"


@pytest.mark.slow
def test_train_validates_and_tests_with_f1(trained) -> None:
    run_dir, _, _ = trained
    with open(next(run_dir.glob("csv/version_*/metrics.csv"))) as metrics:
        rows = list(csv.DictReader(metrics))
    logged = lambda key: [float(row[key]) for row in rows if row.get(key)]
    assert len(logged("val/f1")) == 2, "validation at steps 2 and 4, each with F1"
    for key in ("test/f1", "test/precision", "test/recall", "test/exact_match"):
        assert len(logged(key)) == 1 and 0.0 <= logged(key)[0] <= 100.0
    assert "val/bleu" not in rows[0]
    summary = json.loads((run_dir / "summary.json").read_text())  # what the tables and W&B's summary read
    assert summary["dev/f1"] == pytest.approx(logged("val/f1")[-1]) and summary["dev/step"] == 4 and "dev/bleu" not in summary
    config = (run_dir / ".hydra" / "config.yaml").read_text()
    assert "split: sample" in config and "beam_size: 21" in config and "alpha: 0.3" in config


@pytest.mark.slow
def test_evaluate_of_a_parser_on_a_translation_task_is_one_line(trained, data_root: Path, tmp_path: Path) -> None:
    _, ckpt, cache = trained
    result = run_tool("src/evaluate.py", f"ckpt={ckpt}", "task=multi30k_en_de", f"out={tmp_path / 'eval'}",
                      "wandb=disabled", data_root=data_root, cache_dir=cache, check=False)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [
        (f"evaluate.py: {ckpt} was trained on task wsj, which parses sentences into trees, but task multi30k_en_de "
         "translates en→de; pick a task of the same kind and direction")]
    assert not (tmp_path / "eval").exists()


@pytest.mark.slow
def test_evaluate_reports_f1_and_writes_evalb_files(trained, data_root: Path, tmp_path: Path) -> None:
    _, ckpt, cache = trained
    result = run_tool("src/evaluate.py", f"ckpt={ckpt}", "split=test", f"out={tmp_path}", "wandb=disabled",
                      data_root=data_root, cache_dir=cache)
    for label in ("F1", "precision", "recall", "exact match", "EVALB files"):
        assert label in result.stdout, result.stdout
    report = json.loads(next(tmp_path.glob("wsj_0180-wsj_0199.step*.json")).read_text())
    gold = Path(report["evalb_gold"]).read_text().splitlines()
    test = Path(report["evalb_test"]).read_text().splitlines()
    assert len(gold) == len(test) == report["sentences"] == 245
    for gold_line, test_line in zip(gold, test):  # every output became a tree over the sentence's words
        g, t = parse_trees(gold_line)[0], parse_trees(test_line)[0]
        assert t.label == "TOP" and t.leaves() == g.leaves() and t.tags() == g.tags()
    scores = parseval(gold, test)
    assert report["test/f1"] == pytest.approx(scores.f1)
    assert report["test/exact_match"] == pytest.approx(scores.exact_match)
    assert report["parseval"]["error_sentences"] == 0 and report["decoding"]["beam_size"] == 21
    assert report["split"] == "wsj_0180-wsj_0199"
    # constrained decoding, the parsing tasks' default: every output as decoded is a well-formed
    # tree with one XX per word, which the repair gives back unchanged
    assert report["decoding"]["constrained"] is True and ".constrained" in report["hypotheses"]
    hypotheses = Path(report["hypotheses"]).read_text().splitlines()
    for gold_line, output in zip(gold, hypotheses):
        words = parse_trees(gold_line)[0].leaves()
        assert output.split().count(LEAF) == len(words) and linearize(delinearize(output, words)) == output


@pytest.mark.slow
def test_evaluate_unconstrained_is_plain_beam_search(trained, data_root: Path, tmp_path: Path) -> None:
    """decoding.constrained=false: the search of translation, whose outputs the repair reads."""
    _, ckpt, cache = trained
    run_tool("src/evaluate.py", f"ckpt={ckpt}", "split=test", f"out={tmp_path}", "wandb=disabled",
             "decoding.constrained=false", data_root=data_root, cache_dir=cache)
    report = json.loads(next(tmp_path.glob("wsj_0180-wsj_0199.step*.json")).read_text())
    assert report["decoding"]["constrained"] is False and ".constrained" not in report["hypotheses"]
    assert report["parseval"]["error_sentences"] == 0  # the repair still gives a tree over every sentence


@pytest.fixture(scope="module")
def trained_words(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> tuple[Path, Path, Path]:
    """A parser of the words linearisation (task.datamodule.linearization=words), as ``trained``."""
    root = tmp_path_factory.mktemp("parsing_words")
    run_tool("src/train.py", *TINY, *PARSING, "task.datamodule.linearization=words", "task.datamodule.max_length=400",
             "model.max_positions=512", "logger=none", "visualize_at_end=false", "test_after_training=false",
             f"hydra.run.dir={root / 'run'}", data_root=data_root, cache_dir=root / "cache")
    return root / "run", root / "run" / "checkpoints" / "last.ckpt", root / "cache"


@pytest.mark.slow
def test_the_words_linearisation_trains_and_decodes_trees_of_the_words(trained_words, data_root: Path,
                                                                       tmp_path: Path) -> None:
    """task.datamodule.linearization=words: the leaves are the words, copied from the input by
    constrained decoding, so every output holds the sentence's words in order."""
    _, ckpt, cache = trained_words
    run_tool("src/evaluate.py", f"ckpt={ckpt}", "split=val", f"out={tmp_path / 'eval'}", "wandb=disabled",
             data_root=data_root, cache_dir=cache)
    report = json.loads(next((tmp_path / "eval").glob("*.json")).read_text())
    gold = Path(report["evalb_gold"]).read_text().splitlines()
    hypotheses = Path(report["hypotheses"]).read_text().splitlines()
    assert len(hypotheses) == 273 and report["decoding"]["constrained"] is True
    for gold_line, output in zip(gold, hypotheses):
        words = parse_trees(gold_line)[0].leaves()
        assert linearize(delinearize(output, words), "words") == output
        assert [token for token in output.split() if token[0] not in "()"] == words


@pytest.mark.slow
def test_a_checkpoint_from_before_constrained_decoding_decodes_constrained(trained, tmp_path: Path) -> None:
    import torch

    from aiayn.checkpoints.trained import load_trained

    _, ckpt, _ = trained
    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=False)
    del checkpoint["hyper_parameters"]["decoding"]["constrained"]
    torch.save(checkpoint, tmp_path / "old.ckpt")
    assert load_trained(tmp_path / "old.ckpt").decoding["constrained"] is True


def test_table4_configs_compose(data_root: Path, tmp_path: Path) -> None:
    """task=wsj / wsj_semi and model=parsing hold §6.3's settings."""
    import hydra
    import torch
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from aiayn.config.schemas import network_arguments
    from aiayn.errors import DataError
    from aiayn.metrics import ParseF1
    from aiayn.training.module import TranslationModule

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        wsj = compose("train", overrides=["task=wsj", "model=parsing", f"paths.data_root={data_root}",
                                          f"paths.cache_dir={tmp_path}"])
        semi = compose("train", overrides=["task=wsj_semi"])
        sample = compose("train", overrides=["task=wsj", "task.split=sample"])
    task = OmegaConf.to_container(wsj.task, resolve=True)
    assert task["vocab_size"] == 16000
    assert (task["datamodule"]["train_split"], task["datamodule"]["val_split"], task["datamodule"]["test_split"]) == \
        ("02-21", "22", "23")
    assert OmegaConf.to_container(wsj.decoding) == {"beam_size": 21, "alpha": 0.3, "max_len_offset": 300, "min_len": 0,
                                                    "kv_cache": True, "constrained": True, "stop": "paper", "nbest": 1, "sampling": False, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "seed": 0}
    assert semi.task.vocab_size == 32000 and list(semi.task.datamodule.extra_trees) == ["parsing_semi/*"]
    assert sample.task.vocab_size == 2000 and sample.task.datamodule.test_split == "wsj_0180-wsj_0199"
    with torch.device("meta"):
        network = network_arguments(OmegaConf.to_container(wsj.model, resolve=True))  # d_k, d_v: d_model / h
        module = TranslationModule(model=network, vocab_size=16000,
                                   decoding={}, label_smoothing=wsj.loss.label_smoothing,
                                   optim=OmegaConf.to_container(wsj.optim, resolve=True))
    assert len(module.model.encoder_layers) == len(module.model.decoder_layers) == 4 and module.model.d_model == 1024
    # the standard split needs the full treebank, which the shared data does not have
    datamodule = hydra.utils.instantiate(task["datamodule"])
    assert isinstance(datamodule.scorer(), ParseF1)  # validation and test log f1, precision, recall, exact_match
    with pytest.raises(DataError, match="treebank_3/parsed/mrg/wsj: no such folder"):
        datamodule.split_files(datamodule.splits["train"])


@pytest.mark.slow
def test_attention_pictures_of_a_parser_show_the_tree_translate_writes(trained, data_root: Path, tmp_path: Path) -> None:
    """visualize.py and the end-of-training pictures decode with the checkpoint's settings,
    constrained decoding included, read the text as translate.py reads it (a word that looks like a
    tree symbol stays a word) and show the tree over its words translate.py writes (before: the
    linearisation as sentencepiece decodes it, `(S (NP XX XX )NP …`, and `(S` read as a bracket)."""
    from types import SimpleNamespace

    from aiayn.checkpoints.trained import load_trained
    from aiayn.data.parsing.datamodule import ParsingDataModule
    from aiayn.training.callbacks import AttentionPicturesCallback

    _, ckpt, cache = trained
    text = "The café said (S it expects a loss ."
    translated = run_tool("src/translate.py", f"ckpt={ckpt}", stdin=text + "\n", data_root=data_root,
                          cache_dir=cache).stdout.strip()
    tree = parse_trees(translated)[0]
    assert tree.leaves() == [escaped(word) for word in text.split()] and set(tree.tags()) == {LEAF}
    shown = run_tool("src/visualize.py", f"ckpt={ckpt}", f"text={text}", f"out={tmp_path / 'pictures'}",
                     data_root=data_root, cache_dir=cache)
    assert f"{text} → {translated}" in shown.stderr.splitlines(), shown.stderr
    model = load_trained(ckpt)
    assert model.decoding["constrained"] is True
    datamodule = SimpleNamespace(sources=lambda split: [text], vocab=model.vocab, raw_text=ParsingDataModule.raw_text,
                                 output_constraint=ParsingDataModule.output_constraint)
    trainer = SimpleNamespace(datamodule=datamodule, default_root_dir=str(tmp_path / "run"))
    drawn = AttentionPicturesCallback()._draw(trainer, SimpleNamespace(model=model.model, decoding=model.decoding))
    assert drawn[1] == f"{text} → {translated}" and drawn[0]


# Lines a treebank never has: unknown characters, words that look like the output's tree symbols,
# a blank line.
TYPED = ["The café opened in Zürich .", "She wrote (S on the board .", "A )NP B .", "(S )S XX (NP", "",
         "XXL ( ) -LRB- x"]
# translate.py's warning of an output it had to repair into a tree (aiayn.decoding.translator.output_texts).
REPAIRED = re.compile(r"WARNING aiayn\.decoding\.translator: input line (?P<line>\d+): the parser's output "
                      r"(?:has \d+ leaves for the line's (?P<words>\d+) words|is not a well-formed tree); written as "
                      r"repaired \(words it left out at the end, brackets closed or dropped\)")


@pytest.mark.slow
@pytest.mark.parametrize("parser", ["trained", "trained_words"])
def test_translate_writes_each_line_as_a_tree_over_its_own_words(parser: str, request: pytest.FixtureRequest,
                                                                 data_root: Path) -> None:
    """translate.py on a parser: one tree a line, in evaluate's EVALB form, whose leaves are the
    line's words as typed (brackets in the treebank's escapes); constrained decoding repairs none;
    unconstrained, the repaired outputs are trees over the words too, each warned of on stderr by
    its input line; a blank line stays blank. (The warnings are read on the tool's stderr, where
    they go: a tool run here starts with a root logger of no handlers, as a fresh process, so
    pytest's caplog saw none of them and its check could not fail.)"""
    _, ckpt, cache = request.getfixturevalue(parser)
    stdin = "".join(line + "\n" for line in TYPED)
    for constrained in ("true", "false"):
        result = run_tool("src/translate.py", f"ckpt={ckpt}", f"decoding.constrained={constrained}", "decoding.beam_size=2",
                          stdin=stdin, data_root=data_root, cache_dir=cache)
        outputs = result.stdout.splitlines()
        assert len(outputs) == len(TYPED), result.stdout
        for typed, output in zip(TYPED, outputs):
            if not typed:
                assert output == ""
                continue
            tree = parse_trees(output)[0]
            assert tree.label == "TOP" and tree.leaves() == [escaped(word) for word in typed.split()], output
            assert set(tree.tags()) == {LEAF}
        warned = [line for line in result.stderr.splitlines() if "the parser's output" in line]
        if constrained == "true":  # every output a tree as decoded; from Python too (aiayn.load: translate.py's translator)
            assert not warned, result.stderr
            assert aiayn.load(ckpt, device="cpu").translate(TYPED, beam_size=2) == outputs
            continue
        assert warned, result.stderr  # the 4-step model's free outputs are seldom trees
        named = []
        for line in warned:  # each names its input line and that line's words
            said = REPAIRED.fullmatch(line)
            assert said, line
            named.append(int(said["line"]))
            assert said["words"] is None or int(said["words"]) == len(TYPED[named[-1] - 1].split()), line
        assert len(set(named)) == len(named) and all(TYPED[number - 1] for number in named), warned


@pytest.mark.slow
def test_translate_builds_the_tree_constraint_once(trained) -> None:
    """translate.py on a parser: the tree constraint the search decodes with is the one its outputs
    are read back with, built once."""
    from omegaconf import OmegaConf

    from aiayn.cli.translate import _translator
    from aiayn.decoding.settings import asked

    _, ckpt, _ = trained
    cfg = OmegaConf.create({"engine": "aiayn", "ckpt": str(ckpt), "average_last": None, "device": "cpu",
                            "batch_size": 8})
    translator = _translator(cfg, asked({}), {})
    assert translator.search.constraint is translator.raw_text.constraint is not None


@pytest.mark.slow
@pytest.mark.parametrize("parser", ["trained", "trained_words"])
def test_a_parser_exported_to_ctranslate2_writes_the_trees_aiayn_writes(parser: str, request: pytest.FixtureRequest,
                                                                       data_root: Path, tmp_path: Path) -> None:
    """translate.py engine=ctranslate2 on a parser's export: each line's tree over its own words,
    as the aiayn engine writes it from the same (greedy, unconstrained) outputs, each repair warned
    of by input line with the reason: CTranslate2 cannot constrain its output to trees."""
    pytest.importorskip("transformers", reason="transformers is not installed (pip install 'aiayn[serve]')")
    pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install 'aiayn[serve]')")
    _, ckpt, cache = request.getfixturevalue(parser)
    run_tool("src/export.py", f"ckpt={ckpt}", "format=ctranslate2", f"out={tmp_path / 'ct2'}", data_root=data_root,
             cache_dir=cache)
    stdin = "".join(line + "\n" for line in TYPED)
    written = {}
    for engine in (["engine=ctranslate2", f"model_dir={tmp_path / 'ct2'}"],
                   [f"ckpt={ckpt}", "decoding.alpha=0", "decoding.constrained=false"]):
        result = run_tool("src/translate.py", *engine, "decoding.beam_size=1", stdin=stdin, data_root=data_root,
                          cache_dir=cache)
        written[engine[0]] = result.stdout, [line for line in result.stderr.splitlines() if "the parser's output" in line]
    (theirs, warned), (ours, repaired) = written["engine=ctranslate2"], written[f"ckpt={ckpt}"]
    assert theirs == ours
    for typed, output in zip(TYPED, theirs.splitlines(), strict=True):  # a tree over each line's words
        if not typed:
            assert output == ""
            continue
        tree = parse_trees(output)[0]
        assert tree.leaves() == [escaped(word) for word in typed.split()] and set(tree.tags()) == {LEAF}, output
    # the same repairs (aiayn's come in the order of its batches, by length)
    assert warned and [message.split(";")[0] for message in warned] == sorted(message.split(";")[0] for message in repaired)
    assert all(message.startswith("WARNING aiayn.decoding.translator: input line ") for message in warned), warned
    assert all(message.endswith("; CTranslate2 cannot constrain its output to trees (engine=aiayn ckpt=<file.ckpt> "
                                "decodes within the tree constraint)") for message in warned), warned
    # An export made before exports recorded their task (no task in its aiayn.json): its outputs as their tokens
    # decode, as they were, and one warning says so and what to do (before: nothing said).
    folder, settings = tmp_path / "ct2", json.loads((tmp_path / "ct2" / "aiayn.json").read_text())
    (folder / "aiayn.json").write_text(json.dumps({key: value for key, value in settings.items() if key != "task"}))
    old = run_tool("src/translate.py", "engine=ctranslate2", f"model_dir={folder}", "decoding.beam_size=1", stdin=stdin,
                   data_root=data_root, cache_dir=cache)
    assert len(old.stdout.splitlines()) == len(TYPED) and "(TOP" not in old.stdout
    assert [line for line in old.stderr.splitlines() if "records no task" in line] == [(
        f"WARNING aiayn.decoding.ctranslate2: model_dir={folder}: its aiayn.json records no task (an export made before "
        "exports recorded it) and its vocabulary has a parser's tree symbols, so each output is written as its tokens "
        "decode (for a parser, the linearised tree, not a tree over the line's words); export the checkpoint again "
        "(src/export.py ckpt=<file.ckpt> format=ctranslate2) for the trees")], old.stderr


# Trees with words of characters the sample's vocabulary has not got (a treebank file of its own).
UNKNOWN_WORDS = """\
( (S (NP-SBJ (DT The) (NN café)) (VP (VBD opened) (PP-LOC (IN in) (NP (NNP Zürich)))) (. .)) )
( (S (NP-SBJ (NNP Müller)) (VP (VBD paid) (NP (CD €) (CD 5))) (. .)) )
( (S (NP-SBJ (PRP It)) (VP (VBD was) (ADJP (JJ naïve) (CC and) (JJ 日本))) (. .)) )
"""


@pytest.mark.slow
def test_evaluate_scores_the_gold_words_in_their_places_after_an_unknown_character(trained_words,
                                                                                    tmp_path: Path) -> None:
    """evaluate.py, words linearisation, on trees whose words hold characters the vocabulary has
    not got: each hypothesis has one leaf a word (`caf⁇`, not `caf ⁇`), and the tree scored is the
    hypothesis's own over the gold words and tags."""
    _, ckpt, cache = trained_words
    folder = tmp_path / "data" / "ptb_sample" / "parsed" / "mrg" / "wsj" / "01"
    folder.mkdir(parents=True)
    (folder / "wsj_0180.mrg").write_text(UNKNOWN_WORDS, encoding="utf-8")
    run_tool("src/evaluate.py", f"ckpt={ckpt}", "split=wsj_0180", f"paths.data_root={tmp_path / 'data'}",
             f"out={tmp_path / 'eval'}", "wandb=disabled", data_root=tmp_path / "data", cache_dir=cache)
    report = json.loads(next((tmp_path / "eval").glob("*.json")).read_text())
    gold, hypotheses, scored = (Path(report[key]).read_text(encoding="utf-8").splitlines()
                                for key in ("evalb_gold", "hypotheses", "evalb_test"))
    assert len(gold) == len(hypotheses) == len(scored) == 3 and report["decoding"]["constrained"] is True
    for gold_line, output, test_line in zip(gold, hypotheses, scored):
        words, tree = parse_trees(gold_line)[0], parse_trees(test_line)[0]
        shape = " ".join(token if token[0] in "()" else LEAF for token in output.split())
        assert shape.split().count(LEAF) == len(words.leaves()), output
        assert linearize(tree) == shape and (tree.leaves(), tree.tags()) == (words.leaves(), words.tags()), test_line
    assert any("⁇" in output for output in hypotheses)
