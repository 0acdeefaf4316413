"""Training throughput of a Transformer configuration: target tokens/s, step time, peak memory and
model FLOPs utilisation, with each speed switch on or off.

    .venv/bin/python benchmarks/train_throughput.py --model base [--device cpu|cuda] [--precision fp32|bf16]
        [--attention sdpa|explicit] [--compile [--compile-dynamic] [--compile-mode MODE]] [--no-fused-adam]
        [--fused-loss] [--length-buckets 16,32,...] [--timing block|step] [--vocab-size 37000] [--max-tokens N]
        [--steps 5] [--warmup-steps 2] [--peak-tflops X] [--set model.KEY=VALUE ...] [--out FILE]
        [--profile ROWS]

The batches are what training sees: the sentence lengths of the real newstest2014 EN-DE test set
(``--pair en-fr``: EN-FR's; $AIAYN_DATA_ROOT/wmt14), in subwords, drawn with replacement to ``--pairs``
pairs (1,000,000: batches about as dense as a training corpus's), cut into token-budget batches by the repo's own
TokenBatchSampler (``--max-tokens`` padded tokens per side, as task.datamodule.max_tokens) and
collated by TranslationCollator (with ``--length-buckets``, padded to one shape per bucket, as
task.datamodule.length_buckets does); the token ids are random (the speed of a step does not depend on
them). Subword lengths are the word counts times ``--subwords-per-word``, or the lengths a
sentencepiece model (``--subwords FILE.model``) gives. A timed step is what the training module
does: TranslationModule.training_loss (forward and label-smoothed loss), backward, Adam with the
§5.3 schedule (fused, as optim.fused's default; ``--no-fused-adam``: the per-parameter kernels).
``--timing block`` (the default) waits for the device once before and once after the timed steps,
as training runs (nothing in a step waits for the device), and gives their mean; ``--timing step``
waits after every step, for each step's own time (median, min, max), at the cost of the overlap.

Model FLOPs utilisation = FLOPs counted from the model's shapes (aiayn.reporting.flops, padded
positions included: they are computed) / measured time / the device's peak, given with
``--peak-tflops`` or measured with a large matrix product in the dtype used. Peak memory is the
process's resident-set high-water mark on CPU and torch.cuda.max_memory_allocated on CUDA.
A CUDA record's ``device`` is "cuda" and its ``machine["gpu"]`` the GPU's name (torch.cuda.get_device_name).

Also reports padding waste: the fraction of padded positions (both sides) in the sampler's
batches and in a naive batching of the same sentences in corpus order (same budget, no sorting).

Appends one JSON line per run to benchmarks/results/train_throughput.jsonl (or ``--out``). A
benchmark, not a test: nothing here asserts a figure.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import _time_split
import numpy as np
import torch
from _batches import (
    SUBWORDS_PER_WORD,
    corpus_order_batches,
    drawn_pairs,
    padding_fraction,
    sentence_lengths,
    synthetic_corpus,
    warm_up_batches,
)
from _common import REPO, append_record, commit, data_root, machine, now
from _model_configs import load_model_config

from aiayn.config.schemas import network_arguments
from aiayn.data.batching import TokenBatchSampler
from aiayn.data.corpus import TranslationCollator
from aiayn.data.subwords import BOS_ID, EOS_ID, PAD_ID
from aiayn.reporting.flops import Shapes, training_flops
from aiayn.training.compiling import compile_options
from aiayn.training.module import TranslationModule

RESULTS = REPO / "benchmarks" / "results" / "train_throughput.jsonl"
# The paper's batches: "approximately 25000 source tokens and 25000 target tokens" (§5.1); on a
# CPU that is minutes per step, so the CPU default is a tenth of it.
DEFAULT_MAX_TOKENS = {"cuda": 25000, "cpu": 2500}


def measured_peak_tflops(device: torch.device, dtype: torch.dtype) -> float:
    """The best TFLOPS of a square matrix product in ``dtype`` on ``device``, best of 5 timings. On
    CUDA n = 8192, after one untimed product, each timing 10 products back to back (one product is
    about a millisecond there, too short to time alone). On a CPU n = 2048, or the largest n from
    256 up whose product takes under a quarter of a second: a CPU without bf16 arithmetic (AVX2 alone,
    as AMD's Zen 3) took 2.5 s for one bf16 product of n = 1024 on one thread, and 5 of n = 2048
    took five minutes, far longer than the steps measured."""
    def operands(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(n, n, device=device).to(dtype), torch.randn(n, n, device=device).to(dtype)

    cuda = device.type == "cuda"
    n, repeats = (8192, 10) if cuda else (256, 1)
    a, b = operands(n)
    if cuda:
        a @ b
    while not cuda and n < 2048:
        started = time.perf_counter()
        a @ b
        if time.perf_counter() - started > 0.25 / 8:  # the next n's product: 8 times the work
            break
        n *= 2
        a, b = operands(n)
    best = math.inf
    for _ in range(5):
        _synchronize(device)
        started = time.perf_counter()
        for _ in range(repeats):
            a @ b
        _synchronize(device)
        best = min(best, (time.perf_counter() - started) / repeats)
    return 2 * n**3 / best / 1e12


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def measure(args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device here")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model_config = network_arguments(load_model_config(args.model, args.set))
    model_config["attention"] = args.attention = args.attention or model_config["attention"]  # --set's, unless given
    max_tokens = args.max_tokens or DEFAULT_MAX_TOKENS[device.type]

    src_words, tgt_words = sentence_lengths(Path(args.data_root), args.subwords, args.subwords_per_word, args.pair)
    corpus = synthetic_corpus(src_words, tgt_words, args.vocab_size, args.seed)
    drawn = drawn_pairs(len(corpus), args.pairs, args.seed)  # the pool: newstest2014's pairs, each of its ids
    src_lengths, tgt_lengths = np.asarray(corpus.src_lengths)[drawn], np.asarray(corpus.tgt_lengths)[drawn]
    sampler = TokenBatchSampler(src_lengths, tgt_lengths, max_tokens, shuffle=True, seed=args.seed,
                                num_replicas=1, rank=0, length_buckets=args.length_buckets)
    sampled = list(sampler)
    naive = corpus_order_batches(src_lengths, tgt_lengths, max_tokens)
    collate = TranslationCollator(PAD_ID, BOS_ID, EOS_ID, args.length_buckets, max_tokens)
    total = args.warmup_steps + args.steps
    profiled = 0 if args.profile is None else 1  # one more step after the timed ones, under the profiler
    batches = [collate([corpus[int(drawn[i])] for i in sampled[step % len(sampled)]])
               for step in range(total + profiled)]

    module = TranslationModule(
        model=model_config, vocab_size=args.vocab_size, decoding={}, label_smoothing=0.1,  # ε_ls: loss.label_smoothing
        fused_loss=args.fused_loss,
        optim={"betas": [0.9, 0.98], "eps": 1e-9, "warmup_steps": 4000, "lr_factor": 1.0, "fused": args.fused_adam},
    ).to(device).train()
    if args.compile:
        module.compile_transformer(**compile_options(args.compile_mode), **({"dynamic": True} if args.compile_dynamic else {}))
    if args.cudnn_attention:  # the user's own choice after the model is built stands (aiayn.model.attention)
        torch.backends.cuda.enable_cudnn_sdp(True)
    optimizers = module.configure_optimizers()
    optimizer, scheduler = optimizers["optimizer"], optimizers["lr_scheduler"]["scheduler"]
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    shapes = Shapes.from_config(model_config, args.vocab_size)

    graphs = args.compile and args.compile_mode in ("reduce-overhead", "max-autotune", "cudagraphs")
    on_device = [{key: value.to(device, non_blocking=True) for key, value in batch.items()} for batch in batches]

    def step(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """One training step, waiting for nothing: its loss and target tokens stay on the device."""
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss, n_tokens = module.training_loss(batch)
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach().clone(), n_tokens

    def timed(batch: dict[str, torch.Tensor], label: str) -> tuple[float, torch.Tensor, torch.Tensor]:
        _synchronize(device)
        started = time.perf_counter()
        loss, n_tokens = step(batch)
        _synchronize(device)
        elapsed = time.perf_counter() - started
        print(f"step {label}: {elapsed:.3f} s, {int(n_tokens)} target tokens, loss {float(loss):.3f}", file=sys.stderr)
        return elapsed, loss, n_tokens

    warm = warm_up_batches(on_device, args.warmup_steps, args.compile, graphs)
    losses, counted = [], []
    for index, batch in enumerate(warm):
        _, loss, _ = timed(batch, f"{index + 1}/{len(warm)} (warm-up)")
        losses.append(loss)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    measured = on_device[args.warmup_steps:total]
    if args.timing == "step":
        step_seconds = []
        for index, batch in enumerate(measured):
            elapsed, loss, n_tokens = timed(batch, f"{index + 1}/{len(measured)}")
            step_seconds.append(elapsed)
            losses.append(loss)
            counted.append(n_tokens)
    else:
        _synchronize(device)
        started = time.perf_counter()
        for batch in measured:
            loss, n_tokens = step(batch)
            losses.append(loss)
            counted.append(n_tokens)
        _synchronize(device)
        block = time.perf_counter() - started
        step_seconds = [block / len(measured)] * len(measured)
        print(f"{len(measured)} timed steps: {block:.3f} s", file=sys.stderr)
    split = None
    if args.profile is not None:  # one more step after the timed ones, under the profiler
        split = _time_split.profiled_step(lambda: step(on_device[total]), device, statistics.mean(step_seconds),
                                          args.profile)
    losses = [float(loss) for loss in losses]  # read back now that the timing is done
    tokens = int(sum(int(n) for n in counted))
    flops = sum(training_flops(shapes, *batch["src"].shape, batch["tgt_in"].size(1)) for batch in measured)

    seconds = sum(step_seconds)
    memory = peak_memory_mb(device)  # the steps' (the peak matmul below allocates its own operands)
    peak = args.peak_tflops
    peak_source = "given"
    if peak is None:
        peak, peak_source = measured_peak_tflops(device, dtype), f"measured {args.precision} matmul"
    achieved = flops / seconds / 1e12
    return {
        "date": now(), "commit": commit(), "torch": torch.__version__, "device": device.type,
        "machine": {**machine(), **({"gpu": torch.cuda.get_device_name(device)} if device.type == "cuda" else {})},
        "threads": torch.get_num_threads(),
        "settings": {**{key: value for key, value in vars(args).items() if key not in ("out", "data_root")},
                     "max_tokens": max_tokens,
                     "length_buckets": list(args.length_buckets) if args.length_buckets else None,
                     # SDPA's cuDNN kernel, which the model keeps off (aiayn.model.attention)
                     "cudnn_attention": torch.backends.cuda.cudnn_sdp_enabled()},
        "model": {"name": Path(args.model).stem,
                  **{key: model_config[key] for key in ("n_layers", "d_model", "d_ff", "n_heads", "d_k", "d_v")}},
        "parameters": sum(p.numel() for p in module.model.parameters()),
        "timed_steps": len(step_seconds), "warmup_steps_run": len(warm),  # a compiled step's: one of each shape too
        "tgt_tokens_per_s": tokens / seconds,
        # --timing step: each step's own time; block: their mean alone, which is all one wait measures
        # (before: the mean was recorded as the median, min and max too)
        "step_seconds": {"mean": statistics.mean(step_seconds),
                         **({"median": statistics.median(step_seconds), "min": min(step_seconds),
                             "max": max(step_seconds)} if args.timing == "step" else {})},
        "tgt_tokens_per_step": tokens / len(step_seconds),
        "peak_memory_mb": memory,
        "train_flops_per_step": flops / len(step_seconds),
        "achieved_tflops": achieved,
        "peak_tflops": peak, "peak_tflops_source": peak_source,
        "mfu": achieved / peak,
        "time_split": split,  # --profile: where a step's time goes (benchmarks/_time_split.py)
        "losses": losses,
        "padding": {"sampler": sampler.padding_fraction,  # the rows and lengths that buckets add included
                    "corpus_order": padding_fraction(naive, src_lengths, tgt_lengths),
                    "sampler_batches": len(sampled), "corpus_order_batches": len(naive),
                    "sentences": len(src_lengths)},
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="base", help="conf/model/<name>.yaml, or a model yaml file")
    parser.add_argument("--set", action="append", default=[], metavar="model.KEY=VALUE",
                        help="override a model setting (repeatable)")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"),
                        help="bf16: torch.autocast to bfloat16 around forward and loss, as bf16-mixed does")
    parser.add_argument("--attention", choices=("sdpa", "explicit"),
                        help="the model's attention setting (default: the model config's, sdpa unless --set says)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the Transformer (config: compile)")
    parser.add_argument("--compile-dynamic", action="store_true",
                        help="with --compile: dynamic=True, one compilation for every batch shape (the graph "
                             "training reaches once a second shape has made torch mark the lengths dynamic)")
    parser.add_argument("--cudnn-attention", action="store_true",
                        help="turn SDPA's cuDNN kernel back on after building the model, which keeps it off: "
                             "what keeping it off gains (settings.cudnn_attention in the record)")
    parser.add_argument("--fused-adam", action=argparse.BooleanOptionalAction, default=True,
                        help="torch's fused Adam (config: optim.fused, on by default); --no-fused-adam: the plain one")
    parser.add_argument("--fused-loss", action="store_true",
                        help="the label-smoothed loss with its gradient in one pass (config: loss.fused)")
    parser.add_argument("--compile-mode", default="default",
                        choices=("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs", "cudagraphs"),
                        help="with --compile: torch.compile's mode, or cudagraphs (config: compile_mode)")
    parser.add_argument("--length-buckets", default=None, type=lambda text: tuple(int(n) for n in text.split(",")),
                        help="pad batches to these lengths and rows, e.g. 16,32,48,64,96,128,192,256 "
                             "(config: task.datamodule.length_buckets)")
    parser.add_argument("--timing", default="block", choices=("block", "step"),
                        help="block: one wait for the device around the timed steps (as training runs); "
                             "step: a wait after every step, for each step's time")
    parser.add_argument("--vocab-size", type=int, default=37000)
    parser.add_argument("--max-tokens", type=int, default=None,
                        help=f"padded tokens per batch and side (default {DEFAULT_MAX_TOKENS})")
    parser.add_argument("--steps", type=int, default=5, help="timed steps")
    parser.add_argument("--warmup-steps", type=int, default=2, help="untimed steps first (compilation, allocator)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the device's peak TFLOPS in the dtype used (default: measured with a matmul)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--profile", type=int, default=None, metavar="ROWS",
                        help="after the timed steps, profile one more with torch.profiler: the record's time_split "
                             "(where its time goes, benchmarks/_time_split.py); ROWS > 0 also prints its top ROWS "
                             "operators by own time")
    parser.add_argument("--subwords", default=None, help="a sentencepiece .model to measure subword lengths with")
    parser.add_argument("--subwords-per-word", type=float, default=SUBWORDS_PER_WORD)
    parser.add_argument("--pair", default="en-de", choices=("en-de", "en-fr"),
                        help="whose newstest2014 sentence lengths the batches have (default en-de)")
    parser.add_argument("--pairs", type=int, default=1_000_000,
                        help="sentence pairs the batches are cut from: newstest2014's lengths drawn with replacement "
                             "to this many, so that batches are as dense as a training corpus's (default 1,000,000: "
                             "1.3%% padding at 25,000 tokens; 0: its 3,003 pairs as they are, as records without "
                             "this setting were: 31%%)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-root", default=str(data_root()))
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"JSON lines file to append to (default {RESULTS})")
    args = parser.parse_args(argv)
    if args.pairs < 0:
        parser.error("--pairs must be 0 or more")
    for name in ("vocab_size", "steps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup_steps < 0:
        parser.error("--warmup-steps must be 0 or more")
    if args.compile_dynamic and not args.compile:
        parser.error("--compile-dynamic goes with --compile")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    record = measure(args)
    append_record(args.out, record)
    shown = {key: record[key] for key in ("tgt_tokens_per_s", "step_seconds", "peak_memory_mb", "achieved_tflops",
                                          "peak_tflops", "mfu", "padding")}
    print(json.dumps({"model": record["model"]["name"], **record["settings"], **shown}, indent=2))


if __name__ == "__main__":
    main()
