"""A run that ``trainer.max_time`` stops before its last step says so (aiayn.training.time_limit):
the step, the setting and what to do; its resume with the same limit trains nothing more and says
so again; a run that finishes within its limit says nothing of it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from aiayn.checkpoints.io import list_checkpoints
from tests.helpers.inprocess import train

# Far more steps than one second holds: the limit ends the run, whatever the machine's speed.
CUT_SHORT = ["debug=tiny", "logger=csv", "optim.train_steps=100000", "trainer.max_time=00:00:00:01",
             "test_after_training=false"]
LINE = re.compile(r"training stopped at step ([\d,]+) of 100,000: trainer\.max_time=00:00:00:01 ran out \(\S+ of "
                  r"training and validation, counted over every attempt of this run\); to train on, the same command "
                  r"with resume=auto and a longer trainer\.max_time")


@pytest.mark.slow  # real tiny runs, in this process
def test_a_run_cut_short_by_max_time_says_at_which_step_and_its_resume_trains_no_more(
        tmp_path: Path, data_root: Path, subword_cache: Path) -> None:
    run_dir = tmp_path / "run"
    result = train(run_dir, *CUT_SHORT, data_root=data_root, cache_dir=subword_cache)
    said = LINE.findall((run_dir / "train.log").read_text())
    assert len(said) == 1, result.stderr[-3000:]
    step = int(said[0].replace(",", ""))
    assert LINE.search(result.stdout)  # on the terminal too
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == step and 0 < step < 100000
    assert list_checkpoints(run_dir / "checkpoints")[-1][0] == step  # the step it stopped at is saved

    train(run_dir, *CUT_SHORT, "resume=auto", data_root=data_root, cache_dir=subword_cache)
    said = LINE.findall((run_dir / "train.log").read_text())
    assert [int(found.replace(",", "")) for found in said] == [step, step]  # said again, nothing trained
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == step


@pytest.mark.slow
def test_a_run_that_finishes_within_its_time_limit_says_nothing_of_it(
        tmp_path: Path, data_root: Path, subword_cache: Path) -> None:
    run_dir = tmp_path / "run"
    result = train(run_dir, "debug=tiny", "logger=csv", "trainer.max_time=00:01:00:00", "test_after_training=false",
                   data_root=data_root, cache_dir=subword_cache)
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 4
    assert "(or trainer.max_time=00:01:00:00, whichever comes first)" in result.stdout  # the plan's line
    assert "ran out" not in (run_dir / "train.log").read_text() + result.stdout + result.stderr
