"""Stopping early (callbacks.early_stopping, aiayn.training.early_stopping): a real tiny run on
Multi30k stops after the validation that makes ``patience`` without improvement, saves the step it
stopped at, keeps the best validation's model as best.ckpt and tests it, records it, and a resume
trains no more; bad settings are refused up front."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch

from aiayn.checkpoints.io import list_checkpoints
from aiayn.checkpoints.resume import find_resume
from aiayn.errors import ConfigError
from aiayn.training.config_check import check_train_config
from tests.helpers import runs
from tests.helpers.configs import resolved
from tests.helpers.inprocess import run_tool, train
from tests.helpers.runs import TWO_CORES

# Validations at steps 2, 4, 6, 8; checkpoints at 3, 6 (and the last step). A loss that must fall by
# 100 to count as better improves only at the first validation: with patience 1 the run stops at 4.
STOPPING = ["debug=tiny", "logger=csv", "optim.train_steps=8", "trainer.val_check_interval=2",
            "checkpoint.every_n_train_steps=3", "callbacks.early_stopping.patience=1",
            "callbacks.early_stopping.metric=loss", "callbacks.early_stopping.min_delta=100"]
# The whole of the smaller test set (461 sentences), decoded greedily: seconds, as evaluate.py scores it.
WHOLE_TEST = ["trainer.limit_test_batches=1.0", "task.datamodule.test_split=test_2017_mscoco", "decoding.beam_size=1"]


@pytest.mark.slow  # real tiny runs, in this process
def test_a_run_stops_after_patience_validations_without_improvement_and_resumes_to_no_more(
        tmp_path: Path, data_root: Path, subword_cache: Path) -> None:
    run_dir = tmp_path / "run"
    result = train(run_dir, *STOPPING, *WHOLE_TEST, data_root=data_root, cache_dir=subword_cache)
    log = (run_dir / "train.log").read_text()
    assert "stopped early at step 4: val loss has not improved by more than 100 on" in log
    assert "(step 2) in 1 validations; callbacks.early_stopping.patience=1" in log
    checkpoints = run_dir / "checkpoints"
    # The step it stopped at is saved though every_n_train_steps=3 would not save it, and is the last.
    assert sorted(path.name for path in checkpoints.glob("step*.ckpt")) == ["step0000003.ckpt", "step0000004.ckpt"]
    assert os.readlink(checkpoints / "last.ckpt") == "step0000004.ckpt"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["steps"], summary["stopped_early_at"], summary["dev/step"], summary["dev/best_step"]) == (4, 4, 4, 2)
    # The best validation's model (step 2) is kept, without what only a resume needs, and the test scores it.
    best = torch.load(checkpoints / "best.ckpt", map_location="cpu", weights_only=False)
    assert best["global_step"] == 2 and "optimizer_states" not in best and "subwords" in best
    assert (summary["test_weights"], summary["test_averaged"]) == ("best", 1)
    # No step of the run to resume from or average (evaluate.py average_last=k, resume=auto).
    assert [path.name for _, path in list_checkpoints(checkpoints)] == ["step0000003.ckpt", "step0000004.ckpt"]
    assert re.search(rf"^test \S+ \(the best validation's model, step 2: {re.escape(str(checkpoints / 'best.ckpt'))}\): "
                     r"test/loss=", result.stdout, re.MULTILINE)
    # Its perplexity is evaluate.py's of best.ckpt, to rounding, not that of the step it stopped at.
    scored = evaluated(checkpoints / "best.ckpt", tmp_path / "best", data_root, subword_cache)
    assert scored["step"] == 2 and scored["ppl"] == pytest.approx(summary["test/ppl"], rel=1e-4)
    assert evaluated(checkpoints / "step0000004.ckpt", tmp_path / "last", data_root, subword_cache)["ppl"] != (
        pytest.approx(summary["test/ppl"], rel=1e-4))
    with pytest.raises(ConfigError, match=r"best.ckpt holds a model's weights alone, not the optimizer's state"):
        find_resume(str(checkpoints / "best.ckpt"), run_dir, {}, multirun=False)  # resume= names it: refused in one line

    again = train(run_dir, *STOPPING, "resume=auto", data_root=data_root, cache_dir=subword_cache)
    log = (run_dir / "train.log").read_text()
    assert "the run stopped early at step 4 (val loss has not improved by more than 100 on" in log
    assert sorted(path.name for path in checkpoints.glob("step*.ckpt")) == ["step0000003.ckpt", "step0000004.ckpt"]
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 4  # no step trained
    assert re.search(r"^test \S+ \(the best validation's model, step 2: ", again.stdout, re.MULTILINE)  # only the test

    # Resumed with a larger patience, the run goes on: 4 and 6 without improvement, it stops at 6.
    train(run_dir, *STOPPING, "resume=auto", "callbacks.early_stopping.patience=2", data_root=data_root,
          cache_dir=subword_cache)
    assert "with callbacks.early_stopping.patience=2 it goes on" in (run_dir / "train.log").read_text()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["steps"], summary["stopped_early_at"], summary["dev/best_step"]) == (6, 6, 2)

    # Resumed watching another figure, it starts from scratch: ppl improves, by any amount, at 8.
    train(run_dir, *STOPPING, "resume=auto", "callbacks.early_stopping.metric=ppl",
          "callbacks.early_stopping.min_delta=0", data_root=data_root, cache_dir=subword_cache)
    assert "callbacks.early_stopping watched val loss until the checkpoint; it watches val ppl from here" in (
        run_dir / "train.log").read_text()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["steps"], summary["stopped_early_at"], summary["dev/best_step"]) == (8, None, 8)
    assert torch.load(checkpoints / "best.ckpt", map_location="cpu", weights_only=False)["global_step"] == 8


def evaluated(checkpoint: Path, out: Path, data_root: Path, cache_dir: Path) -> dict:
    """src/evaluate.py's report of ``checkpoint`` on WHOLE_TEST's split, as the test after training scores it."""
    run_tool("src/evaluate.py", f"ckpt={checkpoint}", "split=test_2017_mscoco", f"out={out}", "wandb=disabled",
             data_root=data_root, cache_dir=cache_dir)
    (report,) = out.glob("*.json")
    report = json.loads(report.read_text())
    return {**report, "ppl": report["test_2017_mscoco/ppl"]}


@pytest.mark.cli  # ddp_spawn: two training processes, spawned by a process of its own
@pytest.mark.slow
@TWO_CORES
def test_two_ddp_processes_stop_after_the_same_step(tmp_path: Path, data_root: Path, subword_cache: Path) -> None:
    run_dir = tmp_path / "run"
    runs.train(run_dir, *STOPPING, "hardware=cpu2_ddp", data_root=data_root, cache_dir=subword_cache)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["processes"], summary["steps"], summary["stopped_early_at"]) == (2, 4, 4)
    assert summary["test_weights"] == "best"  # rank zero read best.ckpt, both ranks tested it
    assert torch.load(run_dir / "checkpoints" / "best.ckpt", map_location="cpu", weights_only=False)["global_step"] == 2
    assert sorted(path.name for path in (run_dir / "checkpoints").glob("step*.ckpt")) == [
        "step0000003.ckpt", "step0000004.ckpt"]


@pytest.mark.slow  # real tiny runs, in this process
def test_without_patience_the_run_trains_its_steps_as_the_paper_does(tmp_path: Path, data_root: Path,
                                                                        subword_cache: Path) -> None:
    run_dir = tmp_path / "run"
    train(run_dir, *[o for o in STOPPING if "patience" not in o], data_root=data_root, cache_dir=subword_cache)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 8 and "stopped_early_at" not in summary


@pytest.mark.slow  # real tiny runs, in this process
def test_patience_run_out_at_the_last_step_is_no_early_stop(tmp_path: Path, data_root: Path,
                                                             subword_cache: Path) -> None:
    run_dir = tmp_path / "run"
    train(run_dir, *STOPPING, "optim.train_steps=4", data_root=data_root, cache_dir=subword_cache)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["stopped_early_at"] is None
    assert "stopped early" not in (run_dir / "train.log").read_text()


@pytest.mark.parametrize(("overrides", "message"), [
    (["callbacks.early_stopping.patience=0"], r"^callbacks.early_stopping.patience must be a positive whole number"),
    (["callbacks.early_stopping.patience=3", "callbacks.early_stopping.metric=bleu"],
     r"^callbacks.early_stopping.metric must be one of score, loss, ppl \(score: the task's own, bleu or f1\), got 'bleu'"),
    (["callbacks.early_stopping.patience=3", "callbacks.early_stopping.min_delta=-1"],
     r"^callbacks.early_stopping.min_delta must be a number, 0 or more"),
    (["callbacks.early_stopping.patience=3", "validation.bleu_sentences=0"],
     r"^callbacks.early_stopping.metric=score: validation.bleu_sentences=0 scores no sentence at validation"),
])
def test_settings_that_cannot_stop_a_run_are_refused_before_it_starts(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_train_config(resolved(*overrides))
    check_train_config(resolved("callbacks.early_stopping.patience=3", "callbacks.early_stopping.metric=ppl"))
