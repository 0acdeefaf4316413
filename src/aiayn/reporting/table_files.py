"""A rebuilt table (:func:`aiayn.reporting.tables.build_table`) written out: markdown, CSV, a
chart of each row beside the paper's figures, and a W&B run holding them as ``wandb.Table``s."""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiayn.reporting.tables import Row, Run, build_table


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, float):
        if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
            return f"{value:.2e}"
        return f"{value:.2f}".rstrip("0").rstrip(".")
    return str(value)


def to_markdown(lines: list[dict[str, Any]], columns: list[str] | None = None) -> str:
    columns = columns or list(lines[0])
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(_cell(line.get(c)) for c in columns) + " |" for line in lines]
    return "\n".join(out) + "\n"


def to_csv(lines: list[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(lines[0]))
    writer.writeheader()
    writer.writerows({k: ("" if v is None else v) for k, v in line.items()} for line in lines)
    return buffer.getvalue()


# Columns of the markdown table (the CSV has them all).
MARKDOWN_COLUMNS = {
    "table3": ["row", "N", "d_model", "d_ff", "h", "d_k", "d_v", "P_drop", "eps_ls", "steps", "PPL (dev)",
               "paper PPL", "BLEU (dev)", "paper BLEU", "params ×10^6", "paper params ×10^6", "train FLOPs",
               "estimate FLOPs", "seed", "scale"],
    "table2": ["row", "BLEU (test)", "sacreBLEU (test)", "paper BLEU", "averaged", "params ×10^6", "train FLOPs",
               "estimate FLOPs", "paper FLOPs", "steps", "seed", "scale"],
}


def draw_chart(table: str, lines: list[dict[str, Any]], path: Path | str) -> Path:
    """Bars of BLEU (and for Table 3 perplexity) per row, measured beside the paper's."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    metrics = [("BLEU (dev)", "paper BLEU", "BLEU"), ("PPL (dev)", "paper PPL", "perplexity (dev, per wordpiece)")] \
        if table == "table3" else [("BLEU (test)", "paper BLEU", "BLEU (newstest2014)")]
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
    axes[0].set_title({"table3": "Table 3: variations on the Transformer",
                       "table2": "Table 2: WMT 2014 newstest2014"}[table])
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
    """``<out_dir>/<table>.md``, ``.csv`` and ``.png``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = build_table(rows, [run for run in runs if run.table == table])
    markdown = out_dir / f"{table}.md"
    markdown.write_text(header + to_markdown(lines, MARKDOWN_COLUMNS[table]))
    csv_path = out_dir / f"{table}.csv"
    csv_path.write_text(to_csv(lines))
    chart = draw_chart(table, lines, out_dir / f"{table}.png")
    return Written(table, lines, markdown, csv_path, chart)


def log_to_wandb(written: list[Written], project: str = "aiayn", save_dir: Path | str = ".",
                 mode: str = "auto") -> str:
    """Log each table as a ``wandb.Table`` and its chart as an image, in one run of job type
    "tables" (offline without an API key). Returns the run's directory."""
    import wandb

    from aiayn.reporting.loggers import wandb_logger

    logger = wandb_logger(project=project, save_dir=str(save_dir), mode=mode, name="tables", job_type="tables")
    run = logger.experiment
    for w in written:
        columns = list(w.lines[0])
        data = [[line.get(c) for c in columns] for line in w.lines]  # None: not measured / not in the paper
        table = wandb.Table(columns=columns, data=data, allow_mixed_types=True)
        run.log({w.table: table, f"{w.table}_chart": wandb.Image(str(w.chart))})
    directory = run.dir
    run.finish()
    return directory
