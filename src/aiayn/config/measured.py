"""The measured training throughput a run's plan projects its wall time from: the records of
benchmarks/train_throughput.py (and gpu_suite.py, which runs it), one JSON object a line in
benchmarks/results/train_throughput.jsonl, a path outside the package (docs/architecture.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# Measured training throughput (benchmarks/train_throughput.py, gpu_suite.py): the plan projects a run's wall time.
THROUGHPUT_RECORDS = Path(__file__).resolve().parents[3] / "benchmarks" / "results" / "train_throughput.jsonl"
# Lightning's precision names → the benchmarks' (train_throughput.py --precision).
BENCHMARK_PRECISION = {"32-true": "fp32", "32": "fp32", "bf16-mixed": "bf16", "16-mixed": "fp16"}


def measured_throughput(records: Path, model: str | None, accelerator: str, device: str | None, precision: str,
                        vocab_size: int, compiled: bool, tokens_per_batch: int | None = None,
                        compile_mode: str = "default", length_buckets: bool = False, fused_adam: bool = True,
                        fused_loss: bool = False) -> dict[str, Any] | None:
    """The newest record of ``records`` (train_throughput.py's JSON lines) that measured this model
    (by its config name), vocabulary, precision, compile switch (and mode), length buckets or none,
    and batch (``tokens_per_batch``, the record's ``max_tokens``; None: any) on this kind of device
    (the GPU's or the CPU's name), with SDPA's cuDNN kernel off as the model keeps it (a record with
    ``settings.cudnn_attention`` true measured that kernel, up to 5× slower on an H200); of those,
    one with the run's Adam and loss (``optim.fused``, ``loss.fused``) where there is one, so that
    make gpu-check's later runs of one switch (plain Adam, the fused loss) do not stand for the
    run's; None when there is none."""
    if model is None or device is None or not records.is_file():
        return None
    want = ("cuda" if accelerator == "gpu" else "cpu", BENCHMARK_PRECISION.get(precision))
    found = None
    for line in records.read_text().splitlines():
        try:
            record = json.loads(line)
            settings, machine = record["settings"], record.get("machine") or {}
            name = machine.get("gpu") if record["device"] == "cuda" else machine.get("cpu")
            if ((record["device"], settings["precision"]) == want and settings["model"] == model and name == device
                    and settings["vocab_size"] == vocab_size and bool(settings.get("compile")) == compiled
                    and not settings.get("cudnn_attention") and record["tgt_tokens_per_s"] > 0
                    and (tokens_per_batch is None or settings.get("max_tokens") == tokens_per_batch)
                    and (not compiled or settings.get("compile_mode", "default") == compile_mode)
                    and bool(settings.get("length_buckets")) == length_buckets
                    and record["step_seconds"]["mean"] > 0):
                # (a record of before the fused loss measured the plain one)
                rank = (settings.get("fused_adam") == fused_adam and bool(settings.get("fused_loss")) == fused_loss,
                        record["date"])
                found = (rank, record) if found is None or rank >= found[0] else found
        except (ValueError, KeyError, TypeError):
            continue  # a line of another format
    return None if found is None else found[1]
