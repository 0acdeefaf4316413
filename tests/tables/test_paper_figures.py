"""The paper's figures each experiment config carries (``experiment.paper``), against the paper
(arXiv 1706.03762v5): Table 3's perplexity, BLEU and parameters, Table 2's BLEU and training
cost, Table 4's F1. The tables print them beside the runs', so a slip here would misreport the
paper."""

from __future__ import annotations

from omegaconf import OmegaConf

from tests.helpers.runs import REPO

# Table 3: (dev PPL, dev BLEU, params ×10^6 or None where the paper lists none).
TABLE3 = {
    "base": (4.92, 25.8, 65),
    "A_h1": (5.29, 24.9, None), "A_h4": (5.00, 25.5, None), "A_h16": (4.91, 25.8, None), "A_h32": (5.01, 25.4, None),
    "B_dk16": (5.16, 25.1, 58), "B_dk32": (5.01, 25.4, 60),
    "C_N2": (6.11, 23.7, 36), "C_N4": (5.19, 25.3, 50), "C_N8": (4.88, 25.5, 80),
    "C_dmodel256": (5.75, 24.5, 28), "C_dmodel1024": (4.66, 26.0, 168),
    "C_dff1024": (5.12, 25.4, 53), "C_dff4096": (4.75, 26.2, 90),
    "D_pdrop0": (5.77, 24.6, None), "D_pdrop02": (4.95, 25.5, None),
    "D_ls0": (4.67, 25.3, None), "D_ls02": (5.47, 25.7, None),
    "E_learned": (4.92, 25.7, None),
    "big": (4.33, 26.4, 213),
}
TABLE2 = {"base_en_de": (27.3, 3.3e18), "base_en_fr": (38.1, 3.3e18),
          "big_en_de": (28.4, 2.3e19), "big_en_fr": (41.8, 2.3e19)}  # (newstest2014 BLEU, training FLOPs)
TABLE4 = {"wsj": 91.3, "semi": 92.7}  # WSJ section 23 F1


def papers(table: str) -> dict[str, dict]:
    """Each row's ``experiment.paper`` of conf/experiment/<table>_*.yaml, read as written."""
    files = (REPO / "conf" / "experiment").glob(f"{table}_*.yaml")
    return {f.stem.removeprefix(f"{table}_"): OmegaConf.load(f).experiment.paper for f in files}


def test_every_rows_paper_figures_are_the_papers():
    table3 = {row: paper for row, paper in papers("table3").items() if not row.startswith("F_")}
    assert {row: (p.ppl, p.bleu, p.params_m) for row, p in table3.items()} == TABLE3
    assert {row: (p.bleu, p.flops) for row, p in papers("table2").items()} == TABLE2
    assert {row: p.f1 for row, p in papers("table4").items() if row in TABLE4} == TABLE4
