"""Reading the Penn Treebank (WSJ) in LDC's Treebank-3 layout, for English constituency
parsing (§6.3, "the Wall Street Journal (WSJ) portion of the Penn Treebank").

Trees are read from ``<root>/parsed/mrg/wsj/SS/wsj_SSNN.mrg`` (section ``SS``, file ``NN``);
a split is a list of sections or file ranges (:func:`split_files`), so the standard split
(train 02–21, dev 22, test 23) and any split of a partial copy (e.g. the 10% sample, sections
00–01 only) are both a string. :func:`preprocess` applies the usual preprocessing of parsing
work: traces (``-NONE-``) and the constituents they leave empty are removed, function tags and
indices are stripped (``NP-SBJ-1`` → ``NP``), punctuation is kept.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from aiayn.errors import DataError

ROOT_LABEL = "TOP"
"""The label of every tree's root: the treebank's unlabelled outermost bracket ``( (S ...) )``
is read as ``(TOP (S ...))``, the label EVALB's COLLINS.prm deletes."""

TRACE_TAG = "-NONE-"
TREEBANK_LABELS = ("ADJP", "ADVP", "CONJP", "FRAG", "INTJ", "LST", "NAC", "NP", "NX", "PP", "PRN", "PRT", "QP", "RRC",
                   "S", "SBAR", "SBARQ", "SINV", "SQ", "UCP", "VP", "WHADJP", "WHADVP", "WHNP", "WHPP", "X")
"""The constituent labels of the Penn Treebank II (Bies et al., 1995, its bracketing guidelines):
a parser's vocabulary has a symbol for each, whether or not its training trees use it, so that a
dev or test tree's rare label is read as a label, not spelt as a word's subwords."""

WSJ_DIR = Path("parsed") / "mrg" / "wsj"
_FILE_NAME = re.compile(r"wsj_(\d\d)(\d\d)\.mrg$")
_TOKEN = re.compile(r"\(|\)|[^\s()]+")
_BRACKETS = {"(": "-LRB-", ")": "-RRB-"}


def escaped(word: str) -> str:
    """A word as the treebank writes it, where brackets are structure: each ``(`` as ``-LRB-`` and
    each ``)`` as ``-RRB-`` (the treebank's own words hold no other), e.g. ``(S`` → ``-LRB-S``."""
    for bracket, name in _BRACKETS.items():
        word = word.replace(bracket, name)
    return word


@dataclass
class Tree:
    """A constituent: its label and its children, which are trees or (for a preterminal, whose
    label is the part-of-speech tag) exactly one word."""

    label: str
    children: list[Tree | str] = field(default_factory=list)

    @property
    def is_preterminal(self) -> bool:
        return len(self.children) == 1 and isinstance(self.children[0], str)

    def leaves(self) -> list[str]:
        """The words, left to right."""
        return [word for _, word in self.tagged_words()]

    def tags(self) -> list[str]:
        """The part-of-speech tag of each word."""
        return [tag for tag, _ in self.tagged_words()]

    def tagged_words(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        stack: list[Tree | str] = [self]
        while stack:
            node = stack.pop()
            if isinstance(node, str):
                raise ValueError(f"a word {node!r} outside a preterminal in {self}")  # noqa: TRY004 - a malformed tree
            if node.is_preterminal:
                out.append((node.label, node.children[0]))
            else:
                stack.extend(reversed(node.children))
        return out

    def __str__(self) -> str:
        """One line, the bracketed form EVALB reads: ``(TOP (S (NP (DT The) (NN dog)) ...))``."""
        parts: list[str] = []
        self._write(parts)
        return "".join(parts)

    def _write(self, parts: list[str]) -> None:
        parts.append(f"({self.label}")
        for child in self.children:
            parts.append(" ")
            if isinstance(child, str):
                parts.append(child)
            else:
                child._write(parts)
        parts.append(")")


def parse_trees(text: str, source: str = "<string>", first_line: int = 1) -> list[Tree]:
    """Every bracketed tree in ``text`` (one or many lines); unbalanced brackets or words
    outside a tree raise a :class:`DataError` naming ``source`` and the line."""
    trees: list[Tree] = []
    stack: list[Tree] = []
    opened_at: list[int] = []
    for line_number, line in enumerate(text.split("\n"), start=first_line):
        tokens = _TOKEN.findall(line)
        position = 0
        while position < len(tokens):
            token = tokens[position]
            position += 1
            if token == "(":
                label = ""
                if position < len(tokens) and tokens[position] not in "()":
                    label = tokens[position]
                    position += 1
                node = Tree(label)
                if stack:
                    stack[-1].children.append(node)
                stack.append(node)
                opened_at.append(line_number)
            elif token == ")":
                if not stack:
                    raise DataError(f"{source}: line {line_number}: a closing bracket with no open bracket "
                                    f"(unbalanced brackets); fix or remove the tree there")
                node = stack.pop()
                opened_at.pop()
                if not node.children:
                    raise DataError(f"{source}: line {line_number}: an empty bracket '({node.label})'; "
                                    f"fix or remove the tree there")
                if not stack:
                    trees.append(_rooted(node))
            elif stack:
                stack[-1].children.append(token)
            else:
                raise DataError(f"{source}: line {line_number}: {token!r} outside any tree; "
                                f"fix or remove it")
    if stack:
        raise DataError(f"{source}: line {opened_at[0]}: the tree starting here is never closed "
                        f"({len(stack)} open brackets at the end of the file, unbalanced brackets); "
                        f"fix or remove it")
    return trees


def _rooted(tree: Tree) -> Tree:
    # The treebank's unlabelled root, a ROOT (as some parsers write) or TOP all become TOP; a
    # tree without one (``(S ...)``, as corpora of parser output often are) is put under one.
    if tree.label in ("", "ROOT", ROOT_LABEL):
        return Tree(ROOT_LABEL, tree.children)
    return Tree(ROOT_LABEL, [tree])


def read_trees(path: str | os.PathLike) -> list[Tree]:
    """The trees of one ``.mrg`` file (or any file of bracketed trees, one or many lines each); a
    byte order mark opening it (a file saved by a Windows editor) is no part of its text, as
    :func:`aiayn.data.readers.decode_lines` has it."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise DataError(f"{path}: file not found; check the treebank root") from None
    except UnicodeDecodeError as error:
        line = path.read_bytes()[: error.start].count(b"\n") + 1
        raise DataError(f"{path}: line {line} is not valid UTF-8; re-encode the file as UTF-8") from None
    for tree in (trees := parse_trees(text, str(path))):
        for child in tree.children:
            if isinstance(child, str):
                raise DataError(f"{path}: a word {child!r} directly under a tree's root; fix the tree")
    return trees


def strip_function_tags(label: str) -> str:
    """``NP-SBJ-1`` → ``NP``, ``PP=2`` → ``PP``; labels starting with ``-`` (``-NONE-``,
    ``-LRB-``) are kept whole."""
    if label.startswith("-"):
        return label
    return re.split(r"[-=]", label, maxsplit=1)[0] or label


def preprocess(tree: Tree) -> Tree | None:
    """The tree without traces, without the constituents left empty by removing them, and with
    function tags and indices stripped from constituent labels (part-of-speech tags are kept).
    Punctuation is kept. None if nothing is left (a tree of traces only)."""
    if tree.is_preterminal:
        return None if tree.label == TRACE_TAG else Tree(tree.label, list(tree.children))
    children = [child for child in (preprocess(c) for c in tree.children if isinstance(c, Tree)) if child is not None]
    if not children:
        return None
    return Tree(strip_function_tags(tree.label), children)


# -- splits -------------------------------------------------------------------------------
def treebank_files(root: str | os.PathLike) -> dict[tuple[int, int], Path]:
    """Every ``wsj_SSNN.mrg`` file under ``<root>/parsed/mrg/wsj``, keyed by (section, number)."""
    base = Path(root) / WSJ_DIR
    if not base.is_dir():
        raise DataError(f"{base}: no such folder; point the treebank root at a copy of the Penn Treebank "
                        f"in LDC's Treebank-3 layout (the folder holding parsed/mrg/wsj/)")
    files = {}
    for path in base.glob("[0-9][0-9]/wsj_*.mrg"):
        match = _FILE_NAME.search(path.name)
        if match and match.group(1) == path.parent.name:
            files[int(match.group(1)), int(match.group(2))] = path
    return dict(sorted(files.items()))


def parse_split(spec: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """The (first, last) file ranges, as (section, number) pairs, of a split specification:
    comma-separated sections (``"22"``), section ranges (``"02-21"``), files (``"wsj_0160"``) or
    file ranges (``"wsj_0001-wsj_0159"``)."""
    ranges = []
    for item in str(spec).split(","):
        item = item.strip()
        ends = item.split("-")
        if len(ends) not in (1, 2) or not all(ends):
            raise ValueError(f"bad treebank split item {item!r} in {spec!r}; use e.g. '02-21', '22' or "
                             f"'wsj_0001-wsj_0159'")
        bounds = []
        for end in ends:
            if re.fullmatch(r"\d\d?", end):
                bounds.append(("section", int(end)))
            elif match := re.fullmatch(r"wsj_(\d\d)(\d\d)", end):
                bounds.append(("file", (int(match.group(1)), int(match.group(2)))))
            else:
                raise ValueError(f"bad treebank split item {item!r} in {spec!r}; use sections ('02-21') or "
                                 f"files ('wsj_0001-wsj_0159')")
        if len({kind for kind, _ in bounds}) != 1:
            raise ValueError(f"treebank split item {item!r} mixes a section and a file; use one kind")
        first, last = bounds[0], bounds[-1]
        if last[1] < first[1]:  # an empty range, which would leave its files out in silence
            raise ValueError(f"treebank split item {item!r} runs backwards; write it first to last, "
                             f"{'-'.join(reversed(ends))!r}")
        if first[0] == "section":
            ranges.append(((first[1], 0), (last[1], 99)))
        else:
            ranges.append((first[1], last[1]))
    return ranges


SPLIT_BY_FILES = "a partial copy such as the 10% sample needs a split by files, e.g. task.split=sample"


def split_files(root: str | os.PathLike, spec: str, hint: str = SPLIT_BY_FILES) -> list[Path]:
    """The treebank files of a split (see :func:`parse_split`) in order; a :class:`DataError`
    if none of them is there, ending in ``hint`` (what to do: train's, by default)."""
    files = treebank_files(root)
    chosen = [path for key, path in files.items() if any(lo <= key <= hi for lo, hi in parse_split(spec))]
    if not chosen:
        present = sorted({section for section, _ in files})
        raise DataError(f"{Path(root) / WSJ_DIR}: no files of split {spec!r}; the sections there are "
                        f"{', '.join(f'{s:02d}' for s in present) or 'none'}; {hint}")
    return chosen


def split_coverage(root: str | os.PathLike, spec: str) -> tuple[list[Path], dict[Path, str]]:
    """The treebank files of a split that are there, in order, and what of the split is not:
    each a path where files were expected (the treebank's ``parsed/mrg/wsj`` folder, a section's
    folder, or a file range's first file) with what is missing there. A range of whole sections
    (``"02-21"``) needs files in each of its sections; a file range, at least one file."""
    base = Path(root) / WSJ_DIR
    if not base.is_dir():
        return [], {base: "no such folder (the treebank root must hold parsed/mrg/wsj/, LDC's Treebank-3 layout)"}
    files = treebank_files(root)
    found: dict[Path, None] = {}
    absent: dict[Path, str] = {}
    for lo, hi in parse_split(spec):
        chosen = [path for key, path in files.items() if lo <= key <= hi]
        found.update(dict.fromkeys(chosen))
        if lo[1] == 0 and hi[1] == 99:
            for section in range(lo[0], hi[0] + 1):
                if not any(key[0] == section for key in files):
                    absent[base / f"{section:02d}"] = f"no wsj_{section:02d}NN.mrg file of section {section:02d}"
        elif not chosen:
            first, last = (f"wsj_{s:02d}{n:02d}" for s, n in (lo, hi))
            absent[base / f"{lo[0]:02d}" / f"{first}.mrg"] = f"no file from {first} to {last}"
    return list(found), absent


def iter_split(root: str | os.PathLike, spec: str) -> Iterator[tuple[Path, Tree]]:
    """The raw trees of a split with the file each comes from."""
    for path in split_files(root, spec):
        for tree in read_trees(path):
            yield path, tree
