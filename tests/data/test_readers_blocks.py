"""Files are read a block (1 MiB) at a time (aiayn.data.readers._plain_lines): the lines are those
decode_lines gives line by line, and what it says or refuses past the first block names the
line it names, whichever block holds it."""

from __future__ import annotations

import gzip
import logging
from pathlib import Path

import pytest

from aiayn.data import readers
from aiayn.data.readers import decode_lines, read_lines
from aiayn.errors import DataError


@pytest.fixture(scope="module")
def lines(data_root: Path) -> list[str]:
    """Real German lines (umlauts: two-byte characters), over 2 MiB of them."""
    german = read_lines(data_root / "multi30k" / "train.de.gz")
    return german * 2


def _line_by_line(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        return list(decode_lines(handle, path))


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(gzip.compress(data, compresslevel=1) if path.suffix == ".gz" else data)
    return path


def _straddling(lines: list[str]) -> bytes:
    """The lines, a two-byte character cut by the first block's end, ended by \\r\\n."""
    data = "\r\n".join(lines).encode()
    cut = readers._BLOCK - 1  # the last byte of the first block
    while not 0xC0 <= data[cut] < 0xE0:  # move the lines on until a two-byte character straddles it
        data = b"x" + data
    assert data[cut] >= 0xC0 and 0x80 <= data[cut + 1] < 0xC0
    return data


@pytest.mark.parametrize("name", ["plain.de", "zipped.de.gz"])
@pytest.mark.parametrize("ending", [b"", b"\r\n", b"\r"], ids=["last line unended", "crlf", "last line ends in cr"])
def test_the_lines_are_those_read_one_at_a_time(lines, tmp_path: Path, name: str, ending: bytes) -> None:
    path = _write(tmp_path / name, b"\xef\xbb\xbf" + _straddling(lines) + ending)
    assert path.stat().st_size > 2 * readers._BLOCK or name.endswith(".gz")
    read = read_lines(path)
    assert read == _line_by_line(path) and len(read) == len(lines)
    assert read[-1].endswith("\r") == (ending == b"\r")


def test_the_real_files_read_as_line_by_line(data_root: Path) -> None:
    for path in sorted((data_root / "multi30k").glob("*.gz")):
        assert read_lines(path) == _line_by_line(path), path


def test_a_line_past_the_first_block_that_is_not_utf8_is_named(lines, tmp_path: Path) -> None:
    data = "\n".join(lines).encode()
    line = data[: 2 * readers._BLOCK].count(b"\n") + 1  # a line of the third block
    start = data[: 2 * readers._BLOCK].rfind(b"\n") + 1
    path = _write(tmp_path / "latin1.de", data[:start] + b"Stra\xdfe " + data[start:])
    with pytest.raises(DataError, match=rf"^{path}: line {line} is not valid UTF-8 \(byte 5 of the line\)"):
        read_lines(path)


def test_a_byte_order_mark_opening_a_line_past_the_first_block_is_removed_and_named(lines, tmp_path: Path,
                                                                                  caplog) -> None:
    number = len(lines) - 3
    joined = [*lines[: number - 1], "\ufeff" + lines[number - 1], *lines[number:]]
    path = _write(tmp_path / "joined.de", "\n".join(joined).encode())
    with caplog.at_level(logging.WARNING, logger="aiayn.data.readers"):
        assert read_lines(path) == lines
    assert f"{path}: line {number} begins with a byte order mark" in caplog.text


def test_a_gzip_file_cut_short_past_the_first_block_names_its_last_whole_line(lines, tmp_path: Path) -> None:
    whole = gzip.compress("\n".join(lines).encode(), compresslevel=1)
    path = tmp_path / "cut.de.gz"
    path.write_bytes(whole[: len(whole) * 3 // 4])
    last = _last_line_read(path)
    assert last > readers._BLOCK // 100  # past the first block's lines
    with pytest.raises(DataError, match=rf"^{path}: truncated or corrupt gzip after line {last} "):
        read_lines(path)


def _last_line_read(path: Path) -> int:
    """The lines a line-by-line read of the cut file gets through before its end."""
    count = 0
    with gzip.open(path, "rb") as handle:
        try:
            for _ in handle:
                count += 1
        except EOFError:
            return count
    raise AssertionError("the file read whole")
