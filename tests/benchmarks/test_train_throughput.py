"""benchmarks/train_throughput.py at a CI size (a tiny model, two timed steps), so that the
benchmark keeps working; its figures come from full runs, never from here. The benchmark runs as
``__main__`` in this process (tests.helpers.inprocess)."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from aiayn.data.batching import TokenBatchSampler
from tests.helpers.inprocess import run_tool
from tests.helpers.runs import REPO

TINY = ["--model", "small", "--set", "model.n_layers=1", "--set", "model.d_model=32", "--set", "model.d_ff=64",
        "--set", "model.n_heads=2", "--set", "model.d_k=16", "--set", "model.d_v=16", "--vocab-size", "500",
        "--max-tokens", "1024", "--threads", "1"]


@pytest.fixture(scope="module")
def benchmarks():
    """benchmarks/ on the import path, as the scripts there have it."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        yield
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


@pytest.fixture(scope="module")
def bench(benchmarks):
    import train_throughput
    return train_throughput


@pytest.fixture(scope="module")
def batches(benchmarks):
    import _batches
    return _batches


def _run(data_root: Path, *args: str) -> subprocess.CompletedProcess:
    return run_tool("benchmarks/train_throughput.py", *args, env=os.environ, data_root=data_root, check=False,
                    timeout=300)


def test_benchmark_writes_one_record_per_run(tmp_path: Path, data_root: Path) -> None:
    out = tmp_path / "results.jsonl"
    cudnn_attention = torch.backends.cuda.cudnn_sdp_enabled()  # --cudnn-attention sets torch's switch
    try:
        for extra in ([], ["--attention", "explicit", "--fused-adam", "--precision", "bf16", "--cudnn-attention",
                           "--timing", "step"], ["--set", "model.attention=explicit"]):
            result = _run(data_root, *TINY, "--steps", "2", "--warmup-steps", "1", "--peak-tflops", "0.5",
                          "--pairs", "50000", "--out", str(out), *extra)
            assert result.returncode == 0, result.stderr[-3000:]
    finally:
        torch.backends.cuda.enable_cudnn_sdp(cudnn_attention)
    plain, switched, set_so = [json.loads(line) for line in out.read_text().splitlines()]
    assert set_so["settings"]["attention"] == "explicit"  # the model's setting as --set gives it (before: sdpa ran)
    assert switched["settings"]["cudnn_attention"] is True  # what the kernel's switch was while it ran

    assert plain["settings"]["attention"] == "sdpa" and switched["settings"]["attention"] == "explicit"
    assert switched["settings"]["fused_adam"] and switched["settings"]["precision"] == "bf16"
    assert plain["model"] == {"name": "small", "n_layers": 1, "d_model": 32, "d_ff": 64, "n_heads": 2, "d_k": 16,
                              "d_v": 16}
    assert plain["machine"]["cores"] == os.cpu_count() and plain["commit"] and plain["date"].startswith("20")
    assert plain["device"] == "cpu" and plain["threads"] == 1
    for record in (plain, switched):
        assert record["timed_steps"] == 2 and len(record["losses"]) == 3
        assert all(math.isfinite(loss) and 4 < loss < 8 for loss in record["losses"])  # ln 500 ≈ 6.2
        step = record["step_seconds"]
        if record["settings"]["timing"] == "step":  # a wait after every step: each step's own time
            assert 0 < step["min"] <= step["median"] <= step["max"]
        else:  # one wait around the steps: their mean alone (before: recorded as median, min and max too)
            assert list(step) == ["mean"] and step["mean"] > 0
        # Target tokens per second is the tokens of the timed steps over their summed time.
        assert record["tgt_tokens_per_s"] == pytest.approx(record["tgt_tokens_per_step"] / step["mean"])
        assert 0 < record["tgt_tokens_per_step"] <= 1024
        assert record["peak_tflops"] == 0.5 and record["peak_tflops_source"] == "given"
        assert record["mfu"] == pytest.approx(record["achieved_tflops"] / 0.5)
        assert record["achieved_tflops"] == pytest.approx(record["train_flops_per_step"] / step["mean"] / 1e12)
        assert record["peak_memory_mb"] > 50
    # The same batches and the same initial weights: the first losses agree to bf16 precision.
    assert switched["losses"][0] == pytest.approx(plain["losses"][0], rel=2e-2)
    padding = plain["padding"]
    assert padding["sentences"] == plain["settings"]["pairs"] == 50_000  # newstest2014's lengths, drawn
    assert 0 < padding["sampler"] < padding["corpus_order"] < 1
    assert padding["sampler_batches"] < padding["corpus_order_batches"]


def test_a_compiled_step_is_warmed_up_on_every_batch_shape_it_times(batches) -> None:
    """Length buckets leave a few batch shapes, and a compiled step compiles (and records a CUDA
    graph) once for each: the warm-up takes one batch of every shape the timed and profiled steps
    take beyond its own, so that no compilation falls in the timed block (before: 10 warm-up
    steps, with shapes still new in the 40 timed after them). The eager step keeps its count."""
    def batch(rows: int, src: int, tgt: int) -> dict:
        return {"src": torch.zeros(rows, src), "tgt_in": torch.zeros(rows, tgt), "tgt_out": torch.zeros(rows, tgt)}

    made = [batch(4, 16, 16), batch(4, 16, 16), batch(2, 32, 32), batch(4, 16, 16), batch(1, 64, 32),
            batch(2, 32, 32), batch(1, 64, 64)]
    def same(found: list, indices: list[int]) -> bool:
        return len(found) == len(indices) and all(a is made[i] for a, i in zip(found, indices))

    assert same(batches.warm_up_batches(made, 2, compiled=False), [0, 1])
    warm = batches.warm_up_batches(made, 2, compiled=True)
    assert same(warm, [0, 1, 2, 4, 6])
    assert {batches.shapes(b) for b in made} == {batches.shapes(b) for b in warm}
    # Replayed as CUDA graphs, each shape runs twice first: torch's CUDA graph trees run a new
    # shape eagerly, then record its graph (before: the recording fell in the first timed step).
    assert same(batches.warm_up_batches(made, 1, compiled=True, graphs=True), [0, 1, 2, 2, 4, 4, 6, 6])
    assert same(batches.warm_up_batches(made, 2, compiled=True, graphs=True), [0, 1, 2, 2, 4, 4, 6, 6])


def test_padding_of_the_sampler_and_of_corpus_order(batches, data_root: Path) -> None:
    src_words, tgt_words = batches.sentence_lengths(data_root, None, 1.3)
    corpus = batches.synthetic_corpus(src_words, tgt_words, vocab_size=100, seed=0)
    src, tgt = np.asarray(corpus.src_lengths), np.asarray(corpus.tgt_lengths)
    assert [len(ids) + 1 for _, ids, _ in (corpus[i] for i in range(5))] == src[:5].tolist()
    sampler = TokenBatchSampler(src, tgt, 2000, shuffle=True, seed=0, num_replicas=1, rank=0)
    # The benchmark's count of padding agrees with the sampler's own.
    assert batches.padding_fraction(list(sampler), src, tgt) == pytest.approx(sampler.padding_fraction)

    naive = batches.corpus_order_batches(src, tgt, 2000)
    assert [index for batch in naive for index in batch] == list(range(len(src)))  # corpus order, all of it
    assert all(len(batch) * max(max(src[batch]), max(tgt[batch])) <= 2000 for batch in naive)
    # Greedy: the next sentence would not have fitted.
    assert all((len(a) + 1) * max(max(src[a + b[:1]]), max(tgt[a + b[:1]])) > 2000 for a, b in itertools.pairwise(naive))
    assert batches.padding_fraction(naive, src, tgt) > 2 * sampler.padding_fraction


def test_batches_of_the_steps_size_are_cut_from_a_pool_as_dense_as_a_training_corpus(batches, data_root: Path) -> None:
    """25,000-token batches over newstest2014's 3,003 pairs span a third of their lengths (six
    batches, about 30% padding); drawn with replacement to a million pairs, as the benchmark's
    default, they hold sentences of about one length, as batches of WMT's 4.5M pairs do."""
    lengths = batches.sentence_lengths(data_root, None, 1.3)
    assert batches.resampled(*lengths, 0, seed=0) == lengths

    def padding(pairs: int) -> float:
        src, tgt = (np.asarray(side) + 1 for side in batches.resampled(*lengths, pairs, seed=0))
        return TokenBatchSampler(src, tgt, 25_000, shuffle=True, seed=0, num_replicas=1, rank=0).padding_fraction

    drawn = batches.resampled(*lengths, 1_000_000, seed=0)
    assert len(drawn[0]) == 1_000_000 and set(zip(*drawn)) <= set(zip(*lengths))  # pairs of newstest2014's
    assert padding(0) > 0.2 and padding(1_000_000) < 0.02


def test_model_configs_are_composed_as_hydra_does(bench) -> None:
    big = bench.load_model_config("big", ["model.dropout=0.1"])
    # big.yaml's own sizes over base.yaml's, the override over both; the network's arguments only.
    assert (big["n_layers"], big["d_model"], big["d_ff"], big["n_heads"]) == (6, 1024, 4096, 16)
    assert big["dropout"] == 0.1 and big["attention"] == "sdpa" and big["_target_"] == "aiayn.model.Transformer"
    assert "label_smoothing" not in big and "train_steps" not in big
    with pytest.raises(SystemExit, match="--model huge: no such model config .*name one of base, big"):
        bench.load_model_config("huge", [])
    with pytest.raises(SystemExit, match="expected model.KEY=VALUE"):
        bench.load_model_config("base", ["d_model=8"])
