"""A 2-process CPU DDP run whose rank dies mid-training ends, every process of it, within a
bounded time, with a one-line message saying how to continue — no hang."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.runs import REPO, TINY_MODEL

pytestmark = pytest.mark.cli  # end-to-end runs of the tools; -m 'not cli' skips them

RUN = [
    *TINY_MODEL, "task.datamodule.max_tokens=512", "trainer.max_steps=100000",
    "trainer.val_check_interval=100000", "trainer.num_sanity_val_steps=0", "trainer.enable_progress_bar=false",
    "checkpoint.every_n_train_steps=5", "checkpoint.every_n_minutes=null", "hardware=cpu2_ddp", "logger=none",
]


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return sorted(found)


def _ranks(process: subprocess.Popen, strategy: str) -> list[int]:
    """PIDs of the training processes, rank 0 first."""
    def command(pid):
        try:
            return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            return ""
    if strategy == "ddp_spawn":  # both ranks are spawned children, in rank order
        return [pid for pid in _children(process.pid) if "spawn_main" in command(pid)]
    return [process.pid] + [pid for pid in _children(process.pid) if "src/train.py" in command(pid)]  # ddp


@pytest.mark.parametrize("strategy, victim", [("ddp_spawn", 1), ("ddp_spawn", 0), ("ddp", 1)])
def test_a_dead_rank_ends_the_job_cleanly(tmp_path: Path, data_root: Path, strategy: str, victim: int) -> None:
    env = {**os.environ, "AIAYN_DATA_ROOT": str(data_root), "AIAYN_CACHE_DIR": str(tmp_path / "cache"),
           "OMP_NUM_THREADS": "1"}
    run_dir = tmp_path / "run"
    command = [sys.executable, "src/train.py", *RUN, f"trainer.strategy={strategy}", f"hydra.run.dir={run_dir}"]
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (run_dir / "checkpoints" / "step0000005.ckpt").exists():  # both ranks are training
            assert process.poll() is None, process.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "training did not start within 5 minutes"
            time.sleep(0.1)
        ranks = _ranks(process, strategy)
        assert len(ranks) == 2, ranks
        os.kill(ranks[victim], signal.SIGKILL)
        killed_at = time.monotonic()
        stderr = process.communicate(timeout=120)[1]  # a hang fails here
        took = time.monotonic() - killed_at
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode != 0
    assert took < 60, f"the job took {took:.0f} s to end after rank {victim} died"
    assert not any(Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text()
                   for pid in ranks), "a rank outlived the job"
    if not (strategy == "ddp" and victim == 0):  # the launching process prints the summary
        lines = [line for line in stderr.splitlines() if line.startswith("train.py: ")]
        assert lines and "a training process failed, so the job stopped" in lines[-1], stderr[-3000:]
        assert "resume=auto" in lines[-1]
