"""A corpus of one's own (``task=parallel_text``): what a process pays to start training on it.

    .venv/bin/python benchmarks/own_corpus_data.py [--copies 20 50] [--workdir DIR]

Builds a corpus folder in fairseq's layout from the shared WMT14 slice (its 10,000 real EN-DE
pairs repeated ``--copies`` times as ``train.{en,de}.gz``; newstest2013/2014 as valid and test),
then measures, each in a fresh process (so that its memory is its own):

- ``prepare``: the training split prepared once (read, subwords learnt, pairs encoded into arrays;
  ``prepare_workers`` processes), as the first run or ``prepare.py`` pays;
- ``mapped``: ``setup("fit")`` of every later process (each DDP rank, each later run): the
  preparation checked, the arrays mapped, the training batches built;
- ``read_whole``: the same with the training split read and encoded in the process, as the data
  module did before the preparation existed (and as Multi30k's still does), for comparison.

For each: wall seconds and peak resident memory (private and file-backed). Appends one JSON line
per size to benchmarks/results/own_corpus_data.jsonl. A benchmark, not a test: nothing here
asserts a figure.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, append_record, commit, data_root, machine, memory_mib, now

RESULTS = REPO / "benchmarks" / "results" / "own_corpus_data.jsonl"
PEAK = ("VmHWM", "RssAnon", "RssFile")  # the peak resident memory, and the current private and file-backed


def make_corpus(folder: Path, data_root: Path, copies: int) -> int:
    """The corpus folder (see the module); returns its training pairs."""
    wmt = data_root / "wmt14"
    folder.mkdir(parents=True)
    count = 0
    for name, source in (("train.en.gz", "src-train.txt.gz"), ("train.de.gz", "tgt-train.txt.gz")):
        data = gzip.decompress((wmt / "train_sample" / source).read_bytes())
        count = data.count(b"\n") * copies
        with gzip.open(folder / name, "wb", compresslevel=1) as handle:
            for _ in range(copies):
                handle.write(data)
    for split, stem in (("valid", "newstest2013"), ("test", "newstest2014-en-de")):
        for lang in ("en", "de"):
            shutil.copyfile(wmt / f"{stem}.{lang}", folder / f"{split}.{lang}")
    return count


def measure(kind: str, corpus: Path, cache: Path, vocab_size: int, workers: int) -> dict:
    """In this (fresh) process: ``kind`` of the module's docstring."""
    import torch

    from aiayn.data.datamodule import TranslationDataModule
    from aiayn.data.parallel_text import ParallelTextDataModule

    class ReadWhole(ParallelTextDataModule):  # the training split read and encoded here, as before
        prepare_data = TranslationDataModule.prepare_data
        load_vocab = TranslationDataModule.load_vocab
        check_contents = TranslationDataModule.check_contents
        _load = TranslationDataModule._load

    torch.set_num_threads(1)
    kind_class = ReadWhole if kind == "read_whole" else ParallelTextDataModule
    module = kind_class(str(corpus), "en", "de", vocab_size=vocab_size, max_tokens=3400, cache_dir=str(cache),
                        prepare_workers=workers)
    imported = memory_mib(*PEAK)
    started = time.perf_counter()
    if kind == "prepare":
        module.prepare_data()
    else:
        module.setup("fit")
        module.train_dataloader()
    seconds = time.perf_counter() - started
    return {"seconds": round(seconds, 2), "rss_mib_imported": imported, "rss_mib_after": memory_mib(*PEAK)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--copies", type=int, nargs="+", default=[20, 50], help="copies of the 10,000-pair slice")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--data-root", type=Path, default=data_root())
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--measure", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        kind, corpus, cache, vocab, workers = args.measure
        print(json.dumps(measure(kind, Path(corpus), Path(cache), int(vocab), int(workers))))
        return
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        for copies in args.copies:
            corpus, cache = Path(tmp) / f"corpus-{copies}", Path(tmp) / f"cache-{copies}"
            pairs = make_corpus(corpus, args.data_root, copies)
            record = {"date": now(), "commit": commit(), "pairs": pairs, "vocab_size": args.vocab_size,
                      "workers": args.workers}
            for kind in ("prepare", "mapped", "read_whole"):
                command = [sys.executable, __file__, "--measure", kind, str(corpus), str(cache), str(args.vocab_size),
                           str(args.workers)]
                output = subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout
                record[kind] = json.loads(output.strip().splitlines()[-1])
            record["machine"] = machine()
            print(json.dumps(record), flush=True)
            append_record(args.results, record)


if __name__ == "__main__":
    main()
