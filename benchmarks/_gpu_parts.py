"""The parts of benchmarks/gpu_suite.py, each run as processes of their own under a time cap:

* ``tests_part``: ``python -m pytest -m gpu -ra`` (with --quick: ``--collect-only -q tests/gpu``); the counts
  come from pytest's closing summary line, the ids of failures and errors from its ``-ra`` lines.
* ``train_part``: benchmarks/train_throughput.py once per model eager, and base compiled, bf16 autocast.
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
# (label, conf/model name, vocabulary, extra train_throughput.py arguments): the paper's base model
# on WMT EN-DE (37k shared BPE) and big on EN-FR (32k word-pieces, P_drop 0.1 there, §6.1).
TRAIN_MODELS = [("base", "base", 37000, []), ("big", "big", 32000, ["--set", "model.dropout=0.1"])]
TINY = ["--set", "model.n_layers=1", "--set", "model.d_model=32", "--set", "model.d_ff=64", "--set",
        "model.n_heads=2", "--set", "model.d_k=16", "--set", "model.d_v=16"]
QUICK_MODELS = [("tiny", "small", 1000, TINY)]
MAX_TOKENS = 3125  # one GPU's share of the paper's 25,000-token step on 8 GPUs (§5.1)
EAGER_CAP_S = 90  # the most an eager training run may take (about 15 s on an H100)


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
    """The gpu-marked tests: counts, the failures' ids; --quick collects them only."""
    command = [PYTHON, "-m", "pytest", "-m", "gpu", "-ra", "-p", "no:cacheprovider"]
    if quick:  # tests/gpu/ alone where it is: collecting the whole suite takes longer than the rest
        command += ["--collect-only", "-q", *(["tests/gpu"] if (REPO / "tests" / "gpu").is_dir() else [])]
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
    """bf16 training throughput per model eager, then of the first compiled (on CUDA only with --quick:
    inductor takes minutes on a small CPU); each record of train_throughput.py is appended to
    ``records_file`` (None: not kept, as for --quick) and summed up here."""
    deadline = time.monotonic() + cap_s
    models = QUICK_MODELS if quick else TRAIN_MODELS
    # Every eager run first, then the first model compiled: compiling one model (dynamic shapes,
    # forward and backward) took over 90 s on an H200 with 16 cores, so the part has room for one.
    plan = [(model, False) for model in models] + ([(models[0], True)] if device == "cuda" or not quick else [])
    steps = ["--warmup-steps", "1", "--steps", "2"] if quick else ["--warmup-steps", "5", "--steps", "50"]
    runs, skipped = [], []
    if device == "cpu" and quick:
        skipped.append("compiled: left out of --quick on cpu (torch.compile takes minutes there)")
    for index, ((label, conf, vocab, extra), compiled) in enumerate(plan):
        left = deadline - time.monotonic()
        compiled_left = sum(c for _, c in plan[index:])
        cap = min(left, EAGER_CAP_S) if not compiled else left / compiled_left
        name = f"{label}{'-compiled' if compiled else ''}"
        summary = {"run": name, "model": label, "config": conf, "vocab_size": vocab, "precision": "bf16",
                   "compile": compiled, "max_tokens": 1024 if quick else MAX_TOKENS}
        if cap < 5:
            runs.append({**summary, "status": "not run", "reason": "the part's time cap was spent"})
            continue
        out, log = work / f"train-{name}.jsonl", work / f"train-{name}.log"
        command = [PYTHON, "benchmarks/train_throughput.py", "--model", conf, *extra, "--device", device,
                   "--precision", "bf16", "--vocab-size", str(vocab), "--max-tokens", str(summary["max_tokens"]),
                   *steps, "--out", str(out)]
        command += ["--compile", "--compile-dynamic"] if compiled else []
        command += ["--threads", "1"] if quick and device == "cpu" else []
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
                     "mfu": float(f"{record['mfu']:.4g}"), "peak_memory_mb": round(record["peak_memory_mb"], 1),
                     "gpu": record["machine"].get("gpu")})
    statuses = {run["status"] for run in runs}
    return {"runs": runs, "skipped": skipped, "records_file": str(records_file) if records_file else None,
            "status": "ok" if statuses == {"ok"} else "timed out" if "timed out" in statuses else "incomplete",
            "peak_memory_mb": max((run.get("peak_memory_mb", 0) for run in runs), default=None)}


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
