"""Trees as token sequences and back, as in Vinyals et al. (2015), the paper's [37] (§6.3).

The input of the parser is the sentence's words; its output is the tree in depth-first order
with every part-of-speech tag replaced by ``XX`` and every closing bracket labelled::

    (TOP (S (NP (NNP John)) (VP (VBZ has) (NP (DT a) (NN dog))) (. .)))
    → (S (NP XX )NP (VP XX (NP XX XX )NP )VP XX )S

:func:`delinearize` reads any output back as a valid tree over the input's words: it puts the
words and their tags back in place of the ``XX`` (so that EVALB can delete punctuation as it
does in the gold tree), and repairs what a decoder can get wrong (see its docstring).
"""

from __future__ import annotations

from collections.abc import Sequence

from aiayn.data.parsing.treebank import ROOT_LABEL, Tree

LEAF = "XX"
"""The normalised part-of-speech tag (Vinyals et al., 2015: "we normalized all POS tags to XX")."""


LINEARIZATIONS = ("xx", "words")
"""How leaves are written: ``xx``, Vinyals et al.'s (the paper's), or ``words``, the word itself."""


def linearize(tree: Tree, leaves: str = "xx") -> str:
    """The output sequence of a tree, space-separated; the root (``TOP``) is left out.

    ``leaves="words"`` writes each word instead of ``XX`` (not the paper's; our option for small
    data): ``(S (NP John )NP (VP has (NP a dog )NP )VP . )S``. The decoder then reads the words
    it has placed, and constrained decoding copies them from the input
    (:mod:`aiayn.data.parsing.constraints`), so it never loses count of them."""
    if leaves not in LINEARIZATIONS:
        raise ValueError(f"leaves must be one of {', '.join(LINEARIZATIONS)}, got {leaves!r}")
    tokens: list[str] = []
    for child in tree.children:
        _walk(child, tokens, leaves == "words")
    return " ".join(tokens)


def _walk(node: Tree | str, tokens: list[str], words: bool) -> None:
    if isinstance(node, str) or node.is_preterminal:
        tokens.append((node if isinstance(node, str) else node.children[0]) if words else LEAF)
        return
    tokens.append(f"({node.label}")
    for child in node.children:
        _walk(child, tokens, words)
    tokens.append(f"){node.label}")


def constituent_labels(trees: Sequence[Tree]) -> list[str]:
    """The constituent labels of ``trees`` (preterminals excluded), sorted."""
    labels: set[str] = set()
    stack: list[Tree] = [child for tree in trees for child in tree.children if isinstance(child, Tree)]
    while stack:
        node = stack.pop()
        if not node.is_preterminal:
            labels.add(node.label)
            stack.extend(child for child in node.children if isinstance(child, Tree))
    return sorted(labels)


def output_symbols(labels: Sequence[str], leaves: str = "xx") -> list[str]:
    """The output tokens of a label set: ``(L`` and ``)L`` for each label, and ``XX`` (for the
    ``xx`` linearisation; with ``words`` the leaves are the words' own subwords)."""
    brackets = [symbol for label in labels for symbol in (f"({label}", f"){label}")]
    return [LEAF, *brackets] if leaves == "xx" else brackets


def delinearize(output: str, words: Sequence[str], tags: Sequence[str] | None = None) -> Tree:
    """A tree over exactly ``words`` from an output sequence, whatever the sequence is.

    Each leaf token (``XX``, or any token that is not a bracket) takes the next word, tagged
    with its tag from ``tags`` (``XX`` without them). Repairs, where the paper and Vinyals et al.
    are silent (our choices): leaf tokens beyond the last word are dropped (an over-long
    output); a closing bracket closes the innermost open constituent whatever its label, and one
    with nothing open is ignored; constituents still open at the end are closed; words the
    output did not place are attached, in order, to the root's last child when that is a
    constituent (else to the root), i.e. at the end of the sentence; constituents that end up without words are removed. A tree read
    from :func:`linearize`'s output with its own words and tags is the tree itself.
    """
    if tags is not None and len(tags) != len(words):
        raise ValueError(f"{len(words)} words but {len(tags)} tags")
    tags = list(tags) if tags is not None else [LEAF] * len(words)
    root = Tree(ROOT_LABEL)
    stack = [root]
    placed = 0
    for token in output.split():
        if token.startswith("(") and len(token) > 1:
            node = Tree(token[1:])
            stack[-1].children.append(node)
            stack.append(node)
        elif token.startswith(")"):
            if len(stack) > 1:
                stack.pop()
        elif token == "(":
            continue  # a bare bracket carries no label: nothing to build
        elif placed < len(words):
            stack[-1].children.append(Tree(tags[placed], [words[placed]]))
            placed += 1
    if placed < len(words):  # at the end of the sentence, so that word order is kept
        last = root.children[-1] if root.children else None
        target = last if last is not None and not last.is_preterminal else root
        target.children.extend(Tree(tags[i], [words[i]]) for i in range(placed, len(words)))
    return _without_empty(root) or Tree(ROOT_LABEL)


def _without_empty(node: Tree) -> Tree | None:
    if node.is_preterminal:
        return node
    children = [c for c in (_without_empty(child) for child in node.children) if c is not None]
    return Tree(node.label, children) if children else None
