"""Checkpoint averaging (§6.1): the averaging itself on real torch.save'd files, the choice of the
last k checkpoints, src/average.py end to end (in this process, tests.helpers.inprocess) on
checkpoints of a real tiny training run (the session's `tiny_run`, tests/conftest.py), and §6.1's
window of checkpoints src/train.py writes for it (aiayn.config.checkpointing)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aiayn.checkpoints.averaging import (
    average_checkpoints,
    average_state_dicts,
    last_checkpoints,
)
from aiayn.checkpoints.io import list_checkpoints
from aiayn.errors import DataError
from aiayn.training.preemption import EXIT_STATUS
from tests.helpers.inprocess import run_tool
from tests.helpers.runs import REPO, TINY, TrainedRun, offline_environment, run_command
from tests.helpers.signals import signal_at


def fake_checkpoint(step: int, seed: int = 0) -> dict:
    """A checkpoint shaped like train.py's: float32 and float16 weights, an integer buffer."""
    generator = torch.Generator().manual_seed(seed)
    state_dict = {
        "model.w": torch.randn(3, 4, generator=generator),
        "model.b": torch.randn(4, generator=generator).half(),
        "model.count": torch.tensor([7, 8], dtype=torch.int64),
    }
    return {"state_dict": state_dict, "hyper_parameters": {"vocab_size": 5}, "subwords": b"proto",
            "global_step": step, "epoch": 0}


def test_averaging_copies_of_one_checkpoint_gives_it_exactly(tmp_path: Path) -> None:
    checkpoint = fake_checkpoint(step=100, seed=1)
    paths = []
    for i in range(5):
        paths.append(tmp_path / f"copy{i}.ckpt")
        torch.save(checkpoint, paths[-1])
    averaged = average_checkpoints(paths)
    assert averaged["state_dict"].keys() == checkpoint["state_dict"].keys()
    for key, value in checkpoint["state_dict"].items():
        assert averaged["state_dict"][key].dtype == value.dtype
        assert torch.equal(averaged["state_dict"][key], value), key
    assert averaged["averaged_from"] == [str(path) for path in paths]
    assert averaged["global_step"] == 100 and averaged["subwords"] == b"proto"


def test_average_of_two_state_dicts_is_their_mean() -> None:
    first = {"w": torch.tensor([1.0, 2.0]), "h": torch.tensor([1.0], dtype=torch.bfloat16),
             "n": torch.tensor(3)}
    second = {"w": torch.tensor([3.0, 5.0]), "h": torch.tensor([2.0], dtype=torch.bfloat16),
              "n": torch.tensor(3)}
    mean = average_state_dicts([first, second])
    assert torch.equal(mean["w"], torch.tensor([2.0, 3.5])) and mean["w"].dtype == torch.float32
    assert torch.equal(mean["h"], torch.tensor([1.5], dtype=torch.bfloat16))
    assert torch.equal(mean["n"], torch.tensor(3)) and mean["n"].dtype == torch.int64

    with pytest.raises(ValueError, match="'extra'"):
        average_state_dicts([first, {**second, "extra": torch.zeros(1)}])
    with pytest.raises(ValueError, match="'h'"):
        average_state_dicts([first, {k: v for k, v in second.items() if k != "h"}])
    with pytest.raises(ValueError, match=r"'w' has shape \(3,\)"):
        average_state_dicts([first, {**second, "w": torch.zeros(3)}])
    with pytest.raises(ValueError, match="'n'"):
        average_state_dicts([first, {**second, "n": torch.tensor(4)}])
    with pytest.raises(ValueError):
        average_state_dicts([])


def test_last_checkpoints_in_step_order_over_both_naming_schemes(tmp_path: Path) -> None:
    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    names = {"step0000100.ckpt": 100, "time-step0000150.ckpt": 150, "step0000200.ckpt": 200,
             "time-step0000200.ckpt": 200, "time-step0000250.ckpt": 250,
             "epoch=0-step=300.ckpt": 300}  # a foreign name: its step is read from the file
    for i, (name, step) in enumerate(names.items()):
        torch.save(fake_checkpoint(step), folder / name)
        os.utime(folder / name, (1e9 - i, 1e9 - i))  # modification times say nothing: oldest last
    shutil.copy(folder / "epoch=0-step=300.ckpt", folder / "last.ckpt")
    torch.save({**fake_checkpoint(999), "averaged_from": ["x"]}, folder / "averaged.ckpt")  # no input

    # One file per step: the step checkpoint wins over the time checkpoint of the same step.
    assert [step for step, _ in list_checkpoints(folder)] == [100, 150, 200, 250, 300]
    expected = [folder / "step0000200.ckpt", folder / "time-step0000250.ckpt", folder / "epoch=0-step=300.ckpt"]
    assert last_checkpoints(folder, 3) == expected
    assert last_checkpoints(tmp_path / "run", 3) == expected  # the run dir works as well
    assert last_checkpoints(folder, 1) == [folder / "epoch=0-step=300.ckpt"]
    with pytest.raises(DataError, match="only 5"):
        last_checkpoints(folder, 6)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no checkpoints"):
        last_checkpoints(tmp_path / "empty", 5)


def test_last_checkpoints_ending_at_a_given_one_take_it_and_those_before_it(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for name, step in {"step0000100.ckpt": 100, "time-step0000150.ckpt": 150, "step0000200.ckpt": 200,
                       "time-step0000200.ckpt": 200, "step0000300.ckpt": 300}.items():
        torch.save(fake_checkpoint(step), folder / name)
    shutil.copy(folder / "step0000300.ckpt", folder / "last.ckpt")

    # Not the newest of the folder (300): the one given and the k - 1 before it by step.
    assert last_checkpoints(folder, 2, ending_at=folder / "step0000200.ckpt") == [
        folder / "time-step0000150.ckpt", folder / "step0000200.ckpt"]
    # The file given is used itself, not another of the same step.
    assert last_checkpoints(folder, 2, ending_at=folder / "time-step0000200.ckpt") == [
        folder / "time-step0000150.ckpt", folder / "time-step0000200.ckpt"]
    assert last_checkpoints(folder, 1, ending_at=folder / "step0000100.ckpt") == [folder / "step0000100.ckpt"]
    # last.ckpt: its step is read from the file.
    assert last_checkpoints(folder, 3, ending_at=folder / "last.ckpt") == [
        folder / "time-step0000150.ckpt", folder / "step0000200.ckpt", folder / "last.ckpt"]
    with pytest.raises(DataError, match=r"asked for the 3 checkpoints ending at time-step0000150.ckpt \(step 150\) "
                                        r"but there are only 2 up to it \(steps 100, 150\)"):
        last_checkpoints(folder, 3, ending_at=folder / "time-step0000150.ckpt")
    # average.py's average of 200 and 300 (its step: the newest's): used as it is, never averaged again
    # (before: averaged with step 150 and named as the average of steps 150-300, steps 200 and 300 in it twice).
    averaged = average_checkpoints([folder / "step0000200.ckpt", folder / "step0000300.ckpt"])
    torch.save(averaged, folder / "averaged.ckpt")
    assert last_checkpoints(folder, 1, ending_at=folder / "averaged.ckpt") == [folder / "averaged.ckpt"]
    with pytest.raises(DataError, match=r"averaged.ckpt: an average already \(average.py's, of steps 200, 300\); "
                                        r"averaging it again with the 1 before step 300 would mix"):
        last_checkpoints(folder, 2, ending_at=folder / "averaged.ckpt")


# -- real runs -------------------------------------------------------------------------------
@pytest.fixture
def run_dir(tiny_run: TrainedRun) -> Path:
    """The session's tiny training run (read only): a step checkpoint after every step (tests.helpers.runs.TINY_RUN)."""
    return tiny_run.run_dir


def average_cli(*arguments: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_tool("src/average.py", *arguments, cwd=cwd, check=False, timeout=120)


# 7 steps, a step checkpoint every step, §6.1's last 3 two steps apart: steps 3, 5 and 7, and in the
# window (from step 3) no others; before it, steps 1 and 2. save_top_k=2 keeps the newest 2, but
# never fewer than the window's 3.
WINDOW = [*TINY, "logger=none", "visualize_at_end=false", "test_after_training=false", "optim.train_steps=7",
          "checkpoint.every_n_train_steps=1", "checkpoint.save_top_k=2", "checkpoint.average_last=3",
          "checkpoint.average_every_n_steps=2"]


def _steps_saved(run_dir: Path) -> list[int]:
    return sorted(int(p.name[4:11]) for p in (run_dir / "checkpoints").glob("step*.ckpt"))


@pytest.mark.cli
def test_the_window_saved_through_a_preemption_is_what_the_test_averages(
        tmp_path: Path, data_root: Path, subword_cache: Path) -> None:
    """Stopped by SIGTERM during step 4, the run saves step 4 to resume from. Resumed, it saves
    steps 5 and 7, and step 4 goes with step 5's save: the newest 3 are the window again. Then
    train.py's own test scores their average, what the paper's Table 2 reports: its perplexity is
    evaluate.py's on average.py's average of the three, to rounding."""
    run_dir = tmp_path / "run"
    # the whole of the smaller test set (461 sentences), decoded greedily: seconds
    tested = ["test_after_training=true", "trainer.limit_test_batches=1.0", "task.datamodule.test_split=test_2017_mscoco",
              "decoding.beam_size=1"]
    command = [sys.executable, "src/train.py", *WINDOW, *tested, f"hydra.run.dir={run_dir}"]
    env = {**offline_environment(), "PYTHONPATH": str(REPO)}
    stopped = run_command([*command, *signal_at(4, "SIGTERM")], env=env, data_root=data_root,
                          cache_dir=subword_cache, check=False)
    assert stopped.returncode == EXIT_STATUS, stopped.stderr[-3000:]
    assert _steps_saved(run_dir) == [1, 2, 3, 4]
    resumed = run_command([*command, "resume=auto"], env=env, data_root=data_root, cache_dir=subword_cache)
    assert _steps_saved(run_dir) == [3, 5, 7]
    assert not list((run_dir / "checkpoints").glob("step0000004*")), "its digest went with it"
    assert "§6.1's last 3, every 2 steps from step 3, to average" in (run_dir / "train.log").read_text()

    assert "test test_2017_mscoco (§6.1: the average of the last 3 checkpoints, steps 3–7): " in resumed.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["test_averaged"] == 3  # where Table 2 reads it (aiayn.tables.runs)
    out = tmp_path / "averaged.ckpt"
    result = average_cli(f"ckpt={run_dir}", f"out={out}", cwd=tmp_path)  # the run's own 3 (before: 5, a default)
    assert result.returncode == 0 and "averaged 3 checkpoints (the run's checkpoint.average_last)" in result.stdout, \
        result.stdout + result.stderr
    averaged = torch.load(out, map_location="cpu", weights_only=False)
    assert [Path(p).name for p in averaged["averaged_from"]] == [f"step{s:07d}.ckpt" for s in (3, 5, 7)]
    run_tool("src/evaluate.py", f"ckpt={out}", "split=test_2017_mscoco", "wandb=disabled",
             f"out={tmp_path / 'eval'}", cwd=tmp_path, data_root=data_root, cache_dir=subword_cache)
    report = json.loads(next((tmp_path / "eval").glob("*.json")).read_text())
    assert summary["test/ppl"] == pytest.approx(report["test_2017_mscoco/ppl"], rel=1e-4)


def test_average_cli_writes_the_mean_of_the_last_step_checkpoints(run_dir: Path, tmp_path: Path) -> None:
    from aiayn.checkpoints.trained import load_trained

    work = tmp_path / "cwd"
    work.mkdir()
    out = work / "averaged.ckpt"
    result = average_cli(f"ckpt={run_dir}", "average_last=3", f"out={out}", cwd=work)
    assert result.returncode == 0, result.stdout + result.stderr
    # nothing else (no Hydra folder, no log file) but the digest of its bytes (aiayn.checkpoints.digest)
    assert sorted(os.listdir(work)) == ["averaged.ckpt", "averaged.ckpt.blake2b"]
    assert [line.split(":")[0].strip() for line in result.stdout.splitlines() if "step " in line][:3] == [
        "step 2", "step 3", "step 4"]

    inputs = [torch.load(run_dir / "checkpoints" / f"step{s:07d}.ckpt", map_location="cpu", weights_only=False)
              for s in (2, 3, 4)]
    averaged = torch.load(out, map_location="cpu", weights_only=False)
    assert averaged["global_step"] == 4
    assert [Path(p).name for p in averaged["averaged_from"]] == [f"step{s:07d}.ckpt" for s in (2, 3, 4)]
    trained = load_trained(out)
    assert trained.step == 4
    loaded = trained.model.state_dict()
    changed = 0
    for key, value in averaged["state_dict"].items():
        mean = sum(c["state_dict"][key].double() for c in inputs) / 3
        torch.testing.assert_close(value, mean.to(value.dtype), rtol=1e-6, atol=1e-7)
        assert torch.equal(loaded[key.removeprefix("model.")], value), key
        changed += not torch.equal(value, inputs[-1]["state_dict"][key])
    assert changed > 0, "the weights moved between steps 2 and 4, so their mean is not the last one"


def test_average_cli_errors_are_one_line(tmp_path: Path, run_dir: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    dangling, tensor = tmp_path / "last.ckpt", tmp_path / "tensor.ckpt"
    dangling.symlink_to(tmp_path / "gone.ckpt")
    torch.save(torch.zeros(3), tensor)
    for arguments, expected in [((f"ckpt={empty}", "average_last=5"), str(empty)),
                                ((f"ckpt={run_dir}", "average_last=5"), "only 4"),
                                # a run that set no §6.1 window (the small model's null): before, 5 were taken
                                ((f"ckpt={run_dir}",), ("give average_last=<k>, how many checkpoints to average: "
                                 f"{run_dir / 'checkpoints' / 'step0000004.ckpt'}'s run sets none")),
                                ((f"ckpt={tmp_path / 'missing'}",), "no such directory; give a run folder"),
                                # before: "no such directory" for a checkpoint file that is not there, a link's too
                                ((f"ckpt={tmp_path / 'gone.ckpt'}",),
                                 f"{tmp_path / 'gone.ckpt'}: checkpoint not found"),
                                ((f"ckpt={dangling}",), f"(a link to {tmp_path / 'gone.ckpt'}, which is not there)"),
                                # before: torch's RuntimeError traceback from `key in tensor`
                                ((f"ckpt={tensor}",),
                                 "(it holds an object of type Tensor, not a checkpoint's dictionary)")]:
        result = average_cli(*arguments, f"out={tmp_path / 'out.ckpt'}", cwd=tmp_path)
        assert result.returncode == 2, result.stdout + result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0] and "Traceback" not in result.stderr, result.stderr
    assert not (tmp_path / "out.ckpt").exists()
