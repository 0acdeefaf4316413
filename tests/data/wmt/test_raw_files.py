"""WMT14's raw files (no network but a loopback HTTP server): the readers (plain, gz, sgm) on the
real shared files, the raw tree's errors named by file and line (copies of the miniature tree of
conftest.py with one thing broken), and the archives downloaded and unpacked."""

from __future__ import annotations

import logging
import shutil
import tarfile

import pytest

from aiayn.data.readers import read_lines
from aiayn.data.wmt.archives import ARCHIVES, MIRROR_ENV, fetch_archive, locate
from aiayn.data.wmt.cleaning import normalize
from aiayn.data.wmt.preparation import prepare_wmt
from aiayn.data.wmt.sgm import read_sgm, unescape
from aiayn.errors import DataError

VOCAB = 500


# --- readers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("sgm", [f"newstest2014-{pair}-{role}.{lang}.sgm" for pair, langs in (("deen", "ende"), ("fren", "enfr"))
                                 for role in ("src", "ref") for lang in (langs[:2], langs[2:])])
def test_sgm_segments_equal_the_plain_test_set(data_root, sgm):
    """Every shared sgm file gives exactly the plain test set's lines (before: four lines of
    deen-src.en, one of fren-src.en, kept a double space the plain file has as one)."""
    pair, lang = sgm.split("-")[1], sgm.split(".")[1]
    segments = read_sgm(data_root / "wmt14" / "sgm" / sgm)
    lines = read_lines(data_root / "wmt14" / f"newstest2014-en-{pair[:2]}.{lang}")  # deen: en-de
    assert len(segments) == len(lines) == 3003
    assert segments == lines
    assert not any("&amp;" in s or "&quot;" in s or "&lt;" in s for s in segments)


def test_unescape_decodes_entities_and_normalize_collapses_whitespace():
    assert unescape("Parliament &apos;s &quot;x&quot; &amp; &lt;b&gt; &#124; &#x41;") == "Parliament 's \"x\" & <b> | A"
    assert unescape("AT&T &bogus; &#xZZ;") == "AT&T &bogus; &#xZZ;"
    assert normalize("  a \t b&apos;  ") == "a b'"


def test_sgm_broken_segment_names_file_and_line(data_root, tmp_path):
    lines = (data_root / "wmt14" / "sgm" / "newstest2014-deen-ref.de.sgm").read_text(encoding="utf-8").splitlines()
    number = next(i for i, line in enumerate(lines) if line.startswith("<seg")) + 11  # 0-based, a segment line
    lines[number] = lines[number].replace("</seg>", "")
    path = tmp_path / "broken.de.sgm"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=f"line {number + 1} has a broken segment") as info:
        read_sgm(path)
    assert str(path) in str(info.value)


# --- errors in the raw tree ------------------------------------------------------------------


def test_mismatched_line_counts_name_file_and_line(raw_copy, tmp_path):
    root = raw_copy
    short = root / "training" / "news-commentary-v9.de-en.de"
    short.write_text("".join(f"{line}\n" for line in read_lines(short)[:1500]), encoding="utf-8")
    with pytest.raises(DataError, match="ends after line 1500") as info:
        prepare_wmt(root, tmp_path / "cache", "en", "de", VOCAB, download=False)
    assert str(short) in str(info.value) and "goes on at line 1501" in str(info.value)
    assert not list((tmp_path / "cache" / "wmt14").iterdir())  # nothing half-prepared is left


def test_truncated_gz_names_file_and_line(raw_copy, tmp_path):
    root = raw_copy
    path = root / "commoncrawl.de-en.de.gz"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=r"truncated or corrupt gzip after line \d+") as info:
        prepare_wmt(root, tmp_path / "cache", "en", "de", VOCAB, download=False)
    assert str(path) in str(info.value)


def test_missing_files_are_listed_with_their_archives(raw_copy, tmp_path):
    root = raw_copy
    (root / "commoncrawl.de-en.en.gz").unlink()
    shutil.rmtree(root / "test-full")
    with pytest.raises(DataError) as info:
        locate(root, "en", "de", download=False)
    message = str(info.value)
    assert f"WMT14 en-de files missing under {root} (task.datamodule.download=false): " in message  # named under it
    assert "commoncrawl.de-en.en (from https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz); " in message
    assert ("test-full/newstest2014-deen-src.en.sgm, test-full/newstest2014-deen-ref.de.sgm (from "
            "https://www.statmt.org/wmt14/test-full.tgz); ") in message
    assert "europarl" not in message and "task.raw_dir" in message
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="WMT14 en-fr files missing"):
        locate(tmp_path / "empty", "en", "fr", download=False)


def test_a_training_file_there_both_plain_and_gzipped_is_read_plain_and_the_two_named(raw_copy, caplog):
    """commoncrawl.de-en.en.gz and an unpacked copy beside it: the plain file is read and the two
    named once in a warning, however often the files are located (before: the .gz left unread, no word)."""
    gzipped = raw_copy / "commoncrawl.de-en.en.gz"
    plain = gzipped.with_name("commoncrawl.de-en.en")
    plain.write_text("".join(f"{line}\n" for line in read_lines(gzipped)), encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="aiayn.data.readers"):
        files = locate(raw_copy, "en", "de", download=False)
        assert locate(raw_copy, "en", "de", download=False) == files
    assert ("commoncrawl", plain, raw_copy / "commoncrawl.de-en.de.gz") in files.train
    assert [record.getMessage() for record in caplog.records] == [
        (f"{plain} and commoncrawl.de-en.en.gz are both there: commoncrawl.de-en.en is read (the plain file wins), "
         "commoncrawl.de-en.en.gz is not; keep the one you mean and move the other out")]


def test_a_raw_dir_inside_or_above_the_raw_tree_names_the_folder_to_give(raw_copy, tmp_path):
    """task.raw_dir=<raw>/training (or the folder above <raw>): none of the files is there, and the
    line ends with the folder that holds them (before: only the ten files missing, with their archives)."""
    for given in (raw_copy / "training", raw_copy.parent):
        with pytest.raises(DataError) as info:
            locate(given, "en", "de", download=False)
        assert str(info.value).endswith(f"or point task.raw_dir at a folder that holds them (task.raw_dir={raw_copy} "
                                        "holds 10 of them)")
    (raw_copy / "commoncrawl.de-en.en.gz").unlink()  # some there: no other folder is looked for
    with pytest.raises(DataError) as info:
        locate(raw_copy, "en", "de", download=False)
    assert str(info.value).endswith("or point task.raw_dir at a folder that holds them")


def test_a_raw_dir_that_does_not_exist_is_named_without_listing_every_file(tmp_path):
    with pytest.raises(DataError) as info:
        locate(tmp_path / "nowhere", "en", "de", download=False)
    assert str(info.value).startswith(f"task.raw_dir={tmp_path / 'nowhere'} does not exist: point task.raw_dir at")
    assert "download=true" in str(info.value) and "europarl" not in str(info.value)


# --- downloading (from a real HTTP server on the loopback interface) -------------------------


@pytest.fixture
def mirror(loopback_http, monkeypatch):
    """The folder a loopback HTTP server serves, set as the WMT mirror."""
    root, url = loopback_http
    monkeypatch.setenv(MIRROR_ENV, url)
    return root


def test_archives_that_cannot_be_downloaded_into_a_raw_dir_not_there_leave_no_folder(tmp_path, mirror):
    """Nothing is served: every archive fails (HTTP 404). Before: an empty <raw_dir>/archives/ was
    left under a task.raw_dir given with a typo; a folder that held a partial download is kept."""
    raw = tmp_path / "typo" / "wmt14"
    with pytest.raises(DataError, match="could not be downloaded"):
        locate(raw, "en", "de", download=True)
    assert list(tmp_path.iterdir()) == [mirror]


def test_missing_archives_are_downloaded_and_unpacked(raw_tree, tmp_path, mirror):
    members = {"europarl": ["training/europarl-v7.de-en.en", "training/europarl-v7.de-en.de"],
               "commoncrawl": ["commoncrawl.de-en.en.gz", "commoncrawl.de-en.de.gz"],
               "news-commentary": ["training/news-commentary-v9.de-en.en", "training/news-commentary-v9.de-en.de"],
               "dev": ["dev/newstest2013.en", "dev/newstest2013.de"],
               "test": ["test-full/newstest2014-deen-src.en.sgm", "test-full/newstest2014-deen-ref.de.sgm"]}
    for key, names in members.items():
        with tarfile.open(mirror / ARCHIVES[key].name, "w:gz") as tar:
            for name in names:
                tar.add(raw_tree / name, arcname=name)
    raw = tmp_path / "raw"
    (raw / "training").mkdir(parents=True)
    shutil.copyfile(raw_tree / "training" / "europarl-v7.de-en.en", raw / "training" / "europarl-v7.de-en.en")
    (raw / "archives").mkdir()
    (raw / "archives" / "dev.tgz.part").write_bytes(b"stale partial bytes")  # replaced: this server ignores Range
    files = locate(raw, "en", "de", download=True)
    for name, src, tgt in files.train:
        assert src.read_bytes() == (raw_tree / src.relative_to(raw)).read_bytes()
        assert tgt.read_bytes() == (raw_tree / tgt.relative_to(raw)).read_bytes()
    assert files.test[1].read_bytes() == (raw_tree / "test-full" / "newstest2014-deen-ref.de.sgm").read_bytes()
    assert sorted(p.name for p in (raw / "archives").iterdir()) == sorted(ARCHIVES[k].name for k in members)
    # an archive the server does not have: the error lists what is still missing
    shutil.rmtree(raw / "test-full")
    (raw / "archives" / "test-full.tgz").unlink()
    (mirror / "test-full.tgz").unlink()
    with pytest.raises(DataError) as info:
        locate(raw, "en", "de", download=True)
    # one line: the reason once, each file still missing by its archive, what to do
    assert str(info.value).startswith(f"WMT14 en-de files missing under {raw} (the archive that holds them could not be "
                                      "downloaded (HTTP Error 404")
    assert f"): test-full/newstest2014-deen-src.en.sgm, test-full/newstest2014-deen-ref.de.sgm (from {ARCHIVES['test'].url})" in (
        str(info.value)) and "\n" not in str(info.value)
    assert not [p for p in raw.iterdir() if "unpacking-" in p.name]  # no temporary folder left


@pytest.mark.parametrize("damage", ["cut", "crc"])
def test_a_damaged_archive_unpacks_nothing_is_named_and_removed(raw_tree, tmp_path, damage):
    """cut: the second file cut short. crc: one bit of the gzip trailer's CRC flipped, which tarfile,
    stopping at the tar's end blocks, never reads (before: unpacked as if whole, silently). Either
    is removed, so that the next run downloads it again, and nothing of it is unpacked."""
    raw = tmp_path / "raw"
    (raw / "archives").mkdir(parents=True)
    whole = tmp_path / "test-full.tgz"
    with tarfile.open(whole, "w:gz") as tar:
        for name in ("newstest2014-deen-src.en.sgm", "newstest2014-deen-ref.de.sgm"):
            tar.add(raw_tree / "test-full" / name, arcname=f"test-full/{name}")
    data = bytearray(whole.read_bytes())
    if damage == "crc":
        data[-8] ^= 1
    (raw / "archives" / "test-full.tgz").write_bytes(data[: len(data) * 3 // 4] if damage == "cut" else data)
    failure = fetch_archive(ARCHIVES["test"], raw)
    assert failure.reason.startswith(f"{raw / 'archives' / 'test-full.tgz'} is damaged or not a tar archive (")
    assert ("CRC check failed" if damage == "crc" else "ended before") in failure.reason
    assert failure.reason.endswith("it was removed, so that the next run downloads it again") and failure.again
    assert not (raw / "test-full").exists()  # not even the first, whole member: nothing half-unpacked
    assert [p.name for p in raw.iterdir()] == ["archives"] and not list((raw / "archives").iterdir())
