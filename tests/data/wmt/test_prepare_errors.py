"""src/prepare.py on WMT raw trees with something wrong, kind by kind: one line on stderr naming
the file (and line) or setting and what to do, exit status 2, no traceback. And a corpus whose
two files are empty: skipped, but logged and recorded in report.json, never passed over silently.

Each tree is a copy of the miniature raw tree (`raw_copy`, conftest.py) with one thing broken. The
tool runs in this process (tests.helpers.inprocess)."""

from __future__ import annotations

import gzip
import json
import logging
import shutil
from pathlib import Path

from aiayn.data.wmt.preparation import prepare_wmt
from tests.helpers.inprocess import run_tool

VOCAB = 500
EMPTY_EN_DE = {  # each corpus's two files, emptied (commoncrawl's are gzipped)
    "europarl-v7": ("training/europarl-v7.de-en.en", "training/europarl-v7.de-en.de"),
    "commoncrawl": ("commoncrawl.de-en.en.gz", "commoncrawl.de-en.de.gz"),
    "news-commentary-v9": ("training/news-commentary-v9.de-en.en", "training/news-commentary-v9.de-en.de"),
}


def _empty(raw: Path, corpus: str) -> tuple[Path, Path]:
    paths = tuple(raw / name for name in EMPTY_EN_DE[corpus])
    for path in paths:
        path.write_bytes(gzip.compress(b"") if path.suffix == ".gz" else b"")
    return paths


def _prepare(raw: Path, tmp_path: Path, *overrides: str) -> str:
    """prepare.py on ``raw``; asserts exit status 2 and one line on stderr, which it returns."""
    result = run_tool("src/prepare.py", "task=wmt_en_de", f"task.raw_dir={raw}", f"task.vocab_size={VOCAB}",
                      "task.datamodule.prepare_workers=1", f"hydra.run.dir={tmp_path / 'run'}", *overrides,
                      cache_dir=tmp_path / "cache", check=False, timeout=300)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, (result.returncode, result.stderr[-3000:])
    assert lines[0].startswith("prepare.py: ")
    folders = tmp_path / "cache" / "wmt14"
    assert not folders.is_dir() or not list(folders.iterdir())  # nothing half-prepared is left
    return lines[0]


def test_a_corpus_whose_two_files_are_empty_is_skipped_logged_and_reported(raw_copy, tmp_path, caplog):
    src, tgt = _empty(raw_copy, "news-commentary-v9")
    with caplog.at_level(logging.INFO, logger="aiayn.data"):
        out = prepare_wmt(raw_copy, tmp_path / "cache", "en", "de", VOCAB, workers=1, download=False)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith("skipping the training corpus news-commentary-v9: both of its files "
                                                         f"are empty ({src}, {tgt})")
    cleaning = json.loads((out / "report.json").read_text())["cleaning"]
    assert cleaning["skipped"] == {"news-commentary-v9": {"files": [str(src), str(tgt)], "reason": "both files are empty"}}
    assert cleaning["corpora"]["news-commentary-v9"] == {"read": 0, "empty": 0, "too_long": 0, "ratio": 0, "kept": 0}
    assert cleaning["total"]["read"] == 8000  # the other two corpora
    assert "cleaning news-commentary-v9: read 0, removed 0 empty, 0 too long, 0 over the length ratio; kept 0; " \
           "skipped: both files are empty" in caplog.text
    assert "; 1 corpus(es) skipped (news-commentary-v9)" in caplog.text


def test_every_corpus_empty_is_one_line_naming_them(raw_copy, tmp_path):
    emptied = {corpus: _empty(raw_copy, corpus) for corpus in EMPTY_EN_DE}
    line = _prepare(raw_copy, tmp_path, "task.datamodule.download=false")
    listing = "; ".join(f"{corpus} ({src} / {tgt})" for corpus, (src, tgt) in emptied.items())
    assert line == (f"prepare.py: every WMT14 en-de training corpus is empty: {listing}; unpack their archives into "
                    f"{raw_copy} again, or point task.raw_dir at a folder that holds them")


def test_a_gz_corpus_that_is_not_gzip_is_named(raw_copy, tmp_path):
    path = raw_copy / "commoncrawl.de-en.de.gz"
    path.write_bytes(gzip.decompress(path.read_bytes()))  # plain text under a .gz name
    line = _prepare(raw_copy, tmp_path, "task.datamodule.download=false")
    assert line == (f"prepare.py: {path}: not gzip data, though its name ends in .gz; if it is plain text, name it "
                    "commoncrawl.de-en.de, else delete it and download it again")


def test_an_archive_that_is_not_a_tar_archive_is_named(raw_copy, tmp_path):
    shutil.rmtree(raw_copy / "dev")
    (raw_copy / "archives").mkdir()
    archive = raw_copy / "archives" / "dev.tgz"
    archive.write_bytes(b"<html>404 Not Found</html>\n")  # what a bad mirror may serve
    line = _prepare(raw_copy, tmp_path)  # download=true: the archive is there, so it is only unpacked
    assert line.startswith(f"prepare.py: WMT14 en-de files missing under {raw_copy} (the archive that holds them "
                           f"{archive} is damaged or not a tar archive (")
    assert line.endswith("; it was removed, so that the next run downloads it again): dev/newstest2013.en, "
                         "dev/newstest2013.de (from https://www.statmt.org/wmt14/dev.tgz); run again to fetch them"), line
    assert not archive.exists()


def test_an_sgm_file_with_a_broken_segment_names_file_and_line(raw_copy, tmp_path):
    path = raw_copy / "test-full" / "newstest2014-deen-ref.de.sgm"
    lines = path.read_text(encoding="utf-8").splitlines()
    number = next(i for i, line in enumerate(lines) if line.startswith("<seg")) + 5
    lines[number] = lines[number].replace("</seg>", "")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    line = _prepare(raw_copy, tmp_path, "task.datamodule.download=false")
    assert line.startswith(f"prepare.py: {path}: line {number + 1} has a broken segment (")
    assert line.endswith("the file is damaged, fetch it again")


def test_a_reference_segment_missing_from_the_sgm_test_set_is_named(raw_copy, tmp_path):
    # Segment 11 of the first document gone and segment 12 there twice: as many segments as the source
    # has, every one from the 11th to the 12th paired with another sentence's reference (before: "prepared").
    src, path = raw_copy / "test-full" / "newstest2014-deen-src.en.sgm", raw_copy / "test-full" / "newstest2014-deen-ref.de.sgm"
    lines = path.read_text(encoding="utf-8").splitlines()
    eleventh = next(i for i, line in enumerate(lines) if line.startswith('<seg id="11">'))
    lines[eleventh] = lines[eleventh + 1]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    line = _prepare(raw_copy, tmp_path, "task.datamodule.download=false")
    assert line == (f"prepare.py: {path} is not aligned with {src}: its segment 11 is <seg id='12'> of document "
                    f"'10023-schwarzwaelder-bote.de' where {src.name} has <seg id='11'> of document "
                    "'10023-schwarzwaelder-bote.de'; unpack them from test-full.tgz into task.raw_dir again")


def test_a_test_set_cut_short_at_a_documents_end_is_named(raw_copy, tmp_path):
    """Both sgm files cut after their 20th document, as a download stopped there leaves them: still
    aligned, each ends without its </srcset> or </refset> (before: "prepared", with 465 of newstest2014's
    3,003 sentences)."""
    paths = [raw_copy / "test-full" / f"newstest2014-deen-{side}.sgm" for side in ("src.en", "ref.de")]
    for path in paths:
        lines = path.read_text(encoding="utf-8").splitlines()
        ends = [number for number, line in enumerate(lines) if line.startswith("</doc>")]
        path.write_text("\n".join(lines[:ends[19] + 1]) + "\n", encoding="utf-8")
    line = _prepare(raw_copy, tmp_path, "task.datamodule.download=false")
    assert line.startswith(f"prepare.py: {paths[0]}: ends at line ") and line.endswith(
        " before its </srcset> (after 465 segments): the file is cut short; fetch it again"), line


def test_an_empty_dev_set_is_named_by_its_raw_files(raw_copy, tmp_path):
    src, tgt = raw_copy / "dev" / "newstest2013.en", raw_copy / "dev" / "newstest2013.de"
    src.write_bytes(b"")
    tgt.write_bytes(b"")
    line = _prepare(raw_copy, tmp_path, "task.datamodule.download=false")  # before: "prepared", exit status 0
    assert line == (f"prepare.py: newstest2013: {src} and {tgt} hold no sentence; unpack them from dev.tgz into "
                    "task.raw_dir again")
