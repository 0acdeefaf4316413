"""A corpus of one's own, its training split prepared once (aiayn.data.prepared_text): the pairs a
run trains on are those the text would give, read and encoded once into arrays every process maps;
the same files are never prepared twice, changed or damaged ones are; and prepare.py prepares it.
Real files (the shared WMT14 slice in fairseq's layout), real sentencepiece."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
from filelock import FileLock

from aiayn.data import cache
from aiayn.data.corpus import filter_pairs
from aiayn.data.parallel_text import ParallelTextDataModule
from aiayn.data.readers import read_lines, read_parallel
from aiayn.data.storage import MappedCorpus
from aiayn.data.subwords import train_or_load
from aiayn.errors import DataError
from tests.helpers.datafiles import own_corpus, write_lines
from tests.helpers.inprocess import run_tool


def module(folder: Path, cache: Path, **settings) -> ParallelTextDataModule:
    return ParallelTextDataModule(**{"data_dir": str(folder), "src_lang": "en", "tgt_lang": "de", "vocab_size": 500,
                                     "max_tokens": 2048, "max_length": 60, "cache_dir": str(cache),
                                     "prepare_workers": 2, **settings})


def prepared_train(data: ParallelTextDataModule) -> MappedCorpus:
    data.prepare_data()
    data.setup("fit")
    return data.dataset("train")


@pytest.fixture
def corpus(tmp_path: Path, data_root: Path) -> Path:
    return own_corpus(tmp_path / "corpus", data_root)


def test_the_prepared_pairs_are_those_the_text_gives(corpus: Path, subword_cache: Path, caplog) -> None:
    data = module(corpus, subword_cache)
    train = prepared_train(data)

    assert isinstance(train, MappedCorpus) and train.directory == data.prepared
    assert data.prepared.parent == subword_cache / "parallel_text"
    # The vocabulary is the one the whole corpus's lines learn (the same cache entry, not trained again) …
    src, tgt = read_parallel(corpus / "train.en.gz", corpus / "train.de.gz")
    assert data.vocab.serialized() == train_or_load(src + tgt, 500, subword_cache).serialized()
    # … and the pairs kept, their order and their ids, those of the text encoded and filtered as Multi30k's.
    src_ids, tgt_ids = data.vocab.encode(src), data.vocab.encode(tgt)
    keep, dropped = filter_pairs(src_ids, tgt_ids, 60)
    assert data.filtered == dropped and dropped["too_long"] > 0
    assert train.line_numbers.tolist() == keep
    assert [train[i][1:] for i in range(len(train))] == [(src_ids[k], tgt_ids[k]) for k in keep]

    # Another process (a DDP rank, the next run) maps what is there: nothing read or written again.
    arrays = sorted(data.prepared.glob("*.npy"))
    written = [path.stat().st_mtime_ns for path in arrays]
    with caplog.at_level(logging.INFO, logger="aiayn.data"):
        again = prepared_train(module(corpus, subword_cache))
    assert "reusing the prepared training pairs" in caplog.text and "prepared the" not in caplog.text
    assert [path.stat().st_mtime_ns for path in arrays] == written
    assert len(again) == len(train) and again[5] == train[5]


def test_changed_files_are_prepared_again_and_the_same_bytes_are_not(corpus: Path, tmp_path: Path, caplog) -> None:
    cache = tmp_path / "cache"
    first = prepared_train(module(corpus, cache))

    source = corpus / "train.en.gz"
    os.utime(source, ns=(source.stat().st_atime_ns, source.stat().st_mtime_ns + 10**9))  # touched: the same bytes
    with caplog.at_level(logging.INFO, logger="aiayn.data"):
        assert len(prepared_train(module(corpus, cache))) == len(first)
    assert "preparing again" not in caplog.text and "prepared the" not in caplog.text

    for lang in ("en", "de"):  # the last pair gone from both sides
        path = corpus / f"train.{lang}.gz"
        write_lines(path, read_lines(path)[:-1])
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="aiayn.data"):
        second = module(corpus, cache)
        train = prepared_train(second)
    assert f"raw file {corpus / 'train.en.gz'} changed since the preparation" in caplog.text
    assert train.stored_size == first.stored_size - 1 and second.prepared == first.directory


def test_a_file_replaced_with_its_time_kept_is_prepared_again(corpus: Path, tmp_path: Path, caplog) -> None:
    # Another file of the same size whose modification time was kept (cp -p, rsync -a, tar -x): only its
    # change time and its bytes say it is not the file prepared (before: its stale preparation was reused).
    for lang in ("en", "de"):
        write_lines(corpus / f"train.{lang}", read_lines(corpus / f"train.{lang}.gz"))
        (corpus / f"train.{lang}.gz").unlink()
    cache = tmp_path / "cache"
    prepared_train(module(corpus, cache))
    source, lines = corpus / "train.en", read_lines(corpus / "train.en")
    times = (source.stat().st_atime_ns, source.stat().st_mtime_ns)
    replacement = tmp_path / "train.en"
    write_lines(replacement, [lines[0][::-1], *lines[1:]])  # the same size, other bytes
    assert replacement.stat().st_size == source.stat().st_size
    shutil.copyfile(replacement, source)
    os.utime(source, ns=times)
    with caplog.at_level(logging.INFO, logger="aiayn.data"):
        data = module(corpus, cache)
        stored = MappedCorpus(prepared_train(data).directory, "train")
    assert f"raw file {source} changed since the preparation" in caplog.text
    assert stored[0][1] == data.vocab.encode([lines[0][::-1]])[0]


def test_a_damaged_array_is_prepared_again(corpus: Path, tmp_path: Path, caplog) -> None:
    cache = tmp_path / "cache"
    data = module(corpus, cache)
    stored = prepared_train(data).stored_size
    ids = data.prepared / "train.tgt.ids.npy"
    with open(ids, "r+b") as handle:  # the same size, other bytes: only a check by SHA-256 sees it
        handle.seek(-64, os.SEEK_END)
        handle.write(bytes(64))
    with caplog.at_level(logging.INFO, logger="aiayn.data"):
        module(corpus, cache).prepare_data(hashes=True)  # as prepare.py checks
    assert f"prepared file {ids} is damaged (its bytes changed since it was written); preparing again" in caplog.text
    assert MappedCorpus(data.prepared, "train").stored_size == stored
    assert np.load(ids)[-32:].any()


def test_the_arrays_are_hashed_as_they_are_written_not_read_back(corpus: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    """The folder's record holds the SHA-256 of every file; the token arrays' is taken of their bytes
    as they are written (before: each array was read back and hashed once written, seconds at EN-FR's
    5 GB). It is the SHA-256 of the file's bytes, which the checks of later uses compare with."""
    hashed = []
    real = cache.file_digest

    def read_and_hashed(path, *args, **kwargs) -> str:  # the real hash of a file, read back: which file
        hashed.append(Path(path).name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(cache, "file_digest", read_and_hashed)
    data = module(corpus, tmp_path / "cache")
    data.prepare_data(hashes=True)  # as prepare.py prepares
    folder = data.prepared
    arrays = sorted(path.name for path in folder.glob("*.npy"))
    assert len(arrays) == 4 and not set(arrays) & set(hashed) and "sentencepiece.model" in hashed
    recorded = json.loads((folder / "meta.json").read_text())["files"]
    for name in arrays:
        contents = (folder / name).read_bytes()
        assert recorded[name] == {"size": len(contents), "sha256": hashlib.sha256(contents).hexdigest()}
    hashed.clear()
    with caplog.at_level(logging.INFO, logger="aiayn.data"):
        module(corpus, tmp_path / "cache").prepare_data(hashes=True)  # prepare.py again: each array read and checked
    assert "reusing the prepared training pairs" in caplog.text and set(arrays) <= set(hashed)


def test_jobs_that_want_the_same_preparation_at_once_share_one(corpus: Path, tmp_path: Path, caplog) -> None:
    """While one job prepares a folder (it holds the folder's lock), another that wants it (a DDP
    rank, a node of the same job, a sweep's other run) waits, then maps what the first wrote."""
    first = module(corpus, tmp_path / "first")
    first.prepare_data()  # what "the first job" will have written
    other = module(corpus, tmp_path / "shared")
    folder = other.prepared
    folder.parent.mkdir(parents=True)
    lock = folder.parent / f".{folder.name}.lock"
    waiting = threading.Event()

    class Sign(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("waiting for another job"):
                waiting.set()

    sign = Sign()
    logging.getLogger("aiayn.data").addHandler(sign)
    waiter = threading.Thread(target=other.prepare_data)
    try:
        with caplog.at_level(logging.INFO, logger="aiayn.data"):
            with FileLock(lock):  # the first job is preparing
                waiter.start()
                assert waiting.wait(timeout=120), "the second job did not wait for the folder's lock"
                shutil.copytree(first.prepared, folder)  # the first job's folder, complete
            waiter.join(timeout=120)
    finally:
        logging.getLogger("aiayn.data").removeHandler(sign)
    assert not waiter.is_alive()
    assert "(prepared by another job meanwhile)" in caplog.text and "prepared the" not in caplog.text
    assert other.vocab.serialized() == first.vocab.serialized() and not lock.exists()


def test_a_tab_in_a_sentence_is_encoded_as_the_space_it_normalises_to(corpus: Path, tmp_path: Path) -> None:
    src, tgt = read_parallel(corpus / "train.en.gz", corpus / "train.de.gz")
    src, tgt = src[:3000], tgt[:3000]
    src[0] = "A\tman is\t\tstanding ."
    write_lines(corpus / "train.en", src)  # the plain files win over the gzipped ones
    write_lines(corpus / "train.de", tgt)
    data = module(corpus, tmp_path / "cache", max_length=1000)  # every pair kept: pair 0 is line 0
    train = prepared_train(data)
    assert train[0][1] == data.vocab.encode(["A man is  standing ."])[0]
    assert train.stored_size == 3000


def test_a_large_corpus_learns_its_subwords_from_a_sample(corpus: Path, tmp_path: Path) -> None:
    whole = module(corpus, tmp_path / "cache")
    sampled = module(corpus, tmp_path / "cache", subword_sample_pairs=2000)
    assert sampled.prepared != whole.prepared  # a setting of the preparation: a folder of its own
    train = prepared_train(sampled)
    assert train.stored_size == 10_000  # every pair is encoded; only the subwords are learnt from 2,000
    src, tgt = read_parallel(corpus / "train.en.gz", corpus / "train.de.gz")
    assert sampled.vocab.serialized() != train_or_load(src + tgt, 500, tmp_path / "cache").serialized()


def test_misaligned_training_files_are_named_and_nothing_is_kept(corpus: Path, tmp_path: Path) -> None:
    write_lines(corpus / "train.de.gz", read_lines(corpus / "train.de.gz")[:-3])
    with pytest.raises(DataError) as misaligned:
        module(corpus, tmp_path / "cache").prepare_data()
    assert str(misaligned.value) == (f"train split 'train': parallel files differ in length: {corpus / 'train.de.gz'} "
                                     f"ends after line 9997 but {corpus / 'train.en.gz'} goes on at line 9998; they "
                                     "must be aligned line by line")
    assert list((tmp_path / "cache" / "parallel_text").iterdir()) == []  # no half-written folder, no lock


def test_prepare_py_prepares_the_training_split(corpus: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    result = run_tool("src/prepare.py", "task=parallel_text", f"task.data_dir={corpus}", "task.src_lang=en",
                      "task.tgt_lang=de", "task.vocab_size=500", f"hydra.run.dir={tmp_path / 'run'}", cache_dir=cache)
    (folder,) = (cache / "parallel_text").iterdir()
    assert result.stdout.strip().splitlines()[-1] == f"prepared parallel_text_en_de in {folder}"
    assert MappedCorpus(folder, "train").stored_size == 10_000
