"""Bad files, kind by kind: data files (lengths, gzip, encoding, empty or overlong lines, a
vocabulary the text cannot fill) and checkpoints (not one, cut short, someone else's, too few to
average). Each gives a one-line error naming the file (and line) and what to do, or a counted skip
(docs/guarantees/bad-input.md catalogues every kind)."""

from __future__ import annotations

import gzip
import logging
from pathlib import Path

import pytest
import torch

from aiayn.checkpoints.averaging import last_checkpoints
from aiayn.checkpoints.io import read_checkpoint
from aiayn.data.multi30k import Multi30kDataModule
from aiayn.data.readers import read_lines, read_parallel
from aiayn.errors import DataError
from tests.helpers.datafiles import multi30k_copy, write_lines


# -- data files ---------------------------------------------------------------------------------
def test_parallel_files_of_different_lengths_name_both_files_and_counts(tmp_path):
    a, b = write_lines(tmp_path / "a.en", ["one", "two", "three"]), write_lines(tmp_path / "a.de", ["eins", "zwei"])
    with pytest.raises(DataError, match=rf"{a} has 3 lines, {b} has 2; they must be aligned line by line"):
        read_parallel(a, b)


def test_a_truncated_gzip_names_the_file_and_the_last_line_read(tmp_path):
    full = gzip.compress("".join(f"line {i} with some words\n" for i in range(5000)).encode())
    path = tmp_path / "cut.en.gz"
    path.write_bytes(full[: len(full) // 2])
    with pytest.raises(DataError, match=rf"{path}: truncated or corrupt gzip after line \d+ .*download it again"):
        read_lines(path)


def test_bytes_that_are_not_utf8_name_the_file_line_and_byte(tmp_path):
    path = write_lines(tmp_path / "latin1.de", "eins\nzwei\nGr\xfc\xdfe\n".encode("latin-1"))
    with pytest.raises(DataError, match=rf"{path}: line 3 is not valid UTF-8 \(byte 3 of the line\); re-encode"):
        read_lines(path)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(DataError, match=rf"{tmp_path / 'nope.en'}: file not found; check the path or the data root"):
        read_lines(tmp_path / "nope.en")


def _datamodule(root: Path, tmp_path: Path, **kwargs) -> Multi30kDataModule:
    return Multi30kDataModule(str(root), **{"vocab_size": 100, "cache_dir": str(tmp_path / "cache"), "download": False,
                                            **kwargs})


def test_empty_training_files_are_an_error_naming_them(tmp_path, data_root):
    root = multi30k_copy(tmp_path / "data", data_root, [], [])
    with pytest.raises(DataError, match=r"train.en.gz / .*train.de.gz: no lines; a split needs one sentence pair"):
        _datamodule(root, tmp_path).setup("fit")


def test_empty_and_overlong_training_lines_are_skipped_and_counted(tmp_path, data_root, caplog):
    en, de = read_parallel(data_root / "multi30k" / "train.en.gz", data_root / "multi30k" / "train.de.gz")
    en, de = en[:2000], de[:2000]
    en[10], de[20] = "", "   "  # an empty side each
    en[30] = " ".join(["word"] * 400)  # far over max_length subwords
    root = multi30k_copy(tmp_path / "data", data_root, en, de)
    data = _datamodule(root, tmp_path, vocab_size=1000, max_length=150)
    with caplog.at_level(logging.INFO, logger="aiayn.data"):
        data.setup("fit")
    assert data.filtered == {"empty": 2, "too_long": 1}
    assert len(data.dataset("train")) == 1997
    assert "dropped 2 with an empty side, 1 with a side over max_length=150" in caplog.text


def test_every_training_pair_filtered_says_to_raise_max_length(tmp_path, data_root):
    en, de = read_parallel(data_root / "multi30k" / "train.en.gz", data_root / "multi30k" / "train.de.gz")
    root = multi30k_copy(tmp_path / "data", data_root, en[:500], de[:500])
    with pytest.raises(DataError, match=r"every one of the 500 training pairs was dropped .*raise task.datamodule.max_length$"):
        _datamodule(root, tmp_path, max_length=2).setup("fit")


def test_a_vocabulary_larger_than_the_text_allows_says_to_lower_vocab_size(tmp_path, data_root):
    root = multi30k_copy(tmp_path / "data", data_root, ["a b c d e f g"] * 50, ["h i j k l m n"] * 50)
    with pytest.raises(DataError, match=r"too few distinct pieces for a vocabulary of 100 subwords \(at most \d+ "
                                        r"here\); lower task.vocab_size"):
        _datamodule(root, tmp_path).setup("fit")


# -- checkpoints --------------------------------------------------------------------------------
def test_a_text_file_as_checkpoint_is_not_a_readable_checkpoint(tmp_path):
    path = write_lines(tmp_path / "model.ckpt", ["this is not a checkpoint"])
    with pytest.raises(DataError, match=rf"{path}: not a readable checkpoint"):
        read_checkpoint(path)


def test_a_truncated_checkpoint_is_not_a_readable_checkpoint(tmp_path):
    path = tmp_path / "cut.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(10000)}, "hyper_parameters": {}, "subwords": b""}, path)
    path.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(DataError, match=rf"{path}: not a readable checkpoint"):
        read_checkpoint(path)


def test_someone_elses_checkpoint_is_not_an_aiayn_checkpoint(tmp_path):
    path = tmp_path / "other.ckpt"
    torch.save({"state_dict": {}, "epoch": 3}, path)
    with pytest.raises(DataError, match=rf"{path}: not an aiayn training checkpoint \(no hyper_parameters, subwords\)"):
        read_checkpoint(path)


def test_a_tensor_or_a_number_saved_as_a_checkpoint_is_not_an_aiayn_checkpoint(tmp_path):
    """Before: torch's RuntimeError (``key in tensor``) or a TypeError (``key in 5``), a traceback in every tool."""
    for name, value in (("Tensor", torch.zeros(3)), ("int", 5), ("NoneType", None)):
        path = tmp_path / f"{name}.ckpt"
        torch.save(value, path)
        with pytest.raises(DataError, match=rf"^{path}: not an aiayn training checkpoint \(it holds an object of type "
                                             rf"{name}, not a checkpoint's dictionary\)$"):
            read_checkpoint(path)


def test_averaging_more_checkpoints_than_there_are_names_the_steps_found(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    torch.save({"global_step": 5}, folder / "step0000005.ckpt")
    with pytest.raises(DataError, match=r"asked for the last 5 checkpoints but there is only one \(step 5\)"):
        last_checkpoints(tmp_path, 5)
