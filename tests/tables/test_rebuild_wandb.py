"""experiments/tables.py rebuild --wandb: each training run's tests are the evaluate.py runs that
scored it (W&B's public Api stood in for by the few calls rebuild makes: no W&B server here)."""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.helpers.tables import tables_command


def test_table4_from_wandb_keeps_each_evaluate_run_of_a_training_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """`rebuild --wandb`: a Table 4 training run's evaluate.py runs (job type eval, grouped under its
    name) are its tests, each a line with its decoding and checkpoints averaged, beside train's own
    (W&B's Api stood in for by the few calls rebuild makes)."""
    trained = wandb_run("t4", {"experiment": {"table": "table4", "row": "wsj"}, "run_name": "table4-wsj", "seed": 2,
                               "decoding": {"beam_size": 21, "alpha": 0.3, "max_len_offset": 300},
                               "task": {"datamodule": {"test_split": "23"}}},
                        {"test/f1": 90.1, "test_averaged": 5, "steps": 100000})
    of_it = {"trained_wandb_run": "t4"}
    evaluations = [wandb_run("ev2", {"decoding": {"beam_size": 21, "alpha": 0.3, "max_len_offset": 300},
                                     "evaluate": {"average_last": 10}, **of_it}, {"test/f1": 91.0}, "2026-02"),
                   wandb_run("ev1", {"decoding": {"beam_size": 1}, "evaluate": {"average_last": 1}, **of_it},
                             {"test/f1": 80.0}, "2026-01"),
                   # the test split by its sections (split=23), and the dev split (split=22): no test
                   wandb_run("ev3", {"decoding": {"beam_size": 4}, "evaluate": {"average_last": 1}, **of_it},
                             {"23/f1": 92.0}, "2026-04"),
                   wandb_run("dev", {"evaluate": {}, **of_it}, {"val/f1": 89.0, "22/f1": 89.5}, "2026-03")]
    stand_in_wandb(monkeypatch, {"table4": [trained]}, evaluations)
    out = tmp_path / "tables"
    assert tables_command("rebuild", "--wandb", "e/p", "--out", str(out), "--tables", "table4", "--no-wandb") == 0
    assert "table4: 1 runs of 6 lines" in capsys.readouterr().out
    lines = [line for line in csv.DictReader((out / "table4_runs.csv").read_text().splitlines()) if line["run"]]
    assert [(line["tested by"], line["F1 (test)"], line["beam"], line["averaged"]) for line in lines] == [
        ("train.py", "90.1", "21", "5"), ("evaluate.py ev1", "80.0", "1", "1"), ("evaluate.py ev2", "91.0", "21", "10"),
        ("evaluate.py ev3", "92.0", "4", "1")]


def wandb_run(name: str, config: dict, summary: dict, created: str = "", group: str | None = None) -> SimpleNamespace:
    """A W&B run as the public Api gives it, with the few fields rebuild reads (its id: its name)."""
    return SimpleNamespace(id=name, name=name, config=config, summary_metrics=summary, path=["e", "p", name], tags=[],
                           created_at=created, group=group)


def stand_in_wandb(monkeypatch: pytest.MonkeyPatch, trained: dict[str, list], evaluations: list) -> None:
    """W&B's Api stood in for by the few calls rebuild makes: the finished training runs tagged with
    each table, and the evaluate.py runs (job type eval) by their group, the training run's name."""
    import wandb

    class Api:
        def runs(self, project: str, filters: dict) -> list:
            if filters.get("jobType") == "eval":
                return [e for e in evaluations if e.group == filters["group"]]
            [table] = filters["tags"]["$in"]
            return trained.get(table, [])

    for evaluation in evaluations:  # grouped as evaluate.py groups them: under the training run's name
        evaluation.group = next(run.config["run_name"] for runs in trained.values() for run in runs)
    monkeypatch.setattr(wandb, "Api", Api)
    monkeypatch.setenv("WANDB_MODE", "online")


def test_table2_from_wandb_takes_each_seeds_own_evaluation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
        caplog: pytest.LogCaptureFixture) -> None:
    """Two seeds of Table 2's base EN-DE share their run name, and so the W&B group of their
    evaluate.py runs: each seed's BLEU is that of the evaluation of its own checkpoint, found by the
    training run's W&B id the evaluation holds (trained_wandb_run), the test split named by its role
    or by its name (split=newstest2014) (before: both seeds took the newest evaluation of the group,
    and one of split=newstest2014 was no test). An evaluation that does not say which run it scored
    (logged before evaluations recorded it) is left out where several runs share the name, named
    in a warning. An evaluation decoded otherwise (greedy) is no test of the row, as in a run
    folder's eval/ (before: taken from W&B, being the newest and of the most checkpoints)."""
    search = {"beam_size": 4, "alpha": 0.6, "max_len_offset": 50}
    row = {"experiment": {"table": "table2", "row": "base_en_de"}, "run_name": "table2-base_en_de",
           "task": {"datamodule": {"val_split": "newstest2013", "test_split": "newstest2014"}}, "decoding": search,
           "checkpoint": {"average_last": 5}}
    seeds = [wandb_run(f"seed{seed}", {**row, "seed": seed}, {"steps": 100000, "test/tokenized_bleu": 20.0 + seed})
             for seed in (1, 2)]
    evaluations = [
        wandb_run("ev1", {"evaluate": {"average_last": 5}, "decoding": search, "trained_wandb_run": "seed1"},
                  {"test/tokenized_bleu": 27.1, "test/bleu": 26.5}, "2026-01"),
        # newer, of more checkpoints, but greedy: no test of the row, whose config decodes with beam 4
        wandb_run("greedy", {"evaluate": {"average_last": 8}, "decoding": {**search, "beam_size": 1},
                             "trained_wandb_run": "seed1"}, {"test/tokenized_bleu": 25.0, "test/bleu": 24.0}, "2026-05"),
        # newer, of the recipe's 5, but in bf16: not the row's fp32 model (before: taken, being the newest)
        wandb_run("bf16", {"evaluate": {"average_last": 5, "precision": "bf16"}, "decoding": search,
                           "trained_wandb_run": "seed1"}, {"test/tokenized_bleu": 27.0, "test/bleu": 26.4}, "2026-06"),
        # newer still, of 5 steps, but an ensemble of two (ckpt=a,b: one string in evaluate.ckpt)
        wandb_run("pair", {"evaluate": {"ckpt": "a.ckpt,b.ckpt"}, "ensemble": ["a.ckpt", "b.ckpt"],
                           "averaged_steps": [1, 2, 3, 4, 5], "decoding": search, "trained_wandb_run": "seed1"},
                  {"test/tokenized_bleu": 29.0, "test/bleu": 28.4}, "2026-07"),
        wandb_run("ev2", {"evaluate": {"average_last": 5, "split": "newstest2014"}, "trained_wandb_run": "seed2"},
                  {"newstest2014/tokenized_bleu": 27.6, "newstest2014/bleu": 27.0}, "2026-02"),
        wandb_run("dev2", {"evaluate": {"average_last": 5, "split": "newstest2013"}, "trained_wandb_run": "seed2"},
                  {"newstest2013/tokenized_bleu": 30.0}, "2026-04"),
        wandb_run("old", {"evaluate": {"average_last": 5}}, {"test/tokenized_bleu": 99.0}, "2026-03")]
    stand_in_wandb(monkeypatch, {"table2": seeds}, evaluations)
    out = tmp_path / "tables"
    assert tables_command("rebuild", "--wandb", "e/p", "--out", str(out), "--tables", "table2", "--no-wandb") == 0
    assert "table2: 2 runs of 5 lines" in capsys.readouterr().out
    lines = [line for line in csv.DictReader((out / "table2.csv").read_text().splitlines()) if line["run"]]
    assert [(line["seed"], line["BLEU (test)"], line["sacreBLEU (test)"], line["averaged"]) for line in lines] == [
        ("1", "27.1", "26.5", "5"), ("2", "27.6", "27.0", "5")]
    warnings = [record.getMessage() for record in caplog.records if "do not say which" in record.getMessage()]
    assert warnings and all("the evaluate.py runs old of run name table2-base_en_de" in w for w in warnings)
    assert {record.getMessage() for record in caplog.records if "decoded otherwise" in record.getMessage()} == {
        "e/p/greedy: decoded otherwise than its run (decoding.beam_size=1 (the run's: 4)); left out of the tables"}
    assert "e/p/bf16: decoded with precision=bf16, not the row's model; left out of the tables" in caplog.text
    assert "e/p/pair: an ensemble of 2 checkpoints, not the row's model; left out of the tables" in caplog.text

    # One training run of that name: the evaluation that does not say is its own, as before.
    stand_in_wandb(monkeypatch, {"table2": seeds[:1]}, evaluations)
    assert tables_command("rebuild", "--wandb", "e/p", "--out", str(out), "--tables", "table2", "--no-wandb") == 0
    [line] = [line for line in csv.DictReader((out / "table2.csv").read_text().splitlines()) if line["run"]]
    assert (line["BLEU (test)"], line["averaged"]) == ("99.0", "5")
