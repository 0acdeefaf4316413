"""Part (c) of benchmarks/side_by_side.py (``--part trained``): a trained Multi30k model decoding
test2016 as every engine decodes it, from the same subword ids in the same batches, engines
alternating batch by batch; see side_by_side.py's docstring for what each engine is and counts."""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common
import fairseq_peer

from aiayn.checkpoints.trained import load_trained
from aiayn.data.corpus import TranslationCollator
from aiayn.data.readers import read_lines
from aiayn.decoding.ctranslate2 import CTranslate2Translator
from aiayn.decoding.speed import for_decoding
from aiayn.errors import ConfigError
from aiayn.export.ctranslate2 import export_ctranslate2
from aiayn.metrics.bleu import sacrebleu_score
from aiayn.model import beam_search, greedy_search


def compare_trained(args) -> list[dict]:
    """Every engine on the same batches of a trained model's test set, beam 4 then greedy."""
    trained = load_trained(args.checkpoint, "cpu")
    model, vocab = trained.model.eval(), trained.vocab
    data = _common.data_root() / "multi30k"
    sources = read_lines(data / "test_2016_flickr.en.gz")[: args.sentences]
    references = read_lines(data / "test_2016_flickr.de.gz")[: args.sentences]
    ids = [seq[: model.max_positions - 1] for seq in vocab.encode(sources)]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    batches = [order[start : start + args.batch_size] for start in range(0, len(order), args.batch_size)]
    collate = TranslationCollator(vocab.pad_id, vocab.bos_id, vocab.eos_id)

    def tensor(rows: list[int]) -> torch.Tensor:  # ids + EOS, right-padded: (batch, src_len)
        return collate([(i, ids[i], []) for i in rows])["src"]

    scratch = tempfile.TemporaryDirectory(prefix="aiayn-side-by-side-")
    ct2 = {kind: CTranslate2Translator(export_ctranslate2(trained, Path(scratch.name) / kind, ckpt=args.checkpoint,
                                                          steps=[trained.step], quantization=quantization),
                                       batch_size=args.batch_size, threads=torch.get_num_threads())
           for kind, quantization in (("float32", None), ("int8", "int8"))}
    int8, onednn = for_decoding(model, int8=True), for_decoding(model, onednn=True)

    def ours(net, stop="paper"):
        def run(rows, beam):
            src = tensor(rows)
            if beam == 1:
                return greedy_search(net, src, bos_id=vocab.bos_id, eos_id=vocab.eos_id,
                                     max_len_offset=args.max_len_offset)
            return beam_search(net, src, bos_id=vocab.bos_id, eos_id=vocab.eos_id, beam_size=beam, alpha=args.alpha,
                               max_len_offset=args.max_len_offset, stop=stop)
        return run

    def ctranslate2(translator):
        def run(rows, beam):
            translator.arguments["beam_size"] = beam  # CTranslate2's own argument
            return translator.translate_ids([ids[i] for i in rows])
        return run

    # ours with the paper's stopping rule, and with first_k: CTranslate2's and fairseq's (like for like)
    # (onednn=true: the same fp32 arithmetic by oneDNN's kernels, CTranslate2's on a CPU that is not Intel's)
    engines = {"ours": ours(model), "ours_first_k": ours(model, "first_k"), "ours_onednn": ours(onednn),
               "ours_onednn_first_k": ours(onednn, "first_k"), "ours_int8": ours(int8),
               "ours_int8_first_k": ours(int8, "first_k")}
    try:  # (onnxruntime=true: the decoder step by ONNX Runtime, when the onnx extra is installed)
        onnx = for_decoding(model, onnxruntime=True)
        engines.update(ours_onnxruntime=ours(onnx), ours_onnxruntime_first_k=ours(onnx, "first_k"))
    except ConfigError as error:
        print(f"{error}: its rows are left out")
    if peer := fairseq_peer.fairseq_of(model, vocab):
        peer.eval()
        engines["fairseq"] = lambda rows, beam: fairseq_peer.fairseq_beam_search(
            peer, tensor(rows), beam_size=beam, alpha=args.alpha if beam > 1 else 0.0,
            max_len_offset=args.max_len_offset)
    engines["ctranslate2_float32"] = ctranslate2(ct2["float32"])
    engines["ctranslate2_int8"] = ctranslate2(ct2["int8"])

    records = []
    for beam in (args.beam_size, 1):
        for run in engines.values():  # warm-up
            run(batches[0][:4], beam)
        seconds = {name: [] for name in engines}
        outputs = {name: {} for name in engines}  # (greedy: one stopping rule, first_k not run)
        running = {name: run for name, run in engines.items() if beam > 1 or not name.endswith("first_k")}
        for rows in batches:
            for name, run in running.items():
                started = time.perf_counter()
                for i, hypothesis in zip(rows, run(rows, beam)):
                    outputs[name][i] = hypothesis
                seconds[name].append(time.perf_counter() - started)
        ours_outputs = [outputs["ours"][i] for i in range(len(ids))]
        first_k_outputs = [outputs["ours_first_k"][i] for i in range(len(ids))] if beam > 1 else ours_outputs
        for name in running:
            hypotheses = [outputs[name][i] for i in range(len(ids))]
            total = sum(seconds[name])
            per_batch = sorted(len(rows) / s for rows, s in zip(batches, seconds[name]))
            generated = sum(map(len, hypotheses))
            records.append({
                "part": "trained_decoding", "engine": name, "beam_size": beam, "alpha": args.alpha if beam > 1 else 0.0,
                "max_len_offset": args.max_len_offset, "checkpoint": str(args.checkpoint), "step": trained.step,
                "test_set": "multi30k test_2016_flickr en-de", "sentences": len(ids), "batch_size": args.batch_size,
                "seconds": round(total, 3), "sentences_per_second": round(len(ids) / total, 2),
                "batch_sentences_per_second": {"min": round(per_batch[0], 2),
                                               "median": round(statistics.median(per_batch), 2),
                                               "max": round(per_batch[-1], 2)},
                "generated_tokens": generated, "tokens_per_second": round(generated / total, 1),
                "ms_per_generated_token": round(1000 * total / generated, 3) if generated else None,
                "sacrebleu": round(sacrebleu_score(vocab.decode(hypotheses), references).score, 2),
                "identical_to_ours": sum(a == b for a, b in zip(hypotheses, ours_outputs)),
                "identical_to_ours_first_k": sum(a == b for a, b in zip(hypotheses, first_k_outputs)),
                "stop": "first_k" if name.endswith("first_k") or name.startswith("ctranslate2") else "paper",
            })
            print(f"beam {beam} {name}: {records[-1]['sentences_per_second']} sentences/s, "
                  f"{records[-1]['tokens_per_second']} tokens/s, BLEU {records[-1]['sacrebleu']}", file=sys.stderr,
                  flush=True)
    scratch.cleanup()
    return records
