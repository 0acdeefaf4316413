"""How long a checkpoint save holds training: saved in the training thread, or in the background.

    .venv/bin/python benchmarks/checkpoint_save.py [--model big] [--vocab-size 32000] [--repeats 3]
        [--device cpu|cuda] [--dir DIR]

Builds the model of conf/model/<model>.yaml and Adam's state after one step, that is what a training
checkpoint holds, and saves it as train.py does (aiayn.checkpoints.background.AtomicCheckpointIO:
written to a temporary file, fsynced, hashed, renamed) into ``--dir`` (default: a temporary folder
beside the repository, on the disk runs write to), alternately

- ``in_background=false``: the training thread writes it (held: the whole save);
- ``in_background=true``: aiayn.checkpoints.background.BackgroundCheckpointIO (held: the copy of
  the state into host memory; the thread then writes it while training would go on).

For each it records the time held and the time until the file is on disk, medians of
``--repeats``. Appends one JSON line to benchmarks/results/checkpoint_save.jsonl. A benchmark,
not a test: nothing here asserts a figure.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from _common import REPO, append_record, commit, machine, now
from _model_configs import load_model_config

from aiayn.checkpoints.background import AtomicCheckpointIO, BackgroundCheckpointIO
from aiayn.config.schemas import network_arguments
from aiayn.model.transformer import Transformer

RESULTS = REPO / "benchmarks" / "results" / "checkpoint_save.jsonl"


def training_state(model_name: str, vocab_size: int, device: torch.device) -> dict:
    """A checkpoint's tensors: the model's weights and Adam's two moments after one step."""
    network = network_arguments(load_model_config(model_name, []))
    model = Transformer(vocab_size, vocab_size, **network).to(device)
    optimizer = torch.optim.Adam(model.parameters(), betas=(0.9, 0.98), eps=1e-9)
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    return {"state_dict": model.state_dict(), "optimizer_states": [optimizer.state_dict()], "global_step": 1,
            "hyper_parameters": {"model": network, "vocab_size": vocab_size}}


def timed_save(writer: AtomicCheckpointIO, state: dict, path: Path, device: torch.device) -> tuple[float, float]:
    """(seconds the caller was held, seconds until the file was on disk)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    writer.save_checkpoint(state, path)
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # the copy on the device is part of what holds training
    held = time.perf_counter() - started
    if isinstance(writer, BackgroundCheckpointIO):
        writer.wait()
    return held, time.perf_counter() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="big")
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dir", type=Path, default=None, help="where to save (default: a temporary folder beside the repository)")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    state = training_state(args.model, args.vocab_size, device)
    size = 0  # the file's (the tied embeddings are one storage, written once)
    folder = Path(tempfile.mkdtemp(prefix="checkpoint-save-", dir=args.dir or REPO.parent))
    writers = {"false": AtomicCheckpointIO(), "true": BackgroundCheckpointIO()}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in writers}
    try:
        for repeat in range(args.repeats):
            for name, writer in writers.items():  # alternately, so that both meet the same disk
                path = folder / f"step{repeat:07d}-{name}.ckpt"
                times[name].append(timed_save(writer, state, path, device))
                size = path.stat().st_size
                writer.remove_checkpoint(path)
        writers["true"].teardown()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    record = {
        "date": now(), "commit": commit(), "machine": machine(), "torch": torch.__version__,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "model": args.model, "vocab_size": args.vocab_size, "checkpoint_gb": round(size / 1e9, 2),
        "repeats": args.repeats,
        "in_background": {name: {"held_s": round(statistics.median(h for h, _ in runs), 2),
                                 "on_disk_s": round(statistics.median(d for _, d in runs), 2)}
                          for name, runs in times.items()},
    }
    print(json.dumps(record))
    append_record(args.results, record)


if __name__ == "__main__":
    sys.exit(main())
