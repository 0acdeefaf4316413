"""experiments/table4/baseline.py on the real treebank sample: the trees any parser must beat."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from aiayn.data.parsing.datamodule import ParsingDataModule, output_trees
from aiayn.data.parsing.linearize import linearize
from aiayn.data.parsing.treebank import parse_trees
from aiayn.data.readers import read_lines
from aiayn.metrics.parseval import parseval
from tests.helpers.runs import REPO


def _load():
    name = "table4_baseline"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "experiments" / "table4" / "baseline.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up while the class is built
        spec.loader.exec_module(module)
    return sys.modules[name]


baseline = _load()


@pytest.fixture(scope="module")
def sample(data_root: Path) -> dict:
    """The sample's splits read as the script reads them, and what it learns from train."""
    splits = baseline.sample_split()
    treebank = data_root / splits["treebank"]
    trees = {role: baseline.gold_trees(treebank, splits[role]) for role in ("train", "val", "test")}
    return {"splits": splits, "trees": trees, "learnt": baseline.learn(trees["train"])}


@pytest.fixture(scope="module")
def report(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The command's JSON report on the test split."""
    out = tmp_path_factory.mktemp("baseline") / "table4_baseline.json"
    assert baseline.main(["--data-root", str(data_root), "--split", "test", "--json", str(out)]) == 0
    return json.loads(out.read_text(encoding="utf-8"))


@pytest.mark.slow
def test_gold_trees_are_the_data_modules(sample: dict, data_root: Path, tmp_path: Path) -> None:
    splits = sample["splits"]
    dm = ParsingDataModule(data_root=str(data_root), treebank=splits["treebank"], train_split=splits["train"],
                           val_split=splits["val"], test_split=splits["test"], vocab_size=600, max_tokens=4096,
                           max_length=400, cache_dir=str(tmp_path))
    for role in ("val", "test"):
        assert [str(tree) for tree in sample["trees"][role]] == read_lines(dm.gold_file(role))
    assert [len(sample["trees"][role]) for role in ("train", "val", "test")] == [3396, 273, 245]


@pytest.mark.slow
def test_learnt_from_train(sample: dict) -> None:
    learnt = sample["learnt"]
    assert (learnt.root_label, learnt.frequent_label, learnt.final_label) == ("S", "NP", "VP")
    assert {",", ".", "``", "''", "--", ";", ":", "?"} <= learnt.punctuation
    assert not learnt.punctuation & {"Wa", "$", "-LRB-", "the"}  # a mistagged word is not punctuation


@pytest.mark.slow
@pytest.mark.parametrize("role", ["val", "test"])
def test_every_tree_has_the_gold_words_and_tags(sample: dict, role: str) -> None:
    gold = sample["trees"][role]
    gold_lines = [str(tree) for tree in gold]
    learnt = sample["learnt"]
    makers = [lambda words: baseline.flat(words, learnt)]
    makers += [lambda words, rule=rule: baseline.right_branching(words, learnt, rule) for rule in baseline.RULES]
    for make in makers:
        built = [make(tree.leaves()) for tree in gold]
        assert [tree.leaves() for tree in built] == [tree.leaves() for tree in gold]
        lines = output_trees(gold_lines, [linearize(tree) for tree in built])
        read = [parse_trees(line)[0] for line in lines]
        assert [tree.tagged_words() for tree in read] == [tree.tagged_words() for tree in gold]
        result = parseval(gold_lines, lines)
        assert (result.sentences, result.error_sentences, result.skipped_sentences) == (len(gold), 0, 0)


@pytest.mark.slow
def test_right_branching_beats_flat_on_test(report: dict) -> None:
    assert report["files"] == "wsj_0180-wsj_0199"
    assert report["sentences"] == 245
    flat, right = report["scores"]["flat"], report["scores"]["right_branching"]
    for scores in (flat, right, *report["dev"].values()):
        assert scores["error_sentences"] == 0 and scores["skipped_sentences"] == 0
        for key in ("f1", "precision", "recall", "exact_match"):
            assert 0.0 <= scores[key] <= 100.0
    assert right["f1"] > flat["f1"] + 5.0
    assert right["recall"] > flat["recall"]
    # the flat tree's one bracket (the root label over every word) is right on most sentences
    assert flat["precision"] > 80.0 and flat["test_brackets"] == 245


@pytest.mark.slow
def test_rule_is_chosen_on_dev(report: dict, sample: dict) -> None:
    best = max(row["f1"] for row in report["dev_f1_by_rule"])
    chosen = report["chosen_rule"]
    assert len(report["dev_f1_by_rule"]) == 8
    assert [row["f1"] for row in report["dev_f1_by_rule"]
            if (row["label"], row["punct_root"], row["skip_punct"]) ==
            (chosen["label"], chosen["punct_root"], chosen["skip_punct"])] == [best]
    assert report["dev"]["right_branching"]["f1"] == pytest.approx(best)
    # the figures on dev do not depend on which split was asked for
    rule = baseline.Rule(chosen["label"], chosen["punct_root"], chosen["skip_punct"])
    assert baseline.evaluate(sample["trees"]["val"], sample["learnt"], rule)["f1"] == pytest.approx(best)


HAND_LEARNT = baseline.Learnt(root_label="S", frequent_label="NP", final_label="VP", punctuation=frozenset({".", ","}))
HAND_GOLD = parse_trees("(TOP (S (NP (NNP John)) (VP (VBZ has) (NP (DT a) (NN dog))) (. .)))")
WORDS = ["John", "has", "a", "dog", "."]


@pytest.mark.parametrize(("rule", "linear"), [
    (baseline.Rule("final", punct_root=True, skip_punct=True), "(S XX (VP XX (VP XX XX )VP )VP XX )S"),
    (baseline.Rule("final", punct_root=False, skip_punct=True), "(S XX (VP XX (VP XX (VP XX XX )VP )VP )VP )S"),
    (baseline.Rule("frequent", punct_root=True, skip_punct=False), "(S XX (NP XX (NP XX XX )NP )NP XX )S"),
])
def test_hand_made_right_branching(rule, linear: str) -> None:
    tree = baseline.right_branching(WORDS, HAND_LEARNT, rule)
    assert linearize(tree) == linear
    assert tree.leaves() == WORDS


def test_hand_made_scores() -> None:
    # gold brackets (punctuation deleted): S 0-4, NP 0-1, VP 1-4, NP 2-4
    rule = baseline.Rule("final", punct_root=True, skip_punct=True)
    right = baseline.score(HAND_GOLD, [baseline.right_branching(WORDS, HAND_LEARNT, rule)])
    # S 0-4, VP 1-4, VP 2-4: S and VP 1-4 match
    assert (right["matched_brackets"], right["test_brackets"], right["gold_brackets"]) == (2, 3, 4)
    assert right["f1"] == pytest.approx(400 / 7)  # P 2/3, R 1/2
    flat = baseline.score(HAND_GOLD, [baseline.flat(WORDS, HAND_LEARNT)])
    assert linearize(baseline.flat(WORDS, HAND_LEARNT)) == "(S XX XX XX XX XX )S"
    assert (flat["precision"], flat["recall"]) == (100.0, 25.0)
    # a comma inside the sentence opens nothing when skip_punct is set, else a duplicate span
    words = ["Yes", ",", "he", "left", "."]
    assert linearize(baseline.right_branching(words, HAND_LEARNT, rule)) == "(S XX XX (VP XX XX )VP XX )S"
    loose = baseline.Rule("final", punct_root=True, skip_punct=False)
    assert linearize(baseline.right_branching(words, HAND_LEARNT, loose)) == "(S XX (VP XX (VP XX XX )VP )VP XX )S"
