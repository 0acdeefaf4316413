"""Part 3 of benchmarks/gpu_suite.py, run by it as a process of its own: beam-search decoding speed
of our search and of CTranslate2 on the same weights, on one device.

    .venv/bin/python benchmarks/_gpu_decode.py --json FILE [--device cuda|cpu] [--quick]
        [--sentences N] [--max-tokens N] [--budget-s S] [--threads N] [--cudnn-attention]

What is decoded: the English source of newstest2014 EN-DE ($AIAYN_DATA_ROOT/wmt14), beam 4, α 0.6,
maximum output length = input length + 50 (§6.1), by the base model with random weights (seeded).
The subwords are a joint BPE of 37,000 ids learnt on the WMT slice of the shared data
(benchmarks/decode_speed.py's wmt_subwords), so that the model's vocabulary, and with it the cost
of the output projection, is the paper's 37k EN-DE one and the CTranslate2 export (whose
vocabulary must be the model's) speaks it. --quick: a one-layer 32-wide model and 1,000 ids.

Engines, one after another over the same batches (TokenBatchSampler, ``--max-tokens`` padded
source tokens each, in a seeded shuffled order so that a cut-off run is a fair sample):
``ours_fp32`` and ``ours_bf16`` (aiayn.model.beam_search; bf16 through
aiayn.decoding.speed.for_decoding), then CTranslate2 on the model exported as src/export.py
exports it (aiayn.export.ctranslate2), computing in float32, bfloat16 and float16 where it
supports them on the device. Each gets one untimed warm-up batch. Figures: sentences/s,
generated tokens/s (EOS not counted), outputs at their maximum length, outputs identical to
ours_fp32, and peak memory: torch.cuda.max_memory_allocated for ours, and for CTranslate2 the
device memory in use above what it was before its translator loaded (sampled every 10 ms).

Random weights almost never emit EOS, so every output runs to its maximum length
(``outputs_at_max_length`` says so): the worst case per sentence, but the same work for every
engine. CTranslate2 takes one maximum length per search, so aiayn's engine searches a batch's
sentences in groups of one limit each (aiayn.decoding.ctranslate2: each output within its own
limit, as ours), several calls a batch; it normalises scores by |Y|^α where we use GNMT's
((5 + |Y|) / 6)^α (the two rank hypotheses of one length alike):
``identical_ours_fp32_ctranslate2_float32`` counts the outputs that agree.

Time: after the setup (subwords, model, export), ``ours_fp32`` decodes batches while it has used
less than its share of ``--budget-s``; the batches it reached are then every engine's, and any
engine stops early when the budget is spent. The JSON file is rewritten after every engine, so a
run killed from outside still leaves what it finished.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import decode_speed  # subwords, data, model and machine helpers

from aiayn.checkpoints.trained import TrainedModel
from aiayn.data.batching import TokenBatchSampler
from aiayn.data.corpus import TranslationCollator
from aiayn.decoding.settings import Decoding
from aiayn.decoding.speed import for_decoding
from aiayn.files import atomic_write_text
from aiayn.model import beam_search

# §6.1's beam 4, α 0.6, input + 50: the decoding settings' defaults (aiayn.config.schemas.DecodingConfig).
SEARCH = {key: Decoding.of().settings()[key] for key in ("beam_size", "alpha", "max_len_offset")}
FULL = {"model": "base", "set": [], "vocab": 37000}
QUICK = {"model": "small", "vocab": 1000, "sentences": 16,
         "set": ["model.n_layers=1", "model.d_model=32", "model.d_ff=64", "model.n_heads=2", "model.d_k=16",
                 "model.d_v=16"]}
CT2_TYPES = ("float32", "bfloat16", "float16")


def batches_of(ids: list[list[int]], max_tokens: int, vocab, seed: int = 0) -> list[tuple[list[int], torch.Tensor]]:
    """(sentence indices, right-padded source ids + EOS) per batch, in a seeded shuffled order."""
    lengths = [len(seq) + 1 for seq in ids]
    sampler = TokenBatchSampler(lengths, lengths, max_tokens, shuffle=False, num_replicas=1, rank=0,
                                pad_to_equal=False)
    collate = TranslationCollator(vocab.pad_id, vocab.bos_id, vocab.eos_id)
    batches = [(list(rows), collate([(i, ids[i], []) for i in rows])["src"]) for rows in sampler]
    random.Random(seed).shuffle(batches)
    return batches


def cublas_for_ctranslate2() -> str:
    """CTranslate2's wheels open libcublas.so.12 when they first multiply on a GPU; torch's CUDA
    build brings its cuBLAS as a pip package outside the loader's path. Load it first (already
    loaded with torch's cu12 build); say where it came from."""
    try:
        ctypes.CDLL("libcublas.so.12", mode=ctypes.RTLD_GLOBAL)
        return "libcublas.so.12 (loader path or torch)"
    except OSError:
        pass
    for root in sys.path:
        for path in sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib", "libcublas.so.12*"))):
            try:
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                return path
            except OSError:
                continue
    return "libcublas.so.12 not found: CTranslate2 on the GPU may fail"


def device_bytes_used() -> int:
    """The CUDA device's memory in use, by every process and library (not torch's allocator alone)."""
    free, total = torch.cuda.mem_get_info()
    return total - free


class DevicePeak:
    """The most device memory in use while the block runs, above what it was when it began
    (torch.cuda.mem_get_info every 10 ms; covers memory that torch's allocator does not see)."""

    def __init__(self, device: str, base: int | None = None):
        self.cuda = device.startswith("cuda")
        self.peak_mb = None
        self.base = base  # bytes in use to count from (None: when the block begins)

    def __enter__(self):
        if self.cuda:
            self.base = device_bytes_used() if self.base is None else self.base
            self.high, self.done = 0, threading.Event()
            self.thread = threading.Thread(target=self._poll, daemon=True)
            self.thread.start()
        return self

    def _poll(self) -> None:
        while not self.done.wait(0.01):
            self.high = max(self.high, device_bytes_used())

    def __exit__(self, *exc) -> None:
        if self.cuda:
            self.done.set()
            self.thread.join()
            self.peak_mb = round((max(self.high, device_bytes_used()) - self.base) / 2**20, 1)


def run_engine(name, decode, batches, limits, device, deadline, base=None) -> tuple[dict, dict]:
    """Decode ``batches`` with ``decode`` (rows, src) → outputs until done or ``deadline``; the
    engine's figures and its outputs by sentence index. ``base``: the device's bytes in use before
    a CTranslate2 engine was made, which its peak is counted from (its weights with it)."""
    cuda = device.startswith("cuda")
    decode(*(part[:2] for part in batches[0]))  # warm-up: allocator, kernels, CTranslate2's first call
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    outputs, seconds = {}, 0.0
    with DevicePeak(device if name.startswith("ctranslate2") else "cpu", base) as peak:
        for rows, src in batches:
            if time.monotonic() > deadline:
                break
            started = time.perf_counter()
            hypotheses = decode(rows, src)
            if cuda:
                torch.cuda.synchronize()
            seconds += time.perf_counter() - started
            outputs.update(zip(rows, hypotheses))
    generated = sum(map(len, outputs.values()))
    figures = {"sentences": len(outputs), "seconds": round(seconds, 3),
               "sentences_per_s": round(len(outputs) / seconds, 2) if seconds else None,
               "generated_tokens": generated, "tokens_per_s": round(generated / seconds, 1) if seconds else None,
               "outputs_at_max_length": sum(len(h) >= limits[i] for i, h in outputs.items())}
    if name.startswith("ctranslate2"):
        figures["peak_memory_mb"] = peak.peak_mb
    elif cuda:
        figures["peak_memory_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
    return figures, outputs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, required=True, help="where the result goes (rewritten as it grows)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="a tiny model, 1,000 ids, 16 sentences")
    parser.add_argument("--sentences", type=int, default=None, help="only the first N sentences (default: all 3,003)")
    parser.add_argument("--max-tokens", type=int, default=None, help="padded source tokens per batch "
                        "(default 8,000 on CUDA, 2,000 on CPU, 300 with --quick)")
    parser.add_argument("--budget-s", type=float, default=120.0, help="seconds this part may take in all")
    parser.add_argument("--threads", type=int, default=None, help="torch's and CTranslate2's CPU threads")
    parser.add_argument("--cudnn-attention", action="store_true",
                        help="turn SDPA's cuDNN kernel back on once the model is built (the model keeps it off)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    started = time.monotonic()
    deadline = started + args.budget_s
    sizes = QUICK if args.quick else FULL
    cuda = args.device.startswith("cuda")
    max_tokens = args.max_tokens or (300 if args.quick else 8000 if cuda else 2000)
    result = {"engines": {}, "skipped": {}}

    def save() -> None:  # whole or not at all: the suite may kill this process at its cap, mid-write
        atomic_write_text(args.json, json.dumps(result, indent=1) + "\n")

    vocab = decode_speed.wmt_subwords(sizes["vocab"])
    build = argparse.Namespace(checkpoint=None, model=sizes["model"], set=sizes["set"],
                               vocab_size=sizes["vocab"], seed=0, device="cpu")
    model, vocab, model_sizes = decode_speed.build_model(build, vocab)
    all_sentences = decode_speed.newstest2014("en")
    sentences = all_sentences[: args.sentences or sizes.get("sentences")]
    ids = [seq[: model.max_positions - SEARCH["max_len_offset"] - 1] for seq in vocab.encode(sentences)]
    limits = [len(seq) + 1 + SEARCH["max_len_offset"] for seq in ids]
    batches = batches_of(ids, max_tokens, vocab)
    result.update({
        "data": "newstest2014-en-de.en", "sentences_total": len(all_sentences), "sentences_asked": len(sentences),
        "model": model_sizes, "subwords": vocab.path.name, "subword_vocab": vocab.vocab_size, "search": SEARCH,
        "max_tokens": max_tokens, "batches_total": len(batches), "source_tokens": sum(len(seq) + 1 for seq in ids),
        "random_weights": True,
        "note": "random weights: nearly every output runs to its maximum length (input + 50), the worst case; "
                "the same work for every engine",
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
    })
    scratch = tempfile.TemporaryDirectory(prefix="aiayn-gpu-decode-")
    export_started = time.monotonic()
    try:
        from aiayn.decoding.ctranslate2 import CTranslate2Translator
        from aiayn.export.ctranslate2 import export_ctranslate2

        trained = TrainedModel(model=model, vocab=vocab, decoding=dict(SEARCH), config={}, step=0)
        ct2_folder = export_ctranslate2(trained, Path(scratch.name) / "ct2", steps=[0],
                                        ckpt=Path(scratch.name) / "run" / "checkpoints" / "random.ckpt")
    except Exception as error:  # noqa: BLE001  (a missing package or a converter change: ours still runs)
        ct2_folder, result["skipped"]["ctranslate2"] = None, f"export failed: {type(error).__name__}: {error}"
    result["export_seconds"] = round(time.monotonic() - export_started, 1)
    model = model.to(args.device)
    if args.cudnn_attention:  # after the model is built, which turned it off: a choice of the user's stands
        torch.backends.cuda.enable_cudnn_sdp(True)
    result["cudnn_attention"] = torch.backends.cuda.cudnn_sdp_enabled()
    result["setup_seconds"] = round(time.monotonic() - started, 1)
    save()

    def ours(net):
        return lambda rows, src: beam_search(net, src.to(args.device), bos_id=vocab.bos_id, eos_id=vocab.eos_id,
                                             **SEARCH)

    engines = {"ours_fp32": lambda: ours(model), "ours_bf16": lambda: ours(for_decoding(model, precision="bf16"))}
    if ct2_folder is not None:
        import ctranslate2

        if cuda:
            result["cublas_for_ctranslate2"] = cublas_for_ctranslate2()
        # Without it every CTranslate2 engine fails at its first batch: left out up front, so that ours
        # get the part's time (each engine's share of it counts the engines that run).
        no_cublas = cuda and result["cublas_for_ctranslate2"].startswith("libcublas.so.12 not found")
        where = "cuda" if cuda else "cpu"
        sees_gpu = not cuda or ctranslate2.get_cuda_device_count() > 0
        supported = ctranslate2.get_supported_compute_types(where) if sees_gpu else set()
        for kind in CT2_TYPES:
            if no_cublas:
                result["skipped"][f"ctranslate2_{kind}"] = (
                    f"CTranslate2 {ctranslate2.__version__}'s CUDA 12 wheel opens libcublas.so.12, which this machine "
                    "lacks (torch's CUDA build brings another): not run")
                continue
            if kind not in supported:
                result["skipped"][f"ctranslate2_{kind}"] = (
                    f"CTranslate2 {ctranslate2.__version__} does not compute in {kind} on {where} here" if sees_gpu
                    else f"CTranslate2 {ctranslate2.__version__} sees no CUDA device (its wheel needs the driver's "
                         "libcuda.so.1)")
                continue
            engines[f"ctranslate2_{kind}"] = lambda kind=kind: ct2_engine(
                CTranslate2Translator(ct2_folder, **SEARCH, batch_size=100_000, device="cuda" if cuda else "cpu",
                                      compute_type=kind, threads=0 if cuda else torch.get_num_threads()), ids)
    common, outputs_by = None, {}
    for name, make in engines.items():
        # ours_fp32 settles the batches: as many as fit its share of what is left
        share = (deadline - time.monotonic()) / (2 + 0.5 * (len(engines) - 2))
        decode = None
        try:
            # CTranslate2's memory counted from before its translator loads its weights (ours: torch's peak)
            base = device_bytes_used() if cuda and name.startswith("ctranslate2") else None
            decode = make()
            figures, outputs = run_engine(name, decode, batches if common is None else common, limits, args.device,
                                          time.monotonic() + share if common is None else deadline, base)
        except Exception as error:  # noqa: BLE001  (e.g. CTranslate2 without its CUDA libraries)
            result["skipped"][name] = f"{type(error).__name__}: {str(error)[:300]}"
            save()
            continue
        finally:
            del decode  # frees the engine's weights (a bf16 copy, a CTranslate2 model) before the next
            if cuda:
                torch.cuda.empty_cache()
        if common is None:
            common = [(rows, src) for rows, src in batches if rows[0] in outputs]
            result["sentences"], result["batches"] = len(outputs), len(common)
            result["complete"] = len(outputs) == len(sentences)
        outputs_by[name] = outputs
        reference = outputs_by.get("ours_fp32")
        figures["identical_to_ours_fp32"] = None if reference is None else sum(
            reference.get(i) == hyp for i, hyp in outputs.items())
        result["engines"][name] = figures
        save()
    if {"ours_fp32", "ctranslate2_float32"} <= outputs_by.keys():
        result["identical_ours_fp32_ctranslate2_float32"] = result["engines"]["ctranslate2_float32"][
            "identical_to_ours_fp32"]
    result["seconds"] = round(time.monotonic() - started, 1)
    save()
    scratch.cleanup()


def ct2_engine(translator, ids):
    return lambda rows, src: translator.translate_ids([ids[i] for i in rows])


if __name__ == "__main__":
    main()
