"""The run's log (aiayn.training.run_log): rank zero speaks for the job, the progress lines stay off
a terminal, and a process without handlers (one ddp_spawn starts) gets the launching process's.
The real processes are tests/cli/test_train.py's (two gloo ranks, stdout a file; a terminal)."""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import pickle
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightning.fabric.utilities.rank_zero import rank_zero_only

from aiayn.training.run_log import BAR_SHOWS_IT, RunLogFilter, SpawnedRanksLog
from tests.helpers.inprocess import run_tool


@pytest.fixture
def rank() -> Iterator[None]:
    before = rank_zero_only.rank
    yield
    rank_zero_only.rank = before


def _shown(handler_filter: RunLogFilter) -> list[str]:
    """What a handler with ``handler_filter`` writes of one record of each kind."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(handler_filter)
    records = [("aiayn.training.module", logging.INFO, "ours"), ("train", logging.INFO, "the plan"),
               ("aiayn.data", logging.WARNING, "our warning"), ("lightning.fabric", logging.INFO, "lightning's"),
               ("aiayn.training.progress", logging.INFO, "progress")]
    for name, level, message in records:
        record = logging.LogRecord(name, level, __file__, 1, message, None, None)
        if message == "progress":
            setattr(record, BAR_SHOWS_IT, True)
        handler.handle(record)
    return stream.getvalue().splitlines()


def test_ranks_above_zero_print_warnings_but_none_of_the_projects_info(rank, monkeypatch) -> None:
    for name in ("LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    everything = ["ours", "the plan", "our warning", "lightning's", "progress"]
    rank_zero_only.rank = 0
    assert _shown(RunLogFilter(terminal=False)) == everything
    rank_zero_only.rank = 1  # as Lightning's strategy sets it in rank 1
    assert _shown(RunLogFilter(terminal=False)) == ["our warning", "lightning's"]
    # The process that starts node 1's ranks is no rank yet (Lightning says 0), but not the job's first.
    rank_zero_only.rank = 0
    monkeypatch.setenv("NODE_RANK", "1")
    assert _shown(RunLogFilter(terminal=False)) == ["our warning", "lightning's"]


def test_the_progress_lines_stay_off_a_terminal(rank) -> None:
    rank_zero_only.rank = 0
    assert _shown(RunLogFilter(terminal=True)) == ["ours", "the plan", "our warning", "lightning's"]


def test_a_process_without_handlers_gets_the_launching_processs_when_the_callback_is_unpickled(
        tmp_path: Path, rank, capfd: pytest.CaptureFixture) -> None:
    root = logging.getLogger()
    before = root.handlers[:], root.level
    # Hydra's job logging in the launching process: stdout and the run folder's train.log.
    launching = [logging.FileHandler(tmp_path / "train.log"),
                 logging.StreamHandler(os.fdopen(1, "w", closefd=False)), logging.StreamHandler(io.StringIO())]
    for handler in launching:
        handler.setFormatter(logging.Formatter("[%(name)s][%(levelname)s] - %(message)s"))
    try:
        root.handlers, root.level = launching, logging.INFO
        carried = pickle.dumps(SpawnedRanksLog())
        for handler in launching:
            handler.close()
        root.handlers = []  # a new interpreter, as ddp_spawn starts one
        pickle.loads(carried)
        rebuilt = root.handlers[:]
        # the file and stdout; a stream of this process alone (the StringIO) stays behind
        assert [type(handler) for handler in rebuilt] == [logging.FileHandler, logging.StreamHandler]
        rank_zero_only.rank = 0
        logging.getLogger("aiayn.training.progress").info("step 1/4", extra={BAR_SHOWS_IT: True})
        rank_zero_only.rank = 1
        logging.getLogger("aiayn.data.datamodule").info("rank 1's share")
        pickle.loads(carried)  # a process with handlers of its own keeps them
        assert root.handlers == rebuilt
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers, root.level = before
    line = "[aiayn.training.progress][INFO] - step 1/4\n"
    assert (tmp_path / "train.log").read_text() == line
    assert capfd.readouterr().out == line  # stdout is no terminal here: the progress line is printed


@pytest.mark.slow
def test_a_validation_is_logged_at_the_step_it_validated(tmp_path: Path, data_root: Path, subword_cache: Path) -> None:
    """debug=tiny validates after steps 2 and 4: its metrics.csv rows, its progress lines and its
    summary say 2 and 4 (before: the rows said 1 and 3, Lightning's count of the steps before)."""
    run = tmp_path / "run"
    run_tool("src/train.py", "debug=tiny", "logger=csv", "visualize_at_end=false", f"hydra.run.dir={run}",
             data_root=data_root, cache_dir=subword_cache)
    (metrics,) = run.glob("csv/version_*/metrics.csv")
    rows = list(csv.DictReader(metrics.open()))
    assert [int(row["step"]) for row in rows if row["val/loss"]] == [2, 4]
    assert re.findall(r"validation at step (\d+)", (run / "train.log").read_text()) == ["2", "4"]
    assert json.loads((run / "summary.json").read_text())["dev/step"] == 4
    assert [int(row["step"]) for row in rows if row["train/loss"]] == [0, 1, 2, 3]  # each update's loss, as before


@pytest.mark.slow
def test_the_throughput_logged_after_a_validation_leaves_the_validation_out(tmp_path: Path, data_root: Path,
                                                                            subword_cache: Path) -> None:
    """Each step's logged `train/tgt_tokens_per_sec` is the rate its progress line prints (both over
    the step's time alone), the step after a validation too: a long validation (six batches) after
    step 2 (before: its time counted as step 3's, whose logged rate fell to a fraction of the
    progress line's, a dip in the W&B chart at every validation)."""
    run = tmp_path / "run"
    run_tool("src/train.py", "debug=tiny", "logger=csv", "visualize_at_end=false", "test_after_training=false",
             "trainer.limit_val_batches=6", f"hydra.run.dir={run}", data_root=data_root, cache_dir=subword_cache)
    (metrics,) = run.glob("csv/version_*/metrics.csv")
    # A step's row is at the steps before it (0 for the first), its progress line at its own number.
    logged = {int(row["step"]) + 1: float(row["train/tgt_tokens_per_sec"])
              for row in csv.DictReader(metrics.open()) if row["train/tgt_tokens_per_sec"]}
    printed = {int(step): float(rate.replace(",", ""))
               for step, rate in re.findall(r"step (\d+)/4 \|.*\| ([\d,]+) tok/s", (run / "train.log").read_text())}
    assert set(logged) == {2, 3, 4} and set(printed) == {1, 2, 3, 4}  # the first step has no step end before it
    for step, rate in logged.items():
        assert 0.5 < rate / printed[step] < 2, (step, rate, printed[step])
