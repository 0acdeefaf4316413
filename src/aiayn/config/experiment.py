"""The typed ``experiment`` section: a paper table's row (conf/experiment/), as the run's name and
tags (aiayn.config.identity) and the tables (aiayn.tables, experiments/tables.py) read it, with the
paper's figures for it. Checked with the other schemas as a run starts
(aiayn.config.schemas.check_against_schemas), so that a row of one's own with a figure misnamed
(``paper: {blue: 25.8}``) is refused rather than its column left blank."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


@dataclass
class PaperFigures:
    """The paper's figures for a row; null where it lists none (Table 3's blank parameter counts)."""

    ppl: Optional[float] = None  # noqa: UP045  Table 3: per-wordpiece dev perplexity (newstest2013)
    bleu: Optional[float] = None  # noqa: UP045  Table 2: newstest2014; Table 3: newstest2013
    params_m: Optional[float] = None  # noqa: UP045  Table 3: parameters ×10^6
    flops: Optional[float] = None  # noqa: UP045  Table 2: training cost, FLOPs
    f1: Optional[float] = None  # noqa: UP045  Table 4: WSJ section 23 F1


@dataclass
class ExperimentConfig:
    """A paper table's row; every field null where a run is no row (``experiment`` left out)."""

    table: Optional[str] = None  # noqa: UP045  table2, table3, table4
    row: Optional[str] = None  # noqa: UP045  the row's short name (A_h1, base_en_de): W&B's and the tables' key
    label: Optional[str] = None  # noqa: UP045  the row as the paper prints it, "(A) h=1"
    tags: list[str] = field(default_factory=list)  # its W&B tags (table3, A, A_h1)
    paper: PaperFigures = field(default_factory=PaperFigures)
    scale: Optional[str] = None  # noqa: UP045  the scale it runs at (conf/scale/: multi30k, multi30k_cpu); null: the paper's
