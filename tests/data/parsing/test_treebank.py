"""The Penn Treebank reader on the real NLTK 10% WSJ sample (Treebank-3 layout)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiayn.data.parsing.treebank import (
    iter_split,
    parse_split,
    parse_trees,
    preprocess,
    read_trees,
    split_files,
    strip_function_tags,
)
from aiayn.errors import DataError


@pytest.fixture(scope="module")
def sample(data_root: Path) -> Path:
    return data_root / "ptb_sample"


@pytest.mark.slow
def test_reader_finds_every_tree_of_the_sample(sample: Path) -> None:
    files = split_files(sample, "00-01")
    assert len(files) == 199
    trees = [tree for _, tree in iter_split(sample, "00-01")]
    assert len(trees) == 3914
    assert all(tree.label == "TOP" and len(tree.children) == 1 for tree in trees)
    assert all(preprocess(tree) is not None for tree in trees)


def test_splits_by_sections_and_file_ranges(sample: Path) -> None:
    assert [p.name for p in split_files(sample, "wsj_0160-wsj_0162")] == ["wsj_0160.mrg", "wsj_0161.mrg", "wsj_0162.mrg"]
    assert len(split_files(sample, "00")) == 99 and len(split_files(sample, "01")) == 100
    assert len(split_files(sample, "wsj_0001-wsj_0159,wsj_0199")) == 160
    counts = [sum(1 for _ in iter_split(sample, spec)) for spec in
              ("wsj_0001-wsj_0159", "wsj_0160-wsj_0179", "wsj_0180-wsj_0199")]
    assert counts == [3396, 273, 245] and sum(counts) == 3914
    assert parse_split("02-21") == [((2, 0), (21, 99))]
    with pytest.raises(DataError, match="sections there are 00, 01"):
        split_files(sample, "02-21")  # the standard training sections are not in the sample
    with pytest.raises(ValueError, match="mixes a section and a file"):
        parse_split("00-wsj_0100")
    with pytest.raises(ValueError, match="'21-02' runs backwards; write it first to last, '02-21'"):
        parse_split("22,21-02")  # an empty range, whose sections would be left out in silence


def test_traces_and_function_tags_are_removed_from_a_known_tree(sample: Path) -> None:
    raw = read_trees(sample / "parsed/mrg/wsj/00/wsj_0003.mrg")[0]
    assert "-NONE-" in raw.tags() and "S-TPC-1" in str(raw)
    tree = preprocess(raw)
    text = str(tree)
    assert "-NONE-" not in text and "-TPC" not in text and "-SBJ" not in text and "-CLR" not in text
    # "(VP (VBN used) (NP (-NONE- *)) (S-CLR (NP-SBJ (-NONE- *)) (VP (TO to) ...)))": the trace NPs go,
    # S-CLR stays (as S) with its VP
    assert "(VP (VBN used) (S (VP (TO to) (VP (VB make) (NP (NNP Kent) (NN cigarette) (NNS filters))))))" in text
    assert tree.leaves() == [w for w, t in zip(raw.leaves(), raw.tags()) if t != "-NONE-"]
    assert tree.leaves()[:4] == ["A", "form", "of", "asbestos"] and tree.leaves()[-1] == "."

    first = preprocess(read_trees(sample / "parsed/mrg/wsj/00/wsj_0001.mrg")[0])
    assert str(first) == (
        "(TOP (S (NP (NP (NNP Pierre) (NNP Vinken)) (, ,) (ADJP (NP (CD 61) (NNS years)) (JJ old)) (, ,)) "
        "(VP (MD will) (VP (VB join) (NP (DT the) (NN board)) (PP (IN as) (NP (DT a) (JJ nonexecutive) "
        "(NN director))) (NP (NNP Nov.) (CD 29)))) (. .)))")


def test_function_tags_indices_and_special_labels() -> None:
    assert [strip_function_tags(label) for label in ("NP-SBJ-1", "PP=2", "S-TPC-1", "-NONE-", "-LRB-", "NP")] == \
        ["NP", "PP", "S", "-NONE-", "-LRB-", "NP"]
    only_traces = parse_trees("( (S (NP-SBJ (-NONE- *)) (VP (-NONE- *T*-1))) )")[0]
    assert preprocess(only_traces) is None
    tree = preprocess(parse_trees("( (S (NP-SBJ (-NONE- *-1)) (VP (VBD ran)) (. .)) )")[0])
    assert str(tree) == "(TOP (S (VP (VBD ran)) (. .)))"


@pytest.mark.parametrize("text, line", [
    # the first tree lacks its last ")": it is never closed (the next one ends up inside it)
    ("( (S (NP (DT The) (NN dog))\n   (VP (VBD ran)) )\n( (S (NP (PRP It)) (VP (VBD sat)) ))\n", 1),
    ("( (S (NP (DT The) (NN dog)) (VP (VBD ran)) ))\n)\n", 2),  # a stray closing bracket
])
def test_malformed_tree_file_names_the_file_and_line(tmp_path: Path, text: str, line: int) -> None:
    path = tmp_path / "parsed/mrg/wsj/00/wsj_0001.mrg"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    with pytest.raises(DataError, match=rf"wsj_0001\.mrg: line {line}: .*unbalanced brackets"):
        read_trees(path)
    with pytest.raises(DataError, match=rf"wsj_0001\.mrg: line {line}"):
        list(iter_split(tmp_path, "00"))


def test_a_tree_file_opened_by_a_byte_order_mark_is_read_as_without_it(tmp_path: Path) -> None:
    """A file of trees saved by a Windows editor (extra training trees, a treebank copy) reads as
    the same file without its mark (before: `line 1: '\\ufeff' outside any tree; fix or remove it`)."""
    text = "( (S (NP-SBJ (DT The) (NN café)) (VP (VBD opened)) (. .)) )\r\n( (NP (NN x)) )\n"
    plain, marked = tmp_path / "plain.mrg", tmp_path / "marked.mrg"
    plain.write_text(text, encoding="utf-8")
    marked.write_text("\ufeff" + text, encoding="utf-8")
    assert [str(tree) for tree in read_trees(marked)] == [str(tree) for tree in read_trees(plain)] == [
        "(TOP (S (NP-SBJ (DT The) (NN café)) (VP (VBD opened)) (. .)))", "(TOP (NP (NN x)))"]
