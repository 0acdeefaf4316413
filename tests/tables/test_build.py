"""Tables rebuilt from real runs: a tiny multirun of two Table 3 rows through src/train.py (real
Multi30k, sentencepiece, Lightning, W&B offline), then experiments/tables.py rebuild over its
directory: markdown, CSV, PNG and a W&B Table, each row beside the paper's figures. The tools run
in this process (tests.helpers.inprocess)."""

from __future__ import annotations

import csv
import json
import logging
import os
import subprocess
from pathlib import Path

import pytest

from aiayn.config.schemas import network_arguments
from aiayn.reporting.flops import Shapes
from aiayn.tables.rows import table_rows
from tests.helpers.inprocess import run_tool
from tests.helpers.runs import REPO, TINY_ROW
from tests.helpers.tables import tables_command
from tests.helpers.wandb_offline import read_run

# Small enough for seconds on a CPU. The rows keep what they vary (here N and ε_ls); the width is cut.
TINY = [*TINY_ROW, "trainer.val_check_interval=2", "visualize_at_end=false"]


def offline_env(home: Path, data_root: Path, cache_dir: Path) -> dict[str, str]:
    """No W&B key and no ~/.netrc: what a fresh machine has, so W&B runs offline."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    return {**env, "HOME": str(home), "WANDB_SILENT": "true", "AIAYN_DATA_ROOT": str(data_root),
            "AIAYN_CACHE_DIR": str(cache_dir)}


def multirun(sweep_dir: Path, env: dict[str, str], *overrides: str) -> subprocess.CompletedProcess:
    return run_tool("src/train.py", "--multirun", *overrides, *TINY, f"hydra.sweep.dir={sweep_dir}", env=env,
                    timeout=900)


@pytest.mark.slow
def test_tables_rebuilt_from_real_tiny_runs(tmp_path: Path, data_root: Path, subword_cache: Path,
                                            monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    env = offline_env(tmp_path, data_root, subword_cache)
    sweep = tmp_path / "multirun"
    # Dev-only, as Table 3 is (no test split after training), and at half width, as the CPU-sized
    # table runs at a quarter.
    result = multirun(sweep, env, "experiment=table3_C_N2,table3_D_ls0", "+scale=multi30k", "logger=wandb",
                      "test_after_training=false", "width_divisor=2")
    assert "test test_2016_flickr" not in result.stdout

    # Every job is a W&B run of its own: group = the sweep, name = the row, its scale and the job's
    # overrides, tags = the row's, the scale and `modified` (TINY cuts the row's network); the
    # summary holds what the tables need; the config each setting once.
    read = [read_run(d) for d in sorted(sweep.glob("*_table3-*"))]
    runs = {f"table3-{run.config['experiment']['row']}": run for run in read}
    assert set(runs) == {"table3-C_N2", "table3-D_ls0"}
    for name, run in runs.items():
        row = name.removeprefix("table3-")
        assert run.name.startswith(f"{name}-multi30k-") and "width_divisor=2" in run.name
        assert run.group == (sweep / "group.txt").read_text().strip() and run.exit_code == 0
        assert {row, "table3", "scale:multi30k", "model.d_model=32", "modified"} <= set(run.tags)
        assert not {"data_root", "src_lang", "max_tokens"} & set(run.config)  # only under task.datamodule
        assert run.config["experiment"]["row"] == row and run.config["model"]["n_layers"] == (2 if row == "C_N2" else 6)
        summary = run.summary
        last_validation = [h for h in run.history if "val/ppl" in h][-1]
        assert summary["dev/ppl"] == pytest.approx(last_validation["val/ppl"])
        assert summary["dev/bleu"] == pytest.approx(last_validation["val/bleu"])
        assert summary["dev/tokenized_bleu"] == pytest.approx(last_validation["val/tokenized_bleu"])
        assert summary["dev/chrf"] == pytest.approx(last_validation["val/chrf"])  # every figure the scorer gives
        assert "dev/train_flops" not in summary  # (the running total, the summary's train_flops)
        assert summary["steps"] == 2 and summary["parameters"] == run.config["parameters"]
        assert not any(key.startswith("test/") for key in summary)
        assert summary["tokens_seen"] > 0 and summary["src_tokens_seen"] > 0 and summary["training_time_s"] > 0
        # Counted FLOPs: at least the per-position work of every target token (padding only adds).
        trained = network_arguments(run.config["model"], run.config["width_divisor"])
        shapes = Shapes.from_config(trained, run.config["task"]["vocab_size"])
        assert (shapes.d_model, shapes.d_k) == (16, 8)  # TINY's widths halved
        d, n = shapes.d_model, shapes.n_layers
        per_position = 2 * d * shapes.n_heads * (3 * shapes.d_k + 2 * shapes.d_v) + 2 * shapes.n_heads * shapes.d_v * d
        floor = 3 * (n * (per_position + 4 * d * shapes.d_ff) + 2 * d * shapes.vocab_size)
        assert summary["train_flops"] >= floor * summary["tokens_seen"]
        assert summary["flops_per_token"] == pytest.approx(summary["train_flops"] / summary["tokens_seen"])
        assert summary["train_flops_paper_estimate"] == pytest.approx(summary["training_time_s"] * 9.5e12)

    monkeypatch.setenv("HOME", str(tmp_path))
    for key in [k for k in os.environ if k.startswith("WANDB_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "tables"
    # Changed from their rows, the runs are not the rows: left out unless --include-modified.
    # Named, the table is written with the paper's figures alone, its line saying what was left out.
    assert tables_command("rebuild", "--runs", str(sweep), "--out", str(tmp_path / "none"), "--tables", "table3",
                          "--no-wandb") == 0
    assert f"no run of it in {sweep} (2 changed from their rows, left out: --include-modified counts them)" in (
        capsys.readouterr().out)
    assert tables_command("rebuild", "--runs", str(sweep), "--out", str(out), "--tables", "table3",
                          "--include-modified") == 0
    rows = len(table_rows(REPO / "conf", "table3"))  # base, (A)…(F), big
    assert f"table3: 2 runs of {rows} lines" in capsys.readouterr().out

    # CSV: every row of the table, the two measured beside the paper's figures.
    lines = list(csv.DictReader((out / "table3.csv").read_text().splitlines()))
    assert len(lines) == rows and lines[0]["row"] == "base" and lines[-1]["row"] == "big"
    measured = {line["row"]: line for line in lines if line["run"]}
    assert set(measured) == {"(C) N=2", "(D) eps_ls=0.0"}
    for label, name, paper in (("(C) N=2", "table3-C_N2", ("6.11", "23.7", "36")),
                               ("(D) eps_ls=0.0", "table3-D_ls0", ("4.67", "25.3", ""))):
        line, summary = measured[label], runs[name].summary
        assert float(line["PPL (dev)"]) == pytest.approx(summary["dev/ppl"])
        # Table 3's BLEU is the paper's, tokenized, as Table 2's (before: sacreBLEU beside the paper's)
        assert float(line["BLEU (dev)"]) == pytest.approx(summary["dev/tokenized_bleu"])
        assert float(line["sacreBLEU (dev)"]) == pytest.approx(summary["dev/bleu"])
        assert float(line["params ×10^6"]) == pytest.approx(summary["parameters"] / 1e6)
        assert float(line["train FLOPs"]) == pytest.approx(summary["train_flops"])
        assert (line["paper PPL"], line["paper BLEU"], line["paper params ×10^6"]) == paper
        # No base run among them: no difference of their own, and no noise band; the paper's differences.
        assert (line["ΔPPL"], line["ΔBLEU"], line["within noise"], line["attention window"]) == ("", "", "", "")
        assert float(line["paper ΔPPL"]) == pytest.approx(float(paper[0]) - 4.92)
        assert (line["task"], line["seed"], line["steps"]) == ("multi30k_en_de", "1234", "2")
        # Counted by --include-modified: its scale says what it changed from its row (TINY's widths).
        assert line["scale"].startswith("multi30k, changed: ") and "model.d_model=32" in line["scale"]
        # The widths trained: TINY's divided by width_divisor=2.
        assert (line["d_model"], line["d_ff"], line["d_k"], line["d_v"], line["h"]) == ("16", "32", "8", "8", "2")
    unmeasured = next(line for line in lines if line["row"] == "big")
    assert unmeasured["PPL (dev)"] == "" and unmeasured["paper PPL"] == "4.33" and unmeasured["paper BLEU"] == "26.4"

    # Markdown: a header naming the source, the column names, a line per row, then the differences.
    markdown = (out / "table3.md").read_text().splitlines()
    assert str(sweep) in markdown[0] and markdown[1].startswith("| row | N | d_model")
    assert len([line for line in markdown if line.startswith("| (")]) == rows - 2  # (A)…(F); base and big besides
    assert "Noise band: no base run at this scale, so no differences." in markdown
    assert f"{runs['table3-C_N2'].summary['dev/ppl']:.2f}" in next(line for line in markdown if "(C) N=2" in line)

    # PNG chart.
    assert (out / "table3.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # W&B: the table as a wandb.Table (and the chart) in an offline run of job type "tables".
    import wandb

    wandb.teardown()  # the run file is whole once wandb's service has closed it (see wandb_offline)
    logged = read_run(out)
    assert logged.config == {} or "table3" not in logged.config
    entry = next(h["table3"] for h in logged.history if "table3" in h)
    assert entry["_type"] == "table-file" and entry["nrows"] == rows
    table = json.loads(next((out / "wandb").glob(f"offline-run-*/files/{entry['path']}")).read_text())
    row_column = table["columns"].index("row")
    assert [line[row_column] for line in table["data"]][:2] == ["base", "(A) h=1, d_k=d_v=512"]


@pytest.mark.slow
def test_table2_rebuilt_from_an_averaged_evaluation(tmp_path: Path, data_root: Path, subword_cache: Path,
                                                    capsys: pytest.CaptureFixture) -> None:
    """A Table 2 row at Multi30k scale, logged as CSV (no W&B: summary.json is read), evaluated
    with checkpoint averaging by src/evaluate.py; the rebuilt Table 2 takes its test BLEU."""
    env = offline_env(tmp_path, data_root, subword_cache)
    sweep = tmp_path / "multirun"
    # Greedy, for time: the evaluation decodes as its run does, else the table would leave it out.
    multirun(sweep, env, "experiment=table2_base_en_de", "+scale=multi30k", "logger=csv", "decoding.beam_size=1")
    run_dir = next(sweep.glob("0_table2-base_en_de"))
    run_tool("src/evaluate.py", f"ckpt={run_dir}/checkpoints/last.ckpt", "average_last=2", "split=test",
             "wandb=offline", "decoding.beam_size=1", env=env, timeout=900)
    report = json.loads(next((run_dir / "eval").glob("*.avg2.json")).read_text())
    # Its W&B run is tagged `modified` as the training run is (TINY cuts the row's network), so the
    # tables' W&B reports leave the evaluation out with the run.
    evaluation = read_run(run_dir / "eval")
    assert evaluation.job_type == "eval" and evaluation.group == "table2-base_en_de", evaluation
    assert evaluation.tags == ["modified"]

    out = tmp_path / "tables"
    assert tables_command("rebuild", "--runs", str(sweep), "--out", str(out), "--tables", "table2", "--no-wandb",
                          "--include-modified") == 0  # TINY cuts the row's network
    lines = list(csv.DictReader((out / "table2.csv").read_text().splitlines()))
    assert [line["row"] for line in lines] == ["Transformer (base model) EN-DE", "Transformer (big) EN-DE",
                                               "Transformer (base model) EN-FR", "Transformer (big) EN-FR"]
    line = lines[0]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert float(line["BLEU (test)"]) == pytest.approx(report["test/tokenized_bleu"])
    assert float(line["sacreBLEU (test)"]) == pytest.approx(report["test/bleu"])
    assert (line["averaged"], line["recipe averages"], line["paper BLEU"]) == ("2", "5", "27.3")
    assert float(line["train FLOPs"]) == pytest.approx(summary["train_flops"])
    assert float(line["paper FLOPs"]) == 3.3e18
    assert lines[3]["paper BLEU"] == "41.8" and lines[3]["P_drop"] == "0.1" and lines[3]["run"] == ""
    assert (out / "table2.png").read_bytes()[:4] == b"\x89PNG"


def test_table2_takes_the_test_of_the_recipes_average_from_evaluate_or_train(tmp_path: Path,
                                                                              caplog: pytest.LogCaptureFixture) -> None:
    """A Table 2 row's test is §6.1's: of the average of its recipe's ``checkpoint.average_last``
    checkpoints, train.py's own (summary.json: test/*, test_averaged) or the newest evaluate.py
    report in <run>/eval/ that averaged as many, decoded as the run says, of its fp32 model alone
    (before: the report averaging most won, so `evaluate.py ckpt=last.ckpt split=test`, one
    checkpoint, replaced the 5-checkpoint average, and so did a bf16, int8 or ensemble report)."""
    from aiayn.tables.runs import local_runs

    run = tmp_path / "0_table2-base_en_de"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("experiment: {table: table2, row: base_en_de}\nseed: 1\n"
                                                "checkpoint: {average_last: 5}\n"
                                                "decoding: {beam_size: 4, alpha: 0.6, max_len_offset: 50}\n")
    (run / "summary.json").write_text(json.dumps({"steps": 100000, "test/tokenized_bleu": 27.1, "test/bleu": 26.5,
                                                 "test_averaged": 5}))
    [found] = local_runs([tmp_path])
    assert found.test == {"bleu": 27.1, "sacrebleu": 26.5, "averaged": 5}
    (run / "eval").mkdir()

    def report(name: str, bleu: float, averaged: int, when: int, **more) -> None:
        path = run / "eval" / f"test.step100000.{name}.json"
        path.write_text(json.dumps({"test/tokenized_bleu": bleu, "test/bleu": round(bleu - 0.6, 1),
                                    "averaged": [f"step{s}.ckpt" for s in range(averaged)], **more}))
        os.utime(path, (when, when))

    report("last", 26.0, 0, 1)  # evaluate.py ckpt=last.ckpt: one checkpoint, no average
    report("avg11", 27.9, 11, 2)
    report("greedy", 29.0, 5, 3, decoding={"beam_size": 1, "alpha": 0.6, "max_len_offset": 50, "kv_cache": False})
    report("bf16", 28.1, 5, 4, speed_switches={"precision": "bf16", "int8": False})
    report("ensemble", 28.3, 5, 5, ensemble=["a.ckpt", "b.ckpt"])
    (run / "eval" / "test.step100000.cut.json").write_text('{"test/tokenized_bleu": 2')  # a report cut short
    with caplog.at_level(logging.WARNING):
        [found] = local_runs([tmp_path])
    assert found.test == {"bleu": 27.1, "sacrebleu": 26.5, "averaged": 5}, "train.py's own test of the average"
    said = caplog.text  # the cut report named and left out (before: json's JSONDecodeError, the rebuild's end)
    assert f"{run / 'eval' / 'test.step100000.cut.json'}: not a report src/evaluate.py wrote (" in said
    assert "decoded otherwise than its run (decoding.beam_size=1" in said
    assert "decoded with precision=bf16, not the row's model" in said
    assert "an ensemble of 2 checkpoints, not the row's model" in said
    report("avg5", 27.4, 5, 6, speed_switches={"precision": "fp32", "int8": False, "onednn": True})
    [found] = local_runs([tmp_path])
    assert found.test == {"bleu": 27.4, "sacrebleu": 26.8, "averaged": 5}, "the newest report of the average"
    # average.py's file of the 5 given alone averaged its steps (before: counted as one checkpoint)
    report("file", 27.6, 1, 7, averaged_steps=[96000, 97000, 98000, 99000, 100000])
    [found] = local_runs([tmp_path])
    assert found.test == {"bleu": 27.6, "sacrebleu": 27.0, "averaged": 5}
    (run / "eval" / "test.step100000.file.json").unlink()
    # Without a test of the recipe's average (no test after training), the most averaged, said in a warning.
    (run / "summary.json").write_text(json.dumps({"steps": 100000}))
    (run / "eval" / "test.step100000.avg5.json").unlink()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="aiayn.tables.runs"):
        [found] = local_runs([tmp_path])
    assert found.test == {"bleu": 27.9, "sacrebleu": 27.3, "averaged": 11}
    assert "no test of §6.1's average of its recipe's 5 checkpoints; its row shows the test of 11" in caplog.text


def test_table2_takes_an_evaluation_of_the_test_split_named_by_its_name(tmp_path: Path) -> None:
    """`evaluate.py ... split=newstest2014` writes its figures as newstest2014/*: the task's test
    split all the same, so the run's Table 2 BLEU, as split=test's (before: left out without a word,
    the line keeping train's own test); an evaluation of the dev split, newstest2013, is no test."""
    from aiayn.tables.runs import local_runs

    run = _table2_run(tmp_path, "", sentences=210)
    for split, bleu, sacrebleu in (("newstest2014", 27.4, 26.8), ("newstest2013", 30.0, 29.5)):
        (run / "eval" / f"{split}.step94000-100000.beam4.alpha0.6.len+50.avg5.json").write_text(json.dumps(
            {"split": split, "sentences": 3003, f"{split}/tokenized_bleu": bleu, f"{split}/bleu": sacrebleu,
             "averaged": [f"step{s}.ckpt" for s in range(5)]}))
    [found] = local_runs([tmp_path])
    assert found.test == {"bleu": 27.4, "sacrebleu": 26.8, "averaged": 5, "sentences": 3003}


def test_table2_takes_no_evaluation_of_another_task_as_the_rows_test(tmp_path: Path) -> None:
    """`evaluate.py ckpt=<a WMT run> task=parallel_text … split=test` scores one's own corpus's test
    split: no test of the run's row, whatever its figures are named (before: Table 2's EN-DE BLEU was
    that corpus's, its 1,000 sentences in place of newstest2014's 3,003). Its own task's evaluation counts."""
    from aiayn.tables.runs import local_runs

    run = _table2_run(tmp_path, "name: wmt_en_de, ", sentences=3003)
    for task, bleu, sentences in (("parallel_text_en_de", 35.0, 1000), ("wmt_en_de", 27.4, 3003)):
        (run / "eval" / f"test.{task}.avg5.json").write_text(json.dumps(
            {"task": task, "split": "test", "sentences": sentences, "test/tokenized_bleu": bleu, "test/bleu": bleu - 1,
             "averaged": [f"step{s}.ckpt" for s in range(5)]}))
    [found] = local_runs([tmp_path])
    assert found.test == {"bleu": 27.4, "sacrebleu": 26.4, "averaged": 5, "sentences": 3003}
    (run / "eval" / "test.wmt_en_de.avg5.json").unlink()
    [found] = local_runs([tmp_path])
    assert found.test == {"bleu": 27.1, "sacrebleu": 26.5, "averaged": 5, "sentences": 3003}  # train.py's own


def _table2_run(root: Path, task: str, sentences: int) -> Path:
    """A finished Table 2 EN-DE run folder (``task``: what its config's task says before its
    splits), train.py's own test of 5 averaged checkpoints in its summary, and an empty eval/."""
    run = root / "0_table2-base_en_de"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("experiment: {table: table2, row: base_en_de}\nseed: 1\ntask: {"
                                                f"{task}datamodule: {{val_split: newstest2013, test_split: newstest2014}}}}\n")
    (run / "summary.json").write_text(json.dumps({"steps": 100000, "test/tokenized_bleu": 27.1, "test/bleu": 26.5,
                                                 "test_averaged": 5, "test/sentences": sentences}))
    (run / "eval").mkdir()
    return run
