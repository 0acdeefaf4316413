"""The paper's Tables 2 and 3 rebuilt from finished runs, each row beside the paper's figures.

The rows and the paper's figures come from the experiment configs (``conf/experiment/table2_*``,
``table3_*``: ``experiment.paper``); a run belongs to a row through its resolved config
(``experiment.table`` and ``experiment.row``). What a run measured comes from its summary
(:mod:`aiayn.training.run_summary`): the W&B run's summary, read from the offline run file in the
run directory (or from the W&B project), else ``summary.json``. Table 2's test BLEU comes from
``src/evaluate.py``'s report in ``<run dir>/eval/`` (checkpoint averaging, §6.1).

Table 3 (§6.2): dev perplexity per wordpiece, dev BLEU, parameters ×10^6. Table 2 (§6.1):
newstest2014 BLEU and the training cost in FLOPs, counted and estimated the paper's way (see
:mod:`aiayn.training.flops`).
"""

from __future__ import annotations

import csv
import functools
import io
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import torch
from omegaconf import OmegaConf

from aiayn.model import Transformer
from aiayn.training.model_config import network_arguments
from aiayn.training.run_summary import SUMMARY_FILE
from aiayn.training.wandb_offline import read_run

log = logging.getLogger(__name__)

TABLES = ("table3", "table2")
# Composing a row needs some task; the model does not depend on it. Until the WMT tasks exist
# everywhere the Multi30k one stands in (the parameter count takes its vocabulary size apart).
STAND_IN_TASK = "multi30k_en_de"


@dataclass
class Row:
    """One row of a paper table: its config name, label, architecture and the paper's figures."""

    table: str
    row: str
    label: str
    model: dict[str, Any]
    paper: dict[str, Any]
    experiment: str  # the config name: experiment=<this>
    average_last: int | None = None


@dataclass
class Run:
    """One finished run of a row: where it is, its config and what it measured."""

    source: str  # run directory or W&B run path
    config: dict[str, Any]
    summary: dict[str, Any]
    test: dict[str, Any] = field(default_factory=dict)  # Table 2: test BLEU, sacreBLEU, checkpoints averaged

    @property
    def table(self) -> str | None:
        return (self.config.get("experiment") or {}).get("table")

    @property
    def row(self) -> str | None:
        return (self.config.get("experiment") or {}).get("row")


# -- the rows, from the experiment configs ------------------------------------------------------
def table_rows(conf_dir: Path | str, table: str) -> list[Row]:
    """The rows of ``table`` in the paper's order, each composed from its experiment config."""
    return list(_table_rows(Path(conf_dir).resolve(), table))


@functools.lru_cache(maxsize=None)
def _table_rows(conf_dir: Path, table: str) -> tuple[Row, ...]:
    from hydra import compose, initialize_config_dir

    names = sorted(p.stem for p in (conf_dir / "experiment").glob(f"{table}_*.yaml"))
    if not names:
        raise FileNotFoundError(f"no {table}_*.yaml in {conf_dir / 'experiment'}")
    rows = []
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        for name in names:
            cfg = compose("train", overrides=[f"experiment={name}", f"task={STAND_IN_TASK}"])
            experiment = OmegaConf.to_container(cfg.experiment, resolve=True)
            model = OmegaConf.to_container(cfg.model, resolve=True)
            rows.append(Row(table=table, row=experiment["row"], label=experiment["label"], model=model,
                            paper=dict(experiment.get("paper") or {}), experiment=name,
                            average_last=experiment.get("average_last")))
    return tuple(sorted(rows, key=_paper_order))


def _paper_order(row: Row) -> tuple:
    """Table 3: base, (A)…(E), big, each group as the paper lists it; Table 2: base, big × pairs."""
    if row.table == "table3":
        group = {"base": 0, "big": 99}.get(row.row, ord(row.row[0]))
        within = ["A_h1", "A_h4", "A_h16", "A_h32", "B_dk16", "B_dk32", "C_N2", "C_N4", "C_N8", "C_dmodel256",
                  "C_dmodel1024", "C_dff1024", "C_dff4096", "D_pdrop0", "D_pdrop02", "D_ls0", "D_ls02"]
        return group, within.index(row.row) if row.row in within else len(within), row.row
    return row.row.split("_", 1)[1:], row.row.startswith("big"), row.row


def expand_sweep(conf_dir: Path | str, overrides: list[str]) -> list[list[str]]:
    """The jobs ``python src/train.py --multirun <overrides>`` launches, each as its list of
    overrides, expanded by Hydra's own basic sweeper (globs, ranges, comma lists): a dry run."""
    from hydra import initialize_config_dir
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    with initialize_config_dir(config_dir=str(Path(conf_dir).resolve()), version_base="1.3"):
        parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
        batches = BasicSweeper.split_arguments(parser.parse_overrides(overrides), max_batch_size=None)
    return [list(job) for batch in batches for job in batch]


def count_parameters(model: dict[str, Any], vocab_size: int) -> int:
    """Parameters of the Transformer a model config builds for a shared vocabulary of
    ``vocab_size``, built on the meta device (no memory, no time)."""
    with torch.device("meta"):
        transformer = Transformer(vocab_size, vocab_size, **network_arguments(model))
    return sum(p.numel() for p in transformer.parameters())


def parameter_report(conf_dir: Path | str, vocab_size: int) -> list[dict[str, Any]]:
    """Every Table 3 row's parameter count for ``vocab_size`` beside the paper's (×10^6)."""
    report = []
    for row in table_rows(conf_dir, "table3"):
        count = count_parameters(row.model, vocab_size)
        report.append({"row": row.row, "label": row.label, "experiment": row.experiment, "parameters": count,
                       "params_m": round(count / 1e6, 1), "paper_params_m": row.paper.get("params_m")})
    return report


def format_parameter_report(report: list[dict[str, Any]], vocab_size: int) -> str:
    lines = [f"Table 3 parameters with a shared vocabulary of {vocab_size} (×10^6; paper: 37000 BPE, EN-DE)",
             f"{'row':<34}{'here':>8}{'paper':>8}"]
    for entry in report:
        paper = "-" if entry["paper_params_m"] is None else f"{entry['paper_params_m']:g}"
        lines.append(f"{entry['label']:<34}{entry['params_m']:>8.1f}{paper:>8}")
    lines.append("paper '-': Table 3 lists no count for that row")
    return "\n".join(lines)


# -- the runs ------------------------------------------------------------------------------------
def local_runs(roots: Iterable[Path | str]) -> list[Run]:
    """Every finished run under ``roots`` (run directories or folders of them, e.g. a multirun
    date folder): a directory with ``.hydra/config.yaml`` and a summary. Runs without a summary
    (still training, or stopped) are listed in the log and left out."""
    runs = []
    for root in roots:
        root = Path(root)
        if not root.is_dir():
            raise FileNotFoundError(f"--runs {root}: no such directory")
        for config_file in sorted(root.glob("**/.hydra/config.yaml")):
            run_dir = config_file.parent.parent
            config = OmegaConf.to_container(OmegaConf.load(config_file), resolve=False)
            if not (config.get("experiment") or {}).get("table"):
                continue  # not a table experiment
            summary = _local_summary(run_dir)
            if summary is None:
                log.warning("%s: no summary (unfinished run?); left out", run_dir)
                continue
            runs.append(Run(source=str(run_dir), config=config, summary=summary, test=_test_report(run_dir)))
    return runs


def _local_summary(run_dir: Path) -> dict[str, Any] | None:
    """The W&B offline run's summary when the run logged to W&B, else summary.json."""
    if any(run_dir.glob("wandb/offline-run-*")):
        try:
            summary = read_run(run_dir, strict=False).summary
            if "train_flops" in summary:
                return summary
        except (ValueError, FileNotFoundError) as error:
            log.warning("%s: W&B run unreadable (%s); trying %s", run_dir, error, SUMMARY_FILE)
    path = run_dir / SUMMARY_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def _test_report(run_dir: Path) -> dict[str, Any]:
    """The newest evaluate.py report on the test split, the one averaging most checkpoints."""
    reports = []
    for path in (run_dir / "eval").glob("*.json"):
        report = json.loads(path.read_text())
        if "test/tokenized_bleu" in report:  # `python src/evaluate.py ... split=test`
            reports.append((len(report.get("averaged") or [None]), path.stat().st_mtime, report))
    if not reports:
        return {}
    averaged, _, report = max(reports, key=lambda r: r[:2])
    return _test_figures(report, averaged)


def _test_figures(metrics: dict[str, Any], averaged: int) -> dict[str, Any]:
    return {"bleu": metrics["test/tokenized_bleu"], "sacrebleu": metrics.get("test/sacrebleu"), "averaged": averaged}


def _averaged(evaluate_run_config: dict[str, Any]) -> int:
    """How many checkpoints an evaluate.py W&B run averaged (its config's evaluate.average_last)."""
    return int((evaluate_run_config.get("evaluate") or {}).get("average_last") or 1)


def wandb_runs(project: str, tables: Iterable[str] = TABLES) -> list[Run]:
    """The finished runs of ``project`` ("entity/project") in the tables' groups, online. For
    Table 2 the test BLEU comes from src/evaluate.py's W&B run (job type "eval", grouped under
    the training run's name), the newest with the most checkpoints averaged."""
    import wandb

    api = wandb.Api()
    runs = []
    for table in tables:
        for run in api.runs(project, filters={"group": table, "state": "finished"}):
            config = dict(run.config)
            summary = {k: v for k, v in run.summary_metrics.items() if not k.startswith("_")}
            test = {}
            if table == "table2":
                evaluations = [e for e in api.runs(project, filters={"group": config.get("run_name"), "jobType": "eval"})
                               if "test/tokenized_bleu" in e.summary_metrics]
                if evaluations:
                    newest = max(evaluations, key=lambda e: (_averaged(e.config), e.created_at))
                    test = _test_figures(newest.summary_metrics, _averaged(newest.config))
            runs.append(Run(source="/".join(run.path), config=config, summary=summary, test=test))
    return runs


# -- the tables ----------------------------------------------------------------------------------
def build_table(rows: list[Row], runs: list[Run]) -> list[dict[str, Any]]:
    """One line per run of a row (a row without runs: one line with the paper's figures only),
    in the paper's order."""
    by_row: dict[str, list[Run]] = {}
    for run in runs:
        by_row.setdefault(run.row, []).append(run)
    lines = []
    for row in rows:
        matching = sorted(by_row.get(row.row, []), key=lambda r: (r.config.get("seed", 0), r.source))
        for run in matching or [None]:
            lines.append(_line(row, run))
    return lines


def _line(row: Row, run: Run | None) -> dict[str, Any]:
    model = run.config.get("model", row.model) if run else row.model
    model = {**model, **network_arguments(model)}  # the sizes trained (width_divisor applied)
    summary = run.summary if run else {}
    params = summary.get("parameters")
    line = {
        "row": row.label,
        "N": model.get("n_layers"), "d_model": model.get("d_model"), "d_ff": model.get("d_ff"),
        "h": model.get("n_heads"), "d_k": model.get("d_k"), "d_v": model.get("d_v"),
        "P_drop": model.get("dropout"), "eps_ls": model.get("label_smoothing"), "positions": model.get("positional"),
    }
    if row.table == "table3":
        line |= {
            "PPL (dev)": summary.get("dev/ppl"), "paper PPL": row.paper.get("ppl"),
            "BLEU (dev)": summary.get("dev/bleu"), "paper BLEU": row.paper.get("bleu"),
            "params ×10^6": params / 1e6 if params else None, "paper params ×10^6": row.paper.get("params_m"),
        }
    else:
        test = run.test if run else {}
        line |= {
            "BLEU (test)": test.get("bleu"), "sacreBLEU (test)": test.get("sacrebleu"),
            "paper BLEU": row.paper.get("bleu"),
            "averaged": test.get("averaged"), "recipe averages": row.average_last,
            "params ×10^6": params / 1e6 if params else None,
        }
    line |= {
        "train FLOPs": summary.get("train_flops"), "estimate FLOPs": summary.get("train_flops_paper_estimate"),
        "paper FLOPs": row.paper.get("flops"),
        "steps": summary.get("steps"), "tokens": summary.get("tokens_seen"),
        "hours": summary["training_time_s"] / 3600 if summary.get("training_time_s") is not None else None,
        "seed": run.config.get("seed") if run else None,
        "scale": ((run.config.get("experiment") or {}).get("scale") or "paper") if run else None,
        "task": (run.config.get("task") or {}).get("name") if run else None,
        "device": summary.get("device_name"), "finished": summary.get("finished_at"),
        "run": run.source if run else None,
    }
    return line


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

    from aiayn.training.loggers import wandb_logger

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
