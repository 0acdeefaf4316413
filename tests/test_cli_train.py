"""src/train.py end to end through Hydra, as a user runs it: real Multi30k, real sentencepiece,
real sacreBLEU, real Lightning (one process, and two gloo processes)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# A model and run small enough for seconds on a CPU; everything else is the default job's config.
TINY = [
    "model.n_layers=1", "model.d_model=32", "model.d_ff=64", "model.n_heads=2", "model.d_k=16", "model.d_v=16",
    "task.vocab_size=500", "task.datamodule.max_tokens=1024", "task.decoding.max_len_offset=5",
    "trainer.max_steps=4", "trainer.val_check_interval=2", "trainer.limit_val_batches=2",
    "trainer.limit_test_batches=2", "trainer.num_sanity_val_steps=0", "checkpoint.every_n_train_steps=2",
    "optim.warmup_steps=2",
]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")  # the subword model is trained once for this module


def train(run_dir: Path, cache_dir: Path, data_root: Path, *overrides: str, env: dict | None = None
          ) -> subprocess.CompletedProcess:
    command = [sys.executable, "src/train.py", *TINY, f"hydra.run.dir={run_dir}", *overrides]
    environment = {**os.environ, "AIAYN_DATA_ROOT": str(data_root), "AIAYN_CACHE_DIR": str(cache_dir),
                   **(env or {})}
    result = subprocess.run(command, cwd=REPO, env=environment, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"train.py failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result


def test_train_validates_with_bleu_and_tests(tmp_path: Path, cache_dir: Path, data_root: Path) -> None:
    run_dir = tmp_path / "run"
    result = train(run_dir, cache_dir, data_root, "logger=csv")

    # The run ends by evaluating the test split and printing its metrics, BLEU among them.
    summary = [line for line in result.stdout.splitlines() if line.startswith("test test_2016_flickr:")]
    assert len(summary) == 1, result.stdout[-2000:]
    for metric in ("test/bleu=", "test/ppl=", "test/loss="):
        assert metric in summary[0]
    assert "sacreBLEU signature: nrefs:1|case:mixed|eff:no|tok:13a" in result.stdout

    rows = list(csv.DictReader(open(next(run_dir.glob("csv/version_*/metrics.csv")))))
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


def test_train_with_two_gloo_processes(tmp_path: Path, cache_dir: Path, data_root: Path) -> None:
    result = train(tmp_path / "run", cache_dir, data_root, "hardware=cpu2_ddp", "logger=csv")
    output = result.stdout + result.stderr
    assert "GLOBAL_RANK: 0, MEMBER: 1/2" in output and "GLOBAL_RANK: 1, MEMBER: 2/2" in output
    assert sum(line.startswith("test test_2016_flickr:") for line in result.stdout.splitlines()) == 1


def test_every_table3_row_is_an_override_of_base() -> None:
    """Table 3's rows change only keys of model=base."""
    from hydra import compose, initialize_config_dir

    rows = {
        "A": ["model.n_heads=1", "model.d_k=512", "model.d_v=512"],
        "B": ["model.d_k=16"],
        "C": ["model.n_layers=2", "model.d_model=256", "model.d_k=32", "model.d_v=32", "model.d_ff=4096"],
        "D": ["model.dropout=0.2", "model.label_smoothing=0.0"],
        "E": ["model.positional=learned"],
        "big": ["model.d_model=1024", "model.d_ff=4096", "model.n_heads=16", "model.dropout=0.3",
                "model.train_steps=300000"],
    }
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        for row, overrides in rows.items():
            cfg = compose("train", overrides=["model=base", *overrides], return_hydra_config=True)
            for override in overrides:
                key, value = override.split("=")
                node = cfg
                for part in key.split("."):
                    node = node[part]
                assert str(node) == value, (row, key)


def test_wandb_offline_run_holds_config_and_metrics(tmp_path: Path, cache_dir: Path, data_root: Path) -> None:
    """With no API key, logger=wandb runs offline and the local run file has everything."""
    from aiayn.training.wandb_offline import read_run

    run_dir = tmp_path / "run"
    env = {"HOME": str(tmp_path), "WANDB_API_KEY": "", "WANDB_MODE": "", "WANDB_SILENT": "true"}
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}, **env}
    train(run_dir, cache_dir, data_root, "logger=wandb", "run_name=wandb-test", env=env)

    run = read_run(run_dir)
    assert run.name == "wandb-test" and run.project == "aiayn" and run.exit_code == 0
    assert run.config["model"]["d_model"] == 32 and run.config["task"]["name"] == "multi30k_en_de"
    assert run.config["optim"]["betas"] == [0.9, 0.98] and run.config["parameters"] > 0
    losses = [row["train/loss"] for row in run.history if "train/loss" in row]
    assert len(losses) >= 1 and all(loss > 0 for loss in losses)
    assert sum("val/bleu" in row for row in run.history) == 2
    assert "test/bleu" in run.summary
