"""EVALB (COLLINS.prm) F1 against hand computations."""

from __future__ import annotations

import pytest

from aiayn.metrics.parseval import TreeFormatError, parseval, tree_brackets

GOLD = "(TOP (S (NP (DT The) (NN dog)) (VP (VBD saw) (NP (DT a) (NN cat)) (PP (IN in) (NP (DT the) (NN park)))) (. .)))"
# gold brackets, positions without the final "." : S 0-8, NP 0-2, VP 2-8, NP 3-5, PP 5-8, NP 6-8  (6)


def test_identical_trees_score_100() -> None:
    result = parseval([GOLD, GOLD], [GOLD, GOLD])
    assert (result.f1, result.precision, result.recall, result.exact_match) == (100.0, 100.0, 100.0, 100.0)
    assert result.gold_brackets == 12 and result.crossing_brackets == 0


def test_brackets_ignore_root_punctuation_and_function_tags() -> None:
    found = tree_brackets("(TOP (S (NP-SBJ (DT The) (NN dog)) (, ,) (VP (VBD ran)) (. .)))")
    assert found.words == ("The", "dog", "ran")
    assert sorted(found.brackets) == [("NP", 0, 2), ("S", 0, 3), ("VP", 2, 3)]


def test_wrong_label_and_attachment() -> None:
    # PP attached to the object NP instead of the VP, and the subject labelled ADJP
    test = "(TOP (S (ADJP (DT The) (NN dog)) (VP (VBD saw) (NP (NP (DT a) (NN cat)) (PP (IN in) (NP (DT the) (NN park))))) (. .)))"
    # test brackets: S 0-8, ADJP 0-2, VP 2-8, NP 3-8, NP 3-5, PP 5-8, NP 6-8 (7); matched: S, VP, NP 3-5, PP, NP 6-8 (5)
    result = parseval([GOLD], [test])
    assert (result.matched_brackets, result.gold_brackets, result.test_brackets) == (5, 6, 7)
    assert result.recall == pytest.approx(100 * 5 / 6)
    assert result.precision == pytest.approx(100 * 5 / 7)
    assert result.f1 == pytest.approx(2 * (5 / 7) * (5 / 6) / (5 / 7 + 5 / 6) * 100)
    assert result.exact_match == 0.0 and result.crossing_brackets == 0


def test_crossing_brackets() -> None:
    # "saw a" grouped as a VP-internal constituent crossing gold NP 3-5
    test = "(TOP (S (NP (DT The) (NN dog)) (VP (VP (VBD saw) (DT a)) (NN cat) (PP (IN in) (NP (DT the) (NN park)))) (. .)))"
    # test: S 0-8, NP 0-2, VP 2-8, VP 2-4, PP 5-8, NP 6-8 (6); matched 5 (not VP 2-4); VP 2-4 crosses NP 3-5
    result = parseval([GOLD], [test])
    assert (result.matched_brackets, result.gold_brackets, result.test_brackets) == (5, 6, 6)
    assert result.f1 == pytest.approx(100 * 5 / 6)
    assert result.crossing_brackets == 1


def test_punctuation_differences_do_not_count() -> None:
    # the test tree puts the final "." inside the VP: spans are counted without punctuation, so
    # VP is still 2-8 and everything matches; a comma-only constituent spans nothing and is ignored
    test = "(TOP (S (NP (DT The) (NN dog)) (VP (VBD saw) (NP (DT a) (NN cat)) (PP (IN in) (NP (DT the) (NN park))) (. .)) (PRN (, ,))))"
    result = parseval([GOLD], [test])
    assert (result.matched_brackets, result.gold_brackets, result.test_brackets) == (6, 6, 6)
    assert result.f1 == 100.0 and result.exact_match == 100.0


def test_advp_equals_prt_and_brackets_match_as_multisets() -> None:
    gold = "(TOP (S (NP (PRP He)) (VP (VBD gave) (PRT (RP up)))))"
    test = "(TOP (S (NP (PRP He)) (VP (VBD gave) (ADVP (RP up)))))"
    assert parseval([gold], [test]).f1 == 100.0
    # a unary chain NP -> NP: two gold brackets of the same span and label; the test has one
    gold_chain = "(TOP (S (NP (NP (PRP He))) (VP (VBD ran))))"
    test_flat = "(TOP (S (NP (PRP He)) (VP (VBD ran))))"
    result = parseval([gold_chain], [test_flat])
    assert (result.matched_brackets, result.gold_brackets, result.test_brackets) == (3, 4, 3)


def test_sentences_whose_words_differ_are_errors_and_left_out() -> None:
    other = "(TOP (S (NP (DT A) (NN dog)) (VP (VBD ran)) (. .)))"
    result = parseval([GOLD, GOLD], [GOLD, other])
    assert result.error_sentences == 1 and result.valid_sentences == 1 and result.f1 == 100.0
    with pytest.raises(TreeFormatError, match="unbalanced"):
        tree_brackets("(TOP (S (NP (DT The) (NN dog))")
    with pytest.raises(ValueError, match="aligned"):
        parseval([GOLD], [])
