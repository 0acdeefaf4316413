"""Reading the real Multi30k files, malformed files, and locating/downloading Multi30k."""

from __future__ import annotations

import bz2
import gzip
import io
import logging
import lzma
import shutil

import pytest
from sacrebleu.metrics import BLEU

from aiayn.data import multi30k
from aiayn.data.multi30k import multi30k_files, multi30k_url
from aiayn.data.readers import count_pairs, decode_lines, read_lines, read_parallel
from aiayn.data.wmt.sgm import read_sgm
from aiayn.errors import DataError


@pytest.mark.parametrize("split, count", [("train", 29_000), ("val", 1_014), ("test_2016_flickr", 1_000)])
@pytest.mark.parametrize("lang", ["en", "de"])
def test_multi30k_files_have_their_line_counts_and_no_line_ends(data_root, split, lang, count):
    lines = read_lines(data_root / "multi30k" / f"{split}.{lang}.gz")
    assert len(lines) == count
    assert all("\n" not in line and "\r" not in line for line in lines)


def test_multi30k_train_files_read_as_29000_aligned_pairs(data_root):
    en, de = read_parallel(data_root / "multi30k" / "train.en.gz", data_root / "multi30k" / "train.de.gz")
    assert en[0] == "Two young, White males are outside near many bushes."
    assert de[0] == "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche."
    assert len(en) == len(de) == 29_000


def test_plain_file_matches_gz(data_root, tmp_path):
    gz = data_root / "multi30k" / "val.de.gz"
    plain = tmp_path / "val.de"
    plain.write_bytes(gzip.decompress(gz.read_bytes()))
    assert read_lines(plain) == read_lines(gz)


@pytest.mark.parametrize("data", [b"\xef\xbb\xbf", b"\xef\xbb\xbf\n"], ids=["the mark alone", "the mark and a newline"])
def test_a_file_of_a_byte_order_mark_alone_is_empty(tmp_path, data):
    """What a Windows editor saves for an empty file: no line (before: one empty line, which
    translate.py translated into one output line for an input of none); with a newline after it,
    one empty line, as that newline alone is."""
    path = _written(tmp_path / "empty.en", data)
    expected = [] if data == b"\xef\xbb\xbf" else [""]
    assert read_lines(path) == expected
    with open(path, "rb") as handle:
        assert list(decode_lines(handle, "<stdin>")) == expected

def test_only_the_line_terminator_is_stripped(tmp_path):
    path = tmp_path / "mixed.txt"
    path.write_bytes(b" lead\n\r\nwin\r\nin\rside\ntrail  \nlast")
    assert read_lines(path) == [" lead", "", "win", "in\rside", "trail  ", "last"]


@pytest.mark.parametrize("name", ["bom.de", "bom.de.gz"])
def test_a_byte_order_mark_opening_a_file_is_no_part_of_its_first_line(data_root, tmp_path, name):
    # A file saved by a Windows editor: the reference read with its mark scores below the same text without.
    lines = read_lines(data_root / "multi30k" / "val.de.gz")
    data = "\ufeff".encode() + "".join(f"{line}\n" for line in lines).encode()
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    assert read_lines(path) == lines
    sgm = data_root / "wmt14" / "sgm" / "newstest2014-deen-ref.de.sgm"
    assert read_sgm(_written(tmp_path / "bom.sgm", b"\xef\xbb\xbf" + sgm.read_bytes())) == read_sgm(sgm)


@pytest.mark.parametrize("name", ["joined.de", "joined.de.gz"])
def test_a_byte_order_mark_opening_a_later_line_is_removed_and_named_once(data_root, tmp_path, caplog, name):
    """Two files saved with a byte order mark each, joined with cat: the second's mark opens line
    1,015. It is removed, as the first's is, with one warning naming the file and the line (before:
    kept, a character of that reference no hypothesis has, which sacreBLEU scored below 100)."""
    val, test = read_lines(data_root / "multi30k" / "val.de.gz"), read_lines(data_root / "multi30k" / "test_2016_flickr.de.gz")
    data = b"".join("\ufeff".encode() + "".join(f"{line}\n" for line in lines).encode() for lines in (val, test))
    path = _written(tmp_path / name, gzip.compress(data) if name.endswith(".gz") else data)
    with caplog.at_level(logging.WARNING, logger="aiayn.data.readers"):
        references = read_lines(path)
        assert read_lines(path) == references  # read again: said once
    assert references == val + test
    assert [record.getMessage() for record in caplog.records] == [
        (f"{path}: line 1015 begins with a byte order mark (U+FEFF: files joined with cat, each saved with one?); "
         "removed, as at the file's start, there and at the start of any later line")]
    assert BLEU().corpus_score(val + test, [references]).score == pytest.approx(100)
    assert BLEU(effective_order=True).sentence_score(test[0], [references[1014]]).score == pytest.approx(100)
    assert read_lines(_written(tmp_path / "mid.txt", "one\n\ufeff\ufefftwo \ufeff\n".encode())) == ["one", "two \ufeff"]


def _written(path, data: bytes):
    path.write_bytes(data)
    return path


def test_gzip_data_under_a_plain_name_and_plain_text_under_a_gz_name_say_which_name_to_give(data_root, tmp_path):
    # Before: "line 1 is not valid UTF-8 …; re-encode the file as UTF-8", and "truncated or corrupt gzip after
    # line 0 …; delete the file and download it again", for a corpus of one's own that has nowhere to come from.
    gz = data_root / "multi30k" / "val.de.gz"
    with pytest.raises(DataError) as info:
        read_lines(_written(tmp_path / "valid.de", gz.read_bytes()))
    assert str(info.value) == (f"{tmp_path / 'valid.de'}: gzip-compressed data, but not read as gzip (a name "
                               "ending in .gz); name it valid.de.gz, or decompress it")
    with pytest.raises(DataError) as info:
        read_lines(_written(tmp_path / "test.de.gz", gzip.decompress(gz.read_bytes())))
    assert str(info.value) == (f"{tmp_path / 'test.de.gz'}: not gzip data, though its name ends in .gz; if it is "
                               "plain text, name it test.de, else delete it and download it again")


@pytest.mark.parametrize("kind, command, suffix, compress", [("xz", "unxz", "xz", lzma.compress),
                                                           ("bzip2", "bunzip2", "bz2", bz2.compress)])
def test_data_compressed_otherwise_than_with_gzip_says_what_it_is_and_how_to_decompress_it(data_root, tmp_path, kind,
                                                                                           command, suffix, compress):
    # Before: "line 1 is not valid UTF-8 (byte 1 of the line); re-encode the file as UTF-8", and "not gzip data
    # …; if it is plain text, name it test.de", for a file that is neither.
    data = compress(gzip.decompress((data_root / "multi30k" / "val.de.gz").read_bytes()))
    with pytest.raises(DataError) as info:
        read_lines(_written(tmp_path / "valid.de", data))
    assert str(info.value) == (f"{tmp_path / 'valid.de'}: {kind}-compressed data, which is read only as gzip (a name "
                               f"ending in .gz) or as plain text; decompress it ({command}), or gzip it as valid.de.gz")
    with pytest.raises(DataError) as info:
        read_lines(_written(tmp_path / f"valid.de.{suffix}", data))  # named as compressed: not valid.de.xz.gz
    assert str(info.value).endswith(f"decompress it ({command}), or gzip it as valid.de.gz")
    with pytest.raises(DataError) as info:
        list(decode_lines(io.BytesIO(data), "<stdin>"))
    assert str(info.value) == (f"<stdin>: {kind}-compressed data, which is read only as gzip (a name ending in .gz) "
                               f"or as plain text; decompress it first ({command})")
    with pytest.raises(DataError) as info:
        read_lines(_written(tmp_path / "test.de.gz", data))
    assert str(info.value) == (f"{tmp_path / 'test.de.gz'}: {kind}-compressed data, though its name ends in .gz "
                               f"(read as gzip); decompress it ({command}) and gzip it")


@pytest.mark.parametrize("name", ["mac.de", "mac.de.gz"])
def test_a_file_whose_lines_end_in_a_carriage_return_alone_is_refused_naming_it(data_root, tmp_path, name):
    # Old Mac line ends: before, the file read as one line, and evaluate.py scored its 1,014 sentences as one
    # ("test_2017_mscoco: 1 sentences", sacreBLEU 0.14) with no word but a truncation warning.
    lines = read_lines(data_root / "multi30k" / "val.de.gz")
    data = "".join(f"{line}\r" for line in lines).encode()
    path = _written(tmp_path / name, gzip.compress(data) if name.endswith(".gz") else data)
    message = (f"{path}: all one line, holding 1,014 carriage returns: lines ended by a carriage return alone (old "
               "Mac files) read as one; end them in \\n (tr '\\r' '\\n')")
    with pytest.raises(DataError) as info:
        read_lines(path)
    assert str(info.value) == message
    with pytest.raises(DataError) as info:
        list(decode_lines(io.BytesIO(data), "<stdin>"))
    assert str(info.value) == message.replace(str(path), "<stdin>")
    # A carriage return inside a line of a file of lines stays, as any other character; so in a first line.
    assert read_lines(_written(tmp_path / "two.txt", b"one\rside\nend\n")) == ["one\rside", "end"]


@pytest.mark.parametrize("name", ["valid.de", "valid.de.gz"])
def test_utf16_text_says_what_it_is_and_how_to_re_encode_it(data_root, tmp_path, name):
    # Saved as Windows' "Unicode": before, "line 1 is not valid UTF-8 (byte 1 of the line)".
    data = "".join(f"{line}\n" for line in read_lines(data_root / "multi30k" / "val.de.gz")).encode("utf-16")
    path = _written(tmp_path / name, gzip.compress(data) if name.endswith(".gz") else data)
    with pytest.raises(DataError) as info:
        read_lines(path)
    assert str(info.value) == f"{path}: UTF-16 text, not UTF-8; re-encode it as UTF-8 (iconv -f UTF-16 -t UTF-8 {name})"
    with pytest.raises(DataError) as info:
        list(decode_lines(io.BytesIO("one\n".encode("utf-16")), "<stdin>"))
    assert str(info.value) == "<stdin>: UTF-16 text, not UTF-8; re-encode it as UTF-8 (iconv -f UTF-16 -t UTF-8)"


@pytest.mark.parametrize("name", ["bad.txt", "bad.txt.gz"])
def test_non_utf8_names_file_and_line(tmp_path, name):
    data = "erste\nzweite\ndritte \xff\nvierte\n".encode("latin-1")
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    with pytest.raises(DataError, match="line 3") as info:
        read_lines(path)
    assert str(path) in str(info.value)
    assert "UTF-8" in str(info.value)


def test_truncated_gz_names_file_and_last_good_line(data_root, tmp_path):
    data = (data_root / "multi30k" / "train.en.gz").read_bytes()
    path = tmp_path / "train.en.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError) as info:
        read_lines(path)
    message = str(info.value)
    assert str(path) in message and "download" in message
    last_good = int(message.split("after line ")[1].split()[0])
    assert 0 < last_good < 29_000


def test_a_gz_file_that_is_not_gzip_is_a_data_error_naming_it(tmp_path):
    path = tmp_path / "page.gz"
    path.write_text("<html>404</html>\n")
    with pytest.raises(DataError, match="not gzip data, though its name ends in .gz; .*download it again") as info:
        read_lines(path)
    assert str(path) in str(info.value)


def test_a_missing_file_is_a_data_error_naming_it(tmp_path):
    path = tmp_path / "nope.en.gz"
    with pytest.raises(DataError, match="not found") as info:
        read_lines(path)
    assert str(path) in str(info.value)


def test_parallel_mismatch_names_both_files_and_counts(tmp_path):
    src, tgt = tmp_path / "a.en", tmp_path / "a.de"
    src.write_text("1\n2\n3\n4\n5\n")
    tgt.write_text("1\n2\n3\n4\n")
    with pytest.raises(DataError) as info:
        read_parallel(src, tgt)
    message = str(info.value)
    assert f"{src} has 5 lines" in message and f"{tgt} has 4" in message


def test_a_blank_tail_that_misaligns_two_files_is_named(data_root, tmp_path):
    """newstest2013 with a blank line left at the end of its German side (an editor's, a shell's): the
    line says which lines are blank and to delete them (before: only the two lengths)."""
    en, de = read_lines(data_root / "wmt14" / "newstest2013.en"), read_lines(data_root / "wmt14" / "newstest2013.de")
    src, tgt = _written(tmp_path / "valid.en", "".join(f"{line}\n" for line in en).encode()), tmp_path / "valid.de"
    for tail, said in (([""], "; valid.de's line 3001 is blank, at its end: delete it"),
                       (["", "  ", ""], "; valid.de's lines 3001-3003 are blank, at its end: delete them"),
                       (["", "Noch ein Satz."], ""), ([""] * 101, "")):
        _written(tgt, "".join(f"{line}\n" for line in de + tail).encode())
        with pytest.raises(DataError) as info:
            read_parallel(src, tgt)
        assert str(info.value) == (f"parallel files differ in length: {src} has 3000 lines, {tgt} has {3000 + len(tail)}; "
                                   f"they must be aligned line by line{said}")
        with pytest.raises(DataError) as info:
            count_pairs(tgt, src)
        assert str(info.value) == (f"parallel files differ in length: {src} ends after line 3000 but {tgt} goes on at "
                                   f"line 3001; they must be aligned line by line{said}")


def test_multi30k_files_on_real_data(data_root):
    src, tgt = multi30k_files(data_root, "test_2016_flickr", "de", "en", download=False)
    assert src == data_root / "multi30k" / "test_2016_flickr.de.gz"
    assert tgt == data_root / "multi30k" / "test_2016_flickr.en.gz"


def test_multi30k_missing_without_download_lists_paths_and_urls(tmp_path):
    with pytest.raises(DataError) as info:
        multi30k_files(tmp_path, "val", "en", "de", download=False)
    message = str(info.value)
    for lang in ("en", "de"):
        assert str(tmp_path / "multi30k" / f"val.{lang}.gz") in message
        assert f"https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/val.{lang}.gz" in message
    assert "AIAYN_DATA_ROOT" in message and "paths.data_root" in message


@pytest.mark.parametrize("split, lang", [("dev", "en"), ("train", "fr")])
def test_multi30k_unknown_split_or_language(tmp_path, split, lang):
    with pytest.raises(ValueError, match=split if split == "dev" else lang):
        multi30k_files(tmp_path, split, lang, "de" if lang != "de" else "en", download=False)


@pytest.fixture
def mirror(loopback_http, monkeypatch):
    """The folder a loopback HTTP server serves, set as the Multi30k mirror."""
    root, url = loopback_http
    monkeypatch.setenv(multi30k.MIRROR_ENV, url)
    return root


def test_multi30k_url_is_upstream_unless_mirrored(monkeypatch):
    monkeypatch.delenv(multi30k.MIRROR_ENV, raising=False)
    assert multi30k_url("val", "de") == (
        "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/val.de.gz")
    monkeypatch.setenv(multi30k.MIRROR_ENV, "http://example.org/m30k/")
    assert multi30k_url("train", "en") == "http://example.org/m30k/train.en.gz"


def test_multi30k_download_writes_the_served_files(data_root, tmp_path, mirror):
    for lang in ("en", "de"):
        shutil.copy(data_root / "multi30k" / f"val.{lang}.gz", mirror)
    target = tmp_path / "root"
    src, tgt = multi30k_files(target, "val", "en", "de")
    assert src.read_bytes() == (data_root / "multi30k" / "val.en.gz").read_bytes()
    assert len(read_lines(tgt)) == 1_014
    assert sorted(p.name for p in (target / "multi30k").iterdir()) == ["val.de.gz", "val.en.gz"]


def test_multi30k_failed_or_truncated_download_leaves_nothing(data_root, tmp_path, mirror):
    # The English file is served cut short; the German one is not served at all (HTTP 404).
    (mirror / "val.en.gz").write_bytes((data_root / "multi30k" / "val.en.gz").read_bytes()[:1000])
    target = tmp_path / "root"
    with pytest.raises(DataError, match="download failed") as info:
        multi30k_files(target, "val", "en", "de")
    assert str(target / "multi30k" / "val.en.gz") in str(info.value)
    assert str(target / "multi30k" / "val.de.gz") in str(info.value)
    assert not target.exists()  # nor the folders made for them (before: root/multi30k/, empty, under a root mistyped)


def test_multi30k_files_unpacked_by_the_user_are_read_not_fetched_again(data_root, tmp_path, caplog, monkeypatch):
    monkeypatch.setenv(multi30k.MIRROR_ENV, "http://127.0.0.1:9")  # a download would fail here, never reach the net
    folder = tmp_path / "multi30k"
    folder.mkdir()
    for lang in ("en", "de"):  # as `gunzip val.en.gz` leaves them: the .gz gone
        (folder / f"val.{lang}").write_text("\n".join(read_lines(data_root / "multi30k" / f"val.{lang}.gz")) + "\n")
    # download=True: a file taken for missing would be fetched, fail, and be reported missing
    src, tgt = multi30k_files(tmp_path, "val", "en", "de", download=True)
    assert (src, tgt) == (folder / "val.en", folder / "val.de")
    assert sorted(path.name for path in folder.iterdir()) == ["val.de", "val.en"]  # nothing downloaded beside them
    assert read_lines(src) == read_lines(data_root / "multi30k" / "val.en.gz")
    shutil.copyfile(data_root / "multi30k" / "val.en.gz", folder / "val.en.gz")  # both: the plain one, and said
    with caplog.at_level("WARNING"):
        assert multi30k_files(tmp_path, "val", "en", "de", download=False)[0] == folder / "val.en"
    assert "val.en and val.en.gz are both there: val.en is read (the plain file wins)" in caplog.text
