"""Table 3's noise: the spread of the base runs' seeds at each scale, and whether a row's
difference from base lies within it (§6.2's differences are read against this band).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from aiayn.tables.runs import Run, seed_order


@dataclass
class BaseSpread:
    """The base runs of Table 3 at one scale: their mean, the spread of their seeds around it.

    A band is ``(min − mean, max − mean)`` of the base runs' values of one metric; it and the
    sample standard deviation (ddof=1) need at least 2 base runs with that metric, else None."""

    scale: str
    runs: int  # base runs at this scale
    seeds: list[Any]
    ppl_mean: float | None
    bleu_mean: float | None
    ppl_band: tuple[float, float] | None
    bleu_band: tuple[float, float] | None
    ppl_sd: float | None
    bleu_sd: float | None


# The summary's figure of each metric: Table 3's BLEU is the paper's, tokenized (aiayn.tables.build).
DEV_FIGURE = {"ppl": "dev/ppl", "bleu": "dev/tokenized_bleu"}


def base_spread(runs: Iterable[Run]) -> dict[str, BaseSpread]:
    """Table 3's base runs (row ``base``) by scale, each scale's mean, band and sd."""
    by_scale: dict[str, list[Run]] = {}
    for run in runs:
        if run.table == "table3" and run.row == "base":
            by_scale.setdefault(run.scale, []).append(run)
    spreads = {}
    for scale, base in sorted(by_scale.items()):
        base.sort(key=seed_order)
        figures = {}
        for metric in ("ppl", "bleu"):
            key = DEV_FIGURE[metric]
            values = [r.summary[key] for r in base if r.summary.get(key) is not None]
            mean = statistics.fmean(values) if values else None
            several = len(values) >= 2
            figures |= {f"{metric}_mean": mean,
                        f"{metric}_band": (min(values) - mean, max(values) - mean) if several else None,
                        f"{metric}_sd": statistics.stdev(values) if several else None}
        spreads[scale] = BaseSpread(scale=scale, runs=len(base), seeds=[r.config.get("seed") for r in base],
                                    **figures)
    return spreads


WITHIN_NOISE_RULE = ("Within noise: ΔBLEU lies in [min(lo, −w), max(hi, w)], ends included, where [lo, hi] is "
                     "the BLEU noise band (the base runs' smallest and largest difference from their mean) and "
                     "w = (hi − lo) / 2 its half-width; no band (fewer than 2 base runs at the scale), no verdict")


def within_noise(delta: float | None, band: tuple[float, float] | None) -> str | None:
    """"yes" when ``delta`` lies in the ``band`` ``(lo, hi)`` widened to at least ±half-width:
    ``min(lo, −w) ≤ delta ≤ max(hi, w)`` with ``w = (hi − lo) / 2``, ends included; else "no".
    None without a band or without a delta. (A lopsided band, e.g. (−0.1, 0.5), becomes
    (−0.3, 0.5): a seed spread says as much about falling short as about doing better.)"""
    if delta is None or band is None:
        return None
    low, high = noise_limits(band)
    return "yes" if low <= delta <= high else "no"


def noise_limits(band: tuple[float, float]) -> tuple[float, float]:
    """The limits :func:`within_noise` applies: the band ``(lo, hi)`` widened to at least
    ±its half-width ``w = (hi − lo) / 2``: ``(min(lo, −w), max(hi, w))``."""
    lo, hi = band
    half = (hi - lo) / 2
    return min(lo, -half), max(hi, half)
