"""Every benchmark is a command: ``--help`` says how to run it and runs nothing (before:
``default_job.py --help`` ran ``make train ARGS=--help``, which made a .venv and installed aiayn)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.inprocess import run_tool
from tests.helpers.runs import REPO

COMMANDS = sorted(path.name for path in (REPO / "benchmarks").glob("[!_]*.py")
                  if 'if __name__ == "__main__":' in path.read_text(encoding="utf-8"))


def test_the_benchmarks_are_found() -> None:
    assert {"default_job.py", "train_throughput.py", "gpu_suite.py", "decode_speed.py"} <= set(COMMANDS)


@pytest.mark.parametrize("script", COMMANDS)
def test_help_says_how_to_run_it_and_runs_nothing(script: str, tmp_path: Path) -> None:
    results = {path: path.stat().st_mtime_ns for path in (REPO / "benchmarks" / "results").iterdir()}
    result = run_tool(f"benchmarks/{script}", "--help", cwd=tmp_path)
    assert result.stdout.startswith("usage:"), result.stdout[:500]
    assert list(tmp_path.iterdir()) == []
    assert {path: path.stat().st_mtime_ns for path in (REPO / "benchmarks" / "results").iterdir()} == results
