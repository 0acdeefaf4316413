"""``resume=`` of a run that is finished (trained to its ``optim.train_steps`` and tested): nothing is
done again unless the test is asked for otherwise (aiayn.cli.finished_run), on a copy of the
session's tiny run, in this process."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tests.helpers.inprocess import train
from tests.helpers.runs import TrainedRun


def _files(run_dir: Path) -> dict[str, int]:
    return {str(path.relative_to(run_dir)): path.stat().st_mtime_ns for path in run_dir.rglob("*") if path.is_file()}


def test_a_finished_run_resumed_as_it_was_tested_is_not_tested_again(tiny_run: TrainedRun, data_root: Path,
                                                                      tmp_path: Path) -> None:
    """A sweep resumed after a stop meets its finished jobs so: each says it is finished and gives its test's
    figures back (before: tested again, its attention pictures drawn again, a second test logged at its last
    step); asked to test with another decoding, it is tested again."""
    run = tmp_path / "run"
    shutil.copytree(tiny_run.run_dir, run)
    summary = json.loads((run / "summary.json").read_text())
    before = _files(run)
    result = train(tmp_path / "again", *tiny_run.overrides, f"resume={run}", data_root=data_root,
                   cache_dir=tiny_run.cache_dir)
    assert f"{run} is finished: trained to step 4 of 4 and tested on test_2016_flickr; nothing left to do" in (
        result.stderr + result.stdout)
    line = next(line for line in result.stdout.splitlines() if line.startswith("test test_2016_flickr"))
    assert line.startswith("test test_2016_flickr (as tested when the run finished): test/loss=")
    assert f"test/bleu={summary['test/bleu']:.4g}" in line
    assert _files(run) == before  # no file written or touched: summary, pictures, checkpoints
    assert not (tmp_path / "again" / "attention").exists()

    other = train(tmp_path / "other", *tiny_run.overrides, f"resume={run}", "decoding.beam_size=1",
                  data_root=data_root, cache_dir=tiny_run.cache_dir)
    assert "nothing left to do" not in other.stderr + other.stdout
    assert "dirpath has changed" not in other.stderr  # the copied folder's record of its checkpoints is read
    assert any(line.startswith("test test_2016_flickr: test/loss=") for line in other.stdout.splitlines())
    assert json.loads((run / "summary.json").read_text())["finished_at"] != summary["finished_at"]
