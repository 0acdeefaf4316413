"""experiments/tables.py rebuild of Table 4 (§6.3) from its runs' folders: a line per test of each
run, train.py's own and each evaluate.py report, beside the paper's F1."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.helpers.tables import tables_command


def _parsing_run(folder: Path, row: str, summary: dict, reports: dict[str, dict]) -> Path:
    """A finished Table 4 run as train.py and evaluate.py leave it: its config (without Hydra's
    record of the row's config, so its changes from the row are not looked for), summary and
    evaluate.py's reports in eval/."""
    run = folder / f"table4-{row}"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text(
        f"experiment: {{table: table4, row: {row}}}\nseed: 1\ntask: {{name: wsj, datamodule: {{test_split: '23'}}}}\n"
        "decoding: {beam_size: 21, alpha: 0.3, max_len_offset: 300, constrained: true}\n")
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "eval").mkdir()
    for name, report in reports.items():
        (run / "eval" / name).write_text(json.dumps(report))
    return run


def test_table4_is_rebuilt_from_its_runs_beside_the_papers_f1(
        tmp_path: Path, capsys: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture) -> None:
    """`rebuild --runs` of Table 4's runs: a line per test of each run (train.py's own, evaluate.py's
    reports with their decoding and checkpoints averaged) beside the paper's 91.3 (WSJ only) and 92.7
    (semi-supervised), into table4_runs.* so that the measured page table4.md in --out stays; a run
    with no test F1 keeps a line, named in a warning saying how to test it (before: every Table 4 run
    left out, "no finished table runs in ...", exit 2)."""
    runs = tmp_path / "runs"
    _parsing_run(runs, "wsj", {"steps": 100000, "test/f1": 90.5, "test/precision": 91.0, "test/recall": 90.0,
                               "test/exact_match": 40.0, "test/sentences": 2416, "test_averaged": 5},
                 {"23.step94000-100000.beam21.alpha0.3.len+300.constrained.avg5.json": {
                     "split": "23", "sentences": 2416, "test/f1": 90.75, "test/precision": 91.5, "test/recall": 90.0,
                     "test/exact_match": 41.0, "averaged": ["a", "b", "c", "d", "e"],
                     "decoding": {"beam_size": 4, "alpha": 0.6, "max_len_offset": 50, "constrained": False}}})
    untested = _parsing_run(runs, "semi", {"steps": 100000}, {})
    out = tmp_path / "tables"
    out.mkdir()
    (out / "table4.md").write_text("measured by hand\n")
    assert tables_command("rebuild", "--runs", str(runs), "--out", str(out), "--no-wandb") == 0
    printed = capsys.readouterr().out
    assert "table4: 2 runs of 4 lines -> " in printed, printed
    assert (out / "table4.md").read_text() == "measured by hand\n"
    lines = list(csv.DictReader((out / "table4_runs.csv").read_text().splitlines()))
    by_test = {(line["row"], line["tested by"].split(" ")[0]): line for line in lines}
    trained = by_test[("Transformer (4 layers), WSJ only", "train.py")]
    assert (trained["paper F1"], trained["F1 (test)"], trained["averaged"], trained["beam"], trained["α"],
            trained["max length"], trained["split"]) == ("91.3", "90.5", "5", "21", "0.3", "input + 300", "23")
    evaluated = by_test[("Transformer (4 layers), WSJ only", "evaluate.py")]
    assert (evaluated["F1 (test)"], evaluated["averaged"], evaluated["beam"], evaluated["α"], evaluated["max length"],
            evaluated["constrained"], evaluated["test sentences"]) == ("90.75", "5", "4", "0.6", "input + 50", "False",
                                                                       "2416")
    semi = by_test[("Transformer (4 layers), semi-supervised", "")]
    assert (semi["paper F1"], semi["F1 (test)"], semi["run"]) == ("92.7", "", str(untested))
    assert by_test[("Transformer (N=2, d_model 256), 10% sample, CPU", "")]["run"] == ""
    [warning] = [record.getMessage() for record in caplog.records if "no test F1" in record.getMessage()]
    assert warning.startswith(f"{untested}: no test F1") and (
        f"`python src/evaluate.py ckpt={untested}/checkpoints/last.ckpt split=test average_last=5`" in warning)
    assert "| Transformer (4 layers), WSJ only | 91.3 | 90.5 |" in (out / "table4_runs.md").read_text()
    assert "scale" not in lines[0] and trained["changed from its row"] == ""  # the sample's row is no `paper` scale


def test_table4_counts_an_evaluation_of_the_test_split_named_by_its_sections(tmp_path: Path) -> None:
    """`evaluate.py ... split=23`, section 23 by its number (as the paper names it), writes its
    figures as 23/f1: the run's test all the same, a line of the table, while split=22 (dev) is no
    test (before: left out without a word, as the F1 was not under test/f1)."""
    figures = {"f1": 91.25, "precision": 91.5, "recall": 91.0, "exact_match": 40.0}
    run = _parsing_run(tmp_path / "runs", "wsj", {"steps": 100000}, {
        "23.step100000.beam21.alpha0.3.len+300.constrained.json": {
            "split": "23", "sentences": 2416, "decoding": {"beam_size": 21}, **{f"23/{k}": v for k, v in figures.items()}},
        "22.step100000.beam21.alpha0.3.len+300.constrained.json": {
            "split": "22", "sentences": 1700, "decoding": {"beam_size": 21}, **{f"22/{k}": v for k, v in figures.items()}}})
    out = tmp_path / "tables"
    assert tables_command("rebuild", "--runs", str(run.parent), "--out", str(out), "--no-wandb") == 0
    [line] = [line for line in csv.DictReader((out / "table4_runs.csv").read_text().splitlines()) if line["run"]]
    assert (line["F1 (test)"], line["P"], line["split"], line["test sentences"], line["tested by"]) == (
        "91.25", "91.5", "23", "2416", "evaluate.py 23.step100000.beam21.alpha0.3.len+300.constrained.json")
