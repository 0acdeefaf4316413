"""Time the default job end to end and record its test BLEU with the machine it ran on.

    python3 benchmarks/default_job.py [hydra overrides ...]

Runs the README's `make train` (the default job unless overrides say otherwise, passed as
ARGS) as a user would, measures its wall time (the install included when .venv is new), reads
the test metrics it prints, and appends one JSON line to benchmarks/results/default_job.jsonl.
A benchmark, not a test: nothing here asserts a time. Uses only the standard library, so it runs
before the install.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time

from _common import REPO, append_record, commit, machine, now

RESULTS = REPO / "benchmarks" / "results" / "default_job.jsonl"


def venv_torch() -> str | None:
    """The version of the torch `make train` ran with: the .venv's, not this interpreter's."""
    python = REPO / ".venv" / "bin" / "python"
    if not python.exists():
        return None
    found = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('torch'))"],
                           check=False, capture_output=True, text=True)
    return (found.stdout.strip() or None) if found.returncode == 0 else None


def main(overrides: list[str]) -> None:
    started = time.perf_counter()
    fresh_install = not (REPO / ".venv" / ".installed").exists()
    command = ["make", "train", f"ARGS={' '.join(overrides)}"]
    process = subprocess.run(command, check=False, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - started
    sys.stderr.write(process.stderr[-4000:])
    print(process.stdout[-3000:])
    if process.returncode:
        raise SystemExit(f"make train failed with exit code {process.returncode}")
    summary = next(line for line in process.stdout.splitlines() if line.startswith("test "))
    metrics = {key: float(value) for key, value in re.findall(r"(test/\w+)=([-\d.e+]+)", summary)}
    record = {"date": now(), "commit": commit(),
              "overrides": overrides,
              "wall_seconds": round(wall, 1),
              "fresh_install": fresh_install, **metrics, "machine": {**machine(), "torch": venv_torch()}}
    append_record(RESULTS, record)
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Time `make train` (the default job) and record its test metrics.")
    parser.add_argument("overrides", nargs="*", help="train.py's settings (Hydra overrides), passed as make's ARGS")
    main(parser.parse_args().overrides)
