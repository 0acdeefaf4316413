"""A rebuilt table (:func:`aiayn.tables.build.build_table`) written out: markdown, CSV, a
chart, and a W&B run holding them as ``wandb.Table``s.

Table 2's chart puts each row's BLEU beside the paper's. Table 3's puts each row's difference
from the base runs of its scale beside the paper's difference from its base, over the noise band
of the base runs' seeds; its markdown ends with that band and a line per row (see
:func:`noise_markdown`)."""

from __future__ import annotations

import csv
import io
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiayn.tables import table4
from aiayn.tables.build import build_table
from aiayn.tables.noise import WITHIN_NOISE_RULE, BaseSpread, base_spread, noise_limits, within_noise
from aiayn.tables.rows import Row, base_paper_figures
from aiayn.tables.runs import Run

DELTAS = ("ΔPPL", "paper ΔPPL", "ΔBLEU", "paper ΔBLEU")


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
            return f"{value:.2e}"
        return f"{value:.2f}".rstrip("0").rstrip(".")
    return str(value)


def _signed(value: float | None) -> str:
    """A difference, signed, to 2 decimals ("" when there is none)."""
    if value is None or math.isnan(value):
        return ""
    return f"{0.0 if round(value, 2) == 0 else value:+.2f}"


def to_markdown(lines: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    columns = columns or list(lines[0])
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(_signed(line.get(c)) if c in DELTAS else _cell(line.get(c)) for c in columns) + " |"
            for line in lines]
    return "\n".join(out) + "\n"


def to_csv(lines: list[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(lines[0]))
    writer.writeheader()
    writer.writerows({k: ("" if v is None else v) for k, v in line.items()} for line in lines)
    return buffer.getvalue()


# Columns of the markdown table (the CSV has them all).
MARKDOWN_COLUMNS = {
    "table3": ["row", "N", "d_model", "d_ff", "h", "d_k", "d_v", "P_drop", "eps_ls", "attention window", "steps",
               "PPL (dev)", "paper PPL", "ΔPPL", "paper ΔPPL", "BLEU (dev)", "sacreBLEU (dev)", "paper BLEU", "ΔBLEU",
               "paper ΔBLEU", "within noise", "params ×10^6", "paper params ×10^6", "train FLOPs", "estimate FLOPs", "seed",
               "scale"],
    "table2": ["row", "BLEU (test)", "sacreBLEU (test)", "test sentences", "paper BLEU", "averaged", "params ×10^6", "train FLOPs",
               "estimate FLOPs", "paper FLOPs", "steps", "seed", "scale"],
}


def _scales(lines: list[dict[str, Any]]) -> list[str]:
    """The scales that have runs, the one with most runs first (then by name)."""
    counts: dict[str, int] = {}
    for line in lines:
        if line.get("run") is not None:
            counts[line["scale"]] = counts.get(line["scale"], 0) + 1
    return sorted(counts, key=lambda scale: (-counts[scale], scale))


def _by_row(lines: list[dict[str, Any]], scale: str | None) -> dict[str, list[dict[str, Any]]]:
    """Each row's label (in the table's order) and its lines run at ``scale``."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        rows.setdefault(line["row"], [])
        if line.get("run") is not None and line["scale"] == scale:
            rows[line["row"]].append(line)
    return rows


def _paper_deltas(lines: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each row's label and its first line (the paper's figures are the same in all of them)."""
    first: dict[str, dict[str, Any]] = {}
    for line in lines:
        first.setdefault(line["row"], line)
    return first


def noise_markdown(lines: list[dict[str, Any]], spreads: dict[str, BaseSpread], paper_base: dict[str, Any]) -> str:
    """Table 3's lines after the table: what the differences are, then per scale with runs the
    noise band of the base runs and a line per row run at that scale: its ΔBLEU (the mean over
    its seeds), the paper's ΔBLEU, and whether it is within noise (:func:`within_noise` of that
    mean; with several seeds, how many of them are); then the rows with no run at that scale."""
    definitions = ("ΔPPL, ΔBLEU: a run's dev perplexity and dev BLEU minus the mean of the base runs trained at "
                   "the same scale. paper ΔPPL, paper ΔBLEU: the row's figure in the paper minus the paper's base "
                   f"(PPL {_cell(paper_base.get('ppl')) or '–'}, BLEU {_cell(paper_base.get('bleu')) or '–'}). "
                   "Noise band: the base runs' smallest and largest difference from their mean; sd: their sample "
                   f"standard deviation (ddof=1). {WITHIN_NOISE_RULE}.")
    out = ["", "## Differences from base", "", definitions, ""]
    scales = _scales(lines)
    if not scales:
        out += ["No runs: no differences.", ""]
    paper = _paper_deltas(lines)
    for scale in scales:
        spread = spreads.get(scale)
        out += [f"### Scale `{scale}`", ""]
        if spread is None:
            out += ["Noise band: no base run at this scale, so no differences.", ""]
        else:
            seeds = ", ".join("–" if seed is None else str(seed) for seed in spread.seeds)
            text = (f"Noise band: {spread.runs} base run{'s' if spread.runs != 1 else ''} "
                    f"(seed{'s' if spread.runs != 1 else ''} {seeds}); mean dev BLEU {_cell(spread.bleu_mean) or '–'}, "
                    f"mean dev PPL {_cell(spread.ppl_mean) or '–'}.")
            for name, band, sd in (("BLEU", spread.bleu_band, spread.bleu_sd), ("PPL", spread.ppl_band, spread.ppl_sd)):
                text += (f" {name} band [{_signed(band[0])}, {_signed(band[1])}], sd {sd:.2f}." if band is not None
                         else f" {name} band: none (fewer than 2 base runs with dev {name}).")
            out += [text, ""]
        by_row = _by_row(lines, scale)
        for label, runs in by_row.items():
            if not runs:
                continue
            deltas = [line["ΔBLEU"] for line in runs if line["ΔBLEU"] is not None]
            mean = statistics.fmean(deltas) if deltas else None
            seeds = f"mean over {len(deltas)} seeds" if len(deltas) > 1 else f"{len(runs)} run{'s' if len(runs) > 1 else ''}"
            verdict = within_noise(mean, spread.bleu_band if spread else None)
            if verdict is not None and len(deltas) > 1:
                verdict += f" ({sum(line['within noise'] == 'yes' for line in runs)} of {len(deltas)} seeds)"
            out.append(f"- {label}: ΔBLEU {_signed(mean) or '–'} ({seeds}), "
                       f"paper ΔBLEU {_signed(paper[label]['paper ΔBLEU']) or '–'}, within noise: {verdict or '–'}")
        if missing := [label for label, runs in by_row.items() if not runs]:
            out.append(f"- no run at this scale ({len(missing)} of {len(by_row)} rows): {'; '.join(missing)}")
        out.append("")
    return "\n".join(out)


def draw_chart(table: str, lines: list[dict[str, Any]], path: Path | str,
               spreads: dict[str, BaseSpread] | None = None) -> Path:
    """Table 2: bars of test BLEU per row beside the paper's. Table 3: the differences from base
    (:func:`_draw_differences`; ``spreads`` gives the noise bands)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if table == "table3":
        return _draw_differences(lines, spreads or {}, path)
    metrics = [("BLEU (test)", "paper BLEU", "BLEU (newstest2014)")]
    labels = [line["row"] + (f" s{line['seed']}" if line.get("seed") is not None else "") for line in lines]
    figure = Figure(figsize=(max(6.0, 0.45 * len(lines) + 2), 3.2 * len(metrics)), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(metrics), 1, squeeze=False)[:, 0]
    positions = range(len(lines))
    for ax, (measured, paper, title) in zip(axes, metrics):
        here = [line.get(measured) if line.get(measured) is not None else float("nan") for line in lines]
        theirs = [line.get(paper) if line.get(paper) is not None else float("nan") for line in lines]
        ax.bar([p - 0.2 for p in positions], here, width=0.4, label="here")
        ax.bar([p + 0.2 for p in positions], theirs, width=0.4, label="paper")
        ax.set_ylabel(title)
        ax.set_xticks(list(positions), labels, rotation=60, ha="right", fontsize=7)
        ax.legend(fontsize=8)
    axes[0].set_title("Table 2: WMT 2014 newstest2014")
    path = Path(path)
    figure.savefig(path, dpi=120)
    return path


def _linear_range(band: tuple[float, float] | None, values: list[float]) -> float | None:
    """Where one row's difference dwarfs the rest (more than 10 times the noise band's reach, or
    than 1), the axis is symmetric-log, linear within this range, so the small differences stay
    visible beside it; None keeps a linear axis."""
    reach = max([1.0] + ([abs(end) for end in band] if band is not None else []))
    largest = max((abs(v) for v in values if not math.isnan(v)), default=0.0)
    return float(f"{reach:.2g}") if largest > 10 * reach else None


def _draw_differences(lines: list[dict[str, Any]], spreads: dict[str, BaseSpread], path: Path | str) -> Path:
    """Table 3's chart: two panels per scale that has runs, one pair under the other (most runs
    first; one pair of the paper's differences only when there are no runs). Top: ΔBLEU per row, the bar the
    mean over the row's seeds at that scale, a dot per seed when there are several, beside the
    paper's ΔBLEU; the grey band is the scale's BLEU noise band, dotted lines the within-noise
    limits where they reach past it. Bottom: the same for ΔPPL. A row without a difference at
    that scale has no bar of its own. An axis turns symmetric-log where one difference dwarfs the
    others (:func:`_linear_range`)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    paper = _paper_deltas(lines)
    labels = list(paper)
    scales: list[str | None] = list(_scales(lines)) or [None]
    figure = Figure(figsize=(max(6.0, 0.4 * len(labels) + 2), 7.0 * len(scales)), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(2 * len(scales), 1, squeeze=False)[:, 0]
    positions = list(range(len(labels)))
    nan = float("nan")
    for column, scale in enumerate(scales):
        spread = spreads.get(scale) if scale is not None else None
        rows = _by_row(lines, scale)
        for ax, metric, band, title in (
                (axes[2 * column], "BLEU", spread.bleu_band if spread else None, "ΔBLEU (dev)"),
                (axes[2 * column + 1], "PPL", spread.ppl_band if spread else None, "ΔPPL (dev, per wordpiece)")):
            if band is not None:
                ax.axhspan(*band, color="0.85", zorder=0, label=f"noise band ({spread.runs} base runs)")
                if metric == "BLEU":
                    for limit, end in zip(noise_limits(band), band):
                        if limit != end:
                            ax.axhline(limit, color="0.5", linestyle=":", linewidth=0.8, zorder=0)
            seeds = {label: [line[f"Δ{metric}"] for line in rows[label] if line[f"Δ{metric}"] is not None]
                     for label in labels}
            here = [statistics.fmean(seeds[label]) if seeds[label] else nan for label in labels]
            theirs = [nan if paper[label][f"paper Δ{metric}"] is None else paper[label][f"paper Δ{metric}"]
                      for label in labels]
            ax.bar([p - 0.2 for p in positions], here, width=0.4, label="here (mean over seeds)")
            ax.bar([p + 0.2 for p in positions], theirs, width=0.4, label="paper")
            dotted = False
            for position, label in zip(positions, labels):
                if len(seeds[label]) > 1:
                    ax.plot([position - 0.2] * len(seeds[label]), seeds[label], "o", color="black", markersize=3,
                            label=None if dotted else "a seed", zorder=3)
                    dotted = True
            ax.axhline(0, color="0.3", linewidth=0.6)
            linear = _linear_range(band, here + theirs + [v for label in labels for v in seeds[label]])
            if linear is not None:
                ax.set_yscale("symlog", linthresh=linear)
                ax.text(0.995, 0.02, f"symmetric log scale, linear within ±{linear:g}", transform=ax.transAxes,
                        ha="right", va="bottom", fontsize=7, color="0.3")
            ax.set_ylabel(title)
            ax.set_xticks(positions, labels, rotation=60, ha="right", fontsize=7)
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        axes[2 * column].set_title("Table 3: difference from base, " +
                                  (f"scale {scale}" if scale is not None else "the paper's only (no runs)"))
    path = Path(path)
    figure.savefig(path, dpi=120)
    return path


@dataclass
class Written:
    table: str
    lines: list[dict[str, Any]]
    markdown: Path
    csv: Path
    chart: Path


def write_table(table: str, rows: list[Row], runs: list[Run], out_dir: Path | str, header: str = "") -> Written:
    """``<out_dir>/<table>.md``, ``.csv`` and ``.png`` (Table 3: the differences from base, see
    :func:`noise_markdown` and :func:`_draw_differences`; Table 4: a line per test of a run,
    :mod:`aiayn.tables.table4`, into ``table4_runs.*``, :func:`file_stem`)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = [run for run in runs if run.table == table]
    if table == "table4":  # a line per test of a run (aiayn.tables.table4)
        lines = table4.table4_lines(rows, runs)
        return _written(table, lines, out_dir, header + to_markdown(lines, table4.COLUMNS),
                        table4.draw_chart(lines, out_dir / f"{file_stem(table)}.png"))
    lines = build_table(rows, runs)
    text = header + to_markdown(lines, MARKDOWN_COLUMNS[table])
    spreads = base_spread(runs) if table == "table3" else None
    if table == "table3":
        text += noise_markdown(lines, spreads, base_paper_figures(rows))
    return _written(table, lines, out_dir, text, draw_chart(table, lines, out_dir / f"{table}.png", spreads))


def file_stem(table: str) -> str:
    """The name of a rebuilt table's files in --out: the table's, but Table 4's ``table4_runs``, for
    experiments/results/table4.md (and .json) are the measurements written by hand beside the paper's."""
    return "table4_runs" if table == "table4" else table


def _written(table: str, lines: list[dict[str, Any]], out_dir: Path, text: str, chart: Path) -> Written:
    """``<out_dir>/<file_stem>.md`` (``text``) and ``.csv`` (``lines``) written beside ``chart``."""
    markdown = out_dir / f"{file_stem(table)}.md"
    markdown.write_text(text)
    csv_path = out_dir / f"{file_stem(table)}.csv"
    csv_path.write_text(to_csv(lines))
    return Written(table, lines, markdown, csv_path, chart)


def log_to_wandb(written: list[Written], project: str = "aiayn", save_dir: Path | str = ".",
                 mode: str = "auto") -> str:
    """Log each table as a ``wandb.Table`` and its chart as an image, in one run of job type
    "tables" (offline without an API key). Returns where the run is, as train says it
    (:func:`aiayn.reporting.loggers.describe_runs`): its page, or offline its folder and the
    ``wandb sync`` command that uploads it."""
    import wandb

    from aiayn.reporting.loggers import describe_runs, wandb_logger

    logger = wandb_logger(project=project, save_dir=str(save_dir), mode=mode, name="tables", job_type="tables")
    run = logger.experiment
    for w in written:
        columns = list(w.lines[0])
        data = [[line.get(c) for c in columns] for line in w.lines]  # None: not measured / not in the paper
        table = wandb.Table(columns=columns, data=data, allow_mixed_types=True)
        run.log({w.table: table, f"{w.table}_chart": wandb.Image(str(w.chart))})
    [where] = describe_runs([logger])
    run.finish()
    return where
