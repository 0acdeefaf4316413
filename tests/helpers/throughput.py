"""A benchmarks/train_throughput.py record with the fields the training plan reads (aiayn.config.plan's
projected time), for the tests of the plan."""

from __future__ import annotations


def throughput_record(**changes) -> dict:
    """A record as benchmarks/train_throughput.py writes it (the fields the plan reads)."""
    record = {"date": "2026-11-25T10:00:00", "commit": "abc1234", "device": "cuda",
              "machine": {"cpu": "Xeon", "gpu": "NVIDIA H100 80GB HBM3"}, "tgt_tokens_per_s": 50_000.0,
              "step_seconds": {"mean": 0.0625, "median": 0.06},
              "settings": {"model": "big", "precision": "bf16", "vocab_size": 32000, "compile": False,
                           "max_tokens": 3125}}
    for key, value in changes.items():
        (record["settings"] if key in record["settings"] else record)[key] = value
    return record
