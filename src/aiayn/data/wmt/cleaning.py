"""Cleaning the WMT 2014 training pairs: the rules that drop a pair, the normalisation of each
side, and the per-corpus report of what was removed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from aiayn.data.readers import iter_parallel
from aiayn.data.wmt.archives import WMTFiles
from aiayn.data.wmt.sgm import unescape

log = logging.getLogger(__name__)


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
    """Pairs read, removed by each rule and kept, per corpus and in total; and the corpora
    skipped whole (``skipped``: name → its files and why), which add no pairs but are reported
    and logged rather than passed over in silence."""

    corpora: dict[str, dict[str, int]] = field(default_factory=dict)
    skipped: dict[str, dict] = field(default_factory=dict)

    def count(self, corpus: str, outcome: str) -> None:
        counts = self._counts(corpus)
        counts["read"] += 1
        counts[outcome] += 1

    def skip(self, corpus: str, files: tuple[Path, Path], reason: str) -> None:
        """Record that ``corpus`` (its source and target ``files``) gave no pairs, and why."""
        self._counts(corpus)  # listed with the others, every count 0
        self.skipped[corpus] = {"files": [str(path) for path in files], "reason": reason}

    def _counts(self, corpus: str) -> dict[str, int]:
        return self.corpora.setdefault(corpus, {"read": 0, **{rule: 0 for rule in RULES}, "kept": 0})

    @property
    def total(self) -> dict[str, int]:
        keys = ("read", *RULES, "kept")
        return {key: sum(counts[key] for counts in self.corpora.values()) for key in keys}

    def lines(self) -> list[str]:
        """One line per corpus and one for the total, for the log."""
        rows = [*self.corpora.items(), ("total", self.total)]
        lines = [
            f"{name}: read {c['read']}, removed {c['empty']} empty, {c['too_long']} too long, "
            f"{c['ratio']} over the length ratio; kept {c['kept']}"
            + (f"; skipped: {self.skipped[name]['reason']}" if name in self.skipped else "")
            for name, c in rows
        ]
        if self.skipped:
            lines[-1] += f"; {len(self.skipped)} corpus(es) skipped ({', '.join(self.skipped)})"
        return lines

    def to_json(self) -> dict:
        return {"corpora": self.corpora, "total": self.total, "skipped": self.skipped}


def clean_pairs(files: WMTFiles, rules: CleaningRules, report: CleaningReport) -> Iterator[tuple[str, str]]:
    """The kept training pairs of every corpus in turn, normalised; ``report`` counts each
    pair's fate as it streams (memory stays bounded). A corpus whose two files hold no line
    at all is skipped with a warning naming it and its files, and recorded in ``report``."""
    for name, src_path, tgt_path in files.train:
        log.info("reading %s: %s / %s", name, src_path, tgt_path)
        read = 0
        for src, tgt in iter_parallel(src_path, tgt_path):
            read += 1
            src, tgt = normalize(src), normalize(tgt)
            rule = rules.check(src, tgt)
            report.count(name, rule or "kept")
            if rule is None:
                yield src, tgt
        if read == 0:  # iter_parallel has already refused one empty file beside a non-empty one
            log.warning("skipping the training corpus %s: both of its files are empty (%s, %s); it adds no "
                        "pairs. Unpack its archive again if that is not meant", name, src_path, tgt_path)
            report.skip(name, (src_path, tgt_path), "both files are empty")


def rules_dict(rules: CleaningRules) -> dict:
    return asdict(rules)
