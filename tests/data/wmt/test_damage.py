"""A prepared WMT14 folder damaged for real after its preparation — a token array cut short, bytes
flipped in one, a subword model cut short — and raw files rewritten with the same bytes: the
sizes and SHA-256 that meta.json recorded are checked before the folder is used, a damaged one is
prepared again (one line of the log says which file and why), and an unchanged raw file never
has it prepared again. The tools run in this process (tests.helpers.inprocess)."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from aiayn.data.storage import MappedCorpus
from aiayn.data.wmt.datamodule import WMTDataModule
from aiayn.data.wmt.preparation import prepare_wmt
from aiayn.errors import DataError
from tests.helpers.inprocess import run_tool

VOCAB = 500


def _prepare(raw: Path, cache: Path) -> Path:
    return prepare_wmt(raw, cache, "en", "de", VOCAB, workers=1, download=False)


def _prepare_tool(raw: Path, tmp_path: Path):
    """prepare.py on ``raw``, in this process; returns its result and its log."""
    run_dir = tmp_path / f"run{len(list(tmp_path.glob('run*')))}"
    result = run_tool("src/prepare.py", "task=wmt_en_de", f"task.raw_dir={raw}", f"task.vocab_size={VOCAB}",
                      "task.datamodule.download=false", "task.datamodule.prepare_workers=1",
                      f"hydra.run.dir={run_dir}", cache_dir=tmp_path / "cache")
    return result, (run_dir / "prepare.log").read_text()


@pytest.mark.slow
def test_a_token_array_cut_short_is_found_and_prepared_again(raw_copy, tmp_path, caplog):
    folder = _prepare(raw_copy, tmp_path / "cache")
    array = folder / "train.src.ids.npy"
    whole = array.read_bytes()
    array.write_bytes(whole[: len(whole) // 2])  # a copy cut short, a disk that filled up
    with pytest.raises(DataError, match="train.src.ids.npy or train.src.offsets.npy is not a whole array"):
        MappedCorpus(folder, "train")  # before: numpy's "mmap length is greater than file size"
    module = WMTDataModule(str(raw_copy), vocab_size=VOCAB, max_tokens=1024, cache_dir=str(tmp_path / "cache"),
                           download=False)
    with caplog.at_level(logging.INFO, logger="aiayn.data"):
        module.setup("fit")  # a training run's start: sizes are checked
    assert (f"prepared file {array} is damaged ({len(whole) // 2} bytes, {len(whole)} when it was written); "
            "preparing again") in caplog.text
    assert array.read_bytes() == whole and len(module.dataset("train")) > 9000


@pytest.mark.slow
def test_prepare_finds_flipped_bytes_in_a_token_array_and_prepares_again(raw_copy, tmp_path):
    folder = _prepare(raw_copy, tmp_path / "cache")
    array = folder / "train.tgt.ids.npy"
    whole = array.read_bytes()
    with open(array, "r+b") as handle:  # same size, other bytes: only the hash sees it
        handle.seek(len(whole) // 2)
        handle.write(bytes(b ^ 0xFF for b in whole[len(whole) // 2: len(whole) // 2 + 8]))
    result, log = _prepare_tool(raw_copy, tmp_path)
    assert f"prepared file {array} is damaged (its bytes changed since it was written); preparing again" in log
    assert result.stdout.splitlines()[-1].startswith(f"prepared wmt_en_de in {folder} ")
    assert array.read_bytes() == whole
    result, log = _prepare_tool(raw_copy, tmp_path)  # whole now: reused
    assert f"reusing the prepared WMT14 en-de data in {folder}" in log and "preparing again" not in log


@pytest.mark.slow
def test_a_subword_model_cut_short_is_found_at_load_and_prepared_again(raw_copy, tmp_path, caplog):
    folder = _prepare(raw_copy, tmp_path / "cache")
    model = folder / "sentencepiece.model"
    whole = model.read_bytes()
    model.write_bytes(whole[:-100])
    module = WMTDataModule(str(raw_copy), vocab_size=VOCAB, cache_dir=str(tmp_path / "cache"), download=False)
    with caplog.at_level(logging.INFO, logger="aiayn.data"):
        module.prepare_data()
    assert f"prepared file {model} is damaged ({len(whole) - 100} bytes, {len(whole)} when it was written)" in caplog.text
    assert model.read_bytes() == whole


@pytest.mark.slow
def test_raw_files_touched_or_copied_with_the_same_bytes_keep_the_preparation(raw_copy, tmp_path, caplog):
    cache = tmp_path / "cache"
    folder = _prepare(raw_copy, cache)
    prepared_at = json.loads((folder / "meta.json").read_text())["prepared_at"]
    corpus = raw_copy / "training" / "europarl-v7.de-en.en"
    os.utime(corpus, ns=(1, 1))  # touch
    dev = raw_copy / "dev" / "newstest2013.de"
    copy = tmp_path / "copy"
    shutil.copyfile(dev, copy)
    shutil.copyfile(copy, dev)  # cp: a new time, the same bytes
    with caplog.at_level(logging.INFO, logger="aiayn.data"):
        assert _prepare(raw_copy, cache) == folder
    assert "preparing again" not in caplog.text and f"reusing the prepared WMT14 en-de data in {folder}" in caplog.text
    assert (f"raw files rewritten with the same bytes since the preparation at {folder}: "
            "training/europarl-v7.de-en.en, dev/newstest2013.de; it stays in use") in caplog.text
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["prepared_at"] == prepared_at and meta["raw_files"]["training/europarl-v7.de-en.en"]["mtime_ns"] == 1
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="aiayn.data"):  # the new times are recorded: nothing to hash now
        assert _prepare(raw_copy, cache) == folder
    assert "rewritten" not in caplog.text
    dev.write_bytes(dev.read_bytes().replace(b"a", b"b", 1))  # other bytes, same size
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="aiayn.data"):
        _prepare(raw_copy, cache)
    assert f"raw file {dev} changed since the preparation at {folder} (" in caplog.text


def test_what_a_killed_preparation_left_is_removed_by_the_next(raw_copy, tmp_path, caplog):
    cache = tmp_path / "cache"
    folder = _prepare(raw_copy, cache)
    shutil.rmtree(folder)
    wmt, subwords = cache / "wmt14", cache / "sentencepiece"
    left = [wmt / f".{folder.name}.999999.tmp", wmt / f".{folder.name}.lock", subwords / ".bpe500-0123abcd.lock",
            subwords / ".bpe500-0123abcd.x1y2z3", subwords / ".bpe500-0123abcd.model.999999.tmp"]
    for path in left:
        if path.name.endswith((".999999.tmp", ".x1y2z3")) and "model" not in path.name:
            path.mkdir()
            (path / "train.tsv").write_text("half\n")
        else:
            path.write_bytes(b"")
    with caplog.at_level(logging.INFO, logger="aiayn.data"):
        assert _prepare(raw_copy, cache) == folder
    assert not [path for path in left if path.exists()]
    assert sorted(p.name for p in wmt.iterdir()) == [folder.name]
    assert f"removed what an interrupted job left in {wmt}: .{folder.name}.999999.tmp, .{folder.name}.lock" in caplog.text
    assert np.load(folder / "train.src.ids.npy", mmap_mode="r").size > 0
