"""Downloading Multi30k's files from a real HTTP server on the loopback interface that misbehaves
(tests/helpers/faulty_http.py): each refusal names the URL and what it sent, and keeps nothing."""

from __future__ import annotations

import shutil

import pytest

from aiayn.data import multi30k
from aiayn.data.multi30k import multi30k_files
from aiayn.errors import DataError


@pytest.fixture
def target(tmp_path):
    return tmp_path / "root"


def _refused(monkeypatch, server, mode: str, target, caplog) -> str:
    """The warning multi30k_files logged for val.en.gz served by ``mode``, after checking that nothing was kept."""
    monkeypatch.setenv(multi30k.MIRROR_ENV, f"{server.url}/{mode}/")
    with caplog.at_level("WARNING"), pytest.raises(DataError, match="download failed"):
        multi30k_files(target, "val", "en", "de")
    assert not target.exists()  # no file, no temporary, no folder made for them
    (warning,) = [record.getMessage() for record in caplog.records if "val.en.gz" in record.getMessage()]
    assert ".tmp" not in warning  # before: named a temporary file already deleted
    return warning


def test_a_chunked_transfer_cut_short_is_a_download_failure(data_root, faulty_http, target, monkeypatch, caplog):
    """Before: http.client's IncompleteRead (not an OSError) escaped: a traceback, exit 1."""
    shutil.copy(data_root / "multi30k" / "val.en.gz", faulty_http.root)
    warning = _refused(monkeypatch, faulty_http, "chunkcut", target, caplog)
    assert f"{faulty_http.url}/chunkcut/val.en.gz: the transfer was cut short (IncompleteRead(" in warning
    assert warning.endswith("; run again")


def test_an_html_page_is_named_by_its_url(faulty_http, target, monkeypatch, caplog):
    warning = _refused(monkeypatch, faulty_http, "html", target, caplog)
    assert warning.endswith(f": {faulty_http.url}/html/val.en.gz sent an HTML page, not gzip data (a .gz file)")


def test_gzip_data_whose_crc_fails_is_refused(data_root, faulty_http, target, monkeypatch, caplog):
    data = bytearray((data_root / "multi30k" / "val.en.gz").read_bytes())
    data[-8] ^= 1  # the trailer's CRC: every line decompresses
    (faulty_http.root / "val.en.gz").write_bytes(data)
    warning = _refused(monkeypatch, faulty_http, "ok", target, caplog)
    assert f": {faulty_http.url}/ok/val.en.gz sent damaged gzip data (CRC check failed " in warning


def test_another_file_served_under_the_name_is_refused_by_its_line_count(data_root, faulty_http, target, monkeypatch,
                                                                          caplog):
    """Before: test_2016_flickr.en.gz served as val.en.gz was taken for the validation set."""
    shutil.copyfile(data_root / "multi30k" / "test_2016_flickr.en.gz", faulty_http.root / "val.en.gz")
    warning = _refused(monkeypatch, faulty_http, "ok", target, caplog)
    assert warning.endswith(f": {faulty_http.url}/ok/val.en.gz sent 1,000 lines, where Multi30k's val files have 1,014: "
                            "another file under its name")


def test_a_users_own_files_are_not_held_to_the_official_line_counts(data_root, tmp_path, monkeypatch):
    monkeypatch.setenv(multi30k.MIRROR_ENV, "http://127.0.0.1:9")  # a download would fail here
    (tmp_path / "multi30k").mkdir()
    for lang in ("en", "de"):  # a user's own (shorter) validation files
        shutil.copyfile(data_root / "multi30k" / f"test_2016_flickr.{lang}.gz", tmp_path / "multi30k" / f"val.{lang}.gz")
    assert multi30k_files(tmp_path, "val", "en", "de")[0] == tmp_path / "multi30k" / "val.en.gz"
