"""The two stopping rules of beam search side by side on a trained model: ``decoding.stop=paper``
(tensor2tensor's bound, the default) and ``first_k`` (stop once ``beam`` hypotheses finished).

    taskset -c 1 .venv/bin/python benchmarks/stopping_rule.py --checkpoint FILE \\
        [--test-set multi30k|newstest2014] [--sentences 500] [--batch-size 128] [--int8]

Decodes the test set's first ``--sentences`` (test2016: all 1,000) in batches of ``--batch-size``
length-sorted sentences with each rule, the rules alternating batch by batch (a busy machine slows
both alike), one torch thread. Reports, per rule, sentences/s over the set and the median of the
batches', hypothesis-steps per sentence (rows fed to the decoder, summed over steps), output
tokens, sacreBLEU, chrF2 and how many outputs the two rules share. Appends one JSON line per rule
to benchmarks/results/stopping_rule.jsonl. A benchmark, not a test: nothing here asserts a figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common
import decode_speed

from aiayn.checkpoints.trained import load_trained
from aiayn.data.corpus import TranslationCollator
from aiayn.data.readers import read_lines
from aiayn.decoding.search import Search
from aiayn.decoding.speed import for_decoding
from aiayn.metrics import chrf_score, sacrebleu_score

RESULTS = _common.REPO / "benchmarks" / "results" / "stopping_rule.jsonl"
TEST_SETS = {"multi30k": ("multi30k/test_2016_flickr.en.gz", "multi30k/test_2016_flickr.de.gz"),
             "newstest2014": ("wmt14/newstest2014-en-de.en", "wmt14/newstest2014-en-de.de")}
RULES = ("paper", "first_k")


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--test-set", choices=sorted(TEST_SETS), default="multi30k")
    parser.add_argument("--sentences", type=int, default=None, help="the first N sentences (default: all)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--int8", action="store_true", help="int8 dynamic quantisation (aiayn.decoding.speed)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    trained = load_trained(args.checkpoint, "cpu")
    model, vocab = for_decoding(trained.model, int8=args.int8), trained.vocab
    source_file, reference_file = TEST_SETS[args.test_set]
    sources = read_lines(_common.data_root() / source_file)[: args.sentences]
    references = read_lines(_common.data_root() / reference_file)[: args.sentences]
    ids = [seq[: model.max_positions - 1] or [vocab.eos_id] for seq in vocab.encode(sources)]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    batches = [order[start: start + args.batch_size] for start in range(0, len(order), args.batch_size)]
    collate = TranslationCollator(vocab.pad_id, vocab.bos_id, vocab.eos_id)
    searches = {rule: Search({**trained.decoding, "stop": rule}, vocab) for rule in RULES}

    rows_fed = {"count": 0}
    decode = model.decode

    def counted(tgt_in, state, return_weights=False):  # hypothesis-steps: the rows of every decoder call
        rows_fed["count"] += tgt_in.size(0)
        return decode(tgt_in, state, return_weights)

    model.decode = counted
    searches["paper"].best(model, collate([(i, ids[i], []) for i in batches[0][:4]])["src"])  # warm-up
    seconds = {rule: [] for rule in RULES}
    steps = dict.fromkeys(RULES, 0)
    outputs: dict[str, dict[int, list[int]]] = {rule: {} for rule in RULES}
    for rows in batches:
        src = collate([(i, ids[i], []) for i in rows])["src"]
        for rule in RULES:
            rows_fed["count"] = 0
            started = time.perf_counter()
            hypotheses = searches[rule].best(model, src)
            seconds[rule].append(time.perf_counter() - started)
            steps[rule] += rows_fed["count"]
            outputs[rule].update(zip(rows, hypotheses))
    texts = {rule: vocab.decode([outputs[rule][i] for i in range(len(ids))]) for rule in RULES}
    records = []
    base = {"date": _common.now(), "commit": _common.commit(), "machine": decode_speed.machine(),
            "benchmark": "stopping_rule", "checkpoint": str(args.checkpoint), "step": trained.step,
            "test_set": args.test_set, "sentences": len(ids), "batch_size": args.batch_size, "threads": args.threads,
            "int8": args.int8, "beam_size": trained.decoding["beam_size"], "alpha": trained.decoding["alpha"]}
    for rule in RULES:
        per_batch = [len(rows) / s for rows, s in zip(batches, seconds[rule])]
        records.append({**base, "stop": rule, "seconds": round(sum(seconds[rule]), 3),
                        "sentences_per_second": round(len(ids) / sum(seconds[rule]), 2),
                        "batch_sentences_per_second_median": round(statistics.median(per_batch), 2),
                        "hypothesis_steps_per_sentence": round(steps[rule] / len(ids), 2),
                        "output_tokens": sum(len(outputs[rule][i]) for i in range(len(ids))),
                        "sacrebleu": round(sacrebleu_score(texts[rule], references).score, 2),
                        "chrf": round(chrf_score(texts[rule], references).score, 2),
                        "identical_to_paper": sum(a == b for a, b in zip(texts[rule], texts["paper"]))})
        print(f"{args.test_set} stop={rule}: {records[-1]['sentences_per_second']} sentences/s "
              f"(batches' median {records[-1]['batch_sentences_per_second_median']}), "
              f"{records[-1]['hypothesis_steps_per_sentence']} hypothesis-steps/sentence, "
              f"BLEU {records[-1]['sacrebleu']}, chrF2 {records[-1]['chrf']}, "
              f"same as paper {records[-1]['identical_to_paper']}/{len(ids)}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a", encoding="utf-8") as out:
        out.writelines(json.dumps(record) + "\n" for record in records)
    return records


if __name__ == "__main__":
    main()
