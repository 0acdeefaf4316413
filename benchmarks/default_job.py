"""Time the default job end to end and record its test BLEU with the machine it ran on.

    python benchmarks/default_job.py [hydra overrides ...]

Runs `python src/train.py` (the default job unless overrides say otherwise) as a user would,
measures its wall time, reads the test metrics it prints, and appends one JSON line to
benchmarks/results/default_job.jsonl. A benchmark, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "default_job.jsonl"


def machine() -> dict[str, object]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform()}


def main(overrides: list[str]) -> None:
    started = time.perf_counter()
    process = subprocess.run([sys.executable, "src/train.py", *overrides], cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - started
    sys.stderr.write(process.stderr[-4000:])
    print(process.stdout[-3000:])
    if process.returncode:
        raise SystemExit(f"train.py failed with exit code {process.returncode}")
    summary = next(line for line in process.stdout.splitlines() if line.startswith("test "))
    metrics = {key: float(value) for key, value in re.findall(r"(test/\w+)=([-\d.e+]+)", summary)}
    record = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "overrides": overrides,
              "wall_seconds": round(wall, 1), **metrics, "machine": machine()}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with open(RESULTS, "a") as f:
        f.write(json.dumps(record) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
