"""Decoding speed with and without the decoder self-attention key/value cache (§6.1 settings).

    .venv/bin/python benchmarks/decode_speed.py [--model base] [--sentences N] [--cache both|on|off]
        [--device cpu|cuda] [--checkpoint FILE] [--max-tokens 2000] [--out FILE]

Beam search as the paper decodes (beam 4, α 0.6, maximum output length = input length + 50) over
the English source of newstest2014 (3,003 sentences, $AIAYN_DATA_ROOT/wmt14/newstest2014-en-de.en),
batched by source tokens with the repo's TokenBatchSampler. Reports sentences/s and generated
subword tokens/s (EOS not counted) for each cache setting and appends one JSON line each to
benchmarks/results/decode_speed.jsonl. With both settings it also checks that the outputs agree.

The sentences are turned into subwords by a joint BPE model learnt with aiayn.data.subwords on
the WMT slice of the shared data (newstest2013 en/de and the 10,000-pair training sample),
``--subword-vocab`` ids (default 8,000: that slice is too small for the paper's 37k). A smaller
vocabulary splits words into more pieces, so inputs are somewhat longer than under a 37k model:
the measure errs towards more work. The model itself has ``--vocab-size`` ids (default 37,000,
the paper's, which sets the cost of the output projection). With ``--checkpoint`` the trained
model and its own subword model are used instead.

Random weights (the default) almost never emit EOS, so every output runs to its maximum length:
``outputs_at_max_length`` in the record says so, and the figures are the worst case per
sentence (about input length + 50 tokens each, where a real en→de translation has about as many
subwords as its source). A trained ``--checkpoint`` measures realistic output lengths. A
benchmark, not a test: nothing here asserts a figure.
"""

from __future__ import annotations

import argparse
import datetime
import html
import json
import os
import sys
import time
from pathlib import Path

import torch

from aiayn.config.schemas import network_arguments
from aiayn.data.batching import TokenBatchSampler
from aiayn.data.corpus import TranslationCollator
from aiayn.data.readers import read_lines
from aiayn.data.subwords import Subwords, train_or_load
from aiayn.decoding.settings import Decoding
from aiayn.model import Transformer, beam_search

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/, when imported from elsewhere
import _common
from _model_configs import load_model_config  # one reading of conf/model/*.yaml and --set

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "decode_speed.jsonl"


# ----------------------------------------------------------------------------- machine and commit


def machine() -> dict[str, object]:
    """benchmarks/_common.py's machine record, with torch's version and threads, and the GPU if
    one is used."""
    found = _common.machine()
    found |= {"torch": torch.__version__, "torch_threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        found["gpu"] = torch.cuda.get_device_name()
    return found


commit = _common.commit


# ------------------------------------------------------------------------------ data and model


def wmt_subwords(vocab_size: int) -> Subwords:
    """A joint BPE model of ``vocab_size`` ids learnt on the WMT slice of the shared data (cached
    in $AIAYN_CACHE_DIR like the training runs' models)."""
    wmt = _common.data_root() / "wmt14"
    lines = read_lines(wmt / "newstest2013.en") + read_lines(wmt / "newstest2013.de")
    for name in ("src-train.txt.gz", "tgt-train.txt.gz"):  # Moses-escaped (&apos; …): unescape
        lines += [html.unescape(line) for line in read_lines(wmt / "train_sample" / name)]
    cache = os.environ.get("AIAYN_CACHE_DIR") or Path.home() / ".cache" / "aiayn"
    return train_or_load(lines, vocab_size, cache)


def newstest2014(side: str = "en") -> list[str]:
    return read_lines(_common.data_root() / "wmt14" / f"newstest2014-en-de.{side}")


def build_model(args, vocab: Subwords | None = None) -> tuple[Transformer, Subwords, dict]:
    """The model to decode with and the subword model for its inputs: a trained checkpoint, or
    conf/model/<args.model> with random weights (seeded) and the WMT-slice subwords."""
    if args.checkpoint:
        from aiayn.checkpoints.trained import load_trained

        trained = load_trained(args.checkpoint, args.device)
        sizes = {"checkpoint": str(args.checkpoint), "step": trained.step}
        return trained.model.eval(), trained.vocab, sizes
    vocab = vocab or wmt_subwords(args.subword_vocab)
    if args.vocab_size < vocab.vocab_size:
        sys.exit(f"--vocab-size {args.vocab_size} is smaller than the subword model's {vocab.vocab_size} ids")
    config = network_arguments(load_model_config(args.model, args.set))  # conf/model/<args.model> with --set
    torch.manual_seed(args.seed)
    model = Transformer(args.vocab_size, args.vocab_size, pad_id=vocab.pad_id, **config)
    sizes = {"model": args.model, **config, "vocab_size": args.vocab_size,
             "parameters": sum(p.numel() for p in model.parameters())}
    return model.to(args.device).eval(), vocab, sizes


def source_batches(ids: list[list[int]], max_tokens: int, vocab: Subwords) -> list[torch.Tensor]:
    """Right-padded source batches (ids + EOS) of similar lengths, at most ``max_tokens`` padded
    source tokens each (TokenBatchSampler; the target side is not known, so it uses the source's)."""
    lengths = [len(seq) + 1 for seq in ids]
    sampler = TokenBatchSampler(lengths, lengths, max_tokens, shuffle=False, num_replicas=1, rank=0,
                                pad_to_equal=False)
    collate = TranslationCollator(vocab.pad_id, vocab.bos_id, vocab.eos_id)
    return [collate([(i, ids[i], []) for i in batch])["src"] for batch in sampler]


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# ------------------------------------------------------------------------------------- measure


def measure(model: Transformer, batches: list[torch.Tensor], vocab: Subwords, args, kv_cache: bool) -> tuple[dict, list]:
    """Beam-search every batch once (after one untimed warm-up batch); speed and output lengths."""
    settings = {"bos_id": vocab.bos_id, "eos_id": vocab.eos_id, "beam_size": args.beam_size, "alpha": args.alpha,
                "max_len_offset": args.max_len_offset, "kv_cache": kv_cache}
    beam_search(model, batches[0][:2].to(args.device), **settings)  # warm-up: allocator, kernels
    synchronize(args.device)
    outputs, limits, seconds = [], [], 0.0
    for src in batches:
        src = src.to(args.device)
        started = time.perf_counter()
        outputs += beam_search(model, src, **settings)
        synchronize(args.device)
        seconds += time.perf_counter() - started
        limits += ((src != vocab.pad_id).sum(-1) + args.max_len_offset).clamp(max=model.max_positions).tolist()
    sentences, generated = len(outputs), sum(len(h) for h in outputs)
    at_max = sum(len(h) >= limit for h, limit in zip(outputs, limits))
    return {
        "kv_cache": kv_cache, "sentences": sentences, "seconds": round(seconds, 3),
        "sentences_per_second": round(sentences / seconds, 3), "generated_tokens": generated,
        "tokens_per_second": round(generated / seconds, 1), "mean_output_length": round(generated / sentences, 2),
        "outputs_at_max_length": at_max,
    }, outputs


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="base", help="a conf/model/*.yaml name (default base)")
    parser.add_argument("--set", action="append", default=[], metavar="model.KEY=VALUE",
                        help="override a model setting (repeatable), e.g. --set model.n_layers=1 (CI-sized runs)")
    parser.add_argument("--checkpoint", type=Path, help="a trained checkpoint instead of random weights")
    parser.add_argument("--vocab-size", type=int, default=37000, help="the random model's vocabulary (default 37,000)")
    parser.add_argument("--subword-vocab", type=int, default=8000, help="ids of the BPE model learnt on the WMT slice")
    parser.add_argument("--sentences", type=int, default=None, help="only the first N sentences of newstest2014")
    parser.add_argument("--cache", choices=("both", "on", "off"), default="both", help="the key/value cache setting(s)")
    paper = Decoding.of().settings()  # §6.1's beam 4, α 0.6, input + 50 (aiayn.config.schemas.DecodingConfig)
    parser.add_argument("--beam-size", type=int, default=paper["beam_size"])
    parser.add_argument("--alpha", type=float, default=paper["alpha"])
    parser.add_argument("--max-len-offset", type=int, default=paper["max_len_offset"])
    parser.add_argument("--max-tokens", type=int, default=2000, help="padded source tokens per batch")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS, help="JSON lines file to append to")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    model, vocab, sizes = build_model(args)
    sentences = newstest2014("en")[: args.sentences]
    ids = [seq[: model.max_positions - 1] for seq in vocab.encode(sentences)]
    batches = source_batches(ids, args.max_tokens, vocab)
    base = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": commit(), "machine": machine(),
        "benchmark": "decode_speed", "data": f"newstest2014-en-de.en, first {len(sentences)} sentences",
        "settings": {**sizes, "beam_size": args.beam_size, "alpha": args.alpha, "max_len_offset": args.max_len_offset,
                     "max_tokens": args.max_tokens, "batches": len(batches), "device": args.device,
                     "subwords": str(vocab.path.name), "subword_vocab": vocab.vocab_size,
                     "source_tokens": sum(len(seq) + 1 for seq in ids)},
    }
    records, outputs = [], {}
    for kv_cache in {"both": (True, False), "on": (True,), "off": (False,)}[args.cache]:
        result, outputs[kv_cache] = measure(model, batches, vocab, args, kv_cache)
        records.append({**base, **result})
    if len(outputs) == 2:
        same = outputs[True] == outputs[False]
        for record in records:
            record["same_outputs_with_and_without_cache"] = same
        records[0]["cache_speedup"] = round(records[1]["seconds"] / records[0]["seconds"], 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record) + "\n")
    for record in records:
        print(f"kv_cache={record['kv_cache']!s:5}  {record['sentences']} sentences in {record['seconds']:.1f} s: "
              f"{record['sentences_per_second']:.2f} sentences/s, {record['tokens_per_second']:.0f} tokens/s, "
              f"mean output {record['mean_output_length']} tokens, {record['outputs_at_max_length']} at the maximum length")
    if len(outputs) == 2:
        print(f"cache speed-up {records[0]['cache_speedup']}x; same outputs: {records[0]['same_outputs_with_and_without_cache']}")
    return records


if __name__ == "__main__":
    main()
