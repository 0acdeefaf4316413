"""experiments/tables.py rebuild over real tiny runs (one --multirun of a Table 3 and a Table 2 row,
trained once for the module): which run folders it counts, how many test sentences Table 2 says a
run scored, which tables it writes into --out, what it says of the W&B run it logs to, and --out
refused in one line."""

from __future__ import annotations

import csv
import json
import logging
import os
import shutil
from pathlib import Path

import pytest

from tests.helpers.inprocess import run_tool
from tests.helpers.runs import REPO, TINY_ROW
from tests.helpers.tables import tables_command

REPEATED = "runs of the same row, seed and scale"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory, data_root: Path, subword_cache: Path) -> Path:
    """Table 3's base and Table 2's base EN-DE at Multi30k scale, cut to seconds (TINY_ROW: so both
    are `modified`), tested after training on one batch of the test split; logged as CSV."""
    folder = tmp_path_factory.mktemp("table-runs") / "multirun"
    run_tool("src/train.py", "--multirun", "experiment=table3_base,table2_base_en_de", "+scale=multi30k", *TINY_ROW,
             "trainer.val_check_interval=2", "visualize_at_end=false", "logger=csv", f"hydra.sweep.dir={folder}",
             data_root=data_root, cache_dir=subword_cache)
    return folder


def job(sweep: Path, table: str) -> Path:
    return next(sweep.glob(f"*_{table}-base*"))


@pytest.mark.slow
def test_each_run_folder_is_counted_once_however_the_runs_folders_overlap(
        sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture) -> None:
    """--runs X --runs X/<run> --runs X: the run once (before: three times, and base's noise band of
    its three copies had no width: "3 base runs (seeds 1234, 1234, 1234)")."""
    base = job(sweep, "table3")
    assert tables_command("rebuild", "--runs", str(sweep), "--runs", str(base), "--runs", f"{sweep}/../multirun",
                          "--out", str(tmp_path / "once"), "--tables", "table3", "--no-wandb",
                          "--include-modified") == 0
    assert "table3: 1 runs of" in capsys.readouterr().out
    assert "Noise band: 1 base run (seed 1234)" in (tmp_path / "once" / "table3.md").read_text()
    assert not [record for record in caplog.records if REPEATED in record.getMessage()]

    # A copy of the folder is another run of the same row, seed and scale: counted, and named in one warning.
    copy = tmp_path / "copy" / base.name
    shutil.copytree(base, copy)
    caplog.clear()
    assert tables_command("rebuild", "--runs", str(sweep), "--runs", str(copy.parent), "--out",
                          str(tmp_path / "twice"), "--tables", "table3", "--no-wandb", "--include-modified") == 0
    assert "table3: 2 runs of" in capsys.readouterr().out
    [warning] = [record.getMessage() for record in caplog.records if REPEATED in record.getMessage()]
    assert "table3 base seed 1234 at scale multi30k, changed: " in warning and f": {base}, {copy}" in warning


@pytest.mark.slow
def test_a_runs_test_says_how_many_sentences_it_scored(sweep: Path, tmp_path: Path) -> None:
    """One batch of the test split (trainer.limit_test_batches=1): summary.json and Table 2 say how
    many sentences (before: nothing told it from a test of the whole split)."""
    summary = json.loads((job(sweep, "table2") / "summary.json").read_text())
    assert 0 < summary["test/sentences"] < 1000  # Multi30k's test_2016_flickr has 1,000
    out = tmp_path / "tables"
    assert tables_command("rebuild", "--runs", str(sweep), "--out", str(out), "--tables", "table2", "--no-wandb",
                          "--include-modified") == 0
    [line] = [line for line in csv.DictReader((out / "table2.csv").read_text().splitlines()) if line["run"]]
    assert int(line["test sentences"]) == summary["test/sentences"]
    assert "| test sentences |" in (out / "table2.md").read_text()


@pytest.mark.slow
def test_a_table_without_runs_is_left_as_it_is_unless_named(sweep: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture) -> None:
    """Table 2, then Table 3 rebuilt into one --out: each keeps its own (before: the second rebuild
    wrote Table 2 over with the paper's figures alone). --tables naming a table writes it."""
    out = tmp_path / "tables"
    rebuild = ("rebuild", "--out", str(out), "--no-wandb", "--include-modified")
    assert tables_command(*rebuild, "--runs", str(job(sweep, "table2"))) == 0
    said = capsys.readouterr().out
    assert "table2: 1 runs of 4 lines" in said and f"table3: no runs found, {out / 'table3.md'}" in said
    assert not (out / "table3.md").exists()
    table2 = {name: (out / name).read_bytes() for name in ("table2.md", "table2.csv", "table2.png")}

    assert tables_command(*rebuild, "--runs", str(job(sweep, "table3"))) == 0
    said = capsys.readouterr().out
    assert "table3: 1 runs of" in said and "table2: no runs found" in said
    assert {name: (out / name).read_bytes() for name in table2} == table2

    assert tables_command(*rebuild, "--runs", str(job(sweep, "table3")), "--tables", "table2", "table3") == 0
    assert "table2: 0 runs of 4 lines" in capsys.readouterr().out


@pytest.mark.slow  # a config composed for each row of the table
def test_a_table_named_with_no_runs_yet_is_the_papers_figures_alone(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture) -> None:
    """`rebuild --tables table4` (or 2, or 3: one path) before any run has finished: the table is
    written with the paper's figures and an empty column of ours, its line saying how to train its
    runs, exit 0, as a named table without runs is written beside another table's runs (before: `no
    finished table runs`, exit 2, nothing written). Without --tables there is nothing to write: one
    line, exit 2, saying what to give."""
    (tmp_path / "runs").mkdir()
    out = tmp_path / "tables"
    assert tables_command("rebuild", "--runs", str(tmp_path / "runs"), "--out", str(out), "--no-wandb",
                          "--tables", "table4") == 0
    assert capsys.readouterr().out == (
        f"table4: 0 runs of 3 lines -> {out / 'table4_runs.md'}, table4_runs.csv, table4_runs.png: the paper's figures "
        f"alone, no run of it in {tmp_path / 'runs'}; its runs: python src/train.py --multirun "
        "'experiment=glob(table4_*)' (experiments/README.md), then rebuild with --runs <their folder>\n")
    lines = list(csv.DictReader((out / "table4_runs.csv").read_text().splitlines()))
    assert [line["paper F1"] for line in lines][:2] == ["91.3", "92.7"] and len(lines) == 3
    assert not any(line["F1 (test)"] or line["run"] for line in lines)

    assert tables_command("rebuild", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "none"),
                          "--no-wandb") == 2
    said = capsys.readouterr()
    assert said.err == (f"tables.py: no finished table runs in {tmp_path / 'runs'}; give the folders of the runs, or "
                        "name the tables to write with the paper's figures alone (--tables table3 table2 table4)\n")
    assert not (tmp_path / "none").exists()


def test_an_out_that_is_a_file_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Before: FileExistsError's traceback, exit 1, after the runs were read."""
    (tmp_path / "runs").mkdir()
    taken = tmp_path / "table.md"
    taken.write_text("mine\n")
    for out, why in ((taken, "a file of that name is there"), (taken / "sub", f"{taken}, above it, is a file")):
        assert tables_command("rebuild", "--runs", str(tmp_path / "runs"), "--out", str(out), "--no-wandb") == 2
        said = capsys.readouterr()
        assert said.err == f"tables.py: --out {out}: {why}; give --out a folder (new or existing)\n" and not said.out
    assert taken.read_text() == "mine\n"


@pytest.mark.slow
def test_the_wandb_line_names_the_offline_run_folder_and_how_to_upload_it(
        sweep: Path, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """As train says it (before: the run's files/ subfolder, which `wandb sync` does not take)."""
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, no API key: offline
    for key in [k for k in os.environ if k.startswith("WANDB_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "tables"
    assert tables_command("rebuild", "--runs", str(job(sweep, "table3")), "--out", str(out),
                          "--include-modified") == 0
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("tables logged to W&B: ")]
    [folder] = (out / "wandb").glob("offline-run-*")
    assert line.endswith(f" (offline) in {folder}; upload it with `wandb sync {folder}`"), line


@pytest.mark.slow
def test_a_run_continued_by_a_later_sweep_is_counted_through_that_sweep(
        sweep: Path, tmp_path: Path, data_root: Path, subword_cache: Path, capsys: pytest.CaptureFixture,
        caplog: pytest.LogCaptureFixture) -> None:
    """The same sweep again with resume=auto (after a kill, say) continues each job in the earlier
    sweep's folder; its own job folders keep their config and log. Rebuilt from the later sweep,
    the table has the run, and the folders are not said to be unfinished runs (before: "no summary
    (unfinished run?); left out", and "no finished table runs"), also once the results are moved."""
    runs = tmp_path / "results"
    shutil.copytree(sweep, runs / "first")
    run_tool("src/train.py", "--multirun", "experiment=table3_base", "+scale=multi30k", *TINY_ROW,
             "trainer.val_check_interval=2", "visualize_at_end=false", "logger=csv",
             "resume=auto", f"hydra.sweep.dir={runs / 'again'}", data_root=data_root, cache_dir=subword_cache)
    continued = runs / "first" / job(sweep, "table3").name
    assert not (runs / "again" / continued.name / "summary.json").exists()  # it trained in the first sweep's folder
    moved = tmp_path / "moved"
    for results in (runs, moved):
        if results == moved:
            runs.rename(moved)
        caplog.clear()
        assert tables_command("rebuild", "--runs", str(results / "again"), "--out", str(tmp_path / "tables"),
                              "--tables", "table3", "--no-wandb", "--include-modified") == 0
        assert "table3: 1 runs of" in capsys.readouterr().out
        [line] = [line for line in csv.DictReader((tmp_path / "tables" / "table3.csv").read_text().splitlines())
                  if line["run"]]
        assert line["run"] == str(results / "first" / continued.name)
        assert not [record for record in caplog.records if record.levelno >= logging.WARNING]
    # Moved apart from the run it continued: said, naming where it looked; the table has no run.
    shutil.rmtree(moved / "first")
    assert tables_command("rebuild", "--runs", str(moved / "again"), "--out", str(tmp_path / "tables"),
                          "--tables", "table3", "--no-wandb", "--include-modified") == 0
    assert f"no run of it in {moved / 'again'}" in capsys.readouterr().out
    [warning] = [record.getMessage() for record in caplog.records if "continued the run in" in record.getMessage()]
    assert f"continued the run in {moved / 'first' / continued.name}, which is not there" in warning


@pytest.mark.slow
def test_a_table2_run_without_its_test_is_said_to_have_no_bleu(sweep: Path, tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """A Table 2 run stopped during its test after training: its summary.json (written as training
    ends) holds no test figures. Its line has no BLEU, and a warning names the run and how to test it
    (before: the empty BLEU alone)."""
    stopped = tmp_path / "runs" / job(sweep, "table2").name
    shutil.copytree(job(sweep, "table2"), stopped)
    summary = json.loads((stopped / "summary.json").read_text())
    (stopped / "summary.json").write_text(json.dumps({k: v for k, v in summary.items() if not k.startswith("test")}))
    out = tmp_path / "tables"
    assert tables_command("rebuild", "--runs", str(stopped.parent), "--out", str(out), "--tables", "table2",
                          "--no-wandb", "--include-modified") == 0
    [line] = [line for line in csv.DictReader((out / "table2.csv").read_text().splitlines()) if line["run"]]
    assert line["BLEU (test)"] == "" and line["run"] == str(stopped)
    [warning] = [record.getMessage() for record in caplog.records if "no test BLEU" in record.getMessage()]
    assert warning.startswith(f"{stopped}: no test BLEU") and "resume=auto" in warning


def test_a_run_of_a_row_this_checkout_has_not_is_named_and_left_out(
        tmp_path: Path, capsys: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture) -> None:
    """A run of a row renamed since, or of a row config made in another checkout (table3_C_N16): one
    warning naming it, the rest rebuilt (before: Hydra's MissingConfigException traceback, exit 1;
    from W&B, or without Hydra's record, the run dropped without a word)."""
    run = tmp_path / "runs" / "0_table3-C_N16"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("experiment: {table: table3, row: C_N16}\nseed: 1\n")
    (run / ".hydra" / "hydra.yaml").write_text("hydra: {runtime: {choices: {experiment: table3_C_N16}}}\n")
    (run / "summary.json").write_text(json.dumps({"dev/ppl": 5.0, "dev/bleu": 25.0, "steps": 100000}))
    assert tables_command("rebuild", "--runs", str(run.parent), "--out", str(tmp_path / "tables"), "--no-wandb") == 2
    [warning] = [record.getMessage() for record in caplog.records if "C_N16" in record.getMessage()]
    assert warning.startswith(f"{run}: its row, C_N16 of table3, has no config in ") and "left out" in warning
    assert "no finished table runs" in capsys.readouterr().err

    from aiayn.tables.build import build_table
    from aiayn.tables.rows import table_rows
    from aiayn.tables.runs import local_runs

    (run / ".hydra" / "hydra.yaml").unlink()  # no record of the row's config: the run is read, not its changes
    [found] = local_runs([run.parent], REPO / "conf")
    caplog.clear()
    lines = build_table(table_rows(REPO / "conf", "table3"), [found])
    assert not [line for line in lines if line["run"] is not None]
    [warning] = [record.getMessage() for record in caplog.records]
    assert warning == f"runs of row C_N16, not a row of table3 here (no config of it in conf/experiment/), left out: {run}"
