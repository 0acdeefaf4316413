"""The step checkpoints a run keeps (aiayn.training.saving.StepCheckpoint) are those an
uninterrupted run of the same command keeps at the same step, whatever earlier attempts left: a
preempted attempt's step, the last step of a shorter run that is extended, the one resumed from.
What is kept and when: aiayn.config.checkpointing.kept_before (tests/config/test_checkpointing.py)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from aiayn.training.preemption import EXIT_STATUS
from aiayn.training.saving import StepCheckpoint
from tests.helpers.inprocess import train
from tests.helpers.runs import TINY
from tests.helpers.signals import signal_at

# A checkpoint every 2 steps, the newest 2 kept, no §6.1 window (debug=tiny's small model).
RUN = [*TINY, "logger=none", "test_after_training=false", "visualize_at_end=false", "trainer.enable_progress_bar=false",
       "checkpoint.every_n_train_steps=2", "checkpoint.save_top_k=2"]


def _steps(run_dir: Path) -> list[int]:
    """The steps of the run's step checkpoints, each checked to have its digest beside it and no
    digest to be left of one removed."""
    folder = run_dir / "checkpoints"
    steps = sorted(int(path.name[4:11]) for path in folder.glob("step*.ckpt"))
    digests = sorted(int(path.name[4:11]) for path in folder.glob("step*.ckpt.blake2b"))
    assert digests == steps, (steps, digests)
    return steps


def _newest(run_dir: Path) -> str:
    return (run_dir / "checkpoints" / "last.ckpt").resolve().name


@pytest.mark.cli
def test_a_preempted_step_goes_once_the_resumed_run_no_longer_keeps_it(tmp_path: Path, data_root: Path,
                                                                      subword_cache: Path) -> None:
    """Stopped during step 3, the run saves step 3 to resume from, beside step 2. Resumed, step 4's
    save makes step 3 a stray (an uninterrupted run never saves it): it goes, and the run ends with
    the uninterrupted run's newest 2, steps 4 and 6 (before: step 3 stayed for good)."""
    run_dir = tmp_path / "run"
    stopped = train(run_dir, *RUN, "optim.train_steps=6", *signal_at(3, "SIGTERM"), data_root=data_root,
                    cache_dir=subword_cache, check=False)
    assert stopped.returncode == EXIT_STATUS, stopped.stderr[-3000:]
    assert _steps(run_dir) == [2, 3] and _newest(run_dir) == "step0000003.ckpt"
    train(run_dir, *RUN, "optim.train_steps=6", "resume=auto", data_root=data_root, cache_dir=subword_cache)
    assert _steps(run_dir) == [4, 6] and _newest(run_dir) == "step0000006.ckpt"


@pytest.mark.cli
def test_an_extended_run_keeps_what_the_longer_run_keeps(tmp_path: Path, data_root: Path, subword_cache: Path) -> None:
    """A finished 5-step run keeps steps 4 and 5 (its last step, saved as every run's is). Extended
    to 8 steps, it keeps what an 8-step run keeps, steps 6 and 8: step 5, which an 8-step run never
    saves and which the extension resumed from, goes with step 6's save, step 4 with step 8's
    (before: step 5 stayed, as the checkpoint resumed from, beside steps 6 and 8)."""
    run_dir = tmp_path / "run"
    train(run_dir, *RUN, "optim.train_steps=5", data_root=data_root, cache_dir=subword_cache)
    assert _steps(run_dir) == [4, 5]
    train(run_dir, *RUN, "optim.train_steps=8", "resume=auto", data_root=data_root, cache_dir=subword_cache)
    assert _steps(run_dir) == [6, 8] and _newest(run_dir) == "step0000008.ckpt"


@pytest.mark.slow
def test_the_step_resumed_from_is_not_saved_again_half_way_through_the_next(tmp_path: Path, data_root: Path,
                                                                            subword_cache: Path) -> None:
    """Resumed with 2 accumulated batches a step, the run saved the step it resumed from again after
    the first batch of the next (Lightning's record of the step saved last starts at 0): a whole
    checkpoint written over with half a step, which a second stop would resume. It stays as saved."""
    run_dir = tmp_path / "run"
    accumulating = [*RUN, "trainer.accumulate_grad_batches=2"]
    train(run_dir, *accumulating, "optim.train_steps=4", data_root=data_root, cache_dir=subword_cache)
    step4 = run_dir / "checkpoints" / "step0000004.ckpt"
    saved = step4.read_bytes()
    resumed = train(run_dir, *accumulating, "optim.train_steps=6", "resume=auto", data_root=data_root,
                    cache_dir=subword_cache)
    assert "exists and is not empty" not in resumed.stderr  # Lightning's warning: the folder is the run's own
    assert _steps(run_dir) == [4, 6]
    assert step4.read_bytes() == saved, "the step resumed from was written again"


def test_a_moved_run_folder_keeps_the_record_of_its_checkpoints(tmp_path: Path) -> None:
    """A run folder copied elsewhere (from a cluster's scratch) and resumed there: the checkpoint's
    record of the files it saved is read in the new folder, without Lightning's warning that it is
    not reloaded; a file not in the new folder is forgotten."""
    old, new = tmp_path / "scratch" / "checkpoints", tmp_path / "home" / "checkpoints"
    new.mkdir(parents=True)
    for name in ("step0000002.ckpt", "step0000004.ckpt"):
        (new / name).write_bytes(b"")
    state = {"monitor": "step", "best_model_score": torch.tensor(4), "best_model_path": str(old / "step0000004.ckpt"),
             "current_score": torch.tensor(4), "dirpath": str(old),
             "best_k_models": {str(old / "step0000002.ckpt"): torch.tensor(2), str(old / "step0000004.ckpt"): torch.tensor(4),
                               str(old / "step0000006.ckpt"): torch.tensor(6)},
             "kth_best_model_path": str(old / "step0000002.ckpt"), "kth_value": torch.tensor(2),
             "last_model_path": str(old / "last.ckpt")}
    callback = StepCheckpoint(dirpath=new, monitor="step", mode="max", save_top_k=2, save_last="link")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        callback.load_state_dict(state)
    assert callback.dirpath == str(new)
    assert callback.best_model_path == str(new / "step0000004.ckpt") and callback.best_model_score == 4
    assert sorted(callback.best_k_models) == [str(new / "step0000002.ckpt"), str(new / "step0000004.ckpt")]
    assert callback.kth_best_model_path == str(new / "step0000002.ckpt") and callback.kth_value == 2
    assert callback.last_model_path == ""  # no last.ckpt in the new folder
