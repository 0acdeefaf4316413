"""src/train.py end to end through Hydra, as a user runs it: real Multi30k, real sentencepiece,
real sacreBLEU, real Lightning (one process, and two gloo processes). A run whose results are
tested runs in this process (tests.helpers.inprocess); the two gloo processes, and the W&B run whose
console output is tested as a process prints it, are real processes (marked ``cli``)."""

from __future__ import annotations

import csv
import json
import math
import os
import re
from pathlib import Path

import pytest

from tests.helpers import runs
from tests.helpers.inprocess import train
from tests.helpers.runs import REPO, TINY, TWO_CORES


@pytest.mark.slow
def test_train_validates_with_bleu_and_tests(tmp_path: Path, subword_cache: Path, data_root: Path) -> None:
    run_dir = tmp_path / "run"
    result = train(run_dir, *TINY, "logger=csv", data_root=data_root, cache_dir=subword_cache)

    # The run ends by evaluating the test split and printing its metrics, BLEU among them.
    summary = [line for line in result.stdout.splitlines() if line.startswith("test test_2016_flickr:")]
    assert len(summary) == 1, result.stdout[-2000:]
    for metric in ("test/bleu=", "test/ppl=", "test/loss="):
        assert metric in summary[0]
    assert "sacreBLEU signature: nrefs:1|case:mixed|eff:no|tok:13a" in result.stdout
    assert "Test metric" not in result.stdout  # the line above says it; no table of the same figures besides
    assert "Total FLOPs" not in result.stdout  # nor Lightning's model table: the plan says the model
    assert re.search(r"^  model: small \(n_layers=1, d_model=32, .*\), 37\.0K parameters$", result.stdout, re.MULTILINE)

    with open(next(run_dir.glob("csv/version_*/metrics.csv"))) as metrics:
        rows = list(csv.DictReader(metrics))
    logged = lambda key: [float(row[key]) for row in rows if row.get(key)]
    assert len(logged("train/loss")) >= 1 and len(logged("train/lr")) >= 1
    assert len(logged("train/grad_norm")) >= 1 and len(logged("train/tgt_tokens_per_sec")) >= 1
    assert len(logged("val/bleu")) == 2, "validation at steps 2 and 4, each with BLEU"
    assert all(ppl > 1 for ppl in logged("val/ppl"))
    assert len(logged("test/bleu")) == 1

    # Config, checkpoints and logs all in the run's own directory.
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert len(list((run_dir / "checkpoints").glob("step*.ckpt"))) == 2


@pytest.mark.slow
def test_lightnings_smoke_test_saves_no_checkpoint_and_logs_nothing(tmp_path: Path, subword_cache: Path,
                                                                    data_root: Path) -> None:
    """``trainer.fast_dev_run=2`` trains, validates and tests 2 batches and does what its plan says: "no checkpoint,
    no logger" (before: Lightning's ModelCheckpoint wrote last.ckpt as training ended; an offline W&B run was made,
    and a csv logger's line named a metrics.csv never written)."""
    run_dir = tmp_path / "run"
    result = train(run_dir, *TINY, "trainer.fast_dev_run=2", "logger=[wandb,csv]", data_root=data_root,
                   cache_dir=subword_cache)
    assert "fast_dev_run=2: Lightning's smoke test instead, 2 steps" in result.stdout
    assert "checkpoints:" not in result.stdout  # the plan's line of what a run saves
    assert len([line for line in result.stdout.splitlines() if line.startswith("test test_2016_flickr:")]) == 1
    assert not (run_dir / "checkpoints").exists()
    assert not (run_dir / "wandb").exists() and not (run_dir / "csv").exists()
    assert "W&B run" not in result.stdout + result.stderr and "metrics.csv" not in result.stdout + result.stderr


# A progress line of step N of 4 (debug=tiny: one every step) and of a validation, as a log file has them.
STEP_LINE = re.compile(r"\[aiayn\.training\.progress\]\[INFO\] - step (\d)/4 \| loss (\d+\.\d{3}) \| "
                       r"lr (\d\.\d\de-\d\d) \| ([\d,]+) tok/s \| ETA \d+:\d\d:\d\d$", re.MULTILINE)
VALIDATION_LINE = re.compile(r"\[aiayn\.training\.progress\]\[INFO\] - validation at step (\d) \| "
                             r"loss \d+\.\d{3} \| ppl (\d+\.\d\d) \| bleu \d+\.\d\d \| "
                             r"(\d+\.\d) s, validations (\d+)% of the time so far$", re.MULTILINE)


@pytest.mark.cli  # ddp_spawn: two training processes, spawned by a process of its own
@pytest.mark.slow
@TWO_CORES
def test_train_with_two_gloo_processes(tmp_path: Path, subword_cache: Path, data_root: Path) -> None:
    """Two DDP processes, stdout written to a file (``> log``, as nohup and SLURM write it)."""
    run_dir, cwd = tmp_path / "run", tmp_path / "cwd"
    cwd.mkdir()
    result = runs.train(run_dir, *TINY, "hardware=cpu2_ddp", "logger=[csv,wandb]", data_root=data_root, cwd=cwd,
                        cache_dir=subword_cache, stdout=tmp_path / "stdout.log")
    # The attention pictures logged to W&B by the spawned rank are in the run's W&B folder, nothing in the working
    # folder (before: <working folder>/wandb/offline-run-…/files/media, which wandb sync of the run left out).
    assert len(list(run_dir.glob("wandb/offline-run-*/files/media/images/attention/*.png"))) == 3
    assert list(cwd.iterdir()) == []
    output = result.stdout + result.stderr
    assert "GLOBAL_RANK: 0, MEMBER: 1/2" in output and "GLOBAL_RANK: 1, MEMBER: 2/2" in output
    # The spawned ranks report what the data module kept and dropped, once (rank 0), as one process does.
    assert output.count("kept 29000 of 29000 training pairs") == 1, output[-3000:]
    # Rank 1 prints none of the project's INFO lines: not its share of the batches, not the validations.
    assert "on rank 0 of 2" in output and "on rank 1 of 2" not in output, output[-3000:]
    assert output.count("val sacreBLEU on") == 2
    assert sum(line.startswith("test test_2016_flickr:") for line in result.stdout.splitlines()) == 1
    summary = json.loads((run_dir / "summary.json").read_text())  # counted over both ranks
    assert summary["processes"] == 2 and summary["steps"] == 4 and summary["train_flops"] > 0
    # The test stage, in processes of its own, adds its metrics to the training's file.
    with open(next(run_dir.glob("csv/version_*/metrics.csv"))) as metrics:
        rows = list(csv.DictReader(metrics))
    assert sum(bool(row.get("train/loss")) for row in rows) == 4 and sum(bool(row.get("test/bleu")) for row in rows) == 1
    # The test's row is at the run's last step, as one process logs it (before: step 0, the launching
    # process's count, which never had the spawned ranks' step).
    assert [int(row["step"]) for row in rows if row.get("test/bleu")] == [4]

    # Progress a researcher can read in the file: no bar (no redrawn frames), a plain line a step with
    # step/total, loss, learning rate, tokens a second and ETA, and one a validation, once each (rank
    # 0's), on stdout and in the run's train.log alike.
    assert "\r" not in result.stdout and "Epoch 0" not in result.stdout and "it/s" not in result.stdout
    rates = {int(float(row["step"])) + 1: float(row["train/lr"]) for row in rows if row.get("train/lr")}
    train_log = (run_dir / "train.log").read_text()
    for text in (result.stdout, train_log):
        steps = STEP_LINE.findall(text)
        assert [int(step) for step, *_ in steps] == [1, 2, 3, 4], text[-3000:]
        assert all(float(loss) > 0 and int(tokens.replace(",", "")) > 0 for _, loss, _, tokens in steps)
        # The rate each step trained with, as logged (3 significant digits; the log's is a float32)
        assert all(math.isclose(float(rate), rates[int(step)], rel_tol=0.006) for step, _, rate, _ in steps)
        validations = VALIDATION_LINE.findall(text)
        assert [int(step) for step, *_ in validations] == [2, 4], text[-3000:]
        assert f"{summary['dev/ppl']:.2f}" == validations[-1][1]  # the last validation's, as summary.json has it
        # how long each took, and the share of the run's time validations took so far
        assert all(float(took) >= 0 and 0 <= int(share) <= 100 for *_, took, share in validations)
    # Lightning's own lines reach train.log as well as stdout, once each: the seed, the devices, and
    # the distributed set-up of both ranks (spawned processes, which log as the launching one).
    for text in (result.stdout, train_log):
        assert text.count("Seed set to ") == 1 and text.count("GPU available: False, used: False") == 1, text[-3000:]
        assert "GLOBAL_RANK: 0, MEMBER: 1/2" in text and "GLOBAL_RANK: 1, MEMBER: 2/2" in text, text[-3000:]
    assert "Seed set to" not in result.stderr and "GPU available" not in result.stderr, result.stderr[-3000:]
    # The spawned ranks keep quiet as one process does (before: 17 of Lightning's sync_dist advice).
    assert "sync_dist" not in output and "LeafSpec" not in output, output[-3000:]


TABLE3_ROWS = {  # row: (overrides of model=base, what the built model must have)
    "A h=1": (["model.n_heads=1", "model.d_k=512", "model.d_v=512"], {"n_heads": 1, "d_k": 512, "d_v": 512}),
    "A h=32": (["model.n_heads=32", "model.d_k=16", "model.d_v=16"], {"n_heads": 32, "d_k": 16, "d_v": 16}),
    "B d_k=16": (["model.d_k=16"], {"n_heads": 8, "d_k": 16, "d_v": 64}),
    "C N=2": (["model.n_layers=2"], {"n_layers": 2}),
    "C d_model=256": (["model.d_model=256", "model.d_k=32", "model.d_v=32"], {"d_model": 256, "d_k": 32, "d_v": 32}),
    "C d_ff=4096": (["model.d_ff=4096"], {"d_ff": 4096}),
    "D P_drop=0.2": (["model.dropout=0.2"], {"dropout": 0.2}),
    "D eps_ls=0.2": (["loss.label_smoothing=0.2"], {"label_smoothing": 0.2}),
    "E learned": (["model.positional=learned"], {"positional": "learned"}),
    "big": (["model.d_model=1024", "model.d_ff=4096", "model.n_heads=16", "model.dropout=0.3",
             "optim.train_steps=300000"],
            {"d_model": 1024, "d_ff": 4096, "n_heads": 16, "dropout": 0.3, "train_steps": 300000}),
}


@pytest.mark.parametrize("row", list(TABLE3_ROWS))
def test_every_table3_row_is_an_override_of_base(row: str) -> None:
    """Each Table 3 row, written as overrides of model=base, composes and builds that model."""
    import torch
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from aiayn.config.schemas import network_arguments
    from aiayn.model.positional import LearnedPositionalEmbedding
    from aiayn.training.module import TranslationModule

    overrides, expected = TABLE3_ROWS[row]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=["model=base", *overrides])
    assert cfg.trainer.max_steps == expected.get("train_steps", 100000)
    with torch.device("meta"):  # structure only: nothing is allocated
        module = TranslationModule(model=network_arguments(OmegaConf.to_container(cfg.model, resolve=True), cfg.width_divisor),
                                   vocab_size=37000, optim=OmegaConf.to_container(cfg.optim, resolve=True),
                                   label_smoothing=cfg.loss.label_smoothing, decoding={})
    model = module.model
    layer = model.encoder_layers[0]
    built = {
        "n_layers": len(model.encoder_layers), "d_model": model.d_model, "d_ff": layer.feed_forward.w_1.out_features,
        "n_heads": layer.self_attention.n_heads, "d_k": layer.self_attention.d_k, "d_v": layer.self_attention.d_v,
        "dropout": layer.residual_1.dropout.p, "label_smoothing": module.label_smoothing,
        "positional": "learned" if isinstance(model.src_positions, LearnedPositionalEmbedding) else "sinusoidal",
    }
    base = {"n_layers": 6, "d_model": 512, "d_ff": 2048, "n_heads": 8, "d_k": 64, "d_v": 64, "dropout": 0.1,
            "label_smoothing": 0.1, "positional": "sinusoidal"}
    assert len(model.decoder_layers) == built["n_layers"]
    assert built == {**base, **{k: v for k, v in expected.items() if k in base}}


# A real process: train.py's warning filters, set when it is imported, hold for the whole of a process but
# not in this one, where pytest puts the filters back after the test that first imported it.
@pytest.mark.cli
@pytest.mark.slow
def test_wandb_offline_run_holds_config_and_metrics(tmp_path: Path, subword_cache: Path, data_root: Path) -> None:
    """With no API key, logger=wandb runs offline and the local run file has everything."""
    from tests.helpers.wandb_offline import read_run

    run_dir = tmp_path / "run"
    # No key, no mode: what a fresh machine has (HOME moved so that no ~/.netrc is found). On a terminal.
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}, "HOME": str(tmp_path)}
    result = runs.train(run_dir, *TINY, "logger=wandb", "run_name=wandb-test", env=env, data_root=data_root,
                        cache_dir=subword_cache, stdout=runs.TERMINAL)

    # Quiet, honest output: where the W&B run is and how to upload it, said once by aiayn; no
    # logger advertisements, no "Epoch 0/-2" for a run bounded by steps, the rate readable.
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", result.stdout)  # the terminal's text, without its colours
    output = shown + result.stderr
    offline = next((run_dir / "wandb").glob("offline-run-*"))
    assert f"(offline) in {offline}; upload it with `wandb sync {offline}`" in output
    for noise in ("wandb leet", "💡", "litlogger", "anonymous setting", "/-2", "LeafSpec", "sync_dist", "v_num"):
        assert noise not in output, noise
    assert "Epoch 0 (to step 4)" in output
    rate = re.search(r"train/lr:\s+(\S+)", output)
    assert rate and re.fullmatch(r"\d\.\d\de-\d\d", rate.group(1)), output[-3000:]
    # On a terminal the bar shows the progress; the plain progress lines go to train.log alone.
    assert "aiayn.training.progress" not in output and "validation at step" not in output
    train_log = (run_dir / "train.log").read_text()
    assert len(STEP_LINE.findall(train_log)) == 4 and len(VALIDATION_LINE.findall(train_log)) == 2, train_log
    # the test says what it tests as it starts (debug=tiny cuts it to a fraction of its batches)
    assert re.search(r"testing on test_2016_flickr: 1,000 sentences; trainer.limit_test_batches keeps (\d+) of its "
                     r"(\d+) batches\n", train_log), train_log

    run = read_run(run_dir)
    assert run.name == "wandb-test-debug" and run.project == "aiayn" and run.exit_code == 0  # run_name, the scale
    assert run.group == "" and run.tags == ["task:multi30k_en_de", "model:small", "scale:debug"]  # one run: no sweep
    assert not {"data_root", "src_lang", "max_tokens"} & set(run.config)  # the data module's: task.datamodule.* only
    assert run.config["model"]["d_model"] == 32 and run.config["task"]["name"] == "multi30k_en_de"
    assert run.config["optim"]["betas"] == [0.9, 0.98] and run.config["parameters"] > 0
    losses = [row["train/loss"] for row in run.history if "train/loss" in row]
    assert len(losses) >= 1 and all(loss > 0 for loss in losses)
    assert sum("val/bleu" in row for row in run.history) == 2
    assert "test/bleu" in run.summary


@pytest.mark.slow
@pytest.mark.parametrize("in_background", [True, False])
def test_save_top_k_keeps_the_newest_step_checkpoints(in_background: bool, tmp_path: Path, subword_cache: Path,
                                                      data_root: Path) -> None:
    """checkpoint.save_top_k=2: the two newest step checkpoints stay (Lightning keeps k of them only
    by a monitored value; the step is it), and last.ckpt names the newest: a link to it, not a
    second copy of its bytes written at every save. The same with the saves in the training thread
    and in the background."""
    run_dir = tmp_path / "run"
    train(run_dir, *TINY, "logger=none", "test_after_training=false", "visualize_at_end=false",
          "checkpoint.every_n_train_steps=1", "checkpoint.save_top_k=2", f"checkpoint.in_background={in_background}",
          data_root=data_root, cache_dir=subword_cache)
    names = sorted(path.name for path in (run_dir / "checkpoints").iterdir())
    # each with the digest of its bytes (aiayn.checkpoints.digest); those of the removed ones removed too
    kept = ["step0000003.ckpt", "step0000004.ckpt"]
    assert names == sorted(["last.ckpt", *kept, *(f"{name}.blake2b" for name in kept)]), names
    last = run_dir / "checkpoints" / "last.ckpt"
    assert last.is_symlink() and os.readlink(last) == "step0000004.ckpt"  # relative: the run folder may move
