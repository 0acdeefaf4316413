"""The training split read as text is encoded once (aiayn.data.encoded): the pairs a later run maps
are those encoding them in memory gives, a damaged entry is encoded again, and a cache folder
that cannot hold them costs a warning, not the run."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from aiayn.data.corpus import ParallelCorpus, filter_pairs
from aiayn.data.multi30k import Multi30kDataModule
from aiayn.data.readers import read_lines
from aiayn.data.storage import MappedCorpus
from tests.helpers.datafiles import multi30k_copy

PAIRS = 1500
MAX_LENGTH = 64


@pytest.fixture(scope="module")
def root(tmp_path_factory, data_root: Path) -> Path:
    """Multi30k with 1,500 real training pairs, one with an empty side and one over max_length."""
    src = read_lines(data_root / "multi30k" / "train.en.gz")[:PAIRS]
    tgt = read_lines(data_root / "multi30k" / "train.de.gz")[:PAIRS]
    src[3], tgt[7] = "", " ".join(tgt[7] for _ in range(10))
    return multi30k_copy(tmp_path_factory.mktemp("corpus"), data_root, src, tgt)


def _module(root: Path, cache: Path) -> Multi30kDataModule:
    module = Multi30kDataModule(str(root), vocab_size=300, max_tokens=1024, max_length=MAX_LENGTH,
                                cache_dir=str(cache), download=False)
    module.setup("fit")
    return module


def _cache_beside(first: Multi30kDataModule, cache: Path) -> Path:
    """A cache folder of its own holding ``first``'s subword model (trained again, it could differ)."""
    cache.mkdir()
    (cache / "sentencepiece").symlink_to(first.cache_dir / "sentencepiece")
    return cache


def _items(module: Multi30kDataModule) -> list[tuple[int, list[int], list[int]]]:
    train = module.dataset("train")
    return [train[i] for i in range(len(train))]


def _in_memory(module: Multi30kDataModule, root: Path) -> list[tuple[int, list[int], list[int]]]:
    """The training items as encoding the lines in memory and filtering them gives."""
    src, tgt = (module.vocab.encode(read_lines(root / "multi30k" / f"train.{lang}.gz")) for lang in ("en", "de"))
    keep, dropped = filter_pairs(src, tgt, MAX_LENGTH)
    assert dropped["empty"] == 1 and dropped["too_long"] >= 1 and module.filtered == dropped
    return [(index, src[line], tgt[line]) for index, line in enumerate(keep)]


@pytest.fixture(scope="module")
def first(root: Path, tmp_path_factory) -> Multi30kDataModule:
    return _module(root, tmp_path_factory.mktemp("cache"))


def test_the_pairs_a_later_run_maps_are_those_encoded_in_memory(root: Path, first: Multi30kDataModule, caplog) -> None:
    (entry,) = (first.cache_dir / "encoded").iterdir()
    assert isinstance(first.dataset("train"), MappedCorpus) and first.dataset("train").directory == entry
    expected = _in_memory(first, root)
    assert _items(first) == expected and len(expected) == PAIRS - sum(first.filtered.values())
    with caplog.at_level(logging.INFO, logger="aiayn"):
        later = _module(root, first.cache_dir)
    assert "encoding" not in caplog.text and f"kept {len(expected)} of {PAIRS} training pairs" in caplog.text
    assert _items(later) == expected and later.filtered == first.filtered
    assert [batch["index"].tolist() for batch in later.train_dataloader()] == [
        batch["index"].tolist() for batch in first.train_dataloader()]


def test_a_damaged_entry_is_encoded_again_with_a_warning(root: Path, first: Multi30kDataModule, tmp_path: Path,
                                                          caplog) -> None:
    expected = _items(first)
    (entry,) = (first.cache_dir / "encoded").iterdir()
    cache = _cache_beside(first, tmp_path / "cache")
    copy = cache / "encoded" / entry.name
    copy.mkdir(parents=True)
    for file in entry.iterdir():
        copy.joinpath(file.name).write_bytes(file.read_bytes())
    ids = copy / "train.src.ids.npy"
    data = bytearray(ids.read_bytes())
    data[-1] ^= 0x01  # one id changed, the size kept
    ids.write_bytes(bytes(data))
    with caplog.at_level(logging.INFO, logger="aiayn"):
        again = _module(root, cache)
    assert f"prepared file {ids} is damaged (its bytes changed since it was written); encoding the training pairs " \
           "again" in caplog.text
    assert _items(again) == expected
    (copy / "meta.json").unlink()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="aiayn"):
        assert _items(_module(root, cache)) == expected
    assert f"the encoded training pairs in {copy} have no readable record of their files; encoding" in caplog.text


def test_what_a_killed_encoding_left_is_removed(root: Path, first: Multi30kDataModule, tmp_path: Path) -> None:
    leftover = _cache_beside(first, tmp_path / "cache") / "encoded" / ".1500-0123456789abcdef01234567.x1y2"
    leftover.mkdir(parents=True)
    (leftover / "train.src.ids.npy").write_bytes(b"half")
    _module(root, tmp_path / "cache")
    assert not leftover.exists()


def test_a_cache_folder_that_cannot_hold_them_costs_a_warning_not_the_run(root: Path, first: Multi30kDataModule,
                                                                          tmp_path: Path, caplog) -> None:
    cache = _cache_beside(first, tmp_path / "cache")
    (cache / "encoded").write_text("not a folder")
    with caplog.at_level(logging.WARNING, logger="aiayn"):
        module = _module(root, cache)
    assert f"{cache / 'encoded'}: cannot keep the encoded training pairs there (" in caplog.text
    assert "they are encoded in memory for this run" in caplog.text
    assert isinstance(module.dataset("train"), ParallelCorpus)
    assert _items(module) == _items(first) and module.filtered == first.filtered
