"""A parser on raw text (translate.py): a line's words in, one tree over exactly those words out.

The treebank's words hold no bracket (it writes ``(`` as ``-LRB-``), but typed text may, and the
parser's vocabulary reads ``(S`` or ``)NP`` at a word's start as one of its tree symbols. So each
word is given to the model as the treebank writes it (:func:`~aiayn.data.parsing.treebank.escaped`)
and encoded on its own, which is how sentencepiece encodes a sentence's words anyway; a word that
does not come out as one word (one that normalisation removes, or splits in two) is given as an
unknown word, the word mark and the unknown piece.

An output is read back by its shape alone (:meth:`TreeConstraint.shape`: its brackets and where its
leaves are), and :func:`~aiayn.data.parsing.linearize.delinearize`, the reading that evaluate.py
scores with, puts the line's own words into the leaves, tagged ``XX``: a character the vocabulary
does not know, or a word that looks like a bracket, comes back as typed (with the treebank's
bracket escapes, as a bracketed tree must write it). An output that is not a tree over exactly the
line's words (constrained decoding off, a line cut to the model's length) is written as
``delinearize`` repairs it, and :meth:`RawText.output` says what was wrong.

:meth:`RawText.decode` writes an output as its linearisation instead (evaluate.py's hypotheses, what
its F1 reads back over the gold trees' words), read the same way: one space-separated token per
symbol of the tree, each word's pieces together. Decoded as text, a word with a character the
vocabulary does not know would fall in two (``café`` → ``caf ⁇``: sentencepiece writes the unknown
piece between spaces), and every word after it would be put in the wrong leaf.
"""

from __future__ import annotations

from collections.abc import Sequence

from aiayn.data.parsing.constraints import SPACE, TreeConstraint
from aiayn.data.parsing.linearize import LEAF, delinearize, linearize
from aiayn.data.parsing.treebank import escaped
from aiayn.data.subwords import Subwords


class RawText:
    """How a parser of ``vocab`` reads lines of text and writes its outputs as trees over their
    words, reading them with ``constraint``, the tree constraint of ``vocab`` its decoding uses
    (None: one built here); a ValueError when ``vocab`` has no tree symbols (no parser's)."""

    def __init__(self, vocab: Subwords, constraint: TreeConstraint | None = None):
        self.vocab, self.constraint = vocab, constraint if constraint is not None else TreeConstraint(vocab)
        self._begins = self.constraint.starts_word.tolist()  # by piece: whether it begins a word
        space = vocab.piece_ids().get(SPACE)
        self._unknown = [vocab.unk_id] if space is None else [space, vocab.unk_id]

    def encode(self, sentences: Sequence[str]) -> list[list[int]]:
        """The source ids of each line (no BOS/EOS): each whitespace-separated word, escaped and
        encoded on its own, one word of the source (its first piece alone begins a word)."""
        words = [sentence.split() for sentence in sentences]
        flat = [escaped(word) for line in words for word in line]
        pieces = iter(self.vocab.encode(flat) if flat else [])
        begins = self._begins
        out = []
        for line in words:
            ids: list[int] = []
            for _ in line:
                word = next(pieces)
                one = bool(word) and begins[word[0]] and not any(begins[i] for i in word[1:])
                ids.extend(word if one else self._unknown)
            out.append(ids)
        return out

    def output(self, sentence: str, tokens: Sequence[int]) -> tuple[str, str | None]:
        """The output ``tokens`` of ``sentence`` as a one-line tree over its words (EVALB's
        format, ``(TOP ...)``), and None, or what was wrong with the output when it had to be
        repaired to be such a tree."""
        words = [escaped(word) for word in sentence.split()]
        shape = self.constraint.shape(tokens)
        tree = delinearize(shape, words)
        if linearize(tree) == shape:
            return str(tree), None
        leaves = shape.split().count(LEAF)
        wrong = (f"has {leaves} leaves for the line's {len(words)} words" if leaves != len(words)
                 else "is not a well-formed tree")
        return str(tree), (f"the parser's output {wrong}; written as repaired (words it left out at the end, "
                           "brackets closed or dropped)")

    def decode(self, outputs: Sequence[Sequence[int]]) -> list[str]:
        """Each output's tokens as the text of its linearisation, one space-separated token per
        symbol of the tree :meth:`TreeConstraint.read` finds: each bracket, and each leaf, an ``XX``
        or a word's pieces decoded together with no space inside (``caf⁇``, the unknown piece
        included; a bracket written ``-LRB-``/``-RRB-``), so that ``delinearize`` finds the same tree."""
        read = [self.constraint.read(tokens) for tokens in outputs]
        leaves = [pieces for symbols in read for symbol, pieces in symbols if symbol == LEAF]
        words = iter(self.vocab.decode(leaves) if leaves else [])
        texts = []
        for symbols in read:
            written = []
            for symbol, pieces in symbols:
                if symbol == LEAF:  # a piece that spells nothing (a lone ▁) is written as itself
                    symbol = escaped("".join(next(words).split()) or "".join(self.vocab.pieces(pieces)))
                written.append(symbol)
            texts.append(" ".join(written))
        return texts
