"""The paper's Tables 2 and 3 rebuilt from finished runs, each row beside the paper's figures.

The rows and the paper's figures come from the experiment configs (:mod:`aiayn.tables.rows`);
the runs, and what each measured, from their run directories or W&B
(:mod:`aiayn.tables.runs`). :func:`build_table` puts each run beside its row.

Table 3 (§6.2): dev perplexity per wordpiece, dev BLEU, parameters ×10^6, and each run's
difference from the base model trained at the same scale (ΔPPL and ΔBLEU) beside the paper's
difference, with a noise band from repeated base runs (:mod:`aiayn.tables.noise`).
Rows (F) are restricted self-attention (§4, ``model.attention_window``), which the paper's
Table 3 does not have. Table 2 (§6.1):
newstest2014 BLEU and the training cost in FLOPs, counted and estimated the paper's way (see
:mod:`aiayn.reporting.flops`). :mod:`aiayn.tables.output` writes a rebuilt table out.
"""

from __future__ import annotations

import logging
from typing import Any

from aiayn.config.schemas import network_arguments
from aiayn.tables.noise import BaseSpread, base_spread, within_noise
from aiayn.tables.rows import Row, base_paper_figures
from aiayn.tables.runs import Run, seed_order

log = logging.getLogger(__name__)


def build_table(rows: list[Row], runs: list[Run]) -> list[dict[str, Any]]:
    """One line per run of a row (a row without runs: one line with the paper's figures only),
    in the paper's order. Table 3's lines also hold their difference from the base runs of the
    same scale and from the paper's base (see :func:`_differences`)."""
    by_row: dict[str, list[Run]] = {}
    for run in runs:
        by_row.setdefault(run.row, []).append(run)
    for name in sorted(set(by_row) - {row.row for row in rows}, key=str):
        log.warning("runs of row %s, not a row of %s here (no config of it in conf/experiment/), left out: %s", name,
                    rows[0].table if rows else "the table", ", ".join(run.source for run in by_row[name]))
    spreads = base_spread(runs)
    paper_base = base_paper_figures(rows)
    lines = []
    for row in rows:
        matching = sorted(by_row.get(row.row, []), key=seed_order)
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
            # The paper's BLEU, tokenized as Table 2's (§6.2 scores the rows as §6.1); sacreBLEU beside it.
            # Runs from before the summary kept it have sacreBLEU alone: no BLEU (dev) to set beside the paper's.
            "BLEU (dev)": summary.get("dev/tokenized_bleu"), "sacreBLEU (dev)": summary.get("dev/bleu"),
            "paper BLEU": row.paper.get("bleu"),
            "params ×10^6": params / 1e6 if params else None, "paper params ×10^6": row.paper.get("params_m"),
            # filled in by _differences, which knows the base runs
            "ΔPPL": None, "paper ΔPPL": None, "ΔBLEU": None, "paper ΔBLEU": None, "within noise": None,
        }
    else:
        test = run.test if run else {}
        line |= {
            "BLEU (test)": test.get("bleu"), "sacreBLEU (test)": test.get("sacrebleu"),
            "test sentences": test.get("sentences"),  # scored; newstest2014 has 3,003
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
