"""Binarised parallel corpora: subword ids encoded once, stored as memory-mapped arrays.

A corpus ``<dir>/<name>`` is four ``.npy`` files: ``<name>.<side>.ids`` (every sentence's ids,
no BOS/EOS, concatenated; uint16 when the vocabulary fits, else int32) and
``<name>.<side>.offsets`` (int64, N+1: sentence i is ``ids[offsets[i]:offsets[i+1]]``), for the
sides ``src`` and ``tgt``. Opening maps the files (``np.load(mmap_mode="r")``): it takes the same
time and private memory for 36M pairs as for 36 thousand, and every DDP rank and DataLoader
worker shares the page cache of the same files instead of holding its own copy.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import logging
import multiprocessing
import os
import random
import signal
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import sentencepiece as spm
from torch.utils.data import Dataset

from aiayn.errors import DataError

log = logging.getLogger(__name__)

SIDES = ("src", "tgt")


def ids_dtype(vocab_size: int) -> np.dtype:
    """The narrowest id type for ``vocab_size``: uint16 up to 65,536 ids (the paper's 37k and
    32k vocabularies), int32 above."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.int32)


def corpus_files(directory: str | os.PathLike, name: str) -> dict[str, tuple[Path, Path]]:
    """``{side: (ids file, offsets file)}`` of corpus ``name`` in ``directory``."""
    directory = Path(directory)
    return {side: (directory / f"{name}.{side}.ids.npy", directory / f"{name}.{side}.offsets.npy") for side in SIDES}


# ---------------------------------------------------------------------------------------------
# Writing: lines of "source<TAB>target" cut into chunks, each encoded by a worker process, then
# the chunks' arrays concatenated into the final files.

CHUNK_PAIRS = 200_000  # pairs per encoding job


def write_pairs(pairs: Iterable[tuple[str, str]], tsv: Path,
                sample_pairs: int) -> tuple[list[tuple[int, int]], list[tuple[str, str]], int]:
    """Stream ``pairs`` (no tab or line break in a sentence) into ``tsv``, one ``source<TAB>target``
    a line; returns its byte ranges of ``CHUNK_PAIRS`` pairs each (the encoding jobs of
    :func:`encode_tsv`), a uniform random sample of at most ``sample_pairs`` pairs (reservoir
    sampling, seeded: for the subword model; every pair, in order, when there are no more) and the
    number of pairs."""
    chunks: list[tuple[int, int]] = []
    sample: list[tuple[str, str]] = []
    rng = random.Random(0)
    with open(tsv, "wb") as handle:
        start = position = count = 0
        for src, tgt in pairs:
            if "\t" in src or "\t" in tgt:
                raise ValueError(f"a sentence holds a tab, which separates the two sides here: {src!r} / {tgt!r}")
            data = f"{src}\t{tgt}\n".encode()
            handle.write(data)
            position += len(data)
            count += 1
            if count % CHUNK_PAIRS == 0:
                chunks.append((start, position))
                start = position
            if len(sample) < sample_pairs:
                sample.append((src, tgt))
            else:
                slot = rng.randrange(count)
                if slot < sample_pairs:
                    sample[slot] = (src, tgt)
        if position > start:
            chunks.append((start, position))
    return chunks, sample, count


def encode_tsv(
    tsv: Path,
    chunks: Sequence[tuple[int, int]],
    model_file: Path,
    directory: Path,
    name: str,
    vocab_size: int,
    workers: int,
) -> tuple[int, dict[str, str]]:
    """Encode the pairs of ``tsv`` (one ``source\\ttarget`` per line, cut into byte ranges
    ``chunks``) with the sentencepiece model ``model_file`` into corpus ``name`` of
    ``directory``, using ``workers`` processes. Returns the number of pairs and the SHA-256 of
    each corpus file, by its name, taken of its bytes as they were written (for the folder's
    record, :func:`aiayn.data.manifest.folder_files`: the arrays are not read back to hash them)."""
    parts = directory / f".{name}.parts"
    parts.mkdir(parents=True, exist_ok=True)
    dtype = ids_dtype(vocab_size)
    jobs = [(str(tsv), start, end, str(model_file), str(parts / f"{number:06d}"), dtype.str) for number, (start, end) in enumerate(chunks)]
    workers = max(1, min(workers, len(jobs)))
    if workers == 1:
        results = [_encode_chunk(job) for job in jobs]
    else:
        # fork: the children need only numpy and sentencepiece, already imported here
        context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else None)
        with context.Pool(workers, initializer=_ignore_interrupts) as pool:
            results = pool.map(_encode_chunk, jobs, chunksize=1)
    count, digests = _concatenate([r for r in results], directory, name, dtype)
    for prefix in results:
        for side in SIDES:
            for kind in ("ids", "lengths"):
                Path(f"{prefix}.{side}.{kind}.npy").unlink(missing_ok=True)
    parts.rmdir()
    return count, digests


def _ignore_interrupts() -> None:
    """In an encoding worker: Ctrl-C (sent to the whole process group) is for the parent to
    handle, which stops the pool; the workers would each print a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _encode_chunk(job: tuple[str, int, int, str, str, str]) -> str:
    tsv, start, end, model_file, prefix, dtype = job
    processor = spm.SentencePieceProcessor(model_file=model_file)
    with open(tsv, "rb") as handle:
        handle.seek(start)
        lines = handle.read(end - start).decode("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    src, tgt = zip(*(line.split("\t") for line in lines)) if lines else ((), ())
    for side, texts in zip(SIDES, (src, tgt)):
        ids = processor.encode(list(texts), out_type=int, num_threads=1)
        lengths = np.fromiter(map(len, ids), dtype=np.int32, count=len(ids))
        flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.dtype(dtype), count=int(lengths.sum()))
        np.save(f"{prefix}.{side}.ids.npy", flat)
        np.save(f"{prefix}.{side}.lengths.npy", lengths)
    return prefix


def _concatenate(prefixes: Sequence[str], directory: Path, name: str,
                 dtype: np.dtype) -> tuple[int, dict[str, str]]:
    """The chunks' arrays, written one after the other into the corpus files by plain writes (a
    full disk is then an ``OSError``, where writing through a memory map would kill the process
    with SIGBUS); the number of pairs and each file's SHA-256 by its name."""
    files = corpus_files(directory, name)
    count, digests = 0, {}
    for side in SIDES:
        lengths = [np.load(f"{p}.{side}.lengths.npy", mmap_mode="r") for p in prefixes]
        count = sum(len(part) for part in lengths)
        total = sum(int(part.sum(dtype=np.int64)) for part in lengths)
        ids, offsets = files[side]
        digests[offsets.name] = _write_npy(offsets, np.dtype(np.int64), count + 1, _offsets(lengths))
        digests[ids.name] = _write_npy(ids, dtype, total, (np.load(f"{p}.{side}.ids.npy", mmap_mode="r") for p in prefixes))
    return count, digests


def _offsets(lengths: Sequence[np.ndarray]) -> Iterable[np.ndarray]:
    """0, then the end of every sentence, part by part."""
    yield np.zeros(1, dtype=np.int64)
    total = 0
    for part in lengths:
        ends = total + np.cumsum(part, dtype=np.int64)
        total = int(ends[-1]) if len(ends) else total
        yield ends


def _write_npy(path: Path, dtype: np.dtype, length: int, parts: Iterable[np.ndarray]) -> str:
    """A one-dimensional ``.npy`` file of ``length`` items of ``dtype``, from ``parts`` in order;
    the SHA-256 of its bytes, taken as they are written."""
    sha256, size, written = hashlib.sha256(), 0, 0

    def write(block: memoryview) -> None:
        nonlocal size
        handle.write(block)
        sha256.update(block)
        size += block.nbytes

    with open(path, "wb") as handle:
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(header, {"descr": np.lib.format.dtype_to_descr(dtype),
                                                      "fortran_order": False, "shape": (length,)})
        write(header.getbuffer())
        for part in parts:
            write(memoryview(np.ascontiguousarray(part, dtype=dtype)).cast("B"))
            written += len(part)
    if written != length:
        raise AssertionError(f"{path}: wrote {written} items of {length}")
    if path.stat().st_size != size:  # what was hashed is what the file holds
        raise AssertionError(f"{path}: {path.stat().st_size} bytes on disk, {size} written")
    return sha256.hexdigest()


def write_corpus(directory: Path, name: str, src_ids: Iterable[Sequence[int]], tgt_ids: Iterable[Sequence[int]], vocab_size: int) -> None:
    """Store already-encoded pairs (small corpora, tests) in the same format."""
    files = corpus_files(directory, name)
    for side, seqs in zip(SIDES, (list(src_ids), list(tgt_ids))):
        offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum([len(s) for s in seqs], out=offsets[1:])
        flat = np.fromiter(itertools.chain.from_iterable(seqs), dtype=ids_dtype(vocab_size), count=int(offsets[-1]))
        np.save(files[side][0], flat)
        np.save(files[side][1], offsets)


# ---------------------------------------------------------------------------------------------
# Reading


class MappedCorpus(Dataset):
    """A stored corpus as a dataset of ``(i, src_ids, tgt_ids)`` (like ``ParallelCorpus``),
    optionally restricted to the pairs ``indices`` (e.g. those within ``max_length``).

    The arrays are mapped lazily in each process: pickling the dataset into a DataLoader
    worker sends the file names, never the data.
    """

    def __init__(self, directory: str | os.PathLike, name: str, indices: np.ndarray | None = None):
        self.directory, self.name = Path(directory), name
        self._files = corpus_files(self.directory, name)
        for ids_file, offsets_file in self._files.values():
            for path in (ids_file, offsets_file):
                if not path.is_file():
                    raise DataError(f"{path}: stored corpus file missing; delete {self.directory} and prepare the data again")
        self._arrays: dict[str, tuple[np.ndarray, np.ndarray]] | None = None
        src_offsets, tgt_offsets = self._map()["src"][1], self._map()["tgt"][1]
        if len(src_offsets) != len(tgt_offsets):
            raise DataError(
                f"{self._files['src'][1]} holds {len(src_offsets) - 1} sentences but {self._files['tgt'][1]} "
                f"{len(tgt_offsets) - 1}; delete {self.directory} and prepare the data again"
            )
        self.indices = None if indices is None else np.asarray(indices, dtype=np.int64)

    def _map(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        if self._arrays is None:
            arrays = {}
            for side, (ids_file, offsets_file) in self._files.items():
                try:
                    ids, offsets = np.load(ids_file, mmap_mode="r"), np.load(offsets_file, mmap_mode="r")
                except (OSError, ValueError) as error:  # cut short: "mmap length is greater than file size"
                    raise DataError(f"{ids_file.parent}: {ids_file.name} or {offsets_file.name} is not a whole array "
                                    f"({error}); delete {self.directory} and prepare the data again") from None
                if len(offsets) == 0 or offsets[0] != 0 or offsets[-1] != len(ids):
                    raise DataError(f"{offsets_file}: its offsets do not span {ids_file.name} ({len(ids)} ids); delete "
                                    f"{self.directory} and prepare the data again")
                arrays[side] = ids, offsets
            self._arrays = arrays
        return self._arrays

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_arrays": None}

    @property
    def stored_size(self) -> int:
        """Pairs in the files, before ``indices`` selects some."""
        return len(self._map()["src"][1]) - 1

    def __len__(self) -> int:
        return self.stored_size if self.indices is None else len(self.indices)

    def __getitem__(self, index: int) -> tuple[int, list[int], list[int]]:
        stored = int(index if self.indices is None else self.indices[index])
        arrays = self._map()
        (src, src_off), (tgt, tgt_off) = arrays["src"], arrays["tgt"]
        return (
            index,
            src[src_off[stored] : src_off[stored + 1]].tolist(),
            tgt[tgt_off[stored] : tgt_off[stored + 1]].tolist(),
        )

    def stored_lengths(self, side: str) -> np.ndarray:
        """Subword count of every stored sentence of ``side`` (no BOS/EOS), all pairs."""
        return np.diff(self._map()[side][1]).astype(np.int32)

    def _lengths(self, side: str) -> np.ndarray:
        lengths = self.stored_lengths(side)
        return (lengths if self.indices is None else lengths[self.indices]) + 1

    @property
    def src_lengths(self) -> np.ndarray:
        """Source lengths with the EOS that collation adds."""
        return self._lengths("src")

    @property
    def tgt_lengths(self) -> np.ndarray:
        """Target lengths with the BOS (input side) or EOS (output side) that collation adds."""
        return self._lengths("tgt")

    @property
    def line_numbers(self) -> np.ndarray:
        """The stored position of each pair (its line among the cleaned training pairs)."""
        return np.arange(self.stored_size) if self.indices is None else self.indices


def within_length(corpus: MappedCorpus, max_length: int) -> tuple[MappedCorpus, dict[str, int]]:
    """The pairs of a stored corpus that training keeps, as :func:`aiayn.data.corpus.filter_pairs`
    keeps them (both sides non-empty, neither over ``max_length`` ids), and how many each rule
    dropped (``"empty"`` first, then ``"too_long"``)."""
    src, tgt = corpus.stored_lengths("src"), corpus.stored_lengths("tgt")
    empty = (src == 0) | (tgt == 0)
    too_long = ~empty & ((src > max_length) | (tgt > max_length))
    keep = np.flatnonzero(~(empty | too_long))
    kept = MappedCorpus(corpus.directory, corpus.name, None if len(keep) == corpus.stored_size else keep)
    return kept, {"empty": int(empty.sum()), "too_long": int(too_long.sum())}
