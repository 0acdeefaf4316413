"""A parser on raw text (aiayn.data.parsing.raw_text) with the real treebank sample's vocabulary,
for each linearisation: lines are encoded one source word per word, whatever the words hold, and
outputs are read back as trees over exactly the line's words."""

from __future__ import annotations

import logging

import pytest
import torch

from aiayn.data.parsing.constraints import TreeConstraint
from aiayn.data.parsing.datamodule import ParsingDataModule
from aiayn.data.parsing.linearize import constituent_labels, delinearize, linearize
from aiayn.data.parsing.raw_text import RawText
from aiayn.data.parsing.treebank import escaped, parse_trees
from aiayn.data.readers import read_lines
from aiayn.decoding.translator import Translator
from aiayn.model import Transformer
from tests.helpers.treebank import SMALL

pytestmark = pytest.mark.usefixtures("single_thread")

# Words a treebank never has: unknown characters, words that look like the output's tree symbols
# (a bracket of a label the vocabulary has, the xx linearisation's leaf), one that sentencepiece's
# normalisation removes and one it splits in two.
TYPED = ["The café opened in Zürich 日本 .", "She wrote (S on the board .", "A )NP B .", "(S )S XX (NP",
         "XXL ( ) -LRB- (( x", "a \x01 b", "a\u200bb c"]


@pytest.fixture(scope="module")
def raw(datamodule: ParsingDataModule) -> RawText:
    return ParsingDataModule.raw_text(datamodule.vocab)


def test_each_word_is_one_word_of_the_source_and_none_a_tree_symbol(raw: RawText) -> None:
    constraint = raw.constraint
    for line, ids in zip(TYPED, raw.encode(TYPED)):
        words = line.split()
        src = torch.tensor([ids])
        assert constraint.words(src).item() == len(words), line
        pieces = raw.vocab.pieces(ids)
        assert not [piece for piece in pieces if piece[1:2] in ("(", ")")], pieces  # no bracket reaches the model


def test_treebank_sentences_are_encoded_as_in_training(datamodule: ParsingDataModule, raw: RawText) -> None:
    sentences = read_lines(datamodule.split_files(datamodule.splits["val"])[0])
    assert raw.encode(sentences) == datamodule.vocab.encode(sentences)


def test_a_linearised_tree_is_read_back_over_the_lines_words(datamodule: ParsingDataModule, raw: RawText) -> None:
    """The tokens of each dev tree's linearisation (what the model is trained to write) give back
    that tree over its words, tagged XX: in the words linearisation by where its words begin (every
    dev tree: the vocabulary has every treebank label, WHADJP too, which no training tree has)."""
    gold = [parse_trees(line)[0] for line in read_lines(datamodule.gold_file("val"))]
    assert len(gold) == 273 and set(constituent_labels(gold)) <= set(raw.constraint.labels)
    outputs = datamodule.vocab.encode([linearize(tree, datamodule.linearization) for tree in gold])
    for tree, tokens in zip(gold, outputs):
        words = tree.leaves()
        assert raw.constraint.shape(tokens) == linearize(tree)
        assert raw.output(" ".join(words), tokens) == (str(delinearize(linearize(tree), words)), None)


def test_typed_words_come_back_as_typed_in_a_tree_of_the_outputs_shape(raw: RawText) -> None:
    """A well-formed output over the line's words: the leaves are the words as typed (brackets
    in the treebank's escapes), unknown characters included, and nothing is said to be repaired."""
    vocab = raw.vocab
    for line, ids in zip(TYPED, raw.encode(TYPED)):
        words = line.split()
        leaves = (vocab.piece_ids()["\u2581XX"],) * len(words) if raw.constraint.leaves == "xx" else tuple(ids)
        tokens = [vocab.piece_ids()["\u2581(S"], *leaves, vocab.piece_ids()["\u2581)S"], vocab.eos_id]
        tree, repaired = raw.output(line, tokens)
        assert repaired is None, (line, tree)
        assert tree == "(TOP (S " + " ".join(f"(XX {escaped(word)})" for word in words) + "))"
        assert parse_trees(tree)[0].leaves() == [escaped(word) for word in words]


def test_an_output_that_is_no_tree_over_the_words_is_repaired_and_said_so(raw: RawText) -> None:
    vocab = raw.vocab
    line = "She wrote (S on the board ."
    tree, repaired = raw.output(line, [vocab.piece_ids()["\u2581(S"], vocab.eos_id])  # no leaf at all
    assert parse_trees(tree)[0].leaves() == [escaped(word) for word in line.split()]
    assert repaired is not None and "0 leaves for the line's 7 words" in repaired
    assert raw.output(line, [vocab.eos_id])[0].startswith("(TOP (XX She)")  # an empty output: still every word


def test_the_translator_warns_of_each_repair_by_input_line(raw: RawText, caplog: pytest.LogCaptureFixture) -> None:
    """Unconstrained decoding of a random model: every output written as a tree over its line's
    words, each one repaired named by its input line; an empty line stays empty."""
    torch.manual_seed(0)
    model = Transformer(raw.vocab.vocab_size, raw.vocab.vocab_size, **SMALL).eval()
    lines = ["The café opened .", "", "A )NP B ."]
    settings = {"beam_size": 2, "alpha": 0.0, "max_len_offset": 5, "constrained": False}
    with caplog.at_level(logging.WARNING, logger="aiayn.decoding.translator"):
        texts = Translator(model, raw.vocab, settings, raw_text=raw).translations(lines).texts
    assert texts[1] == ""
    for line, text in zip(lines[::2], texts[::2]):
        assert parse_trees(text)[0].leaves() == [escaped(word) for word in line.split()]
    warned = [record.getMessage() for record in caplog.records]
    assert sorted(message.split(":")[0] for message in warned) == ["input line 1", "input line 3"], warned
    constrained = Translator(model, raw.vocab, {**settings, "constrained": True}, TreeConstraint(raw.vocab),
                             raw_text=raw)
    with caplog.at_level(logging.WARNING, logger="aiayn.decoding.translator"):
        caplog.clear()
        constrained.translations(lines)
    assert not caplog.records  # constrained decoding: a tree over the words as decoded


# Gold trees with words of characters the sample's vocabulary has not got: each word's pieces
# decode to text with the unknown piece between spaces (`café` → `caf ⁇`).
UNKNOWN = ["(TOP (S (NP (DT The) (NN café)) (VP (VBD opened) (PP (IN in) (NP (NNP Zürich)))) (. .)))",
           "(TOP (S (NP (NNP Müller)) (VP (VBD paid) (NP (CD €) (CD 5))) (. .)))",
           "(TOP (S (NP (PRP It)) (VP (VBD was) (ADJP (JJ naïve) (CC and) (JJ 日本))) (. .)))"]


def test_outputs_are_written_one_word_a_leaf_so_that_evaluate_scores_the_gold_words_in_place(
        datamodule: ParsingDataModule, raw: RawText) -> None:
    """RawText.decode, evaluate.py's hypotheses: a word with an unknown character stays one leaf
    (its pieces together, ``caf⁇``), so the scorer reads each output back as the tree it is, with
    the gold words in their places; for the sample's own trees it writes what sentencepiece
    decodes (those of labels the vocabulary has: a label it has not got is no bracket, but a word)."""
    from aiayn.data.parsing.datamodule import output_trees

    vocab = datamodule.vocab
    outputs = vocab.encode([linearize(parse_trees(gold)[0], datamodule.linearization) for gold in UNKNOWN])
    assert all(vocab.unk_id in ids for ids in vocab.encode(["café", "€", "naïve"]))  # characters it has not got
    texts = raw.decode(outputs)
    assert output_trees(UNKNOWN, texts) == UNKNOWN, texts
    for gold, text in zip(UNKNOWN, texts):  # one leaf a word
        assert len([token for token in text.split() if token[0] not in "()"]) == len(parse_trees(gold)[0].leaves())
    trees = [parse_trees(line)[0] for line in read_lines(datamodule.gold_file("val"))]
    dev = [linearize(tree, datamodule.linearization) for tree in trees  # those whose labels the model can write
           if set(constituent_labels([tree])) <= set(raw.constraint.labels)]
    ids = vocab.encode(dev)
    assert raw.decode(ids) == vocab.decode(ids) == dev
