"""The rows of the paper's Tables 2 and 3, from the experiment configs (``conf/experiment/table2_*``,
``table3_*``), each with its architecture and the paper's figures (``experiment.paper``), in the
paper's order; and Table 3's parameter counts for a vocabulary size, without training.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from aiayn.config.schemas import network_arguments
from aiayn.model import Transformer
from aiayn.tables.table4 import row_order


@dataclass
class Row:
    """One row of a paper table: its config name, label, architecture and the paper's figures."""

    table: str
    row: str
    label: str
    model: dict[str, Any]  # the network's arguments (aiayn.config.schemas.network_arguments)
    paper: dict[str, Any]
    experiment: str  # the config name: experiment=<this>
    average_last: int | None = None  # §6.1's checkpoints averaged (checkpoint.average_last; Table 2's rows)
    label_smoothing: float | None = None  # ε_ls (loss.label_smoothing)


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
                            average_last=cfg.checkpoint.average_last,
                            label_smoothing=cfg.loss.label_smoothing))
    return tuple(sorted(rows, key=_paper_order))


# Table 3's rows within their groups, as the paper lists them; (F) follows, by radius.
TABLE3_ORDER = ["A_h1", "A_h4", "A_h16", "A_h32", "B_dk16", "B_dk32", "C_N2", "C_N4", "C_N8", "C_dmodel256",
                "C_dmodel1024", "C_dff1024", "C_dff4096", "D_pdrop0", "D_pdrop02", "D_ls0", "D_ls02", "E_learned"]
WINDOW_ROW = re.compile(r"F_r(\d+)")


def _paper_order(row: Row) -> tuple:
    """Table 3: base, (A)…(E) as the paper lists them, then (F) (restricted self-attention,
    ``F_r<radius>``) by radius, then big; a row of a group not listed here comes after its group's
    known rows (by name). Table 2: base, big × pairs. Table 4: WSJ only, semi-supervised, then ours."""
    if row.table == "table4":
        return row_order(row.row)
    if row.table == "table3":
        group = {"base": 0, "big": 99}.get(row.row, ord(row.row[0]))
        if row.row in TABLE3_ORDER:
            return group, TABLE3_ORDER.index(row.row), 0, row.row
        window = WINDOW_ROW.fullmatch(row.row)
        return group, len(TABLE3_ORDER), int(window[1]) if window else float("inf"), row.row
    return row.row.split("_", 1)[1:], row.row.startswith("big"), row.row


def base_paper_figures(rows: list[Row]) -> dict[str, Any]:
    """The paper's figures for Table 3's base row among ``rows`` ({} without one): what Table 3's
    paper ΔPPL and ΔBLEU are differences from."""
    return next((row.paper for row in rows if row.table == "table3" and row.row == "base"), {})


# -- Table 3's parameter counts, without training -----------------------------------------------
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
    lines.append("paper '-': Table 3 leaves the count blank (its caption: unlisted values are the base model's, 65)")
    return "\n".join(lines)
