"""Table 4 (§6.3, English constituency parsing) rebuilt from finished runs: a line per test of each
run (``src/evaluate.py``'s reports in ``<run dir>/eval/``, and train.py's own test after training,
from its summary), beside the paper's F1 for the run's row, with the decoding each test used (the
paper's: beam 21, α 0.3, maximum output input + 300) and how many checkpoints it averaged. A run
with no test F1 keeps a line without one, named in a warning saying how to test it; a row without
runs keeps the paper's figure alone.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from aiayn.checkpoints.layout import LAST, checkpoint_folder
from aiayn.reporting.evaluations import read_reports
from aiayn.tables.row_tests import as_test, task_name, test_split
from aiayn.tables.runs import seed_order

log = logging.getLogger(__name__)

ROW_ORDER = ("wsj", "semi")  # the paper's rows first (WSJ only, semi-supervised), then ours by name
COLUMNS = ["row", "paper F1", "F1 (test)", "P", "R", "exact match", "test sentences", "split", "beam", "α",
           "max length", "constrained", "averaged", "tested by", "steps", "seed", "changed from its row"]


def row_order(row: str) -> tuple:
    return (ROW_ORDER.index(row) if row in ROW_ORDER else len(ROW_ORDER)), row


def table4_lines(rows: list[Any], runs: list[Any]) -> list[dict[str, Any]]:
    """Each row's lines: one per test of each of its runs (newest evaluate.py report last), one for
    a run with no test F1 (warned of), or one with the paper's figure alone when it has no run."""
    runs = sorted((run for run in runs if run.table == "table4"), key=seed_order)
    if stray := [run for run in runs if run.row not in {row.row for row in rows}]:
        log.warning("runs of rows not in table4 here (no config of them in conf/experiment/), left out: %s",
                    ", ".join(f"{run.source} (row {run.row})" for run in stray))
    lines = []
    for row in rows:
        row_runs = [run for run in runs if run.row == row.row]
        for run in row_runs:
            tests = run_tests(run)
            if not tests:
                log.warning("%s: no test F1, its Table 4 line has none: test it with `python src/evaluate.py "
                            "ckpt=%s split=test average_last=%s` (the k checkpoints ending there averaged; a run "
                            "stopped during its test after training: its train.py command again with resume=auto)", run.source,
                            checkpoint_folder(run.source) / LAST, row.average_last or "<k>")
            for tested_by, figures, decoding, averaged in tests or [(None, {}, {}, None)]:
                lines.append(_line(row, run, tested_by, figures, decoding, averaged))
        if not row_runs:
            lines.append(_line(row, None, None, {}, {}, None))
    return lines


def run_tests(run: Any) -> list[tuple[str, dict[str, Any], dict[str, Any], int | None]]:
    """A run's tests, each (by what, its figures, its decoding, the checkpoints it averaged):
    train.py's test after training (its summary's ``test/f1``), then each evaluate.py report on the
    test split in ``<run dir>/eval/`` (``split=test``, or the split by its sections: ``split=23``; oldest first), or for a run read from W&B each evaluate.py
    run of it there."""
    tests = []
    if "test/f1" in run.summary:
        averaged = run.summary.get("test_averaged")
        tests.append(("train.py", run.summary, dict(run.config.get("decoding") or {}),
                      int(averaged) if averaged is not None else None))
    reports = []
    split = test_split(run.config)
    for path, report in read_reports(Path(run.source, "eval")):
        # `evaluate.py ... split=test`, or the test split by its sections or files (split=23): keys <split>/f1
        if (report := as_test(report, split, "f1", task_name(run.config))) is not None:
            reports.append((path.stat().st_mtime, path.name, report))
    for _, name, report in sorted(reports, key=lambda found: found[:2]):
        tests.append((f"evaluate.py {name}", report, report.get("decoding") or {},
                      len(report.get("averaged") or []) or 1))
    for name, summary, decoding, averaged in run.test.get("evaluations", []):  # a W&B run's (tables.runs.wandb_runs)
        tests.append((f"evaluate.py {name}", summary, decoding, averaged))
    return tests


def _line(row: Any, run: Any, tested_by: str | None, figures: dict[str, Any], decoding: dict[str, Any],
          averaged: int | None) -> dict[str, Any]:
    sentences = figures.get("test/sentences", figures.get("sentences"))
    offset = decoding.get("max_len_offset")
    return {
        "row": row.label, "paper F1": row.paper.get("f1"),
        "F1 (test)": figures.get("test/f1"), "P": figures.get("test/precision"), "R": figures.get("test/recall"),
        "exact match": figures.get("test/exact_match"),
        "test sentences": int(sentences) if sentences is not None else None,
        "split": figures.get("split") or (((run.config.get("task") or {}).get("datamodule") or {}).get("test_split")
                                          if run and tested_by == "train.py" else None),
        "beam": decoding.get("beam_size"), "α": decoding.get("alpha"),
        "max length": f"input + {offset}" if offset is not None else None,
        "constrained": decoding.get("constrained"), "averaged": averaged, "tested by": tested_by,
        "steps": run.summary.get("steps") if run else None, "seed": run.config.get("seed") if run else None,
        # what a run counted by --include-modified set (each row is its own scale: no `paper` for the sample's)
        "changed from its row": run.scale.partition("changed: ")[2] if run else None,
        "run": run.source if run else None,
    }


def draw_chart(lines: list[dict[str, Any]], path: Path) -> Path:
    """Bars of each line's test F1 beside its row's F1 in the paper."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    nan = float("nan")
    labels = [f"{line['row'][:40]}" + (f" ({line['tested by'].split()[0]})" if line["tested by"] else "")
              for line in lines]
    figure = Figure(figsize=(max(6.0, 0.6 * len(lines) + 2), 4.0), layout="constrained")
    FigureCanvasAgg(figure)
    ax = figure.subplots()
    positions = range(len(lines))
    for shift, key, name in ((-0.2, "F1 (test)", "here"), (0.2, "paper F1", "paper")):
        ax.bar([p + shift for p in positions], [nan if line[key] is None else line[key] for line in lines],
               width=0.4, label=name)
    ax.set_ylabel("F1 (EVALB, test)")
    ax.set_xticks(list(positions), labels, rotation=60, ha="right", fontsize=7)
    ax.legend(fontsize=8)
    ax.set_title("Table 4: English constituency parsing (WSJ section 23 in the paper)")
    figure.savefig(path, dpi=120)
    return path
