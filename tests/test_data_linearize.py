"""Vinyals et al. (2015) linearisation and the repairing de-linearisation, on the real sample."""

from __future__ import annotations

from pathlib import Path

from aiayn.data.linearize import delinearize, linearize
from aiayn.data.treebank import iter_split, parse_trees, preprocess

TREE = parse_trees("(TOP (S (NP (NNP John)) (VP (VBZ has) (NP (DT a) (NN dog))) (. .)))")[0]
WORDS, TAGS = TREE.leaves(), TREE.tags()


def test_linearisation_of_a_tree() -> None:
    assert linearize(TREE) == "(S (NP XX )NP (VP XX (NP XX XX )NP )VP XX )S"


def test_every_tree_of_the_sample_comes_back(data_root: Path) -> None:
    count = 0
    for _, raw in iter_split(data_root / "ptb_sample", "00-01"):
        tree = preprocess(raw)
        assert delinearize(linearize(tree), tree.leaves(), tree.tags()) == tree, str(tree)
        count += 1
    assert count == 3914


def test_repairs_make_a_valid_tree_over_the_input_words() -> None:
    cases = {
        # unbalanced: an unclosed VP and S are closed at the end
        "(S (NP XX )NP (VP XX (NP XX XX )NP XX":
            "(TOP (S (NP (NNP John)) (VP (VBZ has) (NP (DT a) (NN dog)) (. .))))",
        # a closing bracket of the wrong label closes the innermost open constituent; a stray one is ignored
        "(S (NP XX )VP (VP XX (NP XX XX )NP )VP XX )S )S":
            "(TOP (S (NP (NNP John)) (VP (VBZ has) (NP (DT a) (NN dog))) (. .)))",
        # over-long: leaves past the last word are dropped, with the constituent they leave empty
        "(S (NP XX )NP (VP XX (NP XX XX )NP )VP XX (NP XX XX )NP )S":
            "(TOP (S (NP (NNP John)) (VP (VBZ has) (NP (DT a) (NN dog))) (. .)))",
        # too short: the words left over join the last top-level constituent
        "(S (NP XX )NP (VP XX )VP )S":
            "(TOP (S (NP (NNP John)) (VP (VBZ has)) (DT a) (NN dog) (. .)))",
        # nothing usable: the words hang from the root
        "": "(TOP (NNP John) (VBZ has) (DT a) (NN dog) (. .))",
    }
    for output, expected in cases.items():
        tree = delinearize(output, WORDS, TAGS)
        assert str(tree) == expected, output
        assert tree.leaves() == WORDS and tree.tags() == TAGS


def test_without_tags_leaves_are_tagged_xx() -> None:
    assert str(delinearize("(S XX XX )S", ["a", "b"])) == "(TOP (S (XX a) (XX b)))"
