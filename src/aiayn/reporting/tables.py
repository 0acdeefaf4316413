"""The paper's Tables 2 and 3 rebuilt from finished runs, each row beside the paper's figures.

The rows and the paper's figures come from the experiment configs (``conf/experiment/table2_*``,
``table3_*``: ``experiment.paper``); a run belongs to a row through its resolved config
(``experiment.table`` and ``experiment.row``). What a run measured comes from its summary
(:mod:`aiayn.reporting.summary`): ``summary.json`` in the run directory, which every run writes
(or the W&B run's summary, read from the W&B project). Table 2's test BLEU comes from
``src/evaluate.py``'s report in ``<run dir>/eval/`` (checkpoint averaging, §6.1).

Table 3 (§6.2): dev perplexity per wordpiece, dev BLEU, parameters ×10^6, and each run's
difference from the base model trained at the same scale (:func:`base_spread`, ΔPPL and ΔBLEU)
beside the paper's difference, with a noise band from repeated base runs (:func:`within_noise`).
Rows (F) are restricted self-attention (§4, ``model.attention_window``), which the paper's
Table 3 does not have. Table 2 (§6.1):
newstest2014 BLEU and the training cost in FLOPs, counted and estimated the paper's way (see
:mod:`aiayn.reporting.flops`). :mod:`aiayn.reporting.table_files` writes a rebuilt table out.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from aiayn.model import Transformer
from aiayn.reporting.summary import read_summary
from aiayn.training.config import network_arguments

log = logging.getLogger(__name__)

TABLES = ("table3", "table2")


@dataclass
class Row:
    """One row of a paper table: its config name, label, architecture and the paper's figures."""

    table: str
    row: str
    label: str
    model: dict[str, Any]  # the network's arguments (aiayn.training.config.network_arguments)
    paper: dict[str, Any]
    experiment: str  # the config name: experiment=<this>
    average_last: int | None = None
    label_smoothing: float | None = None  # ε_ls (loss.label_smoothing)


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

    @property
    def scale(self) -> str:
        """The scale the run was trained at (``experiment.scale``); "paper" without one."""
        return (self.config.get("experiment") or {}).get("scale") or "paper"


# -- the rows, from the experiment configs ------------------------------------------------------
def table_rows(conf_dir: Path | str, table: str) -> list[Row]:
    """The rows of ``table`` in the paper's order, each composed from its experiment config."""
    return list(_table_rows(Path(conf_dir).resolve(), table))


@functools.cache
def _table_rows(conf_dir: Path, table: str) -> tuple[Row, ...]:
    from hydra import compose, initialize_config_dir

    names = sorted(p.stem for p in (conf_dir / "experiment").glob(f"{table}_*.yaml"))
    if not names:
        raise FileNotFoundError(f"no {table}_*.yaml in {conf_dir / 'experiment'}")
    rows = []
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        for name in names:
            # On the row's own task: a task may change the model (conf/task_model/: big EN-FR's P_drop).
            cfg = compose("train", overrides=[f"experiment={name}"])
            experiment = OmegaConf.to_container(cfg.experiment, resolve=True)
            model = network_arguments(OmegaConf.to_container(cfg.model, resolve=True), cfg.width_divisor)
            rows.append(Row(table=table, row=experiment["row"], label=experiment["label"], model=model,
                            paper=dict(experiment.get("paper") or {}), experiment=name,
                            average_last=experiment.get("average_last"),
                            label_smoothing=cfg.loss.label_smoothing))
    return tuple(sorted(rows, key=_paper_order))


# Table 3's rows within their groups, as the paper lists them; (F) follows, by radius.
TABLE3_ORDER = ["A_h1", "A_h4", "A_h16", "A_h32", "B_dk16", "B_dk32", "C_N2", "C_N4", "C_N8", "C_dmodel256",
                "C_dmodel1024", "C_dff1024", "C_dff4096", "D_pdrop0", "D_pdrop02", "D_ls0", "D_ls02", "E_learned"]
WINDOW_ROW = re.compile(r"F_r(\d+)")


def _paper_order(row: Row) -> tuple:
    """Table 3: base, (A)…(E) as the paper lists them, then (F) (restricted self-attention,
    ``F_r<radius>``) by radius, then big; a row of a group not listed here comes after its group's
    known rows (by name). Table 2: base, big × pairs."""
    if row.table == "table3":
        group = {"base": 0, "big": 99}.get(row.row, ord(row.row[0]))
        if row.row in TABLE3_ORDER:
            return group, TABLE3_ORDER.index(row.row), 0, row.row
        window = WINDOW_ROW.fullmatch(row.row)
        return group, len(TABLE3_ORDER), int(window[1]) if window else float("inf"), row.row
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
    """Parameters of the Transformer built from ``model`` (the network's arguments, as
    network_arguments gives them) for a shared vocabulary of ``vocab_size``, built on the meta
    device (no memory, no time)."""
    with torch.device("meta"):
        transformer = Transformer(vocab_size, vocab_size, **model)
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
            summary = read_summary(run_dir)
            if summary is None:
                log.warning("%s: no summary (unfinished run?); left out", run_dir)
                continue
            runs.append(Run(source=str(run_dir), config=config, summary=summary, test=_test_report(run_dir)))
    return runs


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


def base_spread(runs: Iterable[Run]) -> dict[str, BaseSpread]:
    """Table 3's base runs (row ``base``) by scale, each scale's mean, band and sd."""
    by_scale: dict[str, list[Run]] = {}
    for run in runs:
        if run.table == "table3" and run.row == "base":
            by_scale.setdefault(run.scale, []).append(run)
    spreads = {}
    for scale, base in sorted(by_scale.items()):
        base.sort(key=lambda r: (r.config.get("seed", 0), r.source))
        figures = {}
        for metric in ("ppl", "bleu"):
            values = [r.summary[f"dev/{metric}"] for r in base if r.summary.get(f"dev/{metric}") is not None]
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


def build_table(rows: list[Row], runs: list[Run]) -> list[dict[str, Any]]:
    """One line per run of a row (a row without runs: one line with the paper's figures only),
    in the paper's order. Table 3's lines also hold their difference from the base runs of the
    same scale and from the paper's base (see :func:`_differences`)."""
    by_row: dict[str, list[Run]] = {}
    for run in runs:
        by_row.setdefault(run.row, []).append(run)
    spreads = base_spread(runs)
    paper_base = next((row.paper for row in rows if row.table == "table3" and row.row == "base"), {})
    lines = []
    for row in rows:
        matching = sorted(by_row.get(row.row, []), key=lambda r: (r.config.get("seed", 0), r.source))
        for run in matching or [None]:
            line = _line(row, run)
            if row.table == "table3":
                _differences(line, row, run, spreads, paper_base)
            lines.append(line)
    return lines


def _differences(line: dict[str, Any], row: Row, run: Run | None, spreads: dict[str, BaseSpread],
                 paper_base: dict[str, Any]) -> None:
    """ΔPPL, ΔBLEU: the run's dev figure minus the mean of the base runs of its scale (None
    without either); paper ΔPPL, ΔBLEU: the row's paper figure minus the paper's base (None where
    the paper lists none); within noise: :func:`within_noise` of ΔBLEU and the scale's BLEU band."""
    spread = spreads.get(run.scale) if run else None

    def delta(value: float | None, mean: float | None) -> float | None:
        return None if value is None or mean is None else value - mean

    def paper_delta(metric: str) -> float | None:
        theirs, base = row.paper.get(metric), paper_base.get(metric)
        return None if theirs is None or base is None else round(theirs - base, 4)

    bleu = delta(line["BLEU (dev)"], spread.bleu_mean if spread else None)
    line |= {
        "ΔPPL": delta(line["PPL (dev)"], spread.ppl_mean if spread else None), "paper ΔPPL": paper_delta("ppl"),
        "ΔBLEU": bleu, "paper ΔBLEU": paper_delta("bleu"),
        "within noise": within_noise(bleu, spread.bleu_band if spread else None),
    }


def _line(row: Row, run: Run | None) -> dict[str, Any]:
    model, label_smoothing = _trained(run.config) if run else (row.model, row.label_smoothing)
    summary = run.summary if run else {}
    params = summary.get("parameters")
    line = {
        "row": row.label,
        "N": model.get("n_layers"), "d_model": model.get("d_model"), "d_ff": model.get("d_ff"),
        "h": model.get("n_heads"), "d_k": model.get("d_k"), "d_v": model.get("d_v"),
        "P_drop": model.get("dropout"), "eps_ls": label_smoothing, "positions": model.get("positional"),
    }
    if row.table == "table3":
        line |= {
            "attention window": model.get("attention_window"),  # r of restricted self-attention; None: full
            "PPL (dev)": summary.get("dev/ppl"), "paper PPL": row.paper.get("ppl"),
            "BLEU (dev)": summary.get("dev/bleu"), "paper BLEU": row.paper.get("bleu"),
            "params ×10^6": params / 1e6 if params else None, "paper params ×10^6": row.paper.get("params_m"),
            # filled in by _differences, which knows the base runs
            "ΔPPL": None, "paper ΔPPL": None, "ΔBLEU": None, "paper ΔBLEU": None, "within noise": None,
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
        "scale": run.scale if run else None,
        "task": (run.config.get("task") or {}).get("name") if run else None,
        "device": summary.get("device_name"), "finished": summary.get("finished_at"),
        "run": run.source if run else None,
    }
    return line


def _trained(config: dict[str, Any]) -> tuple[dict[str, Any], float | None]:
    """The network a run's config trained (its widths divided by ``width_divisor``) and its ε_ls.
    Runs written before the recipe left the model config kept both in ``model``
    (``model.width_divisor``, ``model.label_smoothing``)."""
    model = dict(config.get("model") or {})
    divisor = config.get("width_divisor", model.pop("width_divisor", 1))
    label_smoothing = (config.get("loss") or {}).get("label_smoothing", model.get("label_smoothing"))
    return network_arguments(model, divisor), label_smoothing
