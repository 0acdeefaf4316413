"""Reading line-aligned text files (plain or gzipped) with errors that say what to do."""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path
from typing import BinaryIO


class DataError(ValueError):
    """A data file is missing, unreadable or malformed; the message names the file and the fix."""


def read_lines(path: str | os.PathLike) -> list[str]:
    """The lines of a UTF-8 text file (gzipped when the name ends in ``.gz``), without their
    trailing ``"\\n"`` or ``"\\r\\n"``; anything else in a line is kept as it is."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    lines: list[str] = []
    try:
        with opener(path, "rb") as handle:
            decode_lines(handle, path, into=lines)
    except FileNotFoundError:
        raise DataError(f"{path}: file not found; check the path or the data root") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as error:
        raise DataError(
            f"{path}: truncated or corrupt gzip after line {len(lines)} (the last line read "
            f"successfully) ({error}); delete the file and download it again"
        ) from None
    except OSError as error:
        raise DataError(f"{path}: cannot be read ({error.strerror or error})") from None
    return lines


def decode_lines(handle: BinaryIO, name: str | os.PathLike, into: list[str] | None = None) -> list[str]:
    """The UTF-8 lines of a binary stream (a file, ``sys.stdin.buffer``) as :func:`read_lines`
    returns them; ``name`` is what an error calls the stream. Lines are appended to ``into``."""
    lines = [] if into is None else into
    for raw in handle:
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise DataError(
                f"{name}: line {len(lines) + 1} is not valid UTF-8 "
                f"(byte {error.start + 1} of the line); re-encode the file as UTF-8"
            ) from None
        if line.endswith("\n"):
            line = line[:-2] if line.endswith("\r\n") else line[:-1]
        lines.append(line)
    return lines


def read_parallel(src_path: str | os.PathLike, tgt_path: str | os.PathLike) -> tuple[list[str], list[str]]:
    """The lines of two line-aligned files; a :class:`DataError` if their line counts differ."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise DataError(
            f"parallel files differ in length: {src_path} has {len(src)} lines, "
            f"{tgt_path} has {len(tgt)}; they must be aligned line by line"
        )
    return src, tgt
