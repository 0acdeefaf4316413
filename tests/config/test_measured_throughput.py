"""Which benchmark record the training plan projects a run's time from (aiayn.config.measured.measured_throughput):
one of the same model, device, precision, vocabulary, compile mode, length buckets and batch, and of
those the run's Adam and loss where there is one."""

from __future__ import annotations

import json
from pathlib import Path

from aiayn.config.measured import measured_throughput
from tests.helpers.throughput import throughput_record


def test_a_throughput_is_used_only_for_the_same_model_device_precision_vocabulary_compile_and_batch(tmp_path: Path) -> None:
    records = tmp_path / "r.jsonl"
    # a newer record measured with SDPA's cuDNN kernel turned back on (train_throughput.py
    # --cudnn-attention): not how the model runs, so never the one used
    cudnn = throughput_record(date="2026-11-26T10:00:00", tgt_tokens_per_s=9_000.0)
    cudnn["settings"]["cudnn_attention"] = True
    records.write_text(json.dumps(throughput_record()) + "\n" + json.dumps(cudnn) + "\n")
    args = {"model": "big", "accelerator": "gpu", "device": "NVIDIA H100 80GB HBM3", "precision": "bf16-mixed",
            "vocab_size": 32000, "compiled": False}
    assert measured_throughput(records, **args)["tgt_tokens_per_s"] == 50_000
    assert measured_throughput(records, **args, tokens_per_batch=3125)["tgt_tokens_per_s"] == 50_000
    for change in ({"model": "base"}, {"device": "NVIDIA A100"}, {"precision": "32-true"}, {"vocab_size": 37000},
                   {"compiled": True}, {"accelerator": "cpu"}, {"model": None}, {"tokens_per_batch": 25_000},
                   {"length_buckets": True}):
        assert measured_throughput(records, **{**args, **change}) is None, change
    assert measured_throughput(tmp_path / "absent.jsonl", **args) is None
    # A compiled record is used for a run compiled in the same mode only.
    graphs = throughput_record(compile=True, tgt_tokens_per_s=70_000.0)
    graphs["settings"]["compile_mode"] = "cudagraphs"
    records.write_text(json.dumps(graphs) + "\n")
    assert measured_throughput(records, **{**args, "compiled": True, "compile_mode": "cudagraphs"}) is not None
    assert measured_throughput(records, **{**args, "compiled": True}) is None


def test_a_throughput_of_the_runs_adam_and_loss_is_taken_before_a_newer_one_of_another(tmp_path: Path) -> None:
    """make gpu-check times plain Adam and the fused loss after the runs of the defaults, on the
    same model and batch: a run with fused Adam and the plain loss (the defaults) is projected from
    the record of those, not from the newer one of a switch it does not turn (before: the newest,
    plain Adam's); where only another's record is there, it is used."""
    def record(date: str, adam: bool, loss: bool, speed: float) -> dict:
        found = throughput_record(date=date, tgt_tokens_per_s=speed)
        found["settings"].update(fused_adam=adam, fused_loss=loss)
        return found

    default, plain_adam, fused_loss = (record("2026-11-25T10:00:00", True, False, 50_000.0),
                                       record("2026-11-25T10:05:00", False, False, 40_000.0),
                                       record("2026-11-25T10:06:00", True, True, 52_000.0))
    records = tmp_path / "r.jsonl"
    records.write_text("".join(json.dumps(each) + "\n" for each in (default, plain_adam, fused_loss)))
    args = {"model": "big", "accelerator": "gpu", "device": "NVIDIA H100 80GB HBM3", "precision": "bf16-mixed",
            "vocab_size": 32000, "compiled": False}
    assert measured_throughput(records, **args)["tgt_tokens_per_s"] == 50_000
    assert measured_throughput(records, **args, fused_adam=False)["tgt_tokens_per_s"] == 40_000
    assert measured_throughput(records, **args, fused_loss=True)["tgt_tokens_per_s"] == 52_000
    records.write_text(json.dumps(plain_adam) + "\n")  # the only one there
    assert measured_throughput(records, **args)["tgt_tokens_per_s"] == 40_000
