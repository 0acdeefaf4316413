"""Reading lines as they arrive, for translate.py's interactive mode: :class:`AvailableLines`
reads a file descriptor (stdin) without blocking to ask whether the next line is there, and
:func:`chunked` groups lines into chunks that end when the input pauses."""

from __future__ import annotations

import os
import select
from collections.abc import Callable, Iterator

from aiayn.errors import UserError

READ_BYTES = 1 << 16  # what one read of stdin asks for


def chunked(lines: Iterator[str], size: int, arrived: Callable[[], bool] | None = None) -> Iterator[list[str]]:
    """``lines`` in chunks of at most ``size``; with ``arrived``, a chunk also ends when it says
    the next line has not arrived yet (the chunk is translated while the input waits). When
    reading a line fails (a line that is not UTF-8), the lines before it are still given as a
    chunk, then the error is raised."""
    chunk: list[str] = []
    try:
        for line in lines:
            chunk.append(line)
            if len(chunk) == size or (arrived is not None and not arrived()):
                yield chunk
                chunk = []
    except UserError:
        if chunk:
            yield chunk
        raise
    if chunk:
        yield chunk


class AvailableLines:
    """The raw lines (bytes, ``\\n`` kept) of a file descriptor, read as they arrive, and
    :meth:`ready` to ask, without waiting, whether the next one is here."""

    def __init__(self, fd: int):
        self.fd, self.buffer, self.ended = fd, bytearray(), False

    def __iter__(self) -> AvailableLines:
        return self

    def __next__(self) -> bytes:
        while True:
            end = self.buffer.find(b"\n")
            if end >= 0 or (self.ended and self.buffer):
                size = end + 1 if end >= 0 else len(self.buffer)
                line = bytes(self.buffer[:size])
                del self.buffer[:size]
                return line
            if self.ended:
                raise StopIteration
            self._read()  # waits for input

    def ready(self) -> bool:
        """Whether the next line (or the end of the input) is here: what has arrived is read, but
        nothing is waited for."""
        while b"\n" not in self.buffer and not self.ended:
            readable, _, _ = select.select([self.fd], [], [], 0)
            if not readable:
                return False
            self._read()
        return True

    def _read(self) -> None:
        data = os.read(self.fd, READ_BYTES)
        if data:
            self.buffer += data
        else:
            self.ended = True
