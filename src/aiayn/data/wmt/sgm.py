"""Reading WMT's SGML test sets (``newstest2014-deen-src.en.sgm`` …) and decoding XML entities.

WMT distributes its dev and test sets (§6.1: newstest2013 for development, newstest2014 for the
reported BLEU) as ``<srcset>``/``<refset>`` files whose ``<doc>`` elements hold one
``<seg id="N">text</seg>`` per line; the text has ``&amp;``, ``&lt;`` … escaped.
"""

from __future__ import annotations

import html.entities
import itertools
import os
import re
from pathlib import Path

from aiayn.data.readers import iter_lines
from aiayn.errors import DataError

_SEGMENT = re.compile(r"^\s*(?:<[A-Za-z]+>)*<seg(\s[^>]*)?>(.*)</seg>(?:</[A-Za-z]+>)*\s*$", re.IGNORECASE)  # <hl><seg …>…</seg></hl> too
_DOC = re.compile(r"^\s*<doc\s", re.IGNORECASE)
_NAME = re.compile(r"^\s*<(/?)([A-Za-z]+)")  # a line's first tag: closing or not, and its name
_ATTRIBUTE = r"""\b{}\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]+))"""
_TAG = re.compile(r"^\s*</?[A-Za-z][^<>]*>\s*$")
_ENTITY = re.compile(r"&(#[0-9]+|#[xX][0-9A-Fa-f]+|[A-Za-z][A-Za-z0-9]*);")
# A run of ASCII whitespace inside a segment: one space, as in the plain-text test sets (sacreBLEU's
# sgm reader collapses runs too; the plain files keep U+00A0, the French no-break space, as it is).
_SPACES = re.compile(r"[ \t\n\r\f\v]+")


def unescape(text: str) -> str:
    """``text`` with XML/HTML character references (``&amp;``, ``&apos;``, ``&#124;``, ``&#x27;``)
    replaced by their characters; an unknown or malformed reference is left as it is."""
    if "&" not in text:
        return text
    return _ENTITY.sub(_character, text)


def _character(match: re.Match) -> str:
    name = match.group(1)
    try:
        if name[0] == "#":
            code = int(name[2:], 16) if name[1] in "xX" else int(name[1:])  # noqa: FURB166  "#x41": hex without "0x"
            return chr(code)
    except (ValueError, OverflowError):
        return match.group(0)
    if name == "apos":  # XML's, not in HTML 4's table
        return "'"
    return html.entities.html5.get(f"{name};", match.group(0))


def read_sgm(path: str | os.PathLike) -> list[str]:
    """The text of every ``<seg>`` of an SGML file, in file order, entities decoded, surrounding
    whitespace stripped and each inner run of it one space (four lines of newstest2014-deen-src.en
    have two, where the plain test set has one). A line that opens a segment but does not close it (or any
    line that is neither a segment nor a lone tag) is a :class:`DataError` naming file and line."""
    return [text for _, text in read_segments(path)]


def read_segments(path: str | os.PathLike) -> list[tuple[tuple[str | None, str | None], str]]:
    """:func:`read_sgm`'s segments, each with its key: the ``docid`` of its ``<doc>`` and its own
    ``id`` (None where the file has none), which :func:`check_aligned` compares between a source
    file and its reference."""
    path = Path(path)
    segments: list[tuple[tuple[str | None, str | None], str]] = []
    document: str | None = None
    root, closed, documents, number = None, False, 0, 0  # the set element (<srcset …>) and the <doc>s open
    for number, line in enumerate(iter_lines(path), start=1):
        tag = _NAME.match(line)
        if tag and tag[2].lower() != "seg":
            closing, name = tag[1] == "/", tag[2].lower()
            if name == "doc":
                documents += -1 if closing else 1
            elif root is None and not closing and not segments:
                root = name
            elif closing and name == root:
                closed = True
        match = _SEGMENT.match(line)
        if match:
            if "<seg" in match.group(2).lower() or "</seg>" in match.group(2).lower():
                raise DataError(f"{path}: line {number} holds more than one <seg>; WMT files have one segment per line")
            segments.append(((document, _attribute(match.group(1) or "", "id")), _SPACES.sub(" ", unescape(match.group(2)).strip())))
        elif "<seg" in line.lower() or "</seg>" in line.lower():
            raise DataError(
                f"{path}: line {number} has a broken segment ({line.strip()[:80]!r}): expected "
                f"'<seg id=\"N\">text</seg>' on one line; the file is damaged, fetch it again"
            )
        elif line.strip() and not _TAG.match(line):
            raise DataError(f"{path}: line {number} is neither a tag nor a segment ({line.strip()[:80]!r}); not a WMT sgm file?")
        elif _DOC.match(line):
            document = _attribute(line, "docid")
    if not segments:
        raise DataError(f"{path}: no <seg> elements found; not a WMT sgm file?")
    if documents > 0 or (root is not None and not closed):  # before: read as it was, a test set cut short
        missing = "</doc>" if documents > 0 else f"</{root}>"
        raise DataError(f"{path}: ends at line {number} before its {missing} (after {len(segments)} segments): the "
                        "file is cut short; fetch it again")
    return segments


def _attribute(tag: str, name: str) -> str | None:
    found = re.search(_ATTRIBUTE.format(name), tag, re.IGNORECASE)
    return None if found is None else next(value for value in found.groups() if value is not None)


def check_aligned(src: tuple[Path, list], tgt: tuple[Path, list], fix: str) -> None:
    """A :class:`DataError` naming the first segment where two files' :func:`read_segments` differ
    (another document or segment id at that place, or one file ending first): a segment missing
    from a reference, or one there twice, would otherwise pair every later source sentence with
    another's reference, or stop with counts alone. An id either file lacks is not compared.
    ``fix`` ends the message (what to do)."""
    (src_path, src_segments), (tgt_path, tgt_segments) = src, tgt
    for place, (a, b) in enumerate(itertools.zip_longest(src_segments, tgt_segments), start=1):
        if a is None or b is None or any(x is not None and y is not None and x != y for x, y in zip(a[0], b[0])):
            raise DataError(f"{tgt_path} is not aligned with {src_path}: its segment {place} is {_named(b)} where "
                            f"{src_path.name} has {_named(a)}; {fix}")


def _named(segment: tuple | None) -> str:
    if segment is None:
        return "missing (the file ends before it)"
    document, number = segment[0]
    return f"<seg id={number!r}>" + (f" of document {document!r}" if document is not None else "")
