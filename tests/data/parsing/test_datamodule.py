"""The parsing datamodule on the real treebank sample: derived files, vocabulary, mixing."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from aiayn.data.parsing.constraints import TreeConstraint
from aiayn.data.parsing.datamodule import ParsingDataModule, output_trees, say_unwritable_labels
from aiayn.data.parsing.linearize import constituent_labels, linearize
from aiayn.data.parsing.treebank import parse_trees
from aiayn.data.readers import read_lines
from aiayn.data.subwords import train_or_load
from aiayn.errors import ConfigError, DataError
from aiayn.metrics.parseval import parseval
from tests.helpers.treebank import SAMPLE_SPLIT


def make(data_root: Path, cache: Path, **kwargs) -> ParsingDataModule:
    settings = dict(data_root=str(data_root), treebank="ptb_sample", vocab_size=600, max_tokens=4096, max_length=400,
                    cache_dir=str(cache), **SAMPLE_SPLIT)
    return ParsingDataModule(**{**settings, **kwargs})


@pytest.fixture(scope="module")
def datamodule(data_root: Path, parsing_cache: Path) -> ParsingDataModule:
    dm = make(data_root, parsing_cache)
    dm.setup("fit")
    dm.setup("test")
    return dm


@pytest.mark.slow
def test_splits_are_words_to_linearised_trees(datamodule: ParsingDataModule) -> None:
    # one training tree linearises to 573 tokens, over max_length=400: dropped and counted
    assert datamodule.filtered == {"empty": 0, "too_long": 1}
    assert datamodule.split_sizes == {"train": 3395, "val": 273, "test": 245}
    words, linear = datamodule.sources("val"), datamodule.references("val")
    gold = datamodule.gold_trees("val")
    assert len(words) == len(linear) == len(gold) == 273
    # the gold trees read back from their own linearisation score 100
    assert parseval(gold, output_trees(gold, linear)).f1 == 100.0
    # what validation and test score outputs with: F1 against the gold trees
    assert datamodule.scoring_references("val") == gold
    scores = datamodule.scorer()(linear, gold)
    assert scores == {"f1": 100.0, "precision": 100.0, "recall": 100.0, "exact_match": 100.0}


@pytest.mark.slow
def test_bracket_tokens_are_single_pieces(datamodule: ParsingDataModule) -> None:
    vocab = datamodule.vocab
    line = datamodule.references("val")[0]
    pieces = vocab.pieces(vocab.encode([line])[0])
    assert pieces == ["\u2581" + token for token in line.split()]
    assert vocab.decode(vocab.encode([line])) == [line]


@pytest.mark.slow
def test_a_dev_trees_label_the_training_trees_lack_is_read_as_a_label(datamodule: ParsingDataModule,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """WHADJP is in one dev tree of the sample and in no training tree: its brackets are each one
    symbol of the vocabulary (before: spelt ▁ <unk> W H A D J P, a word to the constraint and to
    perplexity), so the target's tree is read back whole and the model may write it."""
    training = {token[1:] for line in read_lines(datamodule.split_files(datamodule.splits["train"])[1])
                for token in line.split() if token.startswith("(")}
    trees = [parse_trees(line)[0] for line in datamodule.gold_trees("val")]
    rare = [tree for tree in trees if "WHADJP" in constituent_labels([tree])]
    assert len(rare) == 1 and "WHADJP" not in training
    vocab, constraint = datamodule.vocab, TreeConstraint(datamodule.vocab)
    tokens = vocab.encode([linearize(rare[0])])[0]
    assert vocab.unk_id not in tokens and "WHADJP" in constraint.labels
    assert constraint.shape(tokens) == linearize(rare[0])
    gold = [str(rare[0])]
    assert output_trees(gold, ParsingDataModule.raw_text(vocab, constraint).decode([tokens])) == gold
    with caplog.at_level(logging.WARNING):
        assert not say_unwritable_labels("val", datamodule.gold_trees("val"), vocab)
    assert not caplog.records


def test_a_gold_label_the_vocabulary_lacks_is_said_with_what_it_costs(datamodule: ParsingDataModule,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    gold = ["(TOP (S (NP (DT a)) (ZZP (NN b)) (VP (VB c) (ZZP (NN d)))))", "(TOP (S (NP (DT a))))"]
    with caplog.at_level(logging.WARNING):
        assert say_unwritable_labels("22", gold, datamodule.vocab) == {"ZZP": 2}
    [record] = caplog.records
    assert record.getMessage().startswith("treebank split 22: 1 gold trees have labels the parser's vocabulary has no "
                                          "symbol for (ZZP ×2): the model cannot write them, so F1 counts those 2 "
                                          "brackets as missed")


@pytest.mark.slow
def test_a_given_subword_model_without_tree_symbols_is_refused_before_anything_is_read(
        datamodule: ParsingDataModule, data_root: Path, tmp_path: Path) -> None:
    """task.subword_model of a model that keeps no tree symbol whole (one learnt from words alone, as
    a translation's is): refused in one line (before: the run trained on trees spelt as words,
    `(NP` as ▁ <unk> N P, and stopped on `constrained decoding needs a parsing model ... use
    constrained=false`, or on the positions the spelt trees took); a parser's own is taken."""
    words = read_lines(datamodule.split_files(datamodule.splits["train"])[0])
    plain = train_or_load(words, 300, tmp_path / "plain")
    with pytest.raises(ConfigError, match=rf"^task.subword_model={plain.path} keeps no tree symbols whole "
                                          r"\('▁\(L', '▁\)L', ▁XX\), so the trees would be spelt as words; give a "
                                          "parsing run's subword model, or null"):
        make(data_root, tmp_path / "cache", subword_model=str(plain.path), vocab_size=300)
    own = make(data_root, tmp_path / "cache", subword_model=str(datamodule.vocab.path))
    assert own.given_vocab is not None


def test_semi_supervised_mixing_repeats_wsj(data_root: Path, tmp_path: Path) -> None:
    # the extra corpus: any files of bracketed trees (here the sample's section 01, 1,993 trees)
    extra = str(data_root / "ptb_sample/parsed/mrg/wsj/01/*.mrg")
    dm = make(data_root, tmp_path, train_split="wsj_0001-wsj_0010", extra_trees=[extra], wsj_fraction=0.5)
    words, _ = dm.split_files(dm.splits["train"])
    wsj = len(read_lines(make(data_root, tmp_path, train_split="wsj_0001-wsj_0010").split_files("wsj_0001-wsj_0010")[0]))
    copies = round(0.5 * 1993 / (0.5 * wsj))
    assert len(read_lines(words)) == wsj * copies + 1993
    with pytest.raises(Exception, match="no files of extra training trees"):
        make(data_root, tmp_path, extra_trees=[str(tmp_path / "missing/*.mrg")]).split_files(SAMPLE_SPLIT["train_split"])


def test_the_semi_supervised_setting_says_what_it_needs_and_what_wsj_makes_up(
        data_root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """task=wsj_semi without its corpora: the line says what the trees are, that they are not
    public, where they go and that task=wsj trains on WSJ alone (before: `no file of extra training
    trees (task.datamodule.extra_trees)`, nothing to do). With too few extra trees for WSJ to make up
    wsj_fraction, a warning says what WSJ makes up instead (before: said nowhere)."""
    with pytest.raises(DataError) as refused:
        make(data_root, tmp_path, extra_trees=["parsing_semi/*"]).check_files(("train",))
    message = str(refused.value)
    assert f"{data_root / 'parsing_semi/*'} (train split " in message
    assert "~17M sentences, not public" in message and "point task.datamodule.extra_trees at them" in message
    assert message.endswith("task=wsj trains on WSJ alone)")

    extra = str(data_root / "ptb_sample/parsed/mrg/wsj/01/wsj_019*.mrg")
    dm = make(data_root, tmp_path, train_split="wsj_0001-wsj_0020", extra_trees=[extra], wsj_fraction=0.1)
    with caplog.at_level(logging.WARNING):
        words, _ = dm.split_files(dm.splits["train"])
    [warning] = [record.getMessage() for record in caplog.records if "wsj_fraction" in record.getMessage()]
    assert len(read_lines(words)) == 233 + 118  # wsj_0001-wsj_0020 and wsj_0190-wsj_0199, each once
    assert ("WSJ's 233 trees make up 66% of it, not task.datamodule.wsj_fraction=0.1: 118 extra trees are too few"
            in warning)


def test_setup_fit_names_the_missing_test_files_before_anything_is_loaded(data_root: Path, tmp_path: Path) -> None:
    # a treebank copy without the test split's files (wsj_0180-wsj_0199)
    wsj = tmp_path / "treebank" / "parsed" / "mrg" / "wsj"
    for path in sorted((data_root / "ptb_sample" / "parsed" / "mrg" / "wsj").glob("*/wsj_*.mrg")):
        if path.name < "wsj_0180":
            (wsj / path.parent.name).mkdir(parents=True, exist_ok=True)
            (wsj / path.parent.name / path.name).symlink_to(path)
    dm = make(data_root, tmp_path / "cache", treebank=str(tmp_path / "treebank"))
    with pytest.raises(DataError) as info:
        dm.setup("fit")
    assert str(info.value).startswith(
        f"treebank files missing or unreadable: {wsj / '01' / 'wsj_0180.mrg'} (test split 'wsj_0180-wsj_0199': missing; "
        "no file from wsj_0180 to wsj_0199; from the Penn Treebank WSJ, LDC99T42 (https://catalog.ldc.upenn.edu/LDC99T42)")
    assert dm.split_sizes == {} and not (tmp_path / "cache" / "parsing").exists()  # nothing derived yet


def test_a_missing_section_of_a_section_split_is_named(data_root: Path, tmp_path: Path) -> None:
    dm = make(data_root, tmp_path, train_split="00-02", val_split="01", test_split="23")
    with pytest.raises(DataError) as info:
        dm.check_files()
    wsj = data_root / "ptb_sample" / "parsed" / "mrg" / "wsj"
    message = str(info.value)
    assert f"{wsj / '02'} (train split '00-02': missing; no wsj_02NN.mrg file of section 02; from the Penn" in message
    assert f"{wsj / '23'} (test split '23': missing; no wsj_23NN.mrg file of section 23; from the Penn" in message
    assert f"{wsj / '00'} (" not in message and f"{wsj / '01'} (" not in message
