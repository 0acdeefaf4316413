"""Labelled-bracket F1 of constituency parses, computed as EVALB does with its COLLINS.prm
settings: the figure of the paper's Table 4 (§6.3, "WSJ 23 F1").

What is counted, as in EVALB (Sekine and Collins, 1997) with COLLINS.prm:

- a tree is a line of brackets; ``(TAG word)`` is a word with its tag, every other bracket is a
  constituent spanning the words inside it;
- words tagged with a deleted label (``-NONE-`` and the punctuation tags ``,`` ``:`` `````
  ``''`` ``.``) are removed before positions are counted, so a constituent's span ignores
  punctuation at its edges, and each tree is judged by its own tags;
- constituents labelled ``TOP`` (the root) and those spanning no word are not counted;
- labels are cut at the first ``-`` or ``=`` (``NP-SBJ`` → ``NP``) and ``ADVP`` equals ``PRT``;
- brackets match as multisets: each gold bracket takes at most one test bracket of the same
  span and label, and the other way round;
- a sentence whose two trees have different words (after deletion) is an error sentence, left
  out of the totals (EVALB's "Number of Error sentence"); one whose test tree has no word is
  skipped likewise.

Recall = matched / gold brackets, precision = matched / test brackets, F1 their harmonic mean,
all over the corpus; exact match = sentences whose bracket multisets are equal ("Complete
match"). Depends on nothing else of aiayn: it reads bracket strings itself.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

DELETE_LABELS = frozenset({"TOP", "-NONE-", ",", ":", "``", "''", "."})
"""COLLINS.prm DELETE_LABEL: the root and these tags' words are not scored."""
EQUAL_LABELS = {"PRT": "ADVP"}
"""COLLINS.prm EQ_LABEL ADVP PRT."""
_TOKEN = re.compile(r"\(|\)|[^\s()]+")


class TreeFormatError(ValueError):
    """A tree string that is not a balanced bracketing."""


@dataclass(frozen=True)
class Brackets:
    """What EVALB keeps of one tree: its words (deleted ones removed) and its brackets as
    (label, start, end) with word positions counted without the deleted words."""

    words: tuple[str, ...]
    brackets: Counter = field(default_factory=Counter)


def tree_brackets(tree: str) -> Brackets:
    """The scored words and brackets of a one-line tree such as ``(TOP (S (NP (DT a) (NN b))))``."""
    tokens = _TOKEN.findall(tree)
    words: list[str] = []
    brackets: Counter = Counter()
    stack: list[tuple[str, int]] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token == "(":
            label = tokens[i + 1] if i + 1 < len(tokens) and tokens[i + 1] not in "()" else ""
            i += 1 if label == "" else 2
            # (TAG word): a terminal
            if i + 1 < len(tokens) and tokens[i] not in "()" and tokens[i + 1] == ")":
                if label not in DELETE_LABELS:
                    words.append(tokens[i])
                i += 2
                continue
            stack.append((label, len(words)))
        elif token == ")":
            if not stack:
                raise TreeFormatError(f"unbalanced brackets (a ')' with nothing open) in {tree!r}")
            label, start = stack.pop()
            label = _scored_label(label)
            if start < len(words) and label not in DELETE_LABELS:
                brackets[(label, start, len(words))] += 1
            i += 1
        else:
            raise TreeFormatError(f"{token!r} is not inside a (TAG word) bracket in {tree!r}")
    if stack:
        raise TreeFormatError(f"unbalanced brackets ({len(stack)} left open) in {tree!r}")
    return Brackets(tuple(words), brackets)


def _scored_label(label: str) -> str:
    # EVALB's modify_label: cut at the first '-' or '='; then EQ_LABEL
    label = re.split(r"[-=]", label, maxsplit=1)[0]
    return EQUAL_LABELS.get(label, label)


@dataclass
class ParsevalResult:
    """Corpus totals, EVALB's "All" section. Percentages are 0–100."""

    sentences: int = 0
    error_sentences: int = 0
    skipped_sentences: int = 0
    gold_brackets: int = 0
    test_brackets: int = 0
    matched_brackets: int = 0
    exact_matches: int = 0
    crossing_brackets: int = 0

    @property
    def valid_sentences(self) -> int:
        return self.sentences - self.error_sentences - self.skipped_sentences

    @property
    def recall(self) -> float:
        return 100.0 * self.matched_brackets / self.gold_brackets if self.gold_brackets else 0.0

    @property
    def precision(self) -> float:
        return 100.0 * self.matched_brackets / self.test_brackets if self.test_brackets else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    @property
    def exact_match(self) -> float:
        return 100.0 * self.exact_matches / self.valid_sentences if self.valid_sentences else 0.0

    def as_dict(self) -> dict[str, float]:
        return {"f1": self.f1, "precision": self.precision, "recall": self.recall, "exact_match": self.exact_match,
                "sentences": self.sentences, "error_sentences": self.error_sentences,
                "skipped_sentences": self.skipped_sentences, "gold_brackets": self.gold_brackets,
                "test_brackets": self.test_brackets, "matched_brackets": self.matched_brackets,
                "crossing_brackets": self.crossing_brackets}


def parseval(gold: Sequence[str], test: Sequence[str]) -> ParsevalResult:
    """EVALB (COLLINS.prm) totals of ``test`` trees against ``gold`` trees, one per sentence."""
    if len(gold) != len(test):
        raise ValueError(f"{len(gold)} gold trees but {len(test)} test trees; they must be aligned")
    result = ParsevalResult()
    for gold_tree, test_tree in zip(gold, test):
        result.sentences += 1
        g, t = tree_brackets(gold_tree), tree_brackets(test_tree)
        if not t.words:
            result.skipped_sentences += 1
            continue
        if g.words != t.words:
            result.error_sentences += 1
            continue
        matched = sum((g.brackets & t.brackets).values())
        n_gold, n_test = sum(g.brackets.values()), sum(t.brackets.values())
        result.gold_brackets += n_gold
        result.test_brackets += n_test
        result.matched_brackets += matched
        result.exact_matches += n_gold == n_test == matched
        result.crossing_brackets += _crossing(g.brackets, t.brackets)
    return result


def _crossing(gold: Counter, test: Counter) -> int:
    """Test brackets that cross at least one gold bracket (EVALB's "Cross Bracket")."""
    gold_spans = {(s, e) for _, s, e in gold}
    count = 0
    for (_, ts, te), n in test.items():
        if any(gs < ts < ge < te or ts < gs < te < ge for gs, ge in gold_spans):
            count += n
    return count
