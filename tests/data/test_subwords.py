"""Training, caching and using the joint sentencepiece model on real Multi30k lines."""

from __future__ import annotations

import logging
import unicodedata

import pytest

from aiayn.data.readers import read_lines
from aiayn.data.subwords import Subwords, train_or_load
from aiayn.errors import DataError


def _normalized(text: str) -> str:
    """What sentencepiece's default normalisation (nmt_nfkc) keeps of a line."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


@pytest.fixture(scope="module")
def lines(data_root) -> list[str]:
    en = read_lines(data_root / "multi30k" / "train.en.gz")[:2000]
    de = read_lines(data_root / "multi30k" / "train.de.gz")[:2000]
    return en + de


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def subwords(lines, cache) -> Subwords:
    return train_or_load(lines, 1000, cache)


def test_exact_vocab_size_and_special_ids(subwords, cache):
    assert subwords.vocab_size == 1000
    assert (subwords.pad_id, subwords.unk_id, subwords.bos_id, subwords.eos_id) == (0, 1, 2, 3)
    assert subwords.path.parent == cache / "sentencepiece"
    assert subwords.path.suffix == ".model" and subwords.path.with_suffix(".vocab").is_file()
    pieces = subwords.path.with_suffix(".vocab").read_text(encoding="utf-8").splitlines()
    assert len(pieces) == 1000
    assert [p.split("\t")[0] for p in pieces[:4]] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert sorted(p.name for p in cache.joinpath("sentencepiece").iterdir()) == sorted(
        [subwords.path.name, subwords.path.with_suffix(".vocab").name, subwords.path.with_suffix(".sha256").name]
    )  # no temporary files left behind; the model's size and hash recorded beside it


def test_round_trip_of_real_sentences(subwords, lines, data_root):
    ids = subwords.encode(lines)
    assert len(ids) == len(lines)
    assert all(ids_ and all(3 < i < 1000 for i in ids_) for ids_ in ids)  # no specials, no unknowns
    assert subwords.decode(ids) == [_normalized(line) for line in lines]
    val = read_lines(data_root / "multi30k" / "val.en.gz")
    assert subwords.decode(subwords.encode(val)) == [_normalized(line) for line in val]


def test_decode_strips_specials_and_stops_at_eos(subwords, lines):
    first, second = subwords.encode(lines[:2])
    bos, eos, pad = subwords.bos_id, subwords.eos_id, subwords.pad_id
    padded = [[bos, *first, eos, pad, pad], [*second, eos, *first, eos], [eos, *first], []]
    assert subwords.decode(padded) == [lines[0], lines[1], "", ""]


def test_encode_rejects_a_bare_string(subwords):
    with pytest.raises(TypeError, match="list"):
        subwords.encode("A man.")


def test_second_call_reuses_the_cached_model(subwords, lines, cache, caplog):
    mtime = subwords.path.stat().st_mtime_ns
    with caplog.at_level(logging.INFO, logger="aiayn.data"):
        again = train_or_load(iter(lines), 1000, cache)  # an iterable gives the same key as a list
    assert again.path == subwords.path
    assert again.path.stat().st_mtime_ns == mtime
    assert any("reusing" in r.getMessage() and r.name.startswith("aiayn.data") for r in caplog.records)
    assert not any("training" in r.getMessage() for r in caplog.records)


def test_other_settings_or_lines_give_another_model(subwords, lines, cache, caplog):
    with caplog.at_level(logging.INFO, logger="aiayn.data"):
        smaller = train_or_load(lines, 800, cache)
    assert any("training" in r.getMessage() for r in caplog.records)
    assert smaller.vocab_size == 800 and smaller.path != subwords.path
    other_lines = train_or_load(lines[:-1], 1000, cache)
    assert other_lines.path != subwords.path
    other_seed = train_or_load(lines, 1000, cache, seed=1)
    assert other_seed.path != subwords.path
    assert subwords.path.is_file()


def test_a_vocabulary_larger_than_the_data_allows_says_to_lower_vocab_size(tmp_path):
    with pytest.raises(DataError, match=r"too few distinct pieces for a vocabulary of 500 subwords \(at most \d+ here\); lower task.vocab_size"):
        train_or_load(["a b c", "d e f"], 500, tmp_path)


def test_a_text_of_more_characters_than_the_vocabulary_says_to_raise_vocab_size(tmp_path):
    """Every character is kept as a piece: a Chinese text of 3,000 distinct characters needs more than 500."""
    characters = [chr(0x4E00 + n) for n in range(3000)]
    lines = ["".join(characters[i:i + 30]) for i in range(0, 3000, 30)]
    with pytest.raises(DataError, match=r"^a vocabulary of 500 subwords cannot hold the training text's distinct "
                                        r"characters, each a subword of its own \(3,005 with the special ids\); raise "
                                        r"task.vocab_size to at least 3,005$"):
        train_or_load(lines, 500, tmp_path)
    assert train_or_load(lines, 3005, tmp_path).vocab_size == 3005  # as that says


def test_a_text_whose_lines_end_in_a_carriage_return_alone_says_so(data_root, tmp_path):
    """Old Mac line ends: each file reads as one line, longer than sentencepiece takes (before: "sentencepiece
    training … failed: INTERNAL: src/trainer_interface.cc(467) [!sentences_.empty()]")."""
    sides = ["\r".join(read_lines(data_root / "multi30k" / f"train.{lang}.gz")[:2000]) for lang in ("en", "de")]
    with pytest.raises(DataError) as info:
        train_or_load(sides, 500, tmp_path)
    longest = max(len(side.encode()) for side in sides)
    assert str(info.value) == (f"none of the 2 training lines is one sentencepiece learns from: each is empty or "
                               f"over its 4,192 bytes (the longest has {longest:,}); a file whose lines end in a "
                               "carriage return alone (old Mac files) reads as one line: end its lines in \\n "
                               "(tr '\\r' '\\n')")


def test_training_subwords_on_no_lines_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="no lines"):
        train_or_load([], 500, tmp_path)


def test_loading_a_broken_model_file(tmp_path):
    path = tmp_path / "broken.model"
    path.write_bytes(b"not a model")
    with pytest.raises(DataError, match="broken.model"):
        Subwords(path)


def test_jobs_started_together_share_one_build_of_a_cache_entry(lines, tmp_path, caplog):
    """While one job builds an entry (it holds the entry's lock), another that wants the same
    entry waits, then reuses what the first wrote instead of training and overwriting it: its
    checkpoints must name the model the first job's checkpoints name."""
    import threading

    from filelock import FileLock

    built = train_or_load(lines, 1000, tmp_path / "built")  # what "the first job" will have written
    cache = tmp_path / "shared"
    folder = cache / "sentencepiece"
    folder.mkdir(parents=True)
    lock = folder / f".{built.path.stem}.lock"
    results: list[Subwords] = []
    waiter = threading.Thread(target=lambda: results.append(train_or_load(lines, 1000, cache)))
    with caplog.at_level(logging.INFO, logger="aiayn.data.subwords"):
        with FileLock(lock):  # the first job is training
            waiter.start()
            waiter.join(timeout=1.0)
            assert waiter.is_alive() and not results  # waiting, not training
            for suffix in (".vocab", ".model"):  # the first job writes its model
                folder.joinpath(built.path.stem + suffix).write_bytes(built.path.with_suffix(suffix).read_bytes())
        waiter.join(timeout=60)  # the lock is released: the waiter goes on
    assert results and results[0].path == folder / built.path.name
    assert results[0].serialized() == built.serialized()
    assert "built by another job meanwhile" in caplog.text and "training a" not in caplog.text
    assert not lock.exists()  # nothing left beside the model


def test_a_cached_model_cut_short_is_trained_again(lines, tmp_path, caplog):
    model = train_or_load(lines, 1000, tmp_path).path
    whole = model.read_bytes()
    model.write_bytes(whole[: len(whole) - 1000])  # a copy cut short (before: reused, then unloadable)
    with caplog.at_level(logging.INFO, logger="aiayn.data.subwords"):
        again = train_or_load(lines, 1000, tmp_path)
    assert (f"sentencepiece model {model} is damaged ({len(whole) - 1000} bytes, {len(whole)} when it was written); "
            "training it again") in caplog.text
    assert again.path == model and model.stat().st_size == len(whole) and again.vocab_size == 1000
