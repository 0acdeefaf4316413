"""Fetching WMT's archives from a real HTTP server on the loopback interface that misbehaves as
servers and networks do (tests/helpers/faulty_http.py): a transfer cut short, an HTML page served
for the archive, a resume refused with HTTP 416, Range ignored, two jobs fetching one archive at
once, and a disk that fills while unpacking."""

from __future__ import annotations

import errno
import shutil
import tarfile
import threading

import pytest

from aiayn.data.wmt.archives import MIRROR_ENV, locate
from aiayn.errors import DataError

DEV = ("dev/newstest2013.en", "dev/newstest2013.de")
TEST = ("test-full/newstest2014-deen-src.en.sgm", "test-full/newstest2014-deen-ref.de.sgm")


@pytest.fixture
def served(faulty_http, raw_tree, raw_copy):
    """dev.tgz and test-full.tgz served; the raw tree without dev/ (test-full/ too, where a test removes it)."""
    for name, members in (("dev.tgz", DEV), ("test-full.tgz", TEST)):
        with tarfile.open(faulty_http.root / name, "w:gz") as tar:
            for member in members:
                tar.add(raw_tree / member, arcname=member)
    shutil.rmtree(raw_copy / "dev")
    return faulty_http


def _mirror(monkeypatch, server, mode: str) -> str:
    url = f"{server.url}/{mode}/"
    monkeypatch.setenv(MIRROR_ENV, url)
    return url


def _fetched(server) -> list:
    return [(path.rsplit("/", 1)[1], asked) for path, asked in server.requests]


def test_a_chunked_transfer_cut_short_is_one_line_to_run_again(served, raw_copy, raw_tree, monkeypatch):
    """Before: http.client's IncompleteRead (not an OSError) ended the run in a traceback, exit 1."""
    url = _mirror(monkeypatch, served, "chunkcut")
    with pytest.raises(DataError) as info:
        locate(raw_copy, "en", "de", download=True)
    message = str(info.value)
    assert f"(the archive that holds them could not be downloaded ({url}dev.tgz: the transfer was cut short (" in message
    assert message.endswith("run again to resume)): dev/newstest2013.en, dev/newstest2013.de "
                            f"(from {url}dev.tgz); run again to fetch them") and "\n" not in message
    _mirror(monkeypatch, served, "ok")  # the network back: the next run fetches it
    assert locate(raw_copy, "en", "de", download=True).val[0].read_bytes() == (raw_tree / DEV[0]).read_bytes()


def test_an_html_page_served_for_the_archive_is_named_and_nothing_kept(served, raw_copy, monkeypatch):
    """Before: the page was renamed into archives/dev.tgz, and every later run failed on it."""
    url = _mirror(monkeypatch, served, "html")
    for _ in range(2):  # and again: nothing of the first was taken for the archive
        with pytest.raises(DataError) as info:
            locate(raw_copy, "en", "de", download=True)
        assert "(the archive that holds them sent an HTML page, not a .tgz archive)" in str(info.value)
        assert f"(from {url}dev.tgz)" in str(info.value)  # the address said once
        assert str(info.value).endswith(f"; unpack those archives into {raw_copy} (training files may be gzipped, "
                                        "e.g. commoncrawl.de-en.en.gz), or point task.raw_dir at a folder that holds them")
        assert not (raw_copy / "archives").exists()  # no archive, no .part: nothing kept


def test_two_jobs_fetching_one_archive_download_it_once(served, raw_copy, raw_tree, monkeypatch, caplog):
    """Two jobs (EN-DE and EN-FR, or two nodes) fetching dev.tgz into one raw folder: the second
    waits, says so, and takes what the first fetched (before: both wrote into one dev.tgz.part)."""
    _mirror(monkeypatch, served, "held")  # the first job's transfer stays under way until the second waits
    results: list = []

    def job():
        try:
            results.append(locate(raw_copy, "en", "de", download=True).val[0].read_bytes())
        except Exception as error:  # noqa: BLE001  reported below
            results.append(error)

    threads = [threading.Thread(target=job) for _ in range(2)]
    with caplog.at_level("INFO"):
        for thread in threads:
            thread.start()
        while "; waiting for it" not in caplog.text and all(thread.is_alive() for thread in threads):
            threading.Event().wait(0.01)  # the sign: the second job says it waits for the first
        served.release.set()
        for thread in threads:
            thread.join(30)
    assert results == [(raw_tree / DEV[0]).read_bytes()] * 2
    assert _fetched(served) == [("dev.tgz", None)]
    assert "another process is fetching dev.tgz into" in caplog.text and "; waiting for it" in caplog.text
    assert sorted(p.name for p in (raw_copy / "archives").iterdir()) == ["dev.tgz"]  # no .part, no lock left


def test_a_part_as_long_as_the_file_or_longer_starts_the_download_again(served, raw_copy, monkeypatch, caplog):
    """Before: HTTP 416 (Range Not Satisfiable) on every run, for good."""
    _mirror(monkeypatch, served, "ok")
    (raw_copy / "archives").mkdir()
    part = raw_copy / "archives" / "dev.tgz.part"
    longer = (served.root / "dev.tgz").stat().st_size + 10
    part.write_bytes(b"x" * longer)
    with caplog.at_level("INFO"):
        locate(raw_copy, "en", "de", download=True)
    assert _fetched(served) == [("dev.tgz", f"bytes={longer}-"), ("dev.tgz", None)]
    assert "(HTTP 416: it holds" in caplog.text and "downloading it again from the start" in caplog.text
    assert not part.exists() and (raw_copy / "archives" / "dev.tgz").read_bytes() == (served.root / "dev.tgz").read_bytes()


def test_a_server_that_ignores_range_is_logged_as_starting_over(served, raw_copy, monkeypatch, caplog):
    """Before: "(resuming at byte 19)" though the whole file came again and replaced the .part."""
    url = _mirror(monkeypatch, served, "norange")
    (raw_copy / "archives").mkdir()
    (raw_copy / "archives" / "dev.tgz.part").write_bytes(b"stale partial bytes")
    with caplog.at_level("INFO"):
        locate(raw_copy, "en", "de", download=True)
    assert (f"downloading {url}dev.tgz to {raw_copy / 'archives' / 'dev.tgz'} from the start (the server ignored the "
            "request to resume at byte 19)") in caplog.text and "resuming at byte" not in caplog.text


def test_a_disk_that_fills_while_unpacking_is_said_and_the_archives_left_not_fetched(served, raw_copy, monkeypatch):
    """Before: "could not be downloaded (No space left on device)", and the next archive downloaded
    onto the full disk."""
    _mirror(monkeypatch, served, "ok")
    shutil.rmtree(raw_copy / "test-full")

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tarfile.TarFile, "makefile", full)
    with pytest.raises(DataError) as info:
        locate(raw_copy, "en", "de", download=True)
    assert str(info.value).startswith(f"{raw_copy}: No space left on device while unpacking dev.tgz (the disk is full")
    assert str(info.value).endswith("Free space there and run again")
    assert _fetched(served) == [("dev.tgz", None)]  # not test-full.tgz
    assert not (raw_copy / "dev").exists() and not list(raw_copy.glob("*unpacking-*"))
