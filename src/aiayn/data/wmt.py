"""The WMT 2014 corpora of §5.1: which archives, where their files lie, fetching them, cleaning.

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

import json
import logging
import os
import shutil
import tarfile
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from aiayn.data.readers import DataError, iter_parallel
from aiayn.data.sgm import unescape

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
    taken gzipped when only the ``.gz`` exists) and, for each, the archive key it comes from."""
    raw_dir = Path(raw_dir)
    pair = frozenset({src_lang, tgt_lang})
    if src_lang == tgt_lang or pair not in TRAINING:
        raise ValueError(f"no WMT14 data for {src_lang}-{tgt_lang}; choose en and one of de, fr (either direction)")
    origin: dict[Path, str] = {}
    train = []
    for corpus in TRAINING[pair]:
        paths = []
        for lang in (src_lang, tgt_lang):
            plain = raw_dir / f"{corpus.stem}.{lang}"
            path = plain if plain.is_file() or not Path(f"{plain}.gz").is_file() else Path(f"{plain}.gz")
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
    :class:`DataError` lists every file still missing, with the archive it comes from."""
    files, origin = expected_files(raw_dir, src_lang, tgt_lang)
    missing = [path for path in origin if not path.is_file()]
    if missing and download:
        for key in dict.fromkeys(origin[path] for path in missing):
            fetch_archive(ARCHIVES[key], Path(raw_dir))
        files, origin = expected_files(raw_dir, src_lang, tgt_lang)
        missing = [path for path in origin if not path.is_file()]
    if missing:
        how = "downloading failed (see the warnings above)" if download else "download=False"
        listing = "\n".join(f"  {path}  (from {ARCHIVES[origin[path]].url})" for path in missing)
        raise DataError(
            f"WMT14 {src_lang}-{tgt_lang} files missing under {raw_dir} ({how}):\n{listing}\n"
            f"Unpack those archives into {raw_dir} (training files may be gzipped, e.g. "
            f"commoncrawl.de-en.en.gz), or point task.raw_dir at a folder that holds them"
        )
    return files


def fetch_archive(archive: Archive, raw_dir: Path) -> None:
    """Download ``archive`` into ``<raw_dir>/archives/`` (resuming a partial download) and unpack
    it into ``raw_dir``; failures are logged, not raised (the caller lists what is missing)."""
    target = raw_dir / "archives" / archive.name
    try:
        if not target.is_file():
            download(archive.url, target)
        log.info("unpacking %s into %s", target, raw_dir)
        with tarfile.open(target) as tar:
            tar.extractall(raw_dir, filter="data")
    except (OSError, tarfile.TarError) as error:  # URLError and timeouts are OSErrors
        log.warning("could not fetch or unpack %s (%s): %s", archive.url, target, error)


def download(url: str, path: Path) -> None:
    """Fetch ``url`` into ``path``: bytes go to ``<path>.part``, which a later call resumes
    (HTTP Range) and which is renamed to ``path`` only once complete."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = Path(f"{path}.part")
    have = part.stat().st_size if part.is_file() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    log.info("downloading %s to %s%s", url, path, f" (resuming at byte {have})" if have else "")
    with urllib.request.urlopen(request, timeout=DOWNLOAD_TIMEOUT_S) as response:
        resumed = have and response.status == 206
        expected = response.headers.get("Content-Length")
        expected = int(expected) + (have if resumed else 0) if expected is not None else None
        with open(part, "ab" if resumed else "wb") as out:
            shutil.copyfileobj(response, out, 1 << 20)
    size = part.stat().st_size
    if expected is not None and size != expected:
        raise OSError(f"{url}: got {size} bytes of {expected}; run again to resume")
    os.replace(part, path)


@dataclass(frozen=True)
class CleaningRules:
    """What makes a training pair unusable; the paper is silent, these are our choices.

    Applied in this order, after XML entities are decoded (WMT's Moses-processed releases
    escape ``&``, ``'``, ``"``, ``<``, ``>``) and runs of whitespace are collapsed to one space:
    ``empty`` a side has no text; ``too_long`` a side has more than ``max_words``
    whitespace-separated words; ``ratio`` one side has more than ``max_ratio`` times the words of
    the other (misaligned pairs, frequent in Common Crawl and the Giga corpus).
    """

    max_words: int = 250
    max_ratio: float = 2.5

    def check(self, src: str, tgt: str) -> str | None:
        """The rule that removes the (cleaned) pair, or None to keep it."""
        if not src or not tgt:
            return "empty"
        n_src, n_tgt = src.count(" ") + 1, tgt.count(" ") + 1
        if n_src > self.max_words or n_tgt > self.max_words:
            return "too_long"
        if max(n_src, n_tgt) > self.max_ratio * min(n_src, n_tgt):
            return "ratio"
        return None


RULES = ("empty", "too_long", "ratio")


def normalize(text: str) -> str:
    """A side as it is kept: XML entities decoded, whitespace runs collapsed, ends stripped."""
    return " ".join(unescape(text).split())


@dataclass
class CleaningReport:
    """Pairs read, removed by each rule and kept, per corpus and in total."""

    corpora: dict[str, dict[str, int]] = field(default_factory=dict)

    def count(self, corpus: str, outcome: str) -> None:
        counts = self.corpora.setdefault(corpus, {"read": 0, **{rule: 0 for rule in RULES}, "kept": 0})
        counts["read"] += 1
        counts[outcome] += 1

    @property
    def total(self) -> dict[str, int]:
        keys = ("read", *RULES, "kept")
        return {key: sum(counts[key] for counts in self.corpora.values()) for key in keys}

    def lines(self) -> list[str]:
        """One line per corpus and one for the total, for the log."""
        rows = [*self.corpora.items(), ("total", self.total)]
        return [
            f"{name}: read {c['read']}, removed {c['empty']} empty, {c['too_long']} too long, "
            f"{c['ratio']} over the length ratio; kept {c['kept']}"
            for name, c in rows
        ]

    def to_json(self) -> dict:
        return {"corpora": self.corpora, "total": self.total}


def clean_pairs(files: WMTFiles, rules: CleaningRules, report: CleaningReport) -> Iterator[tuple[str, str]]:
    """The kept training pairs of every corpus in turn, normalised; ``report`` counts each
    pair's fate as it streams (memory stays bounded)."""
    for name, src_path, tgt_path in files.train:
        log.info("reading %s: %s / %s", name, src_path, tgt_path)
        for src, tgt in iter_parallel(src_path, tgt_path):
            src, tgt = normalize(src), normalize(tgt)
            rule = rules.check(src, tgt)
            report.count(name, rule or "kept")
            if rule is None:
                yield src, tgt


def write_json(path: Path, data: dict) -> None:
    """``data`` as indented JSON, written atomically."""
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as tmp:
        json.dump(data, tmp, indent=2, sort_keys=True)
    os.replace(tmp.name, path)


def rules_dict(rules: CleaningRules) -> dict:
    return asdict(rules)
