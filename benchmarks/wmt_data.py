"""WMT14 data pipeline at scale on a synthetic corpus generated on the fly.

    .venv/bin/python benchmarks/wmt_data.py [--pairs 5000000] [--small 500000] [--workdir DIR]

Writes a synthetic EN-DE raw tree in WMT's archive layout (three training corpora, dev
newstest2013, test newstest2014 as sgm) of ``--pairs`` pairs and one of ``--small`` pairs, then
measures for each:

- preparation (clean, learn the 37k shared BPE model on a sample, encode in parallel, binarise):
  wall time and pairs read per second;
- the training loader in a fresh process (one process, no DataLoader workers, the paper's
  ``max_tokens``): resident memory after opening the corpus and building the batches, and after
  iterating; real (non-pad) source + target tokens per second delivered; padding fraction.

Comparing the two sizes shows what grows with the corpus. Appends one JSON line per size to
benchmarks/results/wmt_data.jsonl. A benchmark, not a test: nothing here asserts a figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, append_record, commit, machine, memory_mib, now

RESULTS = REPO / "benchmarks" / "results" / "wmt_data.jsonl"
LETTERS = np.array(list("abcdefghijklmnopqrstuvwxyzäöüß"))


def _words(rng: np.random.Generator, count: int) -> list[str]:
    lengths = rng.integers(2, 11, count)
    return ["".join(rng.choice(LETTERS[:26] if i % 7 else LETTERS, n)) for i, n in enumerate(lengths)]


def _fragments(rng: np.random.Generator, words: list[str], lengths: np.ndarray) -> list[str]:
    # Zipf-like word frequencies, as natural text has
    weights = 1.0 / np.arange(1, len(words) + 1) ** 1.1
    ids = rng.choice(len(words), int(lengths.sum()), p=weights / weights.sum())
    cuts = np.cumsum(lengths)[:-1]
    return [" ".join(words[i] for i in chunk) for chunk in np.split(ids, cuts)]


def make_raw_tree(root: Path, pairs: int, seed: int = 0, fragments: int = 100_000) -> Path:
    """A synthetic EN-DE raw tree of ``pairs`` training pairs in WMT's archive layout. Each
    sentence joins two random 'fragments' (1-24 words) whose translations have 0.8-1.3 times their
    words, so pairs are distinct and length-correlated; one pair in 1,000 has an empty side."""
    rng = np.random.default_rng(seed)
    fragments = min(fragments, max(100, pairs))
    en_words, de_words = _words(rng, 30_000), _words(rng, 30_000)
    en_len = rng.integers(1, 25, fragments)
    de_len = np.maximum(1, np.round(en_len * rng.uniform(0.8, 1.3, fragments))).astype(np.int64)
    en_frag, de_frag = _fragments(rng, en_words, en_len), _fragments(rng, de_words, de_len)
    layout = (("training/europarl-v7.de-en", 0.4), ("commoncrawl.de-en", 0.4), ("training/news-commentary-v9.de-en", 0.2))
    written = 0
    for number, (stem, share) in enumerate(layout):
        count = pairs - written if number == len(layout) - 1 else int(pairs * share)
        written += count
        (root / stem).parent.mkdir(parents=True, exist_ok=True)
        with open(root / f"{stem}.en", "w", encoding="utf-8") as en, open(root / f"{stem}.de", "w", encoding="utf-8") as de:
            for start in range(0, count, 500_000):
                size = min(500_000, count - start)
                a, b = rng.integers(0, fragments, size), rng.integers(0, fragments, size)
                empty = rng.random(size) < 0.001
                en.write("".join(f"{en_frag[i]} {en_frag[j]}\n" for i, j in zip(a.tolist(), b.tolist())))
                de.write("".join("\n" if e else f"{de_frag[i]} {de_frag[j]}\n" for i, j, e in zip(a.tolist(), b.tolist(), empty.tolist())))
    (root / "dev").mkdir(exist_ok=True)
    (root / "test-full").mkdir(exist_ok=True)
    for lang, frag in (("en", en_frag), ("de", de_frag)):
        (root / "dev" / f"newstest2013.{lang}").write_text("".join(f"{frag[i % len(frag)]}\n" for i in range(1000)), encoding="utf-8")
        role = "src" if lang == "en" else "ref"
        segments = "".join(f'<seg id="{i + 1}">{frag[(1000 + i) % len(frag)]}</seg>\n' for i in range(1000))
        (root / "test-full" / f"newstest2014-deen-{role}.{lang}.sgm").write_text(
            f'<{role}set setid="newstest2014" srclang="any">\n<doc docid="synthetic" genre="news">\n{segments}</doc>\n</{role}set>\n',
            encoding="utf-8")
    return root


def datamodule(raw: Path, cache: Path, vocab_size: int, sample_pairs: int, max_tokens: int, workers: int | None = None):
    from aiayn.data.wmt.datamodule import WMTDataModule

    return WMTDataModule(str(raw), vocab_size=vocab_size, max_tokens=max_tokens, cache_dir=str(cache), download=False,
                         subword_sample_pairs=sample_pairs, prepare_workers=workers)


def bench_prepare(raw: Path, cache: Path, vocab_size: int, sample_pairs: int, workers: int | None = None) -> dict:
    module = datamodule(raw, cache, vocab_size, sample_pairs, 3400, workers)
    started = time.perf_counter()
    module.prepare_data()
    seconds = time.perf_counter() - started
    report = json.loads((module.prepared / "report.json").read_text())
    read = report["cleaning"]["total"]["read"]
    return {"pairs_read": read, "pairs_kept": report["train_pairs"], "prepare_seconds": round(seconds, 1),
            "prepare_pairs_per_second": round(read / seconds), "stages_seconds": report["seconds"],
            "subword_tokens": report["train_subword_tokens"], "vocab_size": vocab_size, "sample_pairs": sample_pairs,
            "workers": report["workers"], "prepared_bytes": sum(p.stat().st_size for p in module.prepared.iterdir())}


def bench_loader(raw: Path, cache: Path, vocab_size: int, sample_pairs: int, max_tokens: int, seconds: float) -> dict:
    """The training loader of an already prepared corpus, in this process: memory and speed."""
    import torch

    import aiayn.data.wmt.datamodule  # noqa: F401  (imports are not the loader's memory)

    torch.set_num_threads(1)
    before = memory_mib()
    started = time.perf_counter()
    module = datamodule(raw, cache, vocab_size, sample_pairs, max_tokens)
    module.setup("fit")
    loader = module.train_dataloader()
    open_seconds = time.perf_counter() - started
    opened = memory_mib()
    tokens = padded = batches = 0
    started = time.perf_counter()
    for batch in loader:
        tokens += int((batch["src"] != 0).sum() + (batch["tgt_out"] != 0).sum())
        padded += batch["src"].numel() + batch["tgt_out"].numel()
        batches += 1
        if time.perf_counter() - started > seconds:
            break
    elapsed = time.perf_counter() - started
    return {"max_tokens": max_tokens, "train_pairs": len(module.dataset("train")), "batches_per_epoch": len(loader),
            "open_seconds": round(open_seconds, 2), "rss_mib_imported": before, "rss_mib_opened": opened,
            "rss_mib_after_iterating": memory_mib(), "batches_timed": batches, "loader_seconds": round(elapsed, 2),
            "real_tokens_per_second": round(tokens / elapsed), "padded_tokens_per_second": round(padded / elapsed),
            "padding_fraction": round(loader.batch_sampler.padding_fraction, 4)}


def run_size(workdir: Path, pairs: int, vocab_size: int, sample_pairs: int, max_tokens: int, seconds: float) -> dict:
    raw, cache = workdir / f"raw-{pairs}", workdir / f"cache-{pairs}"
    started = time.perf_counter()
    if not (raw / "training" / "news-commentary-v9.de-en.de").is_file():
        make_raw_tree(raw, pairs)
    generated = round(time.perf_counter() - started, 1)
    prepare = bench_prepare(raw, cache, vocab_size, sample_pairs)
    # the loader in a fresh process, so that its memory is its own
    command = [sys.executable, __file__, "--loader", str(raw), str(cache), str(vocab_size), str(sample_pairs), str(max_tokens), str(seconds)]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    output = subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout
    loader = json.loads(output.strip().splitlines()[-1])
    return {"pairs": pairs, "generate_seconds": generated, **prepare, "loader": loader}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=5_000_000)
    parser.add_argument("--small", type=int, default=500_000, help="a second, smaller corpus to compare memory with")
    parser.add_argument("--vocab-size", type=int, default=37_000)
    parser.add_argument("--sample-pairs", type=int, default=1_000_000)
    parser.add_argument("--max-tokens", type=int, default=3400)
    parser.add_argument("--seconds", type=float, default=30.0, help="how long to time the loader")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--loader", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.loader:
        raw, cache, vocab, sample, max_tokens, seconds = args.loader
        print(json.dumps(bench_loader(Path(raw), Path(cache), int(vocab), int(sample), int(max_tokens), float(seconds))))
        return
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        for pairs in sorted({args.small, args.pairs}):
            record = {"date": now(), "commit": commit(),
                      **run_size(Path(tmp), pairs, args.vocab_size, args.sample_pairs, args.max_tokens, args.seconds),
                      "machine": machine()}
            print(json.dumps(record), flush=True)
            append_record(args.results, record)


if __name__ == "__main__":
    main()
