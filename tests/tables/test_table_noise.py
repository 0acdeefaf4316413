"""Table 3's differences from base: each run's dev PPL and BLEU minus the mean of the base runs
at its scale, the noise band of the base runs' seeds, the within-noise verdict, the row order with
the restricted self-attention rows (F), and the markdown, CSV and chart that show them. The rows
are the real configs (conf/experiment/table3_*); the runs are made up here (no training)."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

import pytest

from aiayn.tables.build import build_table
from aiayn.tables.noise import base_spread, within_noise
from aiayn.tables.output import write_table
from aiayn.tables.rows import Row, table_rows
from aiayn.tables.runs import Run
from tests.helpers.runs import REPO

CONF = REPO / "conf"
BASE_BLEU = [30.0, 31.0, 32.5]  # three seeds of base at Multi30k scale
BASE_PPL = [5.0, 5.2, 4.9]


@pytest.fixture(scope="module")
def rows() -> list[Row]:
    return table_rows(CONF, "table3")


def make_run(row: str, bleu: float | None, ppl: float | None, seed: int = 1, scale: str | None = "multi30k",
             window: int | None = None) -> Run:
    experiment = {"table": "table3", "row": row} | ({"scale": scale} if scale else {})
    model = {"n_layers": 6, "d_model": 512, "d_ff": 2048, "n_heads": 8, "d_k": 64, "d_v": 64, "dropout": 0.1,
             "positional": "sinusoidal", "attention_window": window}
    summary = {key: value for key, value in (("dev/tokenized_bleu", bleu), ("dev/ppl", ppl)) if value is not None}
    return Run(source=f"multirun/{row}-{scale}-{seed}", config={"experiment": experiment, "model": model,
                                                                 "seed": seed, "loss": {"label_smoothing": 0.1}},
               summary=summary | {"steps": 100})


def runs() -> list[Run]:
    return [
        *(make_run("base", bleu, ppl, seed) for seed, (bleu, ppl) in enumerate(zip(BASE_BLEU, BASE_PPL), 1)),
        make_run("base", 20.0, 8.0, scale=None),  # one base run at the paper's scale: no band there
        make_run("A_h1", 30.5, 5.3),  # Δ within Multi30k's band
        make_run("A_h1", 24.0, 9.0, scale=None),  # Δ from the paper-scale base only
        make_run("C_N2", 27.0, 6.0, seed=1), make_run("C_N2", 27.6, 6.1, seed=2),  # clearly below base
        make_run("D_ls0", 29.0, 5.4, scale="other"),  # no base run at this scale
        make_run("F_r2", 30.9, None, window=2),  # no dev PPL
    ]


def measured(lines: list[dict], label: str, scale: str | None = "multi30k") -> list[dict]:
    return [line for line in lines if line["row"] == label and line["run"] is not None
            and line["scale"] == (scale or "paper")]


def test_differences_are_from_the_base_mean_of_the_same_scale_only(rows: list[Row]) -> None:
    lines = build_table(rows, runs())
    label = {row.row: row.label for row in rows}
    mean_bleu, mean_ppl = statistics.fmean(BASE_BLEU), statistics.fmean(BASE_PPL)
    [a_h1] = measured(lines, label["A_h1"])
    assert a_h1["ΔBLEU"] == pytest.approx(30.5 - mean_bleu) and a_h1["ΔPPL"] == pytest.approx(5.3 - mean_ppl)
    [a_h1_paper_scale] = measured(lines, label["A_h1"], None)
    assert a_h1_paper_scale["ΔBLEU"] == pytest.approx(4.0) and a_h1_paper_scale["ΔPPL"] == pytest.approx(1.0)
    # The paper's own differences: the row's figures minus the paper's base (4.92, 25.8).
    assert (a_h1["paper ΔPPL"], a_h1["paper ΔBLEU"]) == (pytest.approx(0.37), pytest.approx(-0.9))
    # No base at its scale, a missing metric, a row the paper lacks: no difference.
    [d_ls0] = measured(lines, label["D_ls0"], "other")
    assert d_ls0["ΔBLEU"] is None and d_ls0["ΔPPL"] is None and d_ls0["within noise"] is None
    assert d_ls0["paper ΔBLEU"] == pytest.approx(-0.5)
    [f_r2] = measured(lines, label["F_r2"])
    assert f_r2["ΔBLEU"] == pytest.approx(30.9 - mean_bleu) and f_r2["ΔPPL"] is None
    assert f_r2["paper ΔBLEU"] is None and f_r2["paper ΔPPL"] is None and f_r2["attention window"] == 2
    assert a_h1["attention window"] is None
    # Base lines: their own difference from the mean (the seed spread); the paper's base: 0.
    base = measured(lines, "base")
    assert [line["ΔBLEU"] for line in base] == pytest.approx([b - mean_bleu for b in BASE_BLEU])
    assert all(line["paper ΔBLEU"] == 0 and line["within noise"] == "yes" for line in base)
    # A row without runs: the paper's difference only.
    [big] = [line for line in lines if line["row"] == label["big"]]
    assert big["run"] is None and big["ΔBLEU"] is None and big["paper ΔBLEU"] == pytest.approx(0.6)


def test_the_band_is_the_base_seeds_spread_around_their_mean() -> None:
    spreads = base_spread(runs())
    assert set(spreads) == {"multi30k", "paper"}
    spread = spreads["multi30k"]
    mean = sum(BASE_BLEU) / 3
    assert (spread.runs, spread.seeds, spread.bleu_mean) == (3, [1, 2, 3], pytest.approx(mean))
    assert spread.bleu_band == pytest.approx((30.0 - mean, 32.5 - mean))
    assert spread.bleu_sd == pytest.approx((sum((b - mean) ** 2 for b in BASE_BLEU) / 2) ** 0.5)  # ddof=1
    ppl_mean = sum(BASE_PPL) / 3
    assert spread.ppl_band == pytest.approx((4.9 - ppl_mean, 5.2 - ppl_mean))
    assert spread.ppl_sd == pytest.approx((sum((p - ppl_mean) ** 2 for p in BASE_PPL) / 2) ** 0.5)


def test_one_base_run_gives_a_mean_but_no_band(rows: list[Row]) -> None:
    spread = base_spread(runs())["paper"]
    assert (spread.runs, spread.bleu_mean, spread.ppl_mean) == (1, 20.0, 8.0)
    assert spread.bleu_band is spread.ppl_band is spread.bleu_sd is spread.ppl_sd is None
    [a_h1] = measured(build_table(rows, runs()), next(r.label for r in rows if r.row == "A_h1"), None)
    assert a_h1["ΔBLEU"] == pytest.approx(4.0) and a_h1["within noise"] is None


def test_within_noise_is_the_band_widened_to_its_half_width_on_both_sides(rows: list[Row]) -> None:
    band = (-0.1, 0.5)  # half-width 0.3: within is [-0.3, 0.5]
    assert [within_noise(d, band) for d in (-0.3, -0.2, 0.0, 0.5)] == ["yes"] * 4
    assert [within_noise(d, band) for d in (-0.31, 0.51, -1.0)] == ["no"] * 3
    assert within_noise(0.1, None) is None and within_noise(None, band) is None
    lines = build_table(rows, runs())
    label = {row.row: row.label for row in rows}
    assert [line["within noise"] for line in measured(lines, label["A_h1"])] == ["yes"]
    assert [line["within noise"] for line in measured(lines, label["C_N2"])] == ["no", "no"]


def test_restricted_attention_rows_come_after_e_and_before_big_by_radius(rows: list[Row]) -> None:
    def row(name: str) -> Row:
        return Row(table="table3", row=name, label=name, model={}, paper={}, experiment=f"table3_{name}")

    from aiayn.tables.rows import _paper_order

    names = ["big", "F_r16", "F_r2", "E_learned", "F_r4", "base", "F_r1", "A_h1", "D_new", "F_other", "D_ls02"]
    ordered = [r.row for r in sorted(map(row, names), key=_paper_order)]
    assert ordered == ["base", "A_h1", "D_ls02", "D_new", "E_learned", "F_r1", "F_r2", "F_r4", "F_r16", "F_other",
                       "big"]
    # The real configs: (F) rows, if any, between (E) and big, by radius, each with its window.
    names = [r.row for r in rows]
    f_rows = [r for r in rows if r.row.startswith("F_r")]
    assert names[0] == "base" and names[-1] == "big"
    if f_rows:
        radii = [int(r.row[3:]) for r in f_rows]
        assert radii == sorted(radii) and [r.model["attention_window"] for r in f_rows] == radii
        assert names.index(f_rows[0].row) == names.index("E_learned") + 1
        assert names.index(f_rows[-1].row) == len(names) - 2


@pytest.mark.slow
def test_markdown_csv_and_chart_show_the_differences(rows: list[Row], tmp_path: Path) -> None:
    written = write_table("table3", rows, runs(), tmp_path, header="<!-- rebuilt from test runs -->\n")
    text = written.markdown.read_text()
    lines = text.splitlines()
    assert lines[0] == "<!-- rebuilt from test runs -->" and lines[1].startswith("| row | N | d_model")
    columns = [c.strip() for c in lines[1].strip("|").split("|")]
    for column in ("attention window", "ΔPPL", "paper ΔPPL", "ΔBLEU", "paper ΔBLEU", "within noise"):
        assert column in columns
    mean = statistics.fmean(BASE_BLEU)
    assert "Within noise: ΔBLEU lies in [min(lo, −w), max(hi, w)]" in text
    assert "### Scale `multi30k`" in text and "### Scale `paper`" in text and "### Scale `other`" in text
    assert (f"Noise band: 3 base runs (seeds 1, 2, 3); mean dev BLEU {mean:.2f}, mean dev PPL 5.03. "
            f"BLEU band [{30 - mean:+.2f}, {32.5 - mean:+.2f}], sd {statistics.stdev(BASE_BLEU):.2f}. "
            f"PPL band [-0.13, +0.17], sd 0.15.") in text
    assert "Noise band: 1 base run (seed 1); mean dev BLEU 20, mean dev PPL 8. BLEU band: none" in text
    assert "Noise band: no base run at this scale, so no differences." in text
    c_n2 = statistics.fmean([27.0 - mean, 27.6 - mean])
    assert (f"- (C) N=2: ΔBLEU {c_n2:+.2f} (mean over 2 seeds), paper ΔBLEU -2.10, within noise: no (0 of 2 seeds)"
            in lines)
    assert f"- (A) h=1, d_k=d_v=512: ΔBLEU {30.5 - mean:+.2f} (1 run), paper ΔBLEU -0.90, within noise: yes" in lines
    table_line = next(line for line in lines if line.startswith("| (A) h=1") and f"| {30.5 - mean:+.2f} |" in line)
    assert "| yes |" in table_line

    with open(written.csv) as file:
        table = list(csv.DictReader(file))
    assert len(table) == len(written.lines) and table[0]["row"] == "base"
    for column in ("attention window", "ΔPPL", "paper ΔPPL", "ΔBLEU", "paper ΔBLEU", "within noise"):
        assert column in table[0]
    f_r2 = next(line for line in table if line["run"].endswith("F_r2-multi30k-1"))
    assert f_r2["attention window"] == "2" and float(f_r2["ΔBLEU"]) == pytest.approx(30.9 - mean)

    png = written.chart.read_bytes()
    assert written.chart.name == "table3.png" and len(png) > 1000 and png[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(written.chart).shape
    assert height > width > 100  # three scales, a pair of panels each, one under the other


def test_no_runs_still_writes_the_papers_differences(rows: list[Row], tmp_path: Path) -> None:
    written = write_table("table3", rows, [], tmp_path)
    assert "No runs: no differences." in written.markdown.read_text()
    assert written.chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_axis_turns_symmetric_log_only_where_one_difference_dwarfs_the_band() -> None:
    from aiayn.tables.output import _linear_range

    nan = float("nan")
    # N=8's ΔPPL of +180 beside differences of a few points: log beyond the band's reach (3).
    assert _linear_range((-1.68, 3.0), [-1.3, 2.1, 180.4, nan]) == 3.0
    # Every difference within 10 times the reach: a plain linear axis.
    assert _linear_range((-0.33, 0.22), [0.98, -0.4, 8.9, nan]) is None
    # A band narrower than 1 still keeps ±1 linear; no band at all likewise.
    assert _linear_range((-0.33, 0.22), [15.7, -5.7]) == 1.0
    assert _linear_range(None, [-21.3, 0.5]) == 1.0
    assert _linear_range(None, []) is None


def test_a_changed_run_counted_as_its_row_is_compared_only_with_runs_changed_alike(rows: list[Row],
                                                                                   tmp_path: Path) -> None:
    """--include-modified: base at another width_divisor (and a row trained so too) beside base's
    own seeds at one scale. Its scale says what it changed, and it is compared with the runs changed
    alike, not pooled into the row's band (before: "4 base runs (seeds 1, 2, 3, 4)", one of half the
    width, and (C) N=2's difference from that mixed mean, each line's scale `multi30k`)."""
    halved = ["width_divisor: 1 → 2"]
    base = [make_run("base", bleu, ppl, seed) for seed, (bleu, ppl) in enumerate(zip(BASE_BLEU, BASE_PPL), 1)]
    changed = [make_run("base", 12.0, 20.0, seed=4), make_run("C_N2", 15.0, 14.0, seed=4)]
    for run in changed:
        run.modified = halved
    written = write_table("table3", rows, [*base, *changed], tmp_path)
    text = written.markdown.read_text()
    assert "Noise band: 3 base runs (seeds 1, 2, 3);" in text
    assert "### Scale `multi30k, changed: width_divisor=2`" in text
    assert "Noise band: 1 base run (seed 4); mean dev BLEU 12, mean dev PPL 20." in text
    label = {row.row: row.label for row in rows}
    [c_n2] = [line for line in written.lines if line["row"] == label["C_N2"] and line["run"] is not None]
    assert c_n2["scale"] == "multi30k, changed: width_divisor=2" and c_n2["ΔBLEU"] == pytest.approx(3.0)
    assert [line["scale"] for line in measured(written.lines, "base")] == ["multi30k"] * 3


def test_each_scale_names_the_rows_it_has_no_run_of(rows: list[Row], tmp_path: Path) -> None:
    """Under each scale's differences, the rows without a run there (before: left out of its list
    without a word; a row run at one scale and not at another looked complete)."""
    text = write_table("table3", rows, runs(), tmp_path).markdown.read_text()
    other = text.split("### Scale `other`", 1)[1].split("###", 1)[0]
    label = {row.row: row.label for row in rows}
    [missing] = [line for line in other.splitlines() if line.startswith("- no run at this scale")]
    assert missing.startswith(f"- no run at this scale ({len(rows) - 1} of {len(rows)} rows): base; {label['A_h1']}; ")
    assert label["D_ls0"] not in missing and missing.endswith(f"; {label['big']}")
    multi30k = text.split("### Scale `multi30k`", 1)[1].split("###", 1)[0]
    [missing] = [line for line in multi30k.splitlines() if line.startswith("- no run at this scale")]
    assert "base" not in missing.split(": ", 1)[1].split("; ") and label["C_N4"] in missing
