"""The parts of benchmarks/gpu_suite.py, each run as processes of their own under a time cap:

* ``tests_part``: ``python -m pytest -m gpu -ra tests/gpu`` (with --quick: ``--collect-only -q``); the counts
  come from pytest's closing summary line, the ids of failures and errors from its ``-ra`` lines.
* ``train_part``: benchmarks/train_throughput.py for each of :data:`TRAIN_RUNS`, bf16 autocast: the
  runs the targets are measured on, and each speed switch on and off.
* ``users_command_part``: benchmarks/_users_command.py (src/train.py model=big task=wmt_en_fr itself).
* ``decode_part``: benchmarks/_gpu_decode.py (our beam search and CTranslate2 on the same weights).

``run_capped`` gives a process its cap: shortly before it, its process group gets SIGINT (pytest
then still prints its summary), and at the cap SIGKILL. ``DeviceMemory`` samples the GPU's memory in
use (nvidia-smi, every 500 ms) while a part runs: its peak covers every process of the part,
CTranslate2's memory and the CUDA contexts included.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from _common import REPO

PYTHON = sys.executable
BIG = ["--set", "model.dropout=0.1", "--pair", "en-fr"]  # big on EN-FR: P_drop 0.1 there (§6.1), EN-FR's lengths
BUCKETS = ["--length-buckets", "16,24,32,40,48,64,96,128,256"]
# CUDA graphs of the step, one per bucket; compiled for dynamic lengths from the first batch: compiled for
# its shape alone, the second shape's recompilation would take the first's batches too, to record anew when timed
GRAPHS = ["--compile", "--compile-dynamic", "--compile-mode", "cudagraphs", *BUCKETS]
# (label, conf/model name, vocabulary, padded tokens a batch, extra train_throughput.py arguments):
# the paper's base model on WMT EN-DE (37k shared BPE) and big on EN-FR (32k word-pieces). 25,000
# tokens: the whole step in one batch (one GPU, task.datamodule.max_tokens=auto); 3,125: one of 8
# GPUs' share (§5.1). The first three are the targets' runs (docs/performance/gpu.md); the rest turn one
# switch each, those a target may take first: the fused loss (big's 25,000 tokens: an eager run, ~20 s),
# CUDA graphs with length buckets (the 3,125-token targets: each batch shape compiled and recorded
# before the timed steps, benchmarks/train_throughput.py), then plain Adam instead of fused and the
# buckets alone (last: the first runs matter most when the part's cap runs short).
PROFILED = ["--profile", "0"]  # the targets' runs: where a step's time goes (benchmarks/_time_split.py)
TRAIN_RUNS = [
    ("big 25000", "big", 32000, 25000, [*BIG, *PROFILED]),
    ("big 3125", "big", 32000, 3125, [*BIG, *PROFILED]),
    ("base 3125", "base", 37000, 3125, PROFILED),
    ("big 25000 fused loss", "big", 32000, 25000, [*BIG, "--fused-loss"]),
    ("base 3125 graphs", "base", 37000, 3125, GRAPHS),
    ("big 3125 graphs", "big", 32000, 3125, [*BIG, *GRAPHS]),
    ("base 3125 plain Adam", "base", 37000, 3125, ["--no-fused-adam"]),
    ("base 3125 buckets", "base", 37000, 3125, BUCKETS),
]
TINY = ["--set", "model.n_layers=1", "--set", "model.d_model=32", "--set", "model.d_ff=64", "--set",
        "model.n_heads=2", "--set", "model.d_k=16", "--set", "model.d_v=16"]
QUICK_RUNS = [("tiny 1024", "small", 1000, 1024, [*TINY, *PROFILED])]
# The most one run may take: its share of the part's cap, and at least this (an eager run: about 20 s on
# an H200, a compiled one more). A part given a longer cap gives its runs more (the quick run's one run
# takes the whole part's: a loaded CPU took over 60 s for it).
RUN_CAP_S = 60
# The targets (docs/performance/gpu.md): MFU of the bare step in bf16 against the measured bf16 peak,
# each over the runs of that model and batch (the best of its switches), and the real loop's
# target tokens/s over the bare step's at the same batch (the users_command part). A run's MFU counts
# the FLOPs of its padded positions; a target is judged on the real tokens' share of it
# (``mfu_real_tokens``, MFU × (1 − padding)), so that a switch that pads more (length buckets) is not
# counted faster for the padding it computes.
TARGETS = {"big 25000": 0.45, "big 3125": 0.25, "base 3125": 0.15}
LOOP_TARGET = 0.9


def run_capped(command: list[str], cap_s: float, log: Path) -> dict:
    """Run ``command`` in the checkout, its output into ``log``, for at most ``cap_s`` seconds: at
    the cap less a grace (a tenth of it, at most 10 s) its process group gets SIGINT, so that
    pytest still prints its summary; at the cap, SIGKILL."""
    started = time.monotonic()
    grace = min(10.0, 0.1 * cap_s)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "w", encoding="utf-8") as out:
        process = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=env, start_new_session=True)
        timed_out = False
        try:
            process.wait(timeout=max(cap_s - grace, 1))
        except subprocess.TimeoutExpired:
            timed_out = True
            _signal_group(process, signal.SIGINT)
            try:
                process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        except BaseException:  # Ctrl-C on the suite: its parts go with it
            _signal_group(process, signal.SIGKILL)
            raise
        if timed_out:
            _signal_group(process, signal.SIGKILL)  # the process and whatever it started (compile workers)
            process.wait()
    return {"returncode": process.returncode, "timed_out": timed_out, "seconds": round(time.monotonic() - started, 1),
            "cap_s": round(cap_s)}


def _signal_group(process: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def log_tail(log: Path, chars: int = 1500) -> str:
    return log.read_text(encoding="utf-8", errors="replace")[-chars:]


class DeviceMemory:
    """The peak of the GPU's memory in use (MiB, every process) while the block runs, from
    ``nvidia-smi --query-gpu=memory.used`` every half second; ``peak_mb`` stays None on a CPU run
    or without nvidia-smi."""

    def __init__(self, cuda: bool):
        self.smi = shutil.which("nvidia-smi") if cuda else None
        self.gpu = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0]
        self.peak_mb, self.done = None, threading.Event()

    def sample(self) -> None:
        try:
            out = subprocess.run([self.smi, "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", self.gpu],
                                 check=False, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return
        if out.isdigit():
            self.peak_mb = max(self.peak_mb or 0, int(out))

    def _poll(self) -> None:
        while not self.done.wait(0.5):
            self.sample()

    def __enter__(self):
        if self.smi:
            self.thread = threading.Thread(target=self._poll, daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.smi:
            self.done.set()
            self.thread.join()
            self.sample()


def tests_part(cap_s: float, work: Path, quick: bool) -> dict:
    """The gpu-marked tests, all in tests/gpu/ (tests/benchmarks/test_gpu_suite.py checks it: collecting
    the whole suite takes longer than they run): counts, the failures' ids; --quick collects them only."""
    command = [PYTHON, "-m", "pytest", "-m", "gpu", "-ra", "-p", "no:cacheprovider", "tests/gpu"]
    if quick:
        command += ["--collect-only", "-q"]
    log = work / "pytest.log"
    run = run_capped(command, cap_s, log)
    text = log.read_text(encoding="utf-8", errors="replace")
    result = {"command": " ".join(["python", *command[1:]]), **run}
    counts = {}
    for line in text.splitlines():
        if re.match(r"^=+ .* in [\d.]+s", line) or line.startswith("no tests collected"):
            counts = {word.rstrip("s") if word.startswith("error") else word: int(n)
                      for n, word in re.findall(r"(\d+) ([a-z]+)", line)}
    result["counts"] = counts  # every figure of the summary line (deselected, warnings, xfailed ...)
    result.update({key: counts.get(key, 0) for key in ("passed", "failed", "skipped", "error")})
    result["failures"] = re.findall(r"^(?:FAILED|ERROR) (\S+)", text, flags=re.MULTILINE)
    if quick:
        result["collected"] = len(re.findall(r"^\S+\.py::\S+", text, flags=re.MULTILINE))
    status = {0: "passed", 1: "failed", 5: "no tests"}.get(run["returncode"], "error")
    result["status"] = "timed out" if run["timed_out"] else ("collected" if quick and status == "passed" else status)
    if result["status"] in ("error", "timed out"):
        result["log_tail"] = log_tail(log)
    return result


def train_part(cap_s: float, work: Path, device: str, quick: bool, records_file: Path | None) -> dict:
    """bf16 training throughput of each of :data:`TRAIN_RUNS` (with --quick the tiny model alone,
    eager); each record of train_throughput.py is appended to ``records_file`` (None: not kept, as
    for --quick) and summed up here."""
    deadline = time.monotonic() + cap_s
    plan = QUICK_RUNS if quick else TRAIN_RUNS
    runs = []
    skipped = ["compiled runs and the other switches: left out of --quick (compiling takes minutes on a CPU)"] \
        if quick else []
    for label, conf, vocab, max_tokens, extra in plan:
        cap = min(deadline - time.monotonic(), max(RUN_CAP_S, cap_s / len(plan)))
        compiled = "--compile" in extra
        summary = {"run": label, "model": label.split()[0], "config": conf, "vocab_size": vocab, "precision": "bf16",
                   "compile": compiled, "max_tokens": max_tokens, "switches": _switches(extra)}
        if cap < 5:
            runs.append({**summary, "status": "not run", "reason": "the part's time cap was spent"})
            continue
        name = label.replace(" ", "-")
        out, log = work / f"train-{name}.jsonl", work / f"train-{name}.log"
        steps = ["--warmup-steps", "1", "--steps", "2"] if quick else \
            ["--warmup-steps", "10" if compiled else "3" if max_tokens > 10_000 else "5",
             "--steps", "12" if max_tokens > 10_000 else "40"]
        command = [PYTHON, "benchmarks/train_throughput.py", "--model", conf, *extra, "--device", device,
                   "--precision", "bf16", "--vocab-size", str(vocab), "--max-tokens", str(max_tokens), *steps,
                   "--out", str(out)]
        command += ["--threads", "1"] if quick and device == "cpu" else []
        command += ["--pairs", "50000"] if quick else []  # a check that it runs: a pool of seconds less
        run = run_capped(command, cap, log)
        warmup = [float(s) for s in re.findall(r"\(warm-up\): ([\d.]+) s", log.read_text(errors="replace"))]
        summary.update(seconds=run["seconds"], cap_s=run["cap_s"], warmup_step_seconds=warmup)
        if run["returncode"] != 0 or not out.is_file():
            runs.append({**summary, "status": "timed out" if run["timed_out"] else "error", "log_tail": log_tail(log)})
            continue
        record = json.loads(out.read_text().splitlines()[-1])
        if records_file is not None:
            records_file.parent.mkdir(parents=True, exist_ok=True)
            with open(records_file, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")
        runs.append({**summary, "status": "ok", "parameters": record["parameters"],
                     "tgt_tokens_per_s": round(record["tgt_tokens_per_s"], 1),
                     "tgt_tokens_per_step": round(record["tgt_tokens_per_step"], 1),
                     "step_seconds": record["step_seconds"], "timed_steps": record["timed_steps"],
                     "achieved_tflops": float(f"{record['achieved_tflops']:.4g}"),
                     "peak_tflops": float(f"{record['peak_tflops']:.4g}"), "peak_tflops_source": record["peak_tflops_source"],
                     "mfu": float(f"{record['mfu']:.4g}"),
                     "mfu_real_tokens": float(f"{record['mfu'] * (1 - record['padding']['sampler']):.4g}"),
                     "peak_memory_mb": round(record["peak_memory_mb"], 1),
                     "padding": round(record["padding"]["sampler"], 4), "gpu": record["machine"].get("gpu"),
                     "time_split": record.get("time_split")})
    statuses = {run["status"] for run in runs}
    return {"runs": runs, "skipped": skipped, "records_file": str(records_file) if records_file else None,
            "status": "ok" if statuses == {"ok"} else "timed out" if "timed out" in statuses else "incomplete",
            "peak_memory_mb": max((run.get("peak_memory_mb", 0) for run in runs), default=None)}


def _switches(extra: list[str]) -> list[str]:
    """The speed switches a run's arguments turn (their names; the compile mode with its value:
    ``compile-mode cudagraphs``), for the record."""
    switches = []
    for index, arg in enumerate(extra):
        if arg.startswith("--") and arg not in ("--set", "--pair", "--profile"):
            switches.append(f"compile-mode {extra[index + 1]}" if arg == "--compile-mode" else arg.removeprefix("--"))
    return switches


def users_command_part(cap_s: float, work: Path, device: str, quick: bool) -> dict:
    """src/train.py model=big task=wmt_en_fr for 100 steps and what follows (benchmarks/_users_command.py)."""
    out, log = work / "users_command.json", work / "users_command.log"
    command = [PYTHON, "benchmarks/_users_command.py", "--json", str(out), "--device", device,
               "--work", str(work / "users_command")]
    command += ["--quick"] if quick else []
    run = run_capped(command, cap_s, log)
    result = json.loads(out.read_text()) if out.is_file() else {}
    result.update(process_seconds=run["seconds"], cap_s=run["cap_s"])
    result["status"] = "ok" if run["returncode"] == 0 and out.is_file() else \
        "timed out" if run["timed_out"] else "error"
    if result["status"] != "ok":
        result["log_tail"] = log_tail(log)
    result["peak_memory_mb"] = (result.get("bare_step") or {}).get("peak_memory_mb")
    return result


def targets(record: dict) -> dict:
    """Each target (docs/performance/gpu.md) with what was measured and whether it was met."""
    found = {}
    runs = [run for run in (record.get("train") or {}).get("runs", []) if run["status"] == "ok"]
    for label, target in TARGETS.items():
        model, tokens = label.split()
        candidates = [run for run in runs if run["model"] == model and run["max_tokens"] == int(tokens)]
        best = max(candidates, key=lambda run: run["mfu_real_tokens"], default=None)
        # Where a step's time went: the best run's split, else that of the run of this model and batch
        # that was profiled (the eager one, beside a switch that did better).
        profiled = best if best and best.get("time_split") else next(
            (run for run in candidates if run.get("time_split")), None)
        found[f"{label} MFU"] = {"target": target, "measured": best and best["mfu_real_tokens"],
                                 "measured_with_padding": best and best["mfu"], "run": best and best["run"],
                                 "met": bool(best and best["mfu_real_tokens"] >= target),
                                 "time_split": profiled and profiled["time_split"],
                                 "time_split_run": profiled and profiled["run"]}
    loop = (record.get("users_command") or {}).get("loop_over_bare")
    found["train.py over the bare step"] = {"target": LOOP_TARGET, "measured": loop, "run": "users_command",
                                           "met": bool(loop and loop >= LOOP_TARGET)}
    return found


def decode_part(cap_s: float, work: Path, device: str, quick: bool, sentences: int | None) -> dict:
    """Beam-4 decoding: ours fp32/bf16 and CTranslate2, each engine's figures (benchmarks/_gpu_decode.py)."""
    out, log = work / "decode.json", work / "decode.log"
    # The script's own budget ends its decoding in time to write; the cap is the backstop.
    command = [PYTHON, "benchmarks/_gpu_decode.py", "--json", str(out), "--device", device,
               "--budget-s", str(round(max(cap_s - 20, 0.5 * cap_s)))]
    command += ["--quick"] if quick else []
    command += ["--sentences", str(sentences)] if sentences else []
    command += ["--threads", "1"] if quick and device == "cpu" else []
    run = run_capped(command, cap_s, log)
    result = json.loads(out.read_text()) if out.is_file() else {"engines": {}, "skipped": {}}
    result.update(process_seconds=run["seconds"], cap_s=run["cap_s"])
    done = run["returncode"] == 0 and "seconds" in result
    result["status"] = "ok" if done and result.get("complete") else "ok, sentences capped" if done else \
        "timed out" if run["timed_out"] else "error"
    if not done:
        result["log_tail"] = log_tail(log)
    peaks = [engine.get("peak_memory_mb") or 0 for engine in result["engines"].values()]
    result["peak_memory_mb"] = max(peaks) if any(peaks) else None
    return result
