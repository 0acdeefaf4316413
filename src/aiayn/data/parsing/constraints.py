"""Constrained decoding of linearised trees: only outputs that are well-formed trees over exactly
the input's words (§6.3's parser, Vinyals et al. 2015's output format).

The paper decodes parse trees with plain beam search (beam 21, α 0.3, input + 300); it says
nothing about outputs that are not trees. A model trained on little data often emits one ``XX``
too many or too few, and then every bracket after it lands on the wrong words. With
``decoding.constrained=true`` (the default of the parsing tasks; our choice, in the spirit
of the parsers that decode with a grammar) beam search may only take a token that keeps the
output a prefix of a well-formed linearisation:

- ``XX`` only while input words remain, and only inside the root constituent;
- an opening bracket ``(L`` only while a word remains to go inside it, not after the root has
  closed (one root), at most ``max_depth`` deep and at most ``max_opens_per_word`` in a row;
- a closing bracket only for the label that is open (``)NP`` closes ``(NP``), never right after
  its opening bracket (no empty constituent), and the root's only after the last word;
- end-of-sentence only when every word is placed and every bracket closed;
- and none of these when what is still needed (the remaining words, one closing bracket per
  open constituent, end-of-sentence) would no longer fit in the maximum output length.

So every finished hypothesis is a tree over exactly the input's word count, and beam search
always has a token it may take (a word or the one closing bracket that is due) until it ends
within the length limit. The masks are computed for all hypotheses at once from small per-
hypothesis counters on the model's device; the log-probabilities of the allowed tokens are
left as the model gives them (not renormalised), so constraints change which hypotheses
survive, not their scores.

The words of a source are counted as its pieces that begin a word (sentencepiece's ``▁``): one
per whitespace-separated word. A source holds words only, so a piece that is a tree symbol in the
output (``▁XX``: the word ``XX``, or the start of ``XXL``) begins a word there too.

With the ``words`` linearisation (leaves written as the words themselves) a leaf is the input's
next subword, copied: the output's leaves are exactly the input's pieces in order, and no
bracket or end-of-sentence comes between two pieces of one word.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from aiayn.data.parsing.linearize import LEAF
from aiayn.data.subwords import Subwords

SPACE = "\u2581"  # sentencepiece's word-boundary mark
_OTHER, _OPEN, _CLOSE, _LEAF, _EOS = range(5)


def has_tree_symbols(vocab: Subwords) -> bool:
    """Whether ``vocab`` has opening and closing brackets (``▁(L``, ``▁)L``), as a parser's has."""
    pieces = vocab.pieces(range(vocab.vocab_size))
    return all(any(piece.startswith(SPACE + bracket) and len(piece) > 2 for piece in pieces) for bracket in "()")


class TreeConstraint:
    """What tokens may follow, for every hypothesis of a batched beam search (see the module
    docstring). Built once per vocabulary; :meth:`start` gives the state of a batch of sources.

    ``max_depth`` bounds the nesting and ``max_opens_per_word`` the opening brackets between two
    words; on the treebank sample the deepest tree has 28 levels and no word has more than 6
    brackets opened right before it, so the defaults only rule out runaway outputs."""

    def __init__(self, vocab: Subwords, *, leaves: str | None = None, max_depth: int = 64,
                 max_opens_per_word: int = 12):
        """``leaves``: the linearisation's leaves, ``xx`` or ``words`` (None: ``xx`` when the
        vocabulary has the ``XX`` symbol, else ``words``)."""
        pieces = vocab.pieces(range(vocab.vocab_size))
        kind, label = [_OTHER] * len(pieces), [-1] * len(pieces)
        labels: dict[str, int] = {}
        for i, piece in enumerate(pieces):
            symbol = piece[1:] if piece.startswith(SPACE) else None
            if symbol == LEAF:
                kind[i] = _LEAF
            elif symbol and len(symbol) > 1 and symbol[0] in "()":
                kind[i] = _OPEN if symbol[0] == "(" else _CLOSE
                label[i] = labels.setdefault(symbol[1:], len(labels))
        kind[vocab.eos_id] = _EOS
        if _OPEN not in kind or _CLOSE not in kind:  # has_tree_symbols, read off the kinds just found
            raise ValueError("constrained decoding needs a parsing model: its vocabulary has no tree symbols "
                             f"('{SPACE}(L', '{SPACE})L'); use constrained=false")
        self.leaves = leaves or ("xx" if _LEAF in kind else "words")
        if self.leaves not in ("xx", "words"):
            raise ValueError(f"leaves must be xx or words, got {leaves!r}")
        if self.leaves == "xx" and _LEAF not in kind:
            raise ValueError(f"the vocabulary has no '{SPACE}{LEAF}' symbol for the xx linearisation's leaves")
        special = {vocab.pad_id, vocab.unk_id, vocab.bos_id, vocab.eos_id}
        self.pad_id, self.bos_id, self.eos_id = vocab.pad_id, vocab.bos_id, vocab.eos_id
        self.kind = torch.tensor(kind)  # (vocab,)
        self.label = torch.tensor(label)  # (vocab,): the label index of a bracket, -1 otherwise
        # (vocab,): the pieces that begin a word of the input (where a tree symbol's piece is a word's)
        self.starts_word = torch.tensor([p.startswith(SPACE) and i not in special for i, p in enumerate(pieces)])
        self.labels = list(labels)
        self._kinds, self._symbols = kind, [p[1:] if k in (_OPEN, _CLOSE) else LEAF for p, k in zip(pieces, kind)]
        self._skipped, self._begins = {vocab.pad_id, vocab.bos_id}, self.starts_word.tolist()
        self.max_depth, self.max_opens_per_word = max_depth, max_opens_per_word
        self._on: dict[torch.device, tuple[Tensor, Tensor, Tensor]] = {}

    def tables(self, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        if device not in self._on:
            self._on[device] = (self.kind.to(device), self.label.to(device), self.starts_word.to(device))
        return self._on[device]

    def read(self, tokens: Sequence[int]) -> list[tuple[str, list[int]]]:
        """An output's ``tokens`` read, up to end of sentence, as the symbols of the tree they make,
        each with its pieces: a bracket (``(L``, ``)L``) with its one piece, and a leaf as ``XX`` with
        its pieces (an ``XX``, or a word: a piece that begins one, or any other piece that follows no
        word piece, with the pieces that continue it). The words linearisation's leaves are so read
        by where words begin, whatever their pieces spell (the unknown piece included)."""
        out: list[tuple[str, list[int]]] = []
        in_word = False
        for token in map(int, tokens):
            kind = self._kinds[token]
            if kind == _EOS:
                break
            if token in self._skipped:
                continue
            if kind != _OTHER or not in_word or self._begins[token]:
                out.append((self._symbols[token], [token]))  # the bracket, or XX for a leaf
            else:
                out[-1][1].append(token)  # a piece that continues the word
            in_word = kind == _OTHER
        return out

    def shape(self, tokens: Sequence[int]) -> str:
        """The tree an output's ``tokens`` make (:meth:`read`), as the ``xx`` linearisation writes
        it: its brackets, and ``XX`` for each leaf."""
        return " ".join(symbol for symbol, _ in self.read(tokens))

    def words(self, src: Tensor) -> Tensor:
        """The number of words of each source (batch, src_len) → (batch,)."""
        starts_word = self.tables(src.device)[2]
        return starts_word[src].sum(-1)

    def leaf_count(self, src: Tensor) -> Tensor:
        """The leaf tokens an output of each source (batch, src_len) has: one ``XX`` per word, or
        (``words``) one per subword of the input → (batch,)."""
        if self.leaves == "xx":
            return self.words(src)
        return ((src != self.pad_id) & (src != self.bos_id) & (src != self.eos_id)).sum(-1)

    def start(self, src: Tensor, max_lengths: Tensor) -> TreeState:
        """The state of sources ``src`` (batch, src_len) before any output token, whose outputs
        may have ``max_lengths`` (batch,) tokens, end-of-sentence included."""
        batch, device = src.size(0), src.device
        zeros = torch.zeros(batch, dtype=torch.long, device=device)
        leaves = self.leaf_count(src)
        return TreeState(
            self, leaves=leaves, max_lengths=max_lengths.to(device),
            # a sentence whose smallest tree (root, leaves, closing, EOS) does not fit is decoded with
            # the structural rules only; the repair of delinearize reads whatever comes out
            roomy=max_lengths.to(device) >= leaves + 3,
            src=src if self.leaves == "words" else None,
            placed=zeros, depth=zeros, opens_in_a_row=zeros, length=0,
            last_opened=torch.zeros(batch, dtype=torch.bool, device=device),
            ended=torch.zeros(batch, dtype=torch.bool, device=device),
            stack=torch.full((batch, self.max_depth), -1, dtype=torch.long, device=device))


@dataclass(frozen=True)
class TreeState:
    """Per hypothesis (rows): the leaves placed, the open constituents' labels (``stack``, ``depth``
    deep), the opening brackets since the last word, whether the last token opened a constituent
    and whether EOS was taken; ``length`` output tokens so far (the same for every row)."""

    constraint: TreeConstraint
    leaves: Tensor  # (rows,) leaf tokens the output must have
    max_lengths: Tensor  # (rows,)
    roomy: Tensor  # (rows,) bool: the length limit can hold a tree over the words
    src: Tensor | None  # (rows, src_len): the input, whose pieces the words linearisation copies
    placed: Tensor  # (rows,) leaf tokens placed
    depth: Tensor  # (rows,)
    opens_in_a_row: Tensor  # (rows,)
    last_opened: Tensor  # (rows,) bool
    ended: Tensor  # (rows,) bool
    stack: Tensor  # (rows, max_depth): label indices, the innermost open one at depth - 1
    length: int

    def allowed(self) -> Tensor:
        """(rows, vocab) bool: the tokens each hypothesis may take next."""
        kind, label, starts_word = self.constraint.tables(self.leaves.device)
        left = self.leaves - self.placed  # (rows,) leaves still to place
        started = self.length > 0
        if self.src is None:  # XX, one per word
            is_leaf = (kind == _LEAF)[None]  # (1, vocab)
            inside_word = torch.zeros_like(self.ended)  # (rows,)
        else:  # the input's next piece; between two pieces of a word nothing else
            following = self._next_piece()  # (rows,)
            is_leaf = torch.arange(kind.numel(), device=kind.device)[None] == following[:, None]  # (rows, vocab)
            inside_word = (left > 0) & (self.placed > 0) & ~starts_word[following]
        # output tokens still possible after the next one (EOS counted), and what each kind of
        # token leaves to do: the leaves left, one closing bracket per open constituent, EOS
        room = self.max_lengths - (self.length + 1)  # (rows,)
        fits = lambda leaves, depth: ~self.roomy | (room >= leaves + depth + 1)  # (rows,)
        live = ~self.ended
        may_open = (live & (left > 0) & ~inside_word & (self.depth < self.constraint.max_depth)
                    & (self.opens_in_a_row < self.constraint.max_opens_per_word) & fits(left, self.depth + 1))
        if started:  # one root: nothing opens at depth 0 once the output has begun
            may_open &= self.depth > 0
        may_place = live & (left > 0) & (self.depth > 0) & fits(left - 1, self.depth)
        may_close = (live & (self.depth > 0) & ~inside_word & ~self.last_opened & ((self.depth > 1) | (left == 0))
                     & fits(left, self.depth - 1))
        may_end = self.ended | ((self.depth == 0) & (left == 0) & (started | (self.leaves == 0)))
        innermost = self.stack.gather(1, (self.depth - 1).clamp(min=0)[:, None])  # (rows, 1)
        # (rows, 1) & (1, vocab) → (rows, vocab)
        return (((kind == _OPEN)[None] & may_open[:, None])
                | (is_leaf & may_place[:, None])
                | ((kind == _CLOSE)[None] & may_close[:, None] & (label[None] == innermost))
                | ((kind == _EOS)[None] & may_end[:, None]))

    def _next_piece(self) -> Tensor:
        """(rows,): the input piece the words linearisation places next (any, when none is left)."""
        at = self.placed.clamp(max=self.src.size(1) - 1)[:, None]  # the pieces come first in src
        return self.src.gather(1, at).squeeze(1)

    def select(self, rows: Tensor) -> TreeState:
        """The states of hypotheses ``rows`` (beam reordering, finished sentences leaving)."""
        pick = lambda t: t.index_select(0, rows)
        return replace(self, leaves=pick(self.leaves), max_lengths=pick(self.max_lengths), roomy=pick(self.roomy),
                       src=pick(self.src) if self.src is not None else None,
                       placed=pick(self.placed), depth=pick(self.depth), opens_in_a_row=pick(self.opens_in_a_row),
                       last_opened=pick(self.last_opened), ended=pick(self.ended), stack=pick(self.stack))

    def advance(self, tokens: Tensor) -> TreeState:
        """The states after each hypothesis takes ``tokens`` (rows,). A token that was not allowed
        (only a hypothesis of score -inf takes one) leaves its counters within bounds."""
        kind, label, _ = self.constraint.tables(tokens.device)
        kinds, labels = kind[tokens], label[tokens]  # (rows,) each
        opens, closes = kinds == _OPEN, kinds == _CLOSE
        leaves = kinds == _LEAF if self.src is None else (tokens == self._next_piece()) & (self.placed < self.leaves)
        at = self.depth.clamp(max=self.constraint.max_depth - 1)[:, None]  # (rows, 1)
        stack = self.stack.scatter(1, at, torch.where(opens[:, None], labels[:, None], self.stack.gather(1, at)))
        return replace(
            self, stack=stack, length=self.length + 1,
            placed=self.placed + leaves.long(),
            depth=(self.depth + opens.long() - closes.long()).clamp(0, self.constraint.max_depth),
            opens_in_a_row=torch.where(leaves, 0, self.opens_in_a_row + opens.long()),
            last_opened=opens, ended=self.ended | (kinds == _EOS))
