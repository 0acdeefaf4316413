"""benchmarks/checkpoint_save.py at a CI size (the small model, a 500-word vocabulary, one save of
each kind), so that the benchmark keeps working; its figures come from full runs, never from
here. The benchmark runs as ``__main__`` in this process (tests.helpers.inprocess)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.helpers.inprocess import run_tool


def test_benchmark_times_both_writers_and_leaves_no_file(tmp_path: Path) -> None:
    out, saves = tmp_path / "results.jsonl", tmp_path / "saves"
    saves.mkdir()
    run_tool("benchmarks/checkpoint_save.py", "--model", "small", "--vocab-size", "500", "--repeats", "1",
             "--dir", str(saves), "--results", str(out), env=os.environ)
    record = json.loads(out.read_text())
    assert record["model"] == "small" and record["device"] == "cpu" and record["machine"]["cpu"]
    assert set(record["in_background"]) == {"false", "true"}
    for times in record["in_background"].values():
        assert 0 <= times["held_s"] <= times["on_disk_s"]
    assert 0 < record["checkpoint_gb"] < 1  # the small model's weights and Adam's two moments
    assert list(saves.iterdir()) == []
