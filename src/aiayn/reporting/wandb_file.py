"""Read back what a W&B offline run wrote (``<save_dir>/wandb/offline-run-*/run-<id>.wandb``).

wandb has no Python reader for its ``.wandb`` transaction log; this is one, built only on wandb's
protobuf module. A resumed run reads its earlier attempts' files with it
(:mod:`aiayn.reporting.wandb_history`), to log again the rows a killed attempt's file lacks and
none twice. The format, as written by wandb-core (``core/pkg/leveldb``,
``core/internal/transactionlog``) and checked against real files:

* a 7-byte file header ``<4sHB``: ident ``b":W&B"``, magic ``0xBEE1``, version ``0``;
* then LevelDB-log 32 KiB blocks, counted from byte 0 of the file (block 0 holds the file
  header, so its first chunk starts at byte 7). A chunk is a 7-byte header ``<IHB`` (checksum,
  payload length, type: 1 FULL, 2 FIRST, 3 MIDDLE, 4 LAST) and its payload; chunks never cross
  a block boundary, and when fewer than 7 bytes are left in a block they are zeros and the
  next chunk starts in the next block;
* the checksum is plain (unmasked) IEEE CRC-32, ``zlib.crc32``, over the type byte followed
  by the payload (wandb-core uses ``CRCAlgoIEEE`` for ``.wandb`` files, not LevelDB's masked
  CRC-32C);
* a record is one FULL chunk or FIRST, MIDDLE*, LAST; its bytes are a serialized
  ``wandb.proto.wandb_internal_pb2.Record``.

wandb-core buffers what it writes and puts it in the file every
``x_transaction_log_flush_interval`` seconds (15 by default), when a 32 KiB block fills, and when
the run finishes; there is no call that flushes it, and ``run.finish()`` can return before the
file is closed: read a run written by this process after ``wandb.teardown()``. Until then (and
for a live or killed run) the file is a prefix that may end inside a record; read it with
``strict=False``.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from google.protobuf.message import DecodeError
from wandb.proto import wandb_internal_pb2

FILE_HEADER = struct.Struct("<4sHB")
FILE_IDENT, FILE_MAGIC, FILE_VERSION = b":W&B", 0xBEE1, 0
BLOCK_SIZE = 32 * 1024
CHUNK_HEADER = struct.Struct("<IHB")
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4

__all__ = ["TruncatedWandbFile", "WandbFileError", "iter_records"]


class WandbFileError(ValueError):
    """A ``.wandb`` file that cannot be read; ``path`` and byte ``offset`` say where."""

    def __init__(self, path: Path | str, offset: int, problem: str):
        self.path, self.offset, self.problem = Path(path), offset, problem
        super().__init__(f"{path}: {problem} (at byte offset {offset})")


class TruncatedWandbFile(WandbFileError):
    """The file ends inside a chunk or record (e.g. the writing process was killed)."""


def _crc(chunk_type: int, payload: bytes) -> int:
    return zlib.crc32(payload, zlib.crc32(bytes((chunk_type,))))


def _rest_is_zero(f: BinaryIO, head: bytes) -> bool:
    """Whether ``head`` and everything left in ``f`` are zero bytes."""
    if head.strip(b"\0"):
        return False
    while buf := f.read(1 << 20):
        if buf.strip(b"\0"):
            return False
    return True


def _iter_payloads(path: Path, strict: bool) -> Iterator[tuple[int, bytes]]:
    """(offset of the record's first chunk, record bytes) for each record in the file."""

    def truncated(offset: int, problem: str) -> None:
        if strict:
            raise TruncatedWandbFile(path, offset, f"truncated: {problem}")

    def corrupt(offset: int, problem: str) -> WandbFileError:
        return WandbFileError(path, offset, f"corrupt: {problem}")

    with open(path, "rb") as f:
        block = f.read(BLOCK_SIZE)
        if len(block) < FILE_HEADER.size:
            if FILE_HEADER.pack(FILE_IDENT, FILE_MAGIC, FILE_VERSION).startswith(block):
                truncated(0, f"{len(block)} bytes, shorter than the 7-byte file header")
                return
            raise corrupt(0, "not a W&B transaction log (bad file header)")
        ident, magic, version = FILE_HEADER.unpack_from(block)
        if ident != FILE_IDENT or magic != FILE_MAGIC:
            raise corrupt(0, f"not a W&B transaction log (header {block[:7]!r})")
        if version != FILE_VERSION:
            raise corrupt(0, f"unsupported .wandb version {version} (expected {FILE_VERSION})")

        block_start, pos = 0, FILE_HEADER.size
        pending: bytearray | None = None  # payload of a FIRST..LAST record being assembled
        pending_start = 0
        while True:
            n = len(block)
            offset = block_start + pos
            if pos + CHUNK_HEADER.size > n:
                if n == BLOCK_SIZE:  # < 7 bytes left in a full block: zero padding
                    if block[pos:].strip(b"\0"):
                        raise corrupt(offset, "non-zero bytes in block padding")
                    block_start, pos, block = block_start + BLOCK_SIZE, 0, f.read(BLOCK_SIZE)
                    continue
                if pos < n:  # a short final block ending inside a chunk header
                    truncated(offset, f"file ends {n - pos} bytes into a 7-byte chunk header")
                elif pending is not None:
                    truncated(pending_start, "file ends inside a multi-chunk record")
                return
            checksum, length, chunk_type = CHUNK_HEADER.unpack_from(block, pos)
            if checksum == 0 and length == 0 and chunk_type == 0:
                # wandb never writes this; a zero-filled tail is what a crash can leave behind.
                if pending is None and _rest_is_zero(f, block[pos:]):
                    truncated(offset, "zero-filled tail instead of records")
                    return
                raise corrupt(offset, "zeroed chunk header")
            end = pos + CHUNK_HEADER.size + length
            if end > n:
                if n < BLOCK_SIZE:  # the short block is the file's last
                    truncated(pending_start if pending is not None else offset,
                              f"chunk of {length} bytes at offset {offset} runs past the end "
                              f"of the file ({n - pos - CHUNK_HEADER.size} bytes present)")
                    return
                raise corrupt(offset, f"chunk length {length} overflows its 32 KiB block")
            payload = block[pos + CHUNK_HEADER.size:end]
            computed = _crc(chunk_type, payload)
            if computed != checksum:
                raise corrupt(offset, f"chunk checksum mismatch (stored {checksum:#010x}, "
                                      f"computed {computed:#010x})")
            if chunk_type in (FULL, FIRST):
                if pending is not None:
                    raise corrupt(offset, f"record starts inside the record at {pending_start}")
                if chunk_type == FULL:
                    yield offset, payload
                else:
                    pending, pending_start = bytearray(payload), offset
            elif chunk_type in (MIDDLE, LAST):
                if pending is None:
                    raise corrupt(offset, f"chunk type {chunk_type} without a FIRST chunk")
                pending += payload
                if chunk_type == LAST:
                    yield pending_start, bytes(pending)
                    pending = None
            else:
                raise corrupt(offset, f"unknown chunk type {chunk_type}")
            pos = end


def iter_records(path: Path | str, strict: bool = True) -> Iterator[wandb_internal_pb2.Record]:
    """The ``Record`` protobufs of a ``.wandb`` file, in order.

    Checksums are verified; corruption raises ``WandbFileError`` naming the file and byte
    offset. A file that ends mid-chunk or mid-record (a killed run) raises
    ``TruncatedWandbFile`` when ``strict``, else iteration stops after the last whole record.
    """
    path = Path(path)
    for offset, payload in _iter_payloads(path, strict):
        record = wandb_internal_pb2.Record()
        try:
            record.ParseFromString(payload)
        except DecodeError as err:
            raise WandbFileError(path, offset, f"corrupt: record is not a wandb Record ({err})")
        yield record
