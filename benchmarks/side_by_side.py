"""Our Transformer side by side with its peers, at the same sizes, on the same inputs.

    .venv/bin/python benchmarks/side_by_side.py [--model base] [--train-steps 10] [--sentences 100]
        [--part both|train|decode] [--out FILE]

(a) Training step — forward, label-smoothed loss (ε_ls 0.1), backward, Adam step (β 0.9/0.98,
    ε 1e-9) — of ours against torch.nn.Transformer wrapped with the same embeddings × √d_model,
    sinusoidal positions and tied output projection (benchmarks/peers.py), and against fairseq's
    TransformerModel (benchmarks/fairseq_peer.py, when installed), all starting from the same
    weights, on the same batches: newstest2014 en→de pairs as subwords, cut by
    TokenBatchSampler to ``--train-max-tokens`` padded tokens per side. Target tokens per second.
(b) Beam search (beam 4, α 0.6, maximum length input + 50) of ours against Hugging Face's
    MarianMTModel.generate(num_beams=4, length_penalty=0.6), the same weights copied into Marian,
    on the first ``--sentences`` newstest2014 English sentences, batched by source tokens.
    Sentences per second. Marian's length penalty is |Y|^α rather than GNMT's ((5 + |Y|)/6)^α,
    and it decodes a whole batch to its longest input + 50; ``identical_outputs`` counts the
    sentences whose outputs agree anyway.

(c) ``--part trained --checkpoint FILE``: a trained Multi30k model decoding test2016 (or its first
    ``--sentences``) as every engine decodes it, from the same subword ids in the same batches of
    ``--batch-size`` length-sorted sentences (benchmarks/_trained_decoding.py): ours (fp32; fp32
    through oneDNN, ``onednn=true``; the decoder step by ONNX Runtime, ``onnxruntime=true``, when
    the onnx extra is installed; and int8: aiayn.decoding.speed),
    fairseq's ``SequenceGenerator`` on a copy of the weights (benchmarks/fairseq_peer.py; skipped
    when fairseq is not installed) and CTranslate2 (float32 and int8) on the model exported as
    src/export.py exports it. Beam 4 and greedy; sentences/s, generated tokens/s, sacreBLEU,
    identical outputs, and each batch's sentences/s (min/median/max). Stopping rules: ours with
    ``stop=paper`` stops a sentence when no live hypothesis can beat its best finished one
    (tensor2tensor's rule, given the largest length penalty still possible); ours with
    ``stop=first_k`` (engines ``ours_first_k``, ``ours_onednn_first_k``, ``ours_onnxruntime_first_k``,
    ``ours_int8_first_k``: the like-for-like race),
    fairseq and CTranslate2 stop when ``beam`` hypotheses have finished; fairseq runs every
    sentence to the batch's limit, and both peers normalise by |Y|^α (CTranslate2 has no GNMT
    penalty). ``generated_tokens`` counts the tokens each returns; ``identical_to_ours`` and
    ``identical_to_ours_first_k`` the outputs equal to ours under each rule.

Ours and the peer alternate batch by batch, so that a busy machine slows both alike. Subwords and
model sizes as in benchmarks/decode_speed.py (random weights; an 8k BPE learnt on the WMT slice,
a 37k model vocabulary). Appends one JSON line per part to benchmarks/results/side_by_side.jsonl.
A benchmark, not a test: nothing here asserts a figure.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common
import _trained_decoding
import decode_speed
import fairseq_peer
import peers

from aiayn.data.batching import TokenBatchSampler
from aiayn.data.corpus import ParallelCorpus, TranslationCollator
from aiayn.decoding.settings import Decoding
from aiayn.model import beam_search
from aiayn.model.loss import label_smoothed_loss

RESULTS = decode_speed.REPO / "benchmarks" / "results" / "side_by_side.jsonl"


def training_batches(model, vocab, max_tokens: int, count: int) -> list[dict]:
    """The first ``count`` batches (plus one for warm-up) of newstest2014 en→de by token budget."""
    limit = model.max_positions - 1
    src = [seq[:limit] for seq in vocab.encode(decode_speed.newstest2014("en"))]
    tgt = [seq[:limit] for seq in vocab.encode(decode_speed.newstest2014("de"))]
    corpus = ParallelCorpus(src, tgt)
    sampler = TokenBatchSampler(corpus.src_lengths, corpus.tgt_lengths, max_tokens, shuffle=True, seed=0,
                                num_replicas=1, rank=0, pad_to_equal=False)
    collate = TranslationCollator(vocab.pad_id, vocab.bos_id, vocab.eos_id)
    return [collate([corpus[i] for i in batch]) for batch, _ in zip(sampler, range(count + 1))]


def compare_training(model, vocab, args) -> dict:
    peer = peers.copy_to_torch(model, peers.torch_peer(model, dropout=model.embedding_dropout.p))
    batches = training_batches(model, vocab, args.train_max_tokens, args.train_steps)
    modules = {"ours": model, "torch_nn_transformer": peer}
    forward = {name: module for name, module in modules.items()}  # (src, tgt_in) → logits
    if fairseq := fairseq_peer.fairseq_of(model, vocab):
        modules["fairseq"] = fairseq
        forward["fairseq"] = lambda src, tgt_in: fairseq_peer.fairseq_logits(fairseq, src, tgt_in)
    contenders = {}
    for name, module in modules.items():
        module.train()
        optimizer = torch.optim.Adam(module.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
        contenders[name] = (forward[name], optimizer)

    def step(name: str, batch: dict) -> float:
        module, optimizer = contenders[name]
        started = time.perf_counter()
        logits = module(batch["src"], batch["tgt_in"])
        loss, _, n_tokens = label_smoothed_loss(logits, batch["tgt_out"], 0.1, vocab.pad_id)
        (loss / n_tokens).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - started

    seconds = {name: 0.0 for name in contenders}
    for name in contenders:
        step(name, batches[0])  # warm-up
    tokens = 0
    for batch in batches[1:]:
        tokens += int((batch["tgt_out"] != vocab.pad_id).sum())
        for name in contenders:
            seconds[name] += step(name, batch)
    speed = {name: round(tokens / s, 1) for name, s in seconds.items()}
    return {"part": "training_step", "steps": len(batches) - 1, "target_tokens": tokens,
            "max_tokens": args.train_max_tokens,
            "seconds": {name: round(s, 3) for name, s in seconds.items()},
            "tokens_per_second": speed,
            "ratio_ours_over_peer": round(speed["ours"] / speed["torch_nn_transformer"], 3),
            **({"ratio_ours_over_fairseq": round(speed["ours"] / speed["fairseq"], 3)} if "fairseq" in speed else {})}


def compare_decoding(model, vocab, args) -> dict:
    model.eval()
    marian = peers.copy_to_marian(model, peers.marian_peer(model, bos_id=vocab.bos_id, eos_id=vocab.eos_id)).eval()
    sentences = decode_speed.newstest2014("en")[: args.sentences]
    ids = [seq[: model.max_positions - args.max_len_offset - 1] for seq in vocab.encode(sentences)]
    batches = decode_speed.source_batches(ids, args.max_tokens, vocab)
    ours_settings = {"bos_id": vocab.bos_id, "eos_id": vocab.eos_id, "beam_size": args.beam_size, "alpha": args.alpha,
                     "max_len_offset": args.max_len_offset}
    marian_settings = {"pad_id": vocab.pad_id, "max_len_offset": args.max_len_offset, "num_beams": args.beam_size,
                       "length_penalty": args.alpha}
    run = {"ours": lambda src: beam_search(model, src, **ours_settings),
           "marian_mt": lambda src: peers.marian_generate(marian, src, **marian_settings)}
    for decode in run.values():  # warm-up
        decode(batches[0][:2])
    seconds = {name: 0.0 for name in run}
    outputs = {name: [] for name in run}
    for src in batches:
        for name, decode in run.items():
            started = time.perf_counter()
            outputs[name] += decode(src)
            seconds[name] += time.perf_counter() - started
    count = len(outputs["ours"])
    speed = {name: round(count / s, 3) for name, s in seconds.items()}
    generated = {name: sum(map(len, hyps)) for name, hyps in outputs.items()}
    return {"part": "beam_search", "sentences": count, "max_tokens": args.max_tokens, "beam_size": args.beam_size,
            "alpha": args.alpha, "max_len_offset": args.max_len_offset,
            "seconds": {name: round(s, 3) for name, s in seconds.items()},
            "sentences_per_second": speed,
            "generated_tokens": generated,
            "tokens_per_second": {name: round(generated[name] / seconds[name], 1) for name in run},
            "identical_outputs": sum(a == b for a, b in zip(outputs["ours"], outputs["marian_mt"])),
            "ratio_ours_over_peer": round(speed["ours"] / speed["marian_mt"], 3)}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="base", help="a conf/model/*.yaml name (default base)")
    parser.add_argument("--set", action="append", default=[], metavar="model.KEY=VALUE",
                        help="override a model setting (repeatable), e.g. --set model.n_layers=1 (CI-sized runs)")
    parser.add_argument("--vocab-size", type=int, default=37000)
    parser.add_argument("--subword-vocab", type=int, default=8000)
    parser.add_argument("--part", choices=("both", "train", "decode", "trained"), default="both")
    parser.add_argument("--checkpoint", type=Path, default=None, help="--part trained: a Multi30k checkpoint")
    parser.add_argument("--batch-size", type=int, default=128, help="--part trained: sentences per batch")
    parser.add_argument("--train-steps", type=int, default=10, help="timed training steps per model")
    parser.add_argument("--train-max-tokens", type=int, default=2000, help="padded tokens per side per batch")
    parser.add_argument("--sentences", type=int, default=None,
                        help="sentences to decode: newstest2014's first 100 (parts a, b) or test2016's 1,000 (c)")
    parser.add_argument("--max-tokens", type=int, default=2000, help="padded source tokens per decoding batch")
    paper = Decoding.of().settings()  # §6.1's beam 4, α 0.6, input + 50 (aiayn.config.schemas.DecodingConfig)
    parser.add_argument("--beam-size", type=int, default=paper["beam_size"])
    parser.add_argument("--alpha", type=float, default=paper["alpha"])
    parser.add_argument("--max-len-offset", type=int, default=paper["max_len_offset"])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.device = "cpu"
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.part == "trained":
        if args.checkpoint is None:
            parser.error("--part trained needs --checkpoint FILE (a model trained on Multi30k, e.g. the default job's)")
        base = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": decode_speed.commit(),
                "machine": decode_speed.machine(), "peers": _common.peer_versions(), "benchmark": "side_by_side",
                "device": "cpu", "threads": torch.get_num_threads()}
        records = [{**base, **record} for record in _trained_decoding.compare_trained(args)]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "a", encoding="utf-8") as out:
            out.writelines(json.dumps(record) + "\n" for record in records)
        return records
    args.checkpoint = None  # parts (a) and (b) build a random-weight model
    args.sentences = args.sentences or 100
    warnings.filterwarnings("ignore", message=".*nested tensors.*")  # nn.Transformer's fast path

    model, vocab, sizes = decode_speed.build_model(args)
    base = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": decode_speed.commit(),
            "machine": decode_speed.machine(), "peers": _common.peer_versions(), "benchmark": "side_by_side",
            "device": "cpu", "settings": sizes}
    records = []
    # Decoding first, with the freshly initialised weights: the training comparison's Adam steps
    # teach the model to end every sentence at once, and then both searches would stop after one
    # step. Untrained, neither emits EOS, so both do the same work: every hypothesis to input + 50.
    if args.part in ("both", "decode"):
        import transformers

        records.append({**base, "transformers": transformers.__version__, **compare_decoding(model, vocab, args)})
    if args.part in ("both", "train"):
        records.append({**base, **compare_training(model, vocab, args)})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a", encoding="utf-8") as out:
        out.writelines(json.dumps(record) + "\n" for record in records)
    for record in records:
        unit = "tokens_per_second" if record["part"] == "training_step" else "sentences_per_second"
        figures = ", ".join(f"{name} {value}" for name, value in record[unit].items())
        print(f"{record['part']}: {unit} {figures}; ours / peer = {record['ratio_ours_over_peer']}")
    return records


if __name__ == "__main__":
    main()
