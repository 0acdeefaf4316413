"""The WMT 2014 corpora of §5.1: which archives, where their files lie, fetching them (cleaning
the training pairs is :mod:`aiayn.data.wmt.cleaning`).

§5.1: "We trained on the standard WMT 2014 English-German dataset consisting of about 4.5 million
sentence pairs … For English-French, we used the significantly larger WMT 2014 English-French
dataset consisting of 36M sentences". The paper does not list the corpora; these are WMT14's
constrained parallel data for the two pairs (the corpora the shared task published): EN-DE is
Europarl v7 + Common Crawl + News Commentary v9, EN-FR adds the UN corpus and the 10^9
French-English (Giga) corpus. newstest2013 is the development set (§6.2, Table 3) and the full
newstest2014 the test set (Table 2).

``raw_dir`` holds the archives' contents as they unpack (the upstream layout), e.g.
``training/europarl-v7.de-en.en``, ``commoncrawl.de-en.en``, ``dev/newstest2013.en``,
``test-full/newstest2014-deen-src.en.sgm``; any training file may also be gzipped (``….en.gz``).
"""

from __future__ import annotations

import logging
import lzma
import os
import shutil
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from aiayn.data.download import (
    ARCHIVE_KINDS,
    CutShort,
    NotTheFile,
    download_file,
    open_compressed,
    read_through,
    refuse_unless,
)
from aiayn.data.readers import plain_or_gzipped
from aiayn.errors import DataError
from aiayn.files import atomic_path, new_folders_removed, no_room, release_lock, take_lock

log = logging.getLogger(__name__)

DOWNLOAD_TIMEOUT_S = 60.0
MIRROR_ENV = "AIAYN_WMT_MIRROR"
"""A base URL to fetch the archives from instead of statmt.org: ``<mirror>/<archive name>``."""


@dataclass(frozen=True)
class Archive:
    """One file WMT published: its name, its address, and what it unpacks to."""

    name: str
    upstream: str

    @property
    def url(self) -> str:
        """Where it is fetched from: upstream, or ``$AIAYN_WMT_MIRROR/<name>``."""
        mirror = os.environ.get(MIRROR_ENV)
        return f"{mirror.rstrip('/')}/{self.name}" if mirror else self.upstream


ARCHIVES = {
    "europarl": Archive("training-parallel-europarl-v7.tgz", "https://www.statmt.org/wmt13/training-parallel-europarl-v7.tgz"),
    "commoncrawl": Archive("training-parallel-commoncrawl.tgz", "https://www.statmt.org/wmt13/training-parallel-commoncrawl.tgz"),
    "news-commentary": Archive("training-parallel-nc-v9.tgz", "https://www.statmt.org/wmt14/training-parallel-nc-v9.tgz"),
    "un": Archive("training-parallel-un.tgz", "https://www.statmt.org/wmt13/training-parallel-un.tgz"),
    "giga": Archive("training-giga-fren.tar", "https://www.statmt.org/wmt10/training-giga-fren.tar"),
    "dev": Archive("dev.tgz", "https://www.statmt.org/wmt14/dev.tgz"),
    "test": Archive("test-full.tgz", "https://www.statmt.org/wmt14/test-full.tgz"),
}


@dataclass(frozen=True)
class Corpus:
    """A line-aligned training corpus: ``<raw_dir>/<stem>.<lang>`` (or ``.<lang>.gz``)."""

    name: str
    stem: str
    archive: str


TRAINING = {
    frozenset({"en", "de"}): (
        Corpus("europarl-v7", "training/europarl-v7.de-en", "europarl"),
        Corpus("commoncrawl", "commoncrawl.de-en", "commoncrawl"),
        Corpus("news-commentary-v9", "training/news-commentary-v9.de-en", "news-commentary"),
    ),
    frozenset({"en", "fr"}): (
        Corpus("europarl-v7", "training/europarl-v7.fr-en", "europarl"),
        Corpus("commoncrawl", "commoncrawl.fr-en", "commoncrawl"),
        Corpus("news-commentary-v9", "training/news-commentary-v9.fr-en", "news-commentary"),
        Corpus("un", "un/undoc.2000.fr-en", "un"),
        Corpus("giga-fren", "giga-fren.release2.fixed", "giga"),
    ),
}
DEV_STEM = "dev/newstest2013"  # plain text in dev.tgz: newstest2013.{en,de,fr}
TEST_SGM = "test-full/newstest2014-{pair}-{role}.{lang}.sgm"  # pair: deen or fren; role: src or ref


@dataclass
class WMTFiles:
    """Where each file of a language pair lies under ``raw_dir``."""

    train: list[tuple[str, Path, Path]]  # (corpus name, source file, target file)
    val: tuple[Path, Path]  # newstest2013, plain text
    test: tuple[Path, Path]  # newstest2014, sgm


def expected_files(raw_dir: str | os.PathLike, src_lang: str, tgt_lang: str) -> tuple[WMTFiles, dict[Path, str]]:
    """The files of the pair ``src_lang``-``tgt_lang`` under ``raw_dir`` (a training file is
    taken gzipped when only the ``.gz`` exists, plain with a warning where both do) and, for each,
    the archive key it comes from."""
    raw_dir = Path(raw_dir)
    pair = frozenset({src_lang, tgt_lang})
    if src_lang == tgt_lang or pair not in TRAINING:
        raise ValueError(f"no WMT14 data for {src_lang}-{tgt_lang}; choose en and one of de, fr (either direction)")
    origin: dict[Path, str] = {}
    train = []
    for corpus in TRAINING[pair]:
        paths = []
        for lang in (src_lang, tgt_lang):
            path = plain_or_gzipped(raw_dir / f"{corpus.stem}.{lang}")
            origin[path] = corpus.archive
            paths.append(path)
        train.append((corpus.name, *paths))
    val = tuple(raw_dir / f"{DEV_STEM}.{lang}" for lang in (src_lang, tgt_lang))
    (other,) = pair - {"en"}
    sgm_pair = f"{other}en"
    test = (
        raw_dir / TEST_SGM.format(pair=sgm_pair, role="src", lang=src_lang),
        raw_dir / TEST_SGM.format(pair=sgm_pair, role="ref", lang=tgt_lang),
    )
    origin.update({path: "dev" for path in val})
    origin.update({path: "test" for path in test})
    return WMTFiles(train, val, test), origin


def locate(raw_dir: str | os.PathLike, src_lang: str, tgt_lang: str, download: bool) -> WMTFiles:
    """The pair's files under ``raw_dir``; when some are missing and ``download`` is true, their
    archives are fetched into ``<raw_dir>/archives/`` and unpacked into ``raw_dir`` first. A
    :class:`DataError` lists every file still missing, with the archive it comes from, and every
    archive that could not be fetched or unpacked (one that is not a tar archive, say)."""
    raw = Path(raw_dir)
    if not download and not raw.is_dir():
        what = "is not a folder" if raw.exists() else "does not exist"
        raise DataError(
            f"task.raw_dir={raw} {what}: point task.raw_dir at the folder where WMT's archives are unpacked "
            f"(docs/wmt.md lists them), or set task.datamodule.download=true to fetch them into it"
        )
    files, origin = expected_files(raw_dir, src_lang, tgt_lang)
    missing = [path for path in origin if not path.is_file()]
    failures: dict[str, Failure] = {}  # by archive
    if missing and download:
        for key in dict.fromkeys(origin[path] for path in missing):
            failure = fetch_archive(ARCHIVES[key], raw, [path for path in missing if origin[path] == key])
            if failure:
                failures[key] = failure
        files, origin = expected_files(raw_dir, src_lang, tgt_lang)
        missing = [path for path in origin if not path.is_file()]
    if missing:
        nearby = _nearby(raw, src_lang, tgt_lang) if len(missing) == len(origin) else ""
        raise DataError(_missing(f"WMT14 {src_lang}-{tgt_lang}", raw, missing, origin, failures, download) + nearby)
    return files


def _missing(pair: str, raw: Path, missing: list[Path], origin: dict[Path, str], failures: dict[str, Failure],
             download: bool) -> str:
    """One line: the files still missing (under ``raw``), by the archive that holds them, why it did not
    (one reason when every archive failed alike: no network, say) and what to do: run again where
    that is all it takes (:attr:`Failure.again`), else unpack the archives or point elsewhere."""
    by_archive: dict[str, list[str]] = {}
    for path in missing:
        by_archive.setdefault(origin[path], []).append(path.relative_to(raw).as_posix() if path.is_relative_to(raw)
                                                       else str(path))
    reasons = {failure.reason for failure in failures.values()}
    if not download:
        why = "task.datamodule.download=false"
    elif len(reasons) == 1 and set(failures) == set(by_archive):
        why = (f"the {len(failures)} archives that hold them " if len(failures) > 1 else "the archive that holds them ") + \
            reasons.pop()
    else:
        why = None
    listing = "; ".join(
        f"{', '.join(paths)} (from {ARCHIVES[key].url}" + (f": {failures[key].reason})" if why is None and key in failures
                                                          else ")") for key, paths in by_archive.items())
    if why is None:
        why = "not every archive could be fetched or unpacked, as said beside each" if failures else \
            "the archives lack them"
    if download and set(by_archive) <= set(failures) and all(failure.again for failure in failures.values()):
        return f"{pair} files missing under {raw} ({why}): {listing}; run again to fetch them"
    return (f"{pair} files missing under {raw} ({why}):"
            f" {listing}; unpack those archives into {raw} (training files may be gzipped, e.g. commoncrawl.de-en.en.gz),"
            " or point task.raw_dir at a folder that holds them")


def _nearby(raw: Path, src_lang: str, tgt_lang: str) -> str:
    """Where none of the files is under ``raw``: the folder beside it (its parent, or one of its
    folders) that holds the most of them, as the setting to give; "" where none holds any."""
    folders = [raw.parent, *sorted(path for path in raw.iterdir() if path.is_dir())[:100]] if raw.is_dir() else []
    found = {folder: sum(path.is_file() for path in expected_files(folder, src_lang, tgt_lang)[1]) for folder in folders}
    best = max(found, key=found.get, default=None)
    return f" (task.raw_dir={best} holds {found[best]} of them)" if best is not None and found[best] else ""


@dataclass(frozen=True)
class Failure:
    """Why an archive did not give its files: ``reason``, said beside its address; ``again``: running
    again is what to do (a download cut short resumes; a damaged archive, removed, is fetched anew)."""

    reason: str
    again: bool = False


class DamagedArchive(DataError):
    """An archive that does not read whole (cut short, a checksum that fails, not a tar archive at
    all); :func:`unpack` removed it and kept nothing of it."""


def fetch_archive(archive: Archive, raw_dir: Path, wanted: list[Path] | tuple = ()) -> Failure | None:
    """Download ``archive`` into ``<raw_dir>/archives/`` (resuming a partial download) and unpack
    it into ``raw_dir``, holding ``<name>.lock`` there (:func:`aiayn.files.take_lock`): a second job
    fetching it into the same folder (EN-DE and EN-FR share five archives; nodes may share a raw
    folder) waits, saying so, then finds ``wanted`` (the files it lacked) there or the archive
    whole, where both appending into one ``.part`` corrupted it. A failure is logged (naming the
    archive) and returned, for the caller to say beside the archive's address and its files still
    missing; None when it worked. A full disk is a :class:`DataError` at once: the archives left
    are not downloaded onto it."""
    target = raw_dir / "archives" / archive.name
    doing, folder = "downloading", target.parent
    try:
        with new_folders_removed(target.parent):
            target.parent.mkdir(parents=True, exist_ok=True)
            lock_path = target.with_name(f"{target.name}.lock")
            lock = take_lock(lock_path, waiting=lambda: log.warning(
                "another process is fetching %s into %s (it holds %s); waiting for it", archive.name, folder, lock_path))
            try:
                if wanted and all(path.is_file() for path in wanted):
                    return None  # unpacked by the process this one waited for
                if not target.is_file():
                    download_file(archive.url, target, DOWNLOAD_TIMEOUT_S, resume=True,
                                  check=lambda path: refuse_unless(path, archive.url, ARCHIVE_KINDS,
                                                                   f"a {target.suffix} archive"))
                doing, folder = "unpacking", raw_dir
                unpack(target, raw_dir)
            finally:
                release_lock(lock, remove=lock_path)
    except (DamagedArchive, NotTheFile) as error:
        log.warning("%s", error)
        # said beside the archive's address (_missing): "sent an HTML page, …", not the address twice
        return Failure(str(error).removeprefix(f"{archive.url} "), again=isinstance(error, DamagedArchive))
    except OSError as error:  # URLError and timeouts are OSErrors
        if (full := no_room(error)) is not None:
            kept = ("what was downloaded is kept in its .part, to resume" if doing == "downloading" else
                    "nothing half-unpacked was kept")
            raise DataError(f"{folder}: {full.strerror or 'no room left'} while {doing} {target.name} (the disk is "
                            f"full, or a quota reached); {kept}, and the archives left were not fetched. Free space "
                            "there and run again") from None
        log.warning("could not fetch %s into %s (%s)", archive.url, target, error)
        return Failure(f"could not be downloaded ({error})", again=isinstance(error, (CutShort, TimeoutError)))
    return None


def unpack(archive: Path, raw_dir: Path) -> None:
    """Unpack ``archive`` into ``raw_dir`` through a temporary folder beside its files: they are
    moved into place only once the whole archive has been read, to the end of its compressed data
    (a gzip member's CRC and length are checked there, past the tar's end blocks where tarfile
    stops), so a truncated or damaged archive leaves no half-written corpus behind to be prepared
    as if it were whole. Such an archive is removed (a :class:`DamagedArchive`): the next run
    downloads it again."""
    log.info("unpacking %s into %s", archive, raw_dir)
    try:
        with atomic_path(raw_dir / f".unpacking-{archive.name}") as temporary:
            with open_compressed(archive) as stream:
                with tarfile.open(fileobj=stream, mode="r:") as tar:
                    tar.extractall(temporary, filter="data")
                read_through(stream)
            for path in sorted(temporary.rglob("*")):
                if path.is_file() or path.is_symlink():
                    place = raw_dir / path.relative_to(temporary)
                    place.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(path, place)
            shutil.rmtree(temporary)  # emptied: nothing to rename
    except (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, OSError) as error:
        if isinstance(error, OSError) and error.errno is not None:
            raise  # the disk's (full, read-only), not the archive's
        archive.unlink(missing_ok=True)
        raise DamagedArchive(f"{archive} is damaged or not a tar archive ({error}); it was removed, so that the next "
                             "run downloads it again") from None
