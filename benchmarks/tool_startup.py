"""How long the tools take to start: ``--help`` of translate.py, average.py, evaluate.py and
train.py, train.py refusing an override it cannot apply (exit status 2), and translate.py
translating one sentence with a checkpoint (start-up, loading and one beam search), beside the
floor under them all, Python importing torch.

    python benchmarks/tool_startup.py --ckpt outputs/<run>/checkpoints/last.ckpt [--against DIR] [--repeats 7]

Each command runs as a user runs it, a process of its own, ``--repeats`` times; the figure is the
median wall time. ``--against`` names another checkout (``git worktree add /tmp/before <commit>``):
its tools are timed too, alternating with this checkout's, each run with ``PYTHONPATH`` at its own
``src/``, so that the two are measured under the same load. One JSON line per checkout into
benchmarks/results/tool_startup.jsonl. A benchmark, not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _common import REPO, append_record, commit, machine, now

RESULTS = REPO / "benchmarks" / "results" / "tool_startup.jsonl"
SENTENCE = "A man is walking down the street.\n"
REFUSED = "model.d_model=abc"  # not a whole number: train.py refuses it in one line, exit status 2


def commands(ckpt: Path) -> dict[str, list[str]]:
    """What is timed, by name: the floor (Python importing torch), each tool's ``--help``, train.py
    refusing an override, and one sentence translated on the CPU."""
    return {"import torch": ["-c", "import torch"], **{f"{tool} --help": [f"src/{tool}.py", "--help"] for tool in ("translate", "average", "evaluate", "train")},
            "train.py refusing an override": ["src/train.py", REFUSED],
            "translate one sentence": ["src/translate.py", f"ckpt={ckpt}", "device=cpu"]}



def timed(checkout: Path, arguments: list[str]) -> float:
    """Seconds ``python <arguments>`` takes in ``checkout`` (its ``src/`` first on the path)."""
    environment = {**os.environ, "PYTHONPATH": str(checkout / "src"), "WANDB_MODE": "disabled"}
    started = time.perf_counter()
    process = subprocess.run([sys.executable, *arguments], cwd=checkout, env=environment, input=SENTENCE,
                             capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if process.returncode != (2 if REFUSED in arguments else 0):
        raise SystemExit(f"{checkout}: {' '.join(arguments)} failed ({process.returncode}):\n{process.stderr[-2000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", type=Path, required=True, help="a translation checkpoint (a run's last.ckpt)")
    parser.add_argument("--against", type=Path, help="another checkout to time beside this one")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    checkouts = [REPO, *([args.against.resolve()] if args.against else [])]
    timings: dict[Path, dict[str, list[float]]] = {checkout: {} for checkout in checkouts}
    for name, arguments in commands(args.ckpt.resolve()).items():
        for _ in range(args.repeats):
            for checkout in checkouts:  # alternated: the same load for both
                timings[checkout].setdefault(name, []).append(timed(checkout, arguments))
    for checkout in checkouts:
        record = {"date": now(), "commit": commit(checkout),
                  "torch_threads": os.environ.get("OMP_NUM_THREADS"), "repeats": args.repeats,
                  "median_s": {name: round(statistics.median(values), 2) for name, values in timings[checkout].items()},
                  "machine": machine()}
        append_record(RESULTS, record)
        print(json.dumps(record))


if __name__ == "__main__":
    main()
