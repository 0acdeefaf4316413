"""A corpus of one's own (``task=parallel_text``), its training split prepared once: subwords
learnt, every pair encoded into memory-mapped arrays (:mod:`aiayn.data.storage`), as fairseq's
``fairseq-preprocess`` binarises a corpus before training.

``prepare_text`` turns the training split's two files into the folder
``<cache_dir>/parallel_text/<src>-<tgt>-<vocab>-<key>/`` (the key hashes the settings and the two
files' resolved paths):

- ``sentencepiece.model``: the joint vocabulary (§3.4 shares it), learnt from the training pairs,
  all of them up to ``sample_pairs`` (then the same model, from the same cache entry, as a corpus
  read whole would learn), else a uniform random sample of that many;
- ``train.{src,tgt}.{ids,offsets}.npy``: every training pair, encoded; ``max_length`` filters
  them when they are loaded, so that another limit needs no new preparation;
- ``meta.json`` (:mod:`aiayn.data.manifest`), written last: the settings, the two files'
  contents and every prepared file's size and SHA-256. Files whose bytes changed since, or a
  prepared file no longer as written, have the folder prepared again.

Preparing reads the two files once, streaming (a misaligned pair, a line that is not UTF-8 or an
empty file stops it with a line naming the file), with the memory of the sample; loading maps the
arrays, which every DDP rank and DataLoader worker shares instead of reading and encoding the
corpus on its own. The validation and test splits stay text, read when they are loaded (they are
small, and scoring wants their raw lines).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from aiayn.data.cache import build_once, check_folder
from aiayn.data.manifest import META, damage, folder_files, outdated, raw_fingerprints, read_meta
from aiayn.data.readers import iter_parallel
from aiayn.data.storage import MappedCorpus, encode_tsv, write_pairs
from aiayn.data.subwords import given_key, learnt_or_given
from aiayn.errors import DataError
from aiayn.files import atomic_path, write_json

log = logging.getLogger(__name__)

FORMAT = 1  # bump when the folder's contents change meaning
MODEL = "sentencepiece.model"


def prepared_dir(src_path: Path, tgt_path: Path, cache_dir: str | os.PathLike, src_lang: str, tgt_lang: str,
                 vocab_size: int, sample_pairs: int, subword_model: Path | None = None) -> Path:
    """Where the training split ``src_path`` / ``tgt_path`` prepared with these settings lives (or will)."""
    settings = {**_settings(src_lang, tgt_lang, vocab_size, sample_pairs, subword_model),
                "sources": _names(_sources(src_path, tgt_path))}
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    return Path(cache_dir) / "parallel_text" / f"{src_lang}-{tgt_lang}-{vocab_size}-{key}"


def _settings(src_lang: str, tgt_lang: str, vocab_size: int, sample_pairs: int, subword_model: Path | None) -> dict:
    return {"format": FORMAT, "src_lang": src_lang, "tgt_lang": tgt_lang, "vocab_size": int(vocab_size),
            "sample_pairs": int(sample_pairs), **given_key(subword_model)}


def _sources(src_path: Path, tgt_path: Path) -> dict[str, Path]:
    """The two files by side, resolved: what the folder's key and ``meta.json`` name them by."""
    return {"src": Path(src_path).expanduser().resolve(), "tgt": Path(tgt_path).expanduser().resolve()}


def _names(files: dict[str, Path]) -> dict[str, str]:
    return {side: str(path) for side, path in files.items()}


def unusable(directory: Path, src_path: Path, tgt_path: Path, hashes: bool) -> str | None:
    """None when the folder is complete, whole and prepared from the files there are now; else why
    not, in a sentence (``"absent"``: never completed)."""
    meta = read_meta(directory)
    if meta is None:
        return "absent"
    return outdated(directory, meta, _sources(src_path, tgt_path)) or damage(directory, meta, hashes)


def prepare_text(src_path: Path, tgt_path: Path, cache_dir: str | os.PathLike, src_lang: str, tgt_lang: str,
                 vocab_size: int, sample_pairs: int = 1_000_000, workers: int | None = None,
                 hashes: bool = False, subword_model: Path | None = None) -> Path:
    """Prepare the training split (see the module) unless a complete, whole folder prepared from
    the same files with the same settings exists; returns the folder. ``hashes``: check an
    existing folder's token arrays by their SHA-256 too, not only by size. ``workers``: encoding
    processes (default: one per CPU). ``subword_model``: the sentencepiece model to encode with
    (``task.subword_model``) instead of one learnt from the pairs.

    One job prepares a folder at a time (:func:`aiayn.data.cache.build_once`): the others, DDP
    ranks and nodes of the same run among them, wait and reuse it. A killed job's leftovers are
    removed by the next; a full disk stops it with one line and leaves nothing half-written."""
    out = prepared_dir(src_path, tgt_path, cache_dir, src_lang, tgt_lang, vocab_size, sample_pairs, subword_model)
    check_folder(cache_dir, "paths.cache_dir", "AIAYN_CACHE_DIR")
    build_once(out, lambda: unusable(out, src_path, tgt_path, hashes),
               lambda _why: _prepare(src_path, tgt_path, out, cache_dir, src_lang, tgt_lang, vocab_size, sample_pairs,
                                     workers, subword_model),
               f"the prepared training pairs of {src_path} / {tgt_path}")
    return out


def _prepare(src_path: Path, tgt_path: Path, out: Path, cache_dir: str | os.PathLike, src_lang: str, tgt_lang: str,
             vocab_size: int, sample_pairs: int, workers: int | None, subword_model: Path | None) -> None:
    """Build the folder ``out`` beside it under a temporary name, renamed once complete (the caller
    holds its lock)."""
    started = time.perf_counter()
    sources = _sources(src_path, tgt_path)
    fingerprints = raw_fingerprints(sources)  # before reading: a later change shows next time
    with atomic_path(out) as tmp:
        tmp.mkdir()
        tsv = tmp / "train.tsv"
        chunks, sample, count = write_pairs(_untabbed(iter_parallel(src_path, tgt_path)), tsv, sample_pairs)
        if count == 0:
            raise DataError(f"{src_path} / {tgt_path}: no lines; a split needs one sentence pair per line")
        read_s = time.perf_counter() - started
        # Learnt from the lines as read (tabs and all): a corpus of up to sample_pairs pairs gives
        # every source line then every target line, in order, the cache key of the whole corpus.
        try:  # what the text cannot give (a vocabulary too large, no line sentencepiece takes) names its files
            vocab = learnt_or_given([src for src, _ in sample] + [tgt for _, tgt in sample], vocab_size, cache_dir,
                                    subword_model)
        except DataError as error:
            raise DataError(f"{src_path} / {tgt_path}: {error}") from None
        del sample
        shutil.copyfile(vocab.path, tmp / MODEL)
        stored, hashed = encode_tsv(tsv, chunks, tmp / MODEL, tmp, "train", vocab.vocab_size,
                                    workers or os.cpu_count() or 1)
        tsv.unlink()
        if stored != count:
            raise AssertionError(f"encoded {stored} of {count} pairs")
        corpus = MappedCorpus(tmp, "train")
        tokens = {side: int(corpus.stored_lengths(side).sum()) for side in ("src", "tgt")}
        seconds = time.perf_counter() - started
        meta = {**_settings(src_lang, tgt_lang, vocab_size, sample_pairs, subword_model), "files": folder_files(tmp, hashed),
                "raw_files": fingerprints, "sources": _names(sources), "pairs": count,
                "subword_tokens": tokens, "seconds": {"read": round(read_s, 1), "total": round(seconds, 1)},
                "prepared_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        write_json(tmp / META, meta)  # last: its presence marks a complete folder
        shutil.rmtree(out, ignore_errors=True)  # an incomplete, outdated or damaged folder (this job holds its lock)
    log.info("prepared the %d training pairs of %s / %s in %s (%d source, %d target subword tokens) in %.0f s",
             count, src_path, tgt_path, out, tokens["src"], tokens["tgt"], seconds)


def _untabbed(pairs: Iterator[tuple[str, str]]) -> Iterator[tuple[str, str]]:
    """The pairs with each tab a space: the text the encoding workers read separates the sides by
    a tab, and sentencepiece's normalisation (nmt_nfkc) makes a tab a space anyway (the same ids)."""
    for src, tgt in pairs:
        yield src.replace("\t", " "), tgt.replace("\t", " ")
