"""Reading line-aligned text files (plain or gzipped) with errors that say what to do."""

from __future__ import annotations

import gzip
import itertools
import logging
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from aiayn.errors import DataError

GZIP_MAGIC = b"\x1f\x8b"
# Other compressed data, which is read neither as gzip nor as text: the bytes it opens with, its
# name, the command that decompresses it and the suffix its files' names end in.
_OTHER_COMPRESSION = ((b"\xfd7zXZ\x00", "xz", "unxz", ".xz"), (b"BZh", "bzip2", "bunzip2", ".bz2"),
                      (b"\x28\xb5\x2f\xfd", "zstd", "unzstd", ".zst"), (b"PK\x03\x04", "zip", "unzip", ".zip"),
                      (b"7z\xbc\xaf\x27\x1c", "7z", "7z x", ".7z"))
COMPRESSED_SUFFIXES = tuple(suffix for *_, suffix in _OTHER_COMPRESSION)  # names of files read neither way
_BOM = "\ufeff"
_BOM_BYTES = _BOM.encode("utf-8")
_BOM_SAID: set[str] = set()  # the files (streams) whose later lines' byte order marks were named, once a process
_BOTH_SAID: set[Path] = set()  # the plain files read beside a gzipped copy, named once a process

log = logging.getLogger(__name__)

__all__ = ["DataError", "count_pairs", "decode_lines", "iter_lines", "iter_parallel", "plain_or_gzipped", "read_lines",
           "read_parallel"]


def plain_or_gzipped(plain: Path) -> Path:
    """The file ``plain``, else ``plain.gz`` where only that one is there (``plain`` where neither
    is: the name a missing file is reported by). Where both are, the plain one is read, and the two
    are named in a warning, once."""
    gzipped = plain.with_name(f"{plain.name}.gz")
    if not plain.is_file():
        return gzipped if gzipped.is_file() else plain
    if gzipped.is_file() and plain not in _BOTH_SAID:
        _BOTH_SAID.add(plain)
        log.warning("%s and %s are both there: %s is read (the plain file wins), %s is not; keep the one you mean "
                    "and move the other out", plain, gzipped.name, plain.name, gzipped.name)
    return plain


def read_lines(path: str | os.PathLike) -> list[str]:
    """The lines of a UTF-8 text file (gzipped when the name ends in ``.gz``), without their
    trailing ``"\\n"`` or ``"\\r\\n"`` nor a byte order mark opening the file; anything else in a
    line is kept as it is."""
    return list(iter_lines(path))


def iter_lines(path: str | os.PathLike) -> Iterator[str]:
    """The lines of :func:`read_lines`, one at a time: memory stays bounded however large the
    file (the WMT training corpora run to millions of lines)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    count = 0
    try:
        with opener(path, "rb") as handle:
            try:
                for line in _plain_lines(handle):
                    count += 1
                    yield line
                return
            except _Unusual:
                pass
        # Something decode_lines has to say or refuse: read again by it, from the start, the lines
        # given so far passed over (they are the same), so that what it says names the right line.
        with opener(path, "rb") as handle:
            for number, line in enumerate(decode_lines(handle, path), start=1):
                if number > count:
                    count += 1
                    yield line
    except FileNotFoundError:
        raise DataError(f"{path}: file not found; check the path or the data root") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as error:
        if count == 0 and isinstance(error, gzip.BadGzipFile) and not _starts_with(path, GZIP_MAGIC):
            other = other_compression(_head(path))
            if other is not None:
                raise DataError(f"{path}: {other[0]}-compressed data, though its name ends in .gz (read as gzip); "
                                f"decompress it ({other[1]}) and gzip it") from None
            raise DataError(f"{path}: not gzip data, though its name ends in .gz; if it is plain text, name it "
                            f"{path.with_suffix('').name}, else delete it and download it again") from None
        raise DataError(
            f"{path}: truncated or corrupt gzip after line {count} (the last line read "
            f"successfully) ({error}); delete the file and download it again"
        ) from None
    except OSError as error:
        raise DataError(f"{path}: cannot be read ({error.strerror or error})") from None


class _Unusual(Exception):
    """A file :func:`_plain_lines` leaves to :func:`decode_lines`."""


_BLOCK = 1 << 20  # bytes read at a time by _plain_lines


def _plain_lines(handle: BinaryIO) -> Iterator[str]:
    """The lines :func:`decode_lines` gives of a file, read and decoded a block at a time (a third
    of its time on Multi30k: it decodes each line on its own), for files in which it finds nothing
    to say or refuse; raises :class:`_Unusual` at anything else (bytes that are not UTF-8, a byte
    order mark after the file's start, a carriage return in the first line, a read that fails),
    for :func:`decode_lines` to read the file and say what it says."""
    rest, first = b"", True
    while True:
        try:
            block = handle.read(_BLOCK)
        except (EOFError, OSError, zlib.error):  # (gzip.BadGzipFile is an OSError)
            raise _Unusual from None
        if block:  # the lines that end in this block, each with its "\n"
            data = rest + block
            cut = data.rfind(b"\n") + 1
            whole, rest = data[:cut], data[cut:]
            if not whole:
                continue
        elif rest:  # the last line, which no "\n" ends
            whole, rest = rest, b""
            if first and whole == _BOM_BYTES:  # a file of a byte order mark alone: an empty one, no line
                return
        else:
            return
        try:
            text = whole.decode("utf-8-sig" if first else "utf-8")
        except UnicodeDecodeError:
            raise _Unusual from None
        if _BOM in text:
            raise _Unusual
        lines = text.split("\n")
        if block:
            lines.pop()  # (after the last "\n")
            if "\r" in text:
                lines = [line.removesuffix("\r") for line in lines]
        if first and "\r" in lines[0]:
            raise _Unusual
        first = False
        yield from lines


def iter_parallel(src_path: str | os.PathLike, tgt_path: str | os.PathLike) -> Iterator[tuple[str, str]]:
    """The line pairs of two line-aligned files, streamed; a :class:`DataError` naming the file
    that ends first and the line where the other goes on."""
    pairs = itertools.zip_longest(iter_lines(src_path), iter_lines(tgt_path))
    for number, (src, tgt) in enumerate(pairs, start=1):
        if src is None or tgt is None:
            short, long_ = (src_path, tgt_path) if src is None else (tgt_path, src_path)
            more = [tgt if src is None else src,
                    *(b if a is None else a for a, b in itertools.islice(pairs, _BLANK_TAIL))]  # the longer's
            raise DataError(
                f"parallel files differ in length: {short} ends after line {number - 1} but {long_} "
                f"goes on at line {number}; they must be aligned line by line{_blank_tail(more, long_, number)}"
            )
        yield src, tgt


_BLANK_TAIL = 100  # the most lines past the shorter file's end that are looked at for a blank tail


def _blank_tail(more: list[str], path: str | os.PathLike, first: int) -> str:
    """A hint where the lines ``more`` that ``path`` has past its pair's end, from line ``first``
    on, are its last and all blank (a blank line left at the end of a file); "" otherwise."""
    if len(more) > _BLANK_TAIL or any(line.strip() for line in more):
        return ""
    lines = f"line {first} is" if len(more) == 1 else f"lines {first}-{first + len(more) - 1} are"
    return f"; {Path(path).name}'s {lines} blank, at its end: delete {'it' if len(more) == 1 else 'them'}"


def count_pairs(src_path: str | os.PathLike, tgt_path: str | os.PathLike) -> int:
    """The line pairs of two line-aligned files, every line decoded (:func:`iter_parallel`'s errors)."""
    return sum(1 for _ in iter_parallel(src_path, tgt_path))


def decode_lines(handle: BinaryIO, name: str | os.PathLike) -> Iterator[str]:
    """The UTF-8 lines of a binary stream (a file, ``sys.stdin.buffer``) as :func:`read_lines`
    gives them; ``name`` is what an error calls the stream. A byte order mark opening the stream
    (files saved by Windows editors) is no part of the first line: kept, it would be a character
    of the first reference that no hypothesis has, costing BLEU, and would hide an sgm file's
    first tag. One opening a later line (files joined with ``cat``, each saved with one) is removed
    as well, and the first such line of each stream named in a warning: kept, it would be a character
    of that sentence's subwords and reference that no hypothesis has. A stream that is one line
    holding carriage returns (its lines ended by a carriage return alone, as old Mac files end
    them) is refused: read as one sentence, it would be scored or translated as one."""
    head = b""  # the bytes the stream opens with: compressed data is named by them
    held = None  # a first line holding a carriage return, given once a second line follows it
    for number, raw in enumerate(handle, start=1):
        head = raw[:8] if number == 1 else head
        if number == 1 and raw == _BOM_BYTES:  # a byte order mark alone (an empty file a Windows editor saved): no line
            return
        try:
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as error:
            stream = str(name).startswith("<") or not Path(name).is_file()  # stdin, a pipe: no name to give
            if head.startswith(GZIP_MAGIC):
                fix = "decompress it first (zcat)" if stream else f"name it {Path(name).name}.gz, or decompress it"
                raise DataError(f"{name}: gzip-compressed data, but not read as gzip (a name ending in .gz); {fix}") from None
            other = other_compression(head)
            if other is not None:
                fix = f"decompress it first ({other[1]})" if stream else \
                    f"decompress it ({other[1]}), or gzip it as {Path(name).name.removesuffix(other[2])}.gz"
                raise DataError(f"{name}: {other[0]}-compressed data, which is read only as gzip (a name ending in "
                                f".gz) or as plain text; {fix}") from None
            if head.startswith((b"\xff\xfe", b"\xfe\xff")):  # UTF-16's byte order mark (Windows' "Unicode")
                raise DataError(f"{name}: UTF-16 text, not UTF-8; re-encode it as UTF-8 "
                                f"(iconv -f UTF-16 -t UTF-8{'' if stream else f' {Path(name).name}'})") from None
            raise DataError(
                f"{name}: line {number} is not valid UTF-8 "
                f"(byte {error.start + 1} of the line); re-encode the file as UTF-8"
            ) from None
        if line.endswith("\n"):
            line = line[:-2] if line.endswith("\r\n") else line[:-1]
        if line.startswith(_BOM):
            line = _without_bom(line, name, number)
        if number == 1 and "\r" in line:
            held = line
            continue
        if held is not None:
            yield held
            held = None
        yield line
    if held is not None:
        raise DataError(f"{name}: all one line, holding {held.count(chr(13)):,} carriage returns: lines ended by a "
                        "carriage return alone (old Mac files) read as one; end them in \\n (tr '\\r' '\\n')")


def _without_bom(line: str, name: str | os.PathLike, number: int) -> str:
    """``line`` without the byte order marks opening it (line ``number`` of ``name``, not its first:
    files joined with ``cat``), the first such line of ``name`` named in a warning, once."""
    if str(name) not in _BOM_SAID:
        _BOM_SAID.add(str(name))
        log.warning("%s: line %d begins with a byte order mark (U+FEFF: files joined with cat, each saved with one?); "
                    "removed, as at the file's start, there and at the start of any later line", name, number)
    return line.lstrip(_BOM)


def _starts_with(path: Path, magic: bytes) -> bool:
    return _head(path).startswith(magic)


def _head(path: Path) -> bytes:
    """The first bytes of the file ``path`` (none where it cannot be read)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(8)
    except OSError:
        return b""


def other_compression(head: bytes) -> tuple[str, str, str] | None:
    """(format, command that decompresses it, its files' suffix) of data opening with ``head``,
    compressed otherwise than with gzip; None for anything else."""
    return next((tuple(kind) for magic, *kind in _OTHER_COMPRESSION if head.startswith(magic)), None)


def read_parallel(src_path: str | os.PathLike, tgt_path: str | os.PathLike) -> tuple[list[str], list[str]]:
    """The lines of two line-aligned files; a :class:`DataError` if their line counts differ."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        (shorter, _), (longer, path) = sorted(((src, src_path), (tgt, tgt_path)), key=lambda side: len(side[0]))
        raise DataError(
            f"parallel files differ in length: {src_path} has {len(src)} lines, {tgt_path} has {len(tgt)}; they "
            f"must be aligned line by line{_blank_tail(longer[len(shorter):], path, len(shorter) + 1)}"
        )
    return src, tgt
