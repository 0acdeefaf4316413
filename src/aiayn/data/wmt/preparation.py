"""Preparing a WMT14 pair once: clean, learn the shared subwords, binarise (§5.1).

``prepare_wmt`` turns the raw corpora (:mod:`aiayn.data.wmt.archives`) into a prepared folder
``<cache_dir>/wmt14/<src>-<tgt>-<vocab>-<key>/`` (the key hashes the settings):

- ``sentencepiece.model``: the shared source-target vocabulary (§5.1: byte-pair encoding of about
  37k tokens for EN-DE; 32k word-pieces for EN-FR, for which a BPE model of 32k stands in);
- ``train.{src,tgt}.{ids,offsets}.npy``: the cleaned training pairs, encoded (:mod:`aiayn.data.wmt.storage`);
- ``newstest2013.<lang>``, ``newstest2014.<lang>``: dev and test sentences as raw text (the
  test set read from WMT's sgm), one per line, for encoding at load time and for sacreBLEU;
- ``report.json``: how many pairs each cleaning rule removed, per corpus, and the other counts;
- ``meta.json``: the settings, written last: its presence marks a complete folder.

Memory stays bounded whatever the corpus size: the corpora are streamed, the subword model is
learnt from a uniform random sample of at most ``sample_pairs`` pairs (reservoir sampling), and
the encoding runs over chunks of a cleaned text file in ``workers`` processes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import time
from pathlib import Path

from aiayn.data.readers import read_lines
from aiayn.data.subwords import train_or_load
from aiayn.data.wmt.archives import locate
from aiayn.data.wmt.cleaning import (
    CleaningReport,
    CleaningRules,
    clean_pairs,
    rules_dict,
    write_json,
)
from aiayn.data.wmt.sgm import read_sgm
from aiayn.data.wmt.storage import MappedCorpus, encode_tsv
from aiayn.errors import DataError
from aiayn.files import atomic_path

log = logging.getLogger(__name__)

FORMAT = 1  # bump when the prepared folder's contents change meaning
CHUNK_PAIRS = 200_000  # pairs per encoding job
VAL_SPLIT, TEST_SPLIT = "newstest2013", "newstest2014"


def prepared_dir(cache_dir: str | os.PathLike, src_lang: str, tgt_lang: str, vocab_size: int, rules: CleaningRules,
                 sample_pairs: int) -> Path:
    """Where the data prepared with these settings lives (or will)."""
    settings = _settings(src_lang, tgt_lang, vocab_size, rules, sample_pairs)
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    return Path(cache_dir) / "wmt14" / f"{src_lang}-{tgt_lang}-{vocab_size}-{key}"


def _settings(src_lang: str, tgt_lang: str, vocab_size: int, rules: CleaningRules, sample_pairs: int) -> dict:
    return dict(format=FORMAT, src_lang=src_lang, tgt_lang=tgt_lang, vocab_size=int(vocab_size),
                rules=rules_dict(rules), sample_pairs=int(sample_pairs), seed=0)


def is_prepared(directory: Path) -> bool:
    return (directory / "meta.json").is_file()


def prepare_wmt(
    raw_dir: str | os.PathLike,
    cache_dir: str | os.PathLike,
    src_lang: str,
    tgt_lang: str,
    vocab_size: int,
    rules: CleaningRules = CleaningRules(),
    sample_pairs: int = 1_000_000,
    workers: int | None = None,
    download: bool = True,
) -> Path:
    """Prepare the pair (see the module docstring) unless a complete folder with the same
    settings exists; returns the folder. The raw files are needed only the first time."""
    out = prepared_dir(cache_dir, src_lang, tgt_lang, vocab_size, rules, sample_pairs)
    if is_prepared(out):
        log.info("reusing the prepared WMT14 %s-%s data in %s", src_lang, tgt_lang, out)
        return out
    started = time.perf_counter()
    files = locate(raw_dir, src_lang, tgt_lang, download)
    with atomic_path(out) as tmp:  # built beside ``out``, renamed to it once complete
        tmp.mkdir()
        # 1. Clean while streaming into one text file; sample pairs for the subword model.
        report = CleaningReport()
        tsv, chunks, sample = tmp / "train.tsv", [], []
        rng = random.Random(0)
        with open(tsv, "wb") as handle:
            start = position = kept = 0
            for src, tgt in clean_pairs(files, rules, report):
                if "\t" in src or "\t" in tgt:  # cannot happen after whitespace normalisation
                    raise AssertionError("tab in a normalised sentence")
                data = f"{src}\t{tgt}\n".encode("utf-8")
                handle.write(data)
                position += len(data)
                kept += 1
                if kept % CHUNK_PAIRS == 0:
                    chunks.append((start, position))
                    start = position
                if len(sample) < sample_pairs:
                    sample.append((src, tgt))
                else:
                    slot = rng.randrange(kept)
                    if slot < sample_pairs:
                        sample[slot] = (src, tgt)
            if position > start:
                chunks.append((start, position))
        for line in report.lines():
            log.info("cleaning %s", line)
        if kept == 0:
            raise DataError(f"no training pair of {[str(p) for _, p, _ in files.train]} survived cleaning; see the counts above")
        cleaned_s = time.perf_counter() - started

        # 2. The shared subword vocabulary (§3.4 shares the embeddings, so one model for both sides).
        lines = [src for src, _ in sample] + [tgt for _, tgt in sample]
        vocab = train_or_load(lines, vocab_size, cache_dir, input_sentence_size=len(lines))
        del lines, sample
        shutil.copyfile(vocab.path, tmp / "sentencepiece.model")
        subwords_s = time.perf_counter() - started - cleaned_s

        # 3. Encode once, in parallel, into the memory-mapped arrays.
        workers = workers or os.cpu_count() or 1
        count = encode_tsv(tsv, chunks, tmp / "sentencepiece.model", tmp, "train", vocab.vocab_size, workers)
        tsv.unlink()
        encoded_s = time.perf_counter() - started - cleaned_s - subwords_s

        # 4. Dev and test sets as raw text lines (never cleaned or filtered).
        sizes = {}
        for split, (src_path, tgt_path), reader in ((VAL_SPLIT, files.val, read_lines), (TEST_SPLIT, files.test, read_sgm)):
            src, tgt = reader(src_path), reader(tgt_path)
            if len(src) != len(tgt):
                raise DataError(f"{split}: {src_path} has {len(src)} sentences but {tgt_path} has {len(tgt)}; they must be aligned")
            for lang, lines_ in ((src_lang, src), (tgt_lang, tgt)):
                if any("\n" in line or "\r" in line for line in lines_):
                    raise DataError(f"{split}: a sentence of {src_path if lang == src_lang else tgt_path} spans several lines")
                (tmp / f"{split}.{lang}").write_text("".join(f"{line}\n" for line in lines_), encoding="utf-8")
            sizes[split] = len(src)

        corpus = MappedCorpus(tmp, "train")
        tokens = {side: int(corpus.stored_lengths(side).sum()) for side in ("src", "tgt")}
        seconds = time.perf_counter() - started
        summary = {
            "cleaning": report.to_json(),
            "rules": rules_dict(rules),
            "train_pairs": count,
            "train_subword_tokens": tokens,
            "subwords": {"vocab_size": vocab.vocab_size, "sample_pairs": min(sample_pairs, kept), "model": "bpe"},
            "eval_sizes": sizes,
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
        write_json(tmp / "meta.json", _settings(src_lang, tgt_lang, vocab_size, rules, sample_pairs))
        if is_prepared(out):  # another process finished first: keep its folder (ours, removed, is not renamed)
            shutil.rmtree(tmp)
        else:
            shutil.rmtree(out, ignore_errors=True)  # an incomplete folder (no meta.json)
    log.info(
        "prepared WMT14 %s-%s in %s: %d training pairs (%d source, %d target subword tokens) in %.0f s "
        "(%.0f pairs/s); cleaning report in %s",
        src_lang, tgt_lang, out, count, tokens["src"], tokens["tgt"], seconds, report.total["read"] / max(seconds, 1e-9),
        out / "report.json",
    )
    return out
