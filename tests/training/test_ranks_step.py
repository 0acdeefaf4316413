"""ddp_spawn's launching process knows the step its ranks trained to (aiayn.training.ranks_step):
the test, whose ranks start from that process's trainer, logs its row at the run's last step, as
one process does, and a run that trained and then failed its test is never taken for one that
never started (its checkpoints stay). A fresh run's test row: tests/cli/test_train.py
``test_train_with_two_gloo_processes``; the rule that keeps a folder with this attempt's
checkpoints: tests/cli/test_run_folder.py."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.datafiles import multi30k_copy
from tests.helpers.runs import REPO, TINY, TWO_CORES, popen, run_command

SPAWNED = [*TINY, "hardware=cpu2_ddp", "logger=csv", "visualize_at_end=false", "trainer.enable_progress_bar=false"]


def _test_rows(run_dir: Path) -> list[dict[str, str]]:
    """The test's rows of every attempt's metrics.csv."""
    return [row for metrics in sorted(run_dir.glob("csv/version_*/metrics.csv"))
            for row in csv.DictReader(metrics.open()) if row.get("test/loss")]


@pytest.mark.cli  # ddp_spawn: two training processes, spawned by a process of its own
@pytest.mark.slow
@TWO_CORES
def test_a_run_whose_test_fails_after_training_keeps_its_checkpoints_and_resumes_to_the_test_at_its_last_step(
        tmp_path: Path, data_root: Path, subword_cache: Path) -> None:
    """The test split damaged once training has saved its last step: the run fails in its test,
    its checkpoints and summary stay; repaired, ``resume=auto`` trains nothing and logs the test
    at step 4, the last (before: at step 0, the launching process's count, which stayed 0 under
    ddp_spawn, and which train also took for "this run never started": its new files removed)."""
    root = multi30k_copy(tmp_path / "data", data_root)
    test_file = root / "multi30k" / "test_2016_flickr.en.gz"
    env = {**os.environ, "WANDB_MODE": "offline", "AIAYN_DATA_ROOT": str(root), "AIAYN_CACHE_DIR": str(subword_cache),
           "OMP_NUM_THREADS": "1"}
    run_dir = tmp_path / "run"
    command = [sys.executable, "src/train.py", *SPAWNED, f"hydra.run.dir={run_dir}"]
    last = run_dir / "checkpoints" / "step0000004.ckpt"
    process = popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not last.exists():  # the last step saved: the test's ranks are yet to read the split
            assert process.poll() is None, process.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "no step-4 checkpoint within 5 minutes"
            time.sleep(0.02)
        target = test_file.resolve()
        test_file.unlink()
        test_file.write_bytes(b"not gzip\n")
        stderr = process.communicate(timeout=600)[1]
    finally:
        if process.poll() is None:
            process.kill()
    # The rank's DataError is the user's to fix, as in one process: its own line, exit status 2, and
    # as training was saved, how to continue once it is fixed (before: "a training process failed, so
    # the job stopped: aiayn.errors.DataError: …. Continue from the newest checkpoint with resume=auto", exit 1).
    line = stderr.strip().splitlines()[-1]
    assert process.returncode == 2, stderr[-3000:]
    assert line.startswith(f"train.py: test split 'test_2016_flickr': {test_file}: not gzip data"), line
    assert line.endswith(f", else delete it and download it again; the run's training is saved in {run_dir / 'checkpoints'}: "
                         "once that is put right, continue with the same command and resume=auto"), line
    assert "a training process failed" not in stderr, stderr[-3000:]
    kept = {path.name for path in (run_dir / "checkpoints").iterdir()}
    assert {"step0000002.ckpt", "step0000004.ckpt", "last.ckpt"} <= kept, kept
    assert (run_dir / "summary.json").is_file() and not _test_rows(run_dir)

    test_file.unlink()
    test_file.symlink_to(target)
    resumed = run_command([*command, "resume=auto"], env=env)
    assert sum(line.startswith("test test_2016_flickr:") for line in resumed.stdout.splitlines()) == 1
    assert [int(row["step"]) for row in _test_rows(run_dir)] == [4], "the test at the last step, once"
