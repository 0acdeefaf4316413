"""Vinyals et al. (2015) linearisation and the repairing de-linearisation, on the real sample."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiayn.data.parsing.linearize import delinearize, linearize
from aiayn.data.parsing.treebank import iter_split, parse_trees, preprocess

TREE = parse_trees("(TOP (S (NP (NNP John)) (VP (VBZ has) (NP (DT a) (NN dog))) (. .)))")[0]
WORDS, TAGS = TREE.leaves(), TREE.tags()


def test_linearisation_of_a_tree() -> None:
    assert linearize(TREE) == "(S (NP XX )NP (VP XX (NP XX XX )NP )VP XX )S"
    assert linearize(TREE, "words") == "(S (NP John )NP (VP has (NP a dog )NP )VP . )S"
    with pytest.raises(ValueError, match="leaves must be one of xx, words"):
        linearize(TREE, "tags")


@pytest.mark.slow
def test_every_tree_of_the_sample_comes_back(data_root: Path) -> None:
    count = 0
    for _, raw in iter_split(data_root / "ptb_sample", "00-01"):
        tree = preprocess(raw)
        assert delinearize(linearize(tree), tree.leaves(), tree.tags()) == tree, str(tree)
        assert delinearize(linearize(tree, "words"), tree.leaves(), tree.tags()) == tree, str(tree)
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
        # closed too early, a word placed at the top level, then words left over: order is kept
        "(S (NP XX )NP )S )S XX (NP )NP":
            "(TOP (S (NP (NNP John))) (VBZ has) (NP (DT a) (NN dog) (. .)))",
        "(S (NP XX )NP )S XX":
            "(TOP (S (NP (NNP John))) (VBZ has) (DT a) (NN dog) (. .))",
        "(S (NP XX )NP )S (VP XX )VP":
            "(TOP (S (NP (NNP John))) (VP (VBZ has) (DT a) (NN dog) (. .)))",
        # nothing usable: the words hang from the root
        "": "(TOP (NNP John) (VBZ has) (DT a) (NN dog) (. .))",
    }
    for output, expected in cases.items():
        tree = delinearize(output, WORDS, TAGS)
        assert str(tree) == expected, output
        assert tree.leaves() == WORDS and tree.tags() == TAGS


def test_without_tags_leaves_are_tagged_xx() -> None:
    assert str(delinearize("(S XX XX )S", ["a", "b"])) == "(TOP (S (XX a) (XX b)))"


def test_any_output_gives_the_words_in_order(data_root: Path) -> None:
    """Random token sequences (shuffled, cut and lengthened linearisations) of real trees."""
    import random

    rng = random.Random(0)
    for count, (_, raw) in enumerate(iter_split(data_root / "ptb_sample", "wsj_0001-wsj_0020")):
        tree = preprocess(raw)
        tokens = linearize(tree).split()
        for _ in range(5):
            noisy = rng.sample(tokens, len(tokens))[: rng.randint(0, len(tokens) + 5)]
            noisy += rng.choices(tokens, k=rng.randint(0, 10))
            out = delinearize(" ".join(noisy), tree.leaves(), tree.tags())
            assert out.label == "TOP" and out.leaves() == tree.leaves() and out.tags() == tree.tags()
    assert count + 1 == 233  # trees in wsj_0001–wsj_0020
