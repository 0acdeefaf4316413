"""A trained checkpoint served four ways on the CPU: aiayn itself, its Hugging Face MarianMT export
(``generate``), and its CTranslate2 export in float32 and int8: sacreBLEU and sentences/s on
Multi30k test2016 (or ``--sentences`` of it), beam 4, α 0.6, input length + 50.

    OMP_NUM_THREADS=1 taskset -c 1 .venv/bin/python benchmarks/export_speed.py --checkpoint FILE \
        [--sentences N] [--threads 1] [--out-dir DIR] [--results FILE]

Each engine gets ``--threads`` threads (torch's and CTranslate2's intra-op threads; pin the process
with taskset so that they are the cores measured). Sentences go in batches of 64, sorted by length
(aiayn's Translator and CTranslate2 sort themselves; Marian's batches are sorted here). The
exports are written by the same code as src/export.py. Marian and CTranslate2 normalise beam
scores by |Y|^α, aiayn by GNMT's ((5 + |Y|) / 6)^α, so their outputs may differ slightly:
``identical_to_aiayn`` counts the sentences translated exactly as aiayn does. Appends one JSON line
per engine (machine, date, commit) to benchmarks/results/export_speed.jsonl and prints a table.
A benchmark, not a test: nothing here asserts a figure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch

from aiayn.checkpoints.trained import load_trained
from aiayn.data.readers import read_lines
from aiayn.decoding.settings import Decoding
from aiayn.decoding.translator import translate
from aiayn.metrics.bleu import sacrebleu_score

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/, when imported from elsewhere
import _common

RESULTS = _common.REPO / "benchmarks" / "results" / "export_speed.jsonl"
# §6.1's beam 4, α 0.6, input + 50: the decoding settings' defaults (aiayn.config.schemas.DecodingConfig).
SEARCH = {key: Decoding.of().settings()[key] for key in ("beam_size", "alpha", "max_len_offset")}
BATCH = 64


def marian_translate(folder: Path, sentences: list[str]) -> tuple[list[str], float]:
    """Marian ``generate`` over length-sorted batches; the translations in input order and the seconds."""
    from transformers import MarianMTModel, MarianTokenizer

    model = MarianMTModel.from_pretrained(str(folder)).eval()
    tokenizer = MarianTokenizer.from_pretrained(str(folder))
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
    texts = [""] * len(sentences)
    started = time.perf_counter()
    with torch.no_grad():
        for start in range(0, len(order), BATCH):
            rows = order[start : start + BATCH]
            batch = tokenizer([sentences[i] for i in rows], return_tensors="pt", padding=True)
            longest = int(batch["attention_mask"].sum(-1).max())
            out = model.generate(**batch, num_beams=SEARCH["beam_size"], length_penalty=SEARCH["alpha"],
                                 max_new_tokens=longest + SEARCH["max_len_offset"], do_sample=False)
            for i, text in zip(rows, tokenizer.batch_decode(out, skip_special_tokens=True)):
                texts[i] = text
    return texts, time.perf_counter() - started


def ctranslate2_translate(folder: Path, sentences: list[str], threads: int) -> tuple[list[str], float]:
    from aiayn.decoding.ctranslate2 import CTranslate2Translator

    translator = CTranslate2Translator(folder, batch_size=BATCH, threads=threads, **SEARCH)
    texts = [text for ready in translator.stream([sentences]) for text in ready]
    return texts, translator.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, type=Path)
    parser.add_argument("--sentences", type=int, default=None, help="the first N of test2016 (default: all 1,000)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out-dir", type=Path, default=None, help="where the exports go (default: a scratch folder)")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from aiayn.export.ctranslate2 import export_ctranslate2
    from aiayn.export.huggingface import export_huggingface

    data = _common.data_root() / "multi30k"
    sources = read_lines(data / "test_2016_flickr.en.gz")[: args.sentences]
    references = read_lines(data / "test_2016_flickr.de.gz")[: args.sentences]
    trained = load_trained(args.checkpoint, "cpu")
    scratch = tempfile.TemporaryDirectory(prefix="aiayn-export-speed-")
    out_dir = args.out_dir or Path(scratch.name)
    steps = [trained.step]
    folders = {"hf": export_huggingface(trained, out_dir / "hf", ckpt=args.checkpoint, steps=steps),
               "ct2": export_ctranslate2(trained, out_dir / "ct2", ckpt=args.checkpoint, steps=steps),
               "ct2_int8": export_ctranslate2(trained, out_dir / "ct2_int8", ckpt=args.checkpoint, steps=steps,
                                              quantization="int8")}

    def aiayn_translate() -> tuple[list[str], float]:
        result = translate(trained.model, trained.vocab, sources, SEARCH, batch_size=BATCH)
        return result.texts, result.seconds

    engines = {
        "aiayn": aiayn_translate,
        "hf_marian_generate": lambda: marian_translate(folders["hf"], sources),
        "ctranslate2_float32": lambda: ctranslate2_translate(folders["ct2"], sources, args.threads),
        "ctranslate2_int8": lambda: ctranslate2_translate(folders["ct2_int8"], sources, args.threads),
    }
    common = {"date": _common.now(), "commit": _common.commit(), "machine": _common.machine(),
              "peers": _common.peer_versions(), "torch": torch.__version__, "threads": args.threads,
              "checkpoint": str(args.checkpoint),
              "step": trained.step, "test_set": "multi30k test_2016_flickr en-de", "sentences": len(sources),
              **SEARCH, "batch_size": BATCH}
    records, ours = [], None
    for name, run in engines.items():
        texts, seconds = run()
        ours = texts if ours is None else ours
        bleu = sacrebleu_score(texts, references)
        records.append({**common, "engine": name, "sacrebleu": round(bleu.score, 2), "bleu_signature": bleu.signature,
                        "seconds": round(seconds, 2), "sentences_per_s": round(len(sources) / seconds, 2),
                        "identical_to_aiayn": sum(a == b for a, b in zip(texts, ours))})
        print(f"{name}: BLEU {bleu.score:.2f}, {len(sources) / seconds:.1f} sentences/s", file=sys.stderr, flush=True)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    with args.results.open("a", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    base = records[0]["sentences_per_s"]
    print("| engine | sacreBLEU | sentences/s | × aiayn | identical to aiayn |\n| --- | --- | --- | --- | --- |")
    for record in records:
        print(f"| {record['engine']} | {record['sacrebleu']:.1f} | {record['sentences_per_s']:.1f} | "
              f"{record['sentences_per_s'] / base:.1f} | {record['identical_to_aiayn']}/{len(sources)} |")
    scratch.cleanup()


if __name__ == "__main__":
    main()
