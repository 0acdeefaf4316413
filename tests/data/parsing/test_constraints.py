"""Constrained decoding of linearised trees on the real treebank sample's vocabulary: every
finished output of a beam or greedy search is a well-formed tree over exactly the input's words."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from aiayn.data.parsing.constraints import TreeConstraint
from aiayn.data.parsing.datamodule import ParsingDataModule
from aiayn.data.parsing.linearize import LEAF, delinearize, linearize
from aiayn.data.readers import read_lines
from aiayn.data.subwords import Subwords, train_or_load
from aiayn.model import Transformer, beam_search, greedy_search
from tests.helpers.treebank import SMALL

pytestmark = pytest.mark.usefixtures("single_thread")

@pytest.fixture(scope="module")
def constraint(datamodule: ParsingDataModule) -> TreeConstraint:
    return TreeConstraint(datamodule.vocab)


def sources(vocab: Subwords, sentences: list[str]) -> torch.Tensor:
    """Source ids + EOS, right-padded (what the data modules' collator gives the search)."""
    ids = [seq + [vocab.eos_id] for seq in vocab.encode(sentences)]
    src = torch.full((len(ids), max(map(len, ids))), vocab.pad_id)
    for i, seq in enumerate(ids):
        src[i, : len(seq)] = torch.tensor(seq)
    return src


def random_model(vocab: Subwords, seed: int) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(vocab.vocab_size, vocab.vocab_size, **SMALL).eval()


def well_formed(output: str, words: list[str]) -> bool:
    """A linearised tree with one root, labelled closings that match, no empty constituent and
    one leaf per word (``XX``, or the word itself in order): exactly what :func:`linearize` gives
    for some tree over ``words``."""
    leaves = "xx" if LEAF in output.split() else "words"
    return linearize(delinearize(output, words), leaves) == output


@pytest.mark.slow
def test_words_are_counted_as_whitespace_words(datamodule: ParsingDataModule, constraint: TreeConstraint) -> None:
    assert constraint.leaves == datamodule.linearization
    for split in ("val", "test"):
        sentences = datamodule.sources(split)
        counted = constraint.words(sources(datamodule.vocab, sentences)).tolist()
        assert counted == [len(sentence.split()) for sentence in sentences]


@pytest.mark.parametrize("datamodule", ["xx"], indirect=True)
@pytest.mark.slow
def test_the_allowed_tokens_follow_the_tree_step_by_step(datamodule: ParsingDataModule,
                                                         constraint: TreeConstraint) -> None:
    vocab = datamodule.vocab
    src = sources(vocab, ["Pierre Vinken"])  # two words
    state = constraint.start(src, torch.tensor([40]))

    def allowed() -> set[str]:
        return {piece.removeprefix("\u2581") for piece, ok in zip(vocab.pieces(range(vocab.vocab_size)),
                                                                   state.allowed()[0].tolist()) if ok}

    labels = set(constraint.labels)
    opens = {f"({label}" for label in labels}
    assert allowed() == opens  # a root first: no word, closing bracket or EOS
    for token, expected in [
        ("(S", opens | {LEAF}),  # no ")S" right after "(S": no empty constituent
        ("(NP", opens | {LEAF}),
        ("XX", opens | {LEAF, ")NP"}),  # only the open label closes
        ("XX", {")NP"}),  # both words placed: nothing opens, no XX
        (")NP", {")S"}),
        (")S", {"</s>"}),  # EOS only once the root is closed over every word
    ]:
        state = state.advance(torch.tensor(vocab.encode([token])[0]))
        assert allowed() == expected, token


@pytest.mark.parametrize("datamodule", ["words"], indirect=True)
@pytest.mark.slow
def test_words_are_copied_piece_by_piece(datamodule: ParsingDataModule, constraint: TreeConstraint) -> None:
    vocab = datamodule.vocab
    assert constraint.leaves == "words" and TreeConstraint(vocab).leaves == "words"
    pierre, vinken = (vocab.encode([word])[0] for word in ("Pierre", "Vinken"))
    assert len(pierre) > 1, "a word of several pieces, to test that nothing comes between them"
    state = constraint.start(sources(vocab, ["Pierre Vinken"]), torch.tensor([40]))
    labels = set(constraint.labels)
    opens = {vocab.encode([f"({label}"])[0][0] for label in labels}
    close = lambda label: vocab.encode([f"){label}"])[0][0]
    allowed = lambda: set(state.allowed()[0].nonzero().squeeze(1).tolist())
    assert allowed() == opens
    steps = [(vocab.encode(["(S"])[0][0], opens | {pierre[0]}), (pierre[0], {pierre[1]})]
    steps += [(piece, {following}) for piece, following in itertools.pairwise(pierre)]
    steps += [(pierre[-1], opens | {vinken[0]}), *[(piece, set()) for piece in vinken]]  # the root stays open
    for token, expected in steps:
        state = state.advance(torch.tensor([token]))
        if expected:
            assert allowed() == expected, vocab.pieces([token])
    assert allowed() == {close("S")}  # every piece placed: only the root's closing bracket
    state = state.advance(torch.tensor([close("S")]))
    assert allowed() == {vocab.eos_id}


@pytest.mark.parametrize("datamodule", ["words"], indirect=True)
def test_the_words_linearisation_leaves_are_the_sources_pieces(datamodule: ParsingDataModule) -> None:
    """What the constraint copies is what training saw: a tree's leaves, encoded in the target,
    are the source's pieces in order."""
    vocab = datamodule.vocab
    symbols = {piece for piece in vocab.pieces(range(vocab.vocab_size)) if piece[1:2] in ("(", ")")}
    compared = 0
    for words, linear in zip(datamodule.sources("val"), datamodule.references("val")):
        if any(token[0] in "()" and "\u2581" + token not in symbols for token in linear.split()):
            continue  # a label the training trees never had: no symbol of its own
        ids = vocab.encode([linear])[0]
        assert [i for i, piece in zip(ids, vocab.pieces(ids)) if piece not in symbols] == vocab.encode([words])[0]
        compared += 1
    assert compared >= 270


@pytest.mark.slow
@pytest.mark.parametrize("search", ["beam4", "beam21", "greedy"])
def test_every_output_of_a_random_model_is_a_tree_over_the_words(datamodule: ParsingDataModule,
                                                                  constraint: TreeConstraint, search: str) -> None:
    vocab = datamodule.vocab
    sentences = datamodule.sources("val")[: 8 if search == "beam21" else 24]
    model, src = random_model(vocab, seed=3), sources(vocab, sentences)
    settings = {"bos_id": vocab.bos_id, "eos_id": vocab.eos_id, "max_len_offset": 300, "constraint": constraint}
    if search == "greedy":
        hypotheses = greedy_search(model, src, **settings)
    else:
        hypotheses = beam_search(model, src, beam_size=int(search[4:]), alpha=0.3, **settings)
    outputs = vocab.decode(hypotheses)
    for sentence, output in zip(sentences, outputs):
        assert well_formed(output, sentence.split()), (sentence, output)
    # the same model without constraints: its outputs are not trees over the words
    free = vocab.decode(beam_search(model, src, beam_size=4, alpha=0.3, bos_id=vocab.bos_id, eos_id=vocab.eos_id,
                                    max_len_offset=300))
    assert not any(well_formed(output, sentence.split()) for sentence, output in zip(sentences, free))


@pytest.mark.slow
@pytest.mark.parametrize("room", [0, 1, 7, 300])
def test_random_walks_through_the_allowed_tokens_end_in_a_tree_within_the_limit(
        datamodule: ParsingDataModule, constraint: TreeConstraint, room: int) -> None:
    """Whatever allowed token is taken at each step, some token stays allowed and the output ends
    with EOS, a tree over the words, within a limit of the smallest tree (root, words, closing
    bracket, EOS: words + 3 tokens) plus ``room``."""
    vocab = datamodule.vocab
    sentences = datamodule.sources("val")
    words = [len(sentence.split()) for sentence in sentences]
    leaves = words if datamodule.linearization == "xx" else [len(vocab.encode([s])[0]) for s in sentences]
    limits = torch.tensor(leaves) + 3 + room
    state = constraint.start(sources(vocab, sentences), limits)
    generator = torch.Generator().manual_seed(room)
    outputs: list[list[int]] = [[] for _ in sentences]
    for _ in range(int(limits.max())):
        allowed = state.allowed()  # (sentences, vocab)
        assert allowed.any(-1).all()
        # a random allowed token per sentence (EOS again for those already ended)
        tokens = torch.multinomial(allowed.float(), 1, generator=generator).squeeze(1)
        for output, token in zip(outputs, tokens.tolist()):
            output.append(token)
        state = state.advance(tokens)
        if state.ended.all():
            break
    for sentence, output, limit in zip(sentences, outputs, limits.tolist()):
        length = output.index(vocab.eos_id) + 1  # EOS taken, within the limit
        assert length <= limit
        assert well_formed(vocab.decode([output])[0], sentence.split())
    if room == 0:  # no room for anything but the root: exactly the smallest tree
        assert all(output.index(vocab.eos_id) == n + 2 for output, n in zip(outputs, leaves))


@pytest.mark.slow
def test_without_a_constraint_the_search_is_unchanged(datamodule: ParsingDataModule) -> None:
    """The constraint is only consulted when given: a constraint that allows everything gives
    the unconstrained search's outputs exactly."""

    class Anything:
        def start(self, src, max_lengths):
            return self

        def allowed(self):
            return torch.ones(1, datamodule.vocab.vocab_size, dtype=torch.bool)

        def select(self, rows):
            return self

        def advance(self, tokens):
            return self

    vocab = datamodule.vocab
    src = sources(vocab, datamodule.sources("val")[:8])
    model = random_model(vocab, seed=7)
    settings = {"bos_id": vocab.bos_id, "eos_id": vocab.eos_id, "beam_size": 4, "alpha": 0.3, "max_len_offset": 30}
    assert beam_search(model, src, **settings) == beam_search(model, src, constraint=Anything(), **settings)


def test_a_translation_vocabulary_is_refused(data_root: Path, tmp_path: Path) -> None:
    lines = read_lines(data_root / "multi30k" / "test_2016_flickr.en.gz")
    vocab = train_or_load(lines, 300, tmp_path)
    with pytest.raises(ValueError, match="no tree symbols"):
        TreeConstraint(vocab)
