"""Preparing a WMT14 pair once: clean, learn the shared subwords, binarise (§5.1).

``prepare_wmt`` turns the raw corpora (:mod:`aiayn.data.wmt.archives`) into a prepared folder
``<cache_dir>/wmt14/<src>-<tgt>-<vocab>-<key>/`` (the key hashes the settings and the raw
folder's resolved path, so another raw tree is prepared into a folder of its own):

- ``sentencepiece.model``: the shared source-target vocabulary (§5.1: byte-pair encoding of about
  37k tokens for EN-DE; 32k word-pieces for EN-FR, for which a BPE model of 32k stands in);
- ``train.{src,tgt}.{ids,offsets}.npy``: the cleaned training pairs, encoded (:mod:`aiayn.data.storage`);
- ``newstest2013.<lang>``, ``newstest2014.<lang>``: dev and test sentences as raw text (the
  test set read from WMT's sgm), one per line, for encoding at load time and for sacreBLEU;
- ``report.json``: how many pairs each cleaning rule removed, per corpus, the corpora skipped
  (both files empty) and the other counts;
- ``meta.json``: the settings, the contents of every raw file read and the size and SHA-256 of
  every file above (:mod:`aiayn.data.manifest`), written last: its presence marks a complete
  folder; a raw file whose bytes changed since (a damaged file fetched again, say), or a prepared
  file that is no longer as written (cut short, overwritten), has the folder prepared again.

Memory stays bounded whatever the corpus size: the corpora are streamed, the subword model is
learnt from a uniform random sample of at most ``sample_pairs`` pairs (reservoir sampling), and
the encoding runs over chunks of a cleaned text file in ``workers`` processes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path

from aiayn.data.cache import build_once, check_folder
from aiayn.data.manifest import META, damage, folder_files, outdated, raw_fingerprints, read_meta
from aiayn.data.readers import read_lines
from aiayn.data.storage import MappedCorpus, encode_tsv, write_pairs
from aiayn.data.subwords import given_key, learnt_or_given
from aiayn.data.wmt.archives import WMTFiles, expected_files, locate
from aiayn.data.wmt.cleaning import (
    CleaningReport,
    CleaningRules,
    clean_pairs,
    rules_dict,
)
from aiayn.data.wmt.sgm import check_aligned, read_segments
from aiayn.errors import DataError
from aiayn.files import atomic_path, write_json

log = logging.getLogger(__name__)

FORMAT = 2  # bump when the prepared folder's contents change meaning (2: raw folder in the key, raw fingerprints)
VAL_SPLIT, TEST_SPLIT = "newstest2013", "newstest2014"


def prepared_dir(raw_dir: str | os.PathLike, cache_dir: str | os.PathLike, src_lang: str, tgt_lang: str, vocab_size: int,
                 rules: CleaningRules, sample_pairs: int, subword_model: Path | None = None) -> Path:
    """Where the data prepared from ``raw_dir`` with these settings lives (or will)."""
    settings = {**_settings(src_lang, tgt_lang, vocab_size, rules, sample_pairs, subword_model),
                "raw_dir": _resolved(raw_dir)}
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    return Path(cache_dir) / "wmt14" / f"{src_lang}-{tgt_lang}-{vocab_size}-{key}"


def _settings(src_lang: str, tgt_lang: str, vocab_size: int, rules: CleaningRules, sample_pairs: int,
              subword_model: Path | None) -> dict:
    return {"format": FORMAT, "src_lang": src_lang, "tgt_lang": tgt_lang, "vocab_size": int(vocab_size),
            "rules": rules_dict(rules), "sample_pairs": int(sample_pairs), "seed": 0, **given_key(subword_model)}


def _resolved(raw_dir: str | os.PathLike) -> str:
    return str(Path(raw_dir).expanduser().resolve())


def raw_files(raw_dir: str | os.PathLike, src_lang: str, tgt_lang: str) -> dict[str, Path]:
    """Every raw file the pair is prepared from (training corpora, dev and test sets), by its path
    under ``raw_dir`` (what ``meta.json`` records it by)."""
    raw = Path(raw_dir)
    return {path.relative_to(raw).as_posix(): path for path in expected_files(raw, src_lang, tgt_lang)[1]}


def is_prepared(directory: Path) -> bool:
    return (directory / META).is_file()


def unusable(directory: Path, raw_dir: str | os.PathLike, src_lang: str, tgt_lang: str, hashes: bool) -> str | None:
    """None when the folder is complete, whole (:func:`aiayn.data.manifest.damage`; token
    arrays hashed too with ``hashes``) and prepared from the raw files there are now; else why
    not, in a sentence (``"absent"``: never completed)."""
    meta = read_meta(directory)
    if meta is None:
        return "absent"
    return outdated(directory, meta, raw_files(raw_dir, src_lang, tgt_lang)) or damage(directory, meta, hashes)


def prepare_wmt(
    raw_dir: str | os.PathLike,
    cache_dir: str | os.PathLike,
    src_lang: str,
    tgt_lang: str,
    vocab_size: int,
    rules: CleaningRules | None = None,
    sample_pairs: int = 1_000_000,
    workers: int | None = None,
    download: bool = True,
    hashes: bool = False,
    subword_model: Path | None = None,
) -> Path:
    """Prepare the pair (see the module docstring) unless a complete, whole folder prepared from
    the same raw files with the same settings exists; returns the folder. ``rules``: the cleaning
    rules (default: :class:`CleaningRules`'s). ``hashes``: check the token arrays of an existing
    folder by their SHA-256 too (``prepare.py``), not only by size. ``subword_model``: the
    sentencepiece model to encode with (``task.subword_model``) instead of one learnt from a sample.

    One job prepares a folder at a time (:func:`aiayn.data.cache.build_once`); another that wants
    it waits and reuses it. What killed jobs left in the cache (temporary folders, lock files) is
    removed; a full disk stops preparation with one line and leaves nothing half-written."""
    rules = rules if rules is not None else CleaningRules()
    out = prepared_dir(raw_dir, cache_dir, src_lang, tgt_lang, vocab_size, rules, sample_pairs, subword_model)
    check_folder(cache_dir, "paths.cache_dir", "AIAYN_CACHE_DIR")

    def build(why: str) -> None:
        try:
            files = locate(raw_dir, src_lang, tgt_lang, download)
        except DataError as error:
            if why == "absent":
                raise
            raise DataError(f"{why}, and it cannot be prepared again: {error}") from None
        _prepare(files, out, raw_dir, cache_dir, src_lang, tgt_lang, vocab_size, rules, sample_pairs, workers,
                 subword_model)

    build_once(out, lambda: unusable(out, raw_dir, src_lang, tgt_lang, hashes), build,
               f"the prepared WMT14 {src_lang}-{tgt_lang} data")
    return out


def _prepare(files: WMTFiles, out: Path, raw_dir: str | os.PathLike, cache_dir: str | os.PathLike, src_lang: str,
             tgt_lang: str, vocab_size: int, rules: CleaningRules, sample_pairs: int, workers: int | None,
             subword_model: Path | None) -> None:
    """Build the folder ``out`` beside it under a temporary name, renamed once complete (the caller
    holds its lock)."""
    started = time.perf_counter()
    fingerprints = raw_fingerprints(raw_files(raw_dir, src_lang, tgt_lang))  # before reading: a later change shows next time
    with atomic_path(out) as tmp:  # built beside ``out``, renamed to it once complete
        tmp.mkdir()
        # 1. Dev and test sets as raw text lines (never cleaned or filtered); small, so read
        #    first: a damaged sgm file stops preparation in seconds, not after the encoding.
        sizes = _write_eval_sets(files, tmp, src_lang, tgt_lang)

        # 2. Clean while streaming into one text file; sample pairs for the subword model.
        report = CleaningReport()
        tsv = tmp / "train.tsv"
        chunks, sample, kept = _clean(files, rules, report, tsv, sample_pairs)
        for line in report.lines():
            log.info("cleaning %s", line)
        if len(report.skipped) == len(files.train):
            listing = "; ".join(f"{name} ({' / '.join(entry['files'])})" for name, entry in report.skipped.items())
            raise DataError(f"every WMT14 {src_lang}-{tgt_lang} training corpus is empty: {listing}; unpack their "
                            f"archives into {raw_dir} again, or point task.raw_dir at a folder that holds them")
        if kept == 0:
            raise DataError(f"no training pair of {[str(p) for _, p, _ in files.train]} survived cleaning; see the counts above")
        cleaned_s = time.perf_counter() - started

        # 3. The shared subword vocabulary (§3.4 shares the embeddings, so one model for both sides).
        lines = [src for src, _ in sample] + [tgt for _, tgt in sample]
        vocab = learnt_or_given(lines, vocab_size, cache_dir, subword_model, input_sentence_size=len(lines))
        del lines, sample
        shutil.copyfile(vocab.path, tmp / "sentencepiece.model")
        subwords_s = time.perf_counter() - started - cleaned_s

        # 4. Encode once, in parallel, into the memory-mapped arrays.
        workers = workers or os.cpu_count() or 1
        count, hashed = encode_tsv(tsv, chunks, tmp / "sentencepiece.model", tmp, "train", vocab.vocab_size, workers)
        tsv.unlink()
        encoded_s = time.perf_counter() - started - cleaned_s - subwords_s

        corpus = MappedCorpus(tmp, "train")
        tokens = {side: int(corpus.stored_lengths(side).sum()) for side in ("src", "tgt")}
        seconds = time.perf_counter() - started
        summary = {
            "cleaning": report.to_json(),
            "rules": rules_dict(rules),
            "train_pairs": count,
            "train_subword_tokens": tokens,
            "subwords": ({"vocab_size": vocab.vocab_size, "given": str(subword_model)} if subword_model is not None else
                         {"vocab_size": vocab.vocab_size, "sample_pairs": min(sample_pairs, kept), "model": "bpe"}),
            "eval_sizes": sizes,
            "raw_dir": _resolved(raw_dir),
            "raw_files": {
                "train": [[name, str(s), str(t)] for name, s, t in files.train],
                VAL_SPLIT: [str(p) for p in files.val],
                TEST_SPLIT: [str(p) for p in files.test],
            },
            "seconds": {"clean": round(cleaned_s, 1), "subwords": round(subwords_s, 1), "encode": round(encoded_s, 1),
                        "total": round(seconds, 1)},
            "workers": workers,
        }
        write_json(tmp / "report.json", summary)
        meta = {**_settings(src_lang, tgt_lang, vocab_size, rules, sample_pairs, subword_model), "raw_dir": _resolved(raw_dir),
                "raw_files": fingerprints, "files": folder_files(tmp, hashed),
                "prepared_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        write_json(tmp / META, meta)  # last: its presence marks a complete folder
        shutil.rmtree(out, ignore_errors=True)  # an incomplete, outdated or damaged folder (this job holds its lock)
    log.info(
        "prepared WMT14 %s-%s in %s: %d training pairs (%d source, %d target subword tokens) in %.0f s "
        "(%.0f pairs/s); cleaning report in %s",
        src_lang, tgt_lang, out, count, tokens["src"], tokens["tgt"], seconds, report.total["read"] / max(seconds, 1e-9),
        out / "report.json",
    )


def _write_eval_sets(files: WMTFiles, directory: Path, src_lang: str, tgt_lang: str) -> dict[str, int]:
    """``newstest2013.<lang>`` (plain text) and ``newstest2014.<lang>`` (from the sgm files) in
    ``directory``, one sentence a line; returns the sentences of each."""
    sizes = {}
    for split, (src_path, tgt_path), reader in ((VAL_SPLIT, files.val, read_lines), (TEST_SPLIT, files.test, read_segments)):
        src, tgt = reader(src_path), reader(tgt_path)
        if reader is read_segments:  # by document and segment id: a reference's missing segment is named
            check_aligned((src_path, src), (tgt_path, tgt), "unpack them from test-full.tgz into task.raw_dir again")
            src, tgt = [text for _, text in src], [text for _, text in tgt]
        if len(src) != len(tgt):
            raise DataError(f"{split}: {src_path} has {len(src)} sentences but {tgt_path} has {len(tgt)}; they must be aligned")
        if not src:
            raise DataError(f"{split}: {src_path} and {tgt_path} hold no sentence; unpack them from "
                            f"{'dev.tgz' if split == VAL_SPLIT else 'test-full.tgz'} into task.raw_dir again")
        for lang, lines in ((src_lang, src), (tgt_lang, tgt)):
            if any("\n" in line or "\r" in line for line in lines):
                raise DataError(f"{split}: a sentence of {src_path if lang == src_lang else tgt_path} spans several lines")
            (directory / f"{split}.{lang}").write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
        sizes[split] = len(src)
    return sizes


def _clean(files: WMTFiles, rules: CleaningRules, report: CleaningReport, tsv: Path,
           sample_pairs: int) -> tuple[list[tuple[int, int]], list[tuple[str, str]], int]:
    """Stream the cleaned training pairs into ``tsv`` (:func:`aiayn.data.storage.write_pairs`)."""
    return write_pairs(clean_pairs(files, rules, report), tsv, sample_pairs)
