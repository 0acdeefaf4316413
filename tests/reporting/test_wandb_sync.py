"""What ``wandb sync`` uploads of an offline run, as train's line says to run it.

W&B cannot resume a run offline: a resumed run (the id its checkpoint keeps, given back as
``resume_id``) writes a folder of its own per attempt, ``offline-run-<time>-<id>``, each counting
W&B's ``_step`` from 0. ``wandb sync`` given the folders of one run uploads them one after another in
the order they started (its ``--help``), each after the rows already there. The line the run
prints must name them all; its command is run here as a shell runs it, with wandb's own
``--dry-run``, which lists the files it would upload without a key or a network.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aiayn.reporting.loggers import WandbRunLogger


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """No W&B key and an empty home, as on a fresh machine: W&B runs offline."""
    for name in [name for name in os.environ if name.startswith("WANDB_")]:
        monkeypatch.delenv(name)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("WANDB_SILENT", "true")
    return dict(os.environ)


def _attempt(save_dir: Path, step: int, resume_id: str | None = None) -> tuple[str, str]:
    """One attempt of a run, as train builds its logger (a resumed one given the checkpoint's
    run id): a metric logged, the run's line, the run finished. Returns (run id, line)."""
    logger = WandbRunLogger(project="aiayn", save_dir=str(save_dir), mode="auto", name="a-run", resume_id=resume_id)
    logger.log_metrics({"train/loss": 1.0 / (step + 1)}, step=step)
    line = logger.describe()
    logger.close()
    return logger.version, line


def _would_sync(line: str, env: dict[str, str]) -> list[str]:
    """The .wandb files ``wandb sync`` would upload, the line's command run by a shell with ``--dry-run``."""
    command = re.search(r"`(wandb sync [^`]+)`", line).group(1)
    wandb = Path(sys.executable).parent / "wandb"
    shown = subprocess.run(["bash", "-c", command.replace("wandb sync", f"{wandb} sync --dry-run", 1)], env=env,
                           capture_output=True, text=True, timeout=300, check=False)
    assert shown.returncode == 0, shown.stderr
    return sorted(re.findall(r"\S+\.wandb\b", shown.stdout + shown.stderr))


@pytest.mark.slow
def test_a_resumed_offline_runs_line_uploads_every_attempt(tmp_path: Path, offline: dict[str, str]) -> None:
    """Before: the resumed attempt's line named its own folder alone, `wandb sync
    <run>/wandb/offline-run-<second>-<id>`: the steps of the first attempt never reached the run."""
    import wandb

    save_dir = tmp_path / "run"
    run_id, first_line = _attempt(save_dir, 0)
    assert "offline" in first_line and len(_would_sync(first_line, offline)) == 1
    # wandb names an attempt's folder by the second it starts in: a resume (a process started again,
    # seconds later at the least) starts in a later one, which a fast machine may not reach by itself.
    [first] = (save_dir / "wandb").glob(f"offline-run-*-{run_id}")
    while time.strftime("%Y%m%d_%H%M%S") <= first.name.split("-")[2]:
        time.sleep(0.05)
    again, line = _attempt(save_dir, 1, resume_id=run_id)
    wandb.teardown()
    assert again == run_id  # the same W&B run goes on
    folders = sorted((save_dir / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(folders) == 2  # one per attempt
    assert _would_sync(line, offline) == sorted(str(folder / f"run-{run_id}.wandb") for folder in folders)
    assert f"W&B run {run_id} (offline) in 2 folders, one per attempt, the newest {folders[-1]}" in line


@pytest.mark.slow
def test_a_run_of_one_attempt_names_its_folder(tmp_path: Path, offline: dict[str, str]) -> None:
    """Another run's folder beside it (another id) is not this run's attempt."""
    import wandb

    save_dir = tmp_path / "run"
    other, _ = _attempt(save_dir, 0)
    run_id, line = _attempt(save_dir, 0)
    wandb.teardown()
    assert run_id != other
    [folder] = (save_dir / "wandb").glob(f"offline-run-*-{run_id}")
    assert line == f"W&B run {run_id} (offline) in {folder}; upload it with `wandb sync {folder}`"
    assert _would_sync(line, offline) == [str(folder / f"run-{run_id}.wandb")]
