"""Translating and scoring raw sentences with a trained model: what evaluate.py and translate.py
share."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import torch

from aiayn.data.batching import TokenBatchSampler
from aiayn.data.corpus import ParallelCorpus, TranslationCollator
from aiayn.data.subwords import Subwords
from aiayn.model import Transformer, beam_search
from aiayn.training.loss import label_smoothed_loss

log = logging.getLogger(__name__)


@dataclass
class Translations:
    texts: list[str]  # one per input sentence, in input order
    output_tokens: int  # subword tokens generated (EOS not counted)
    seconds: float  # wall time of encoding, search and decoding
    truncated: int  # inputs cut to the model's maximum length

    @property
    def sentences_per_second(self) -> float:
        return len(self.texts) / self.seconds if self.seconds else float("nan")

    @property
    def tokens_per_second(self) -> float:
        return self.output_tokens / self.seconds if self.seconds else float("nan")


def encode_sources(model: Transformer, vocab: Subwords, sentences: list[str]) -> tuple[list[list[int]], int]:
    """Subword ids of each sentence, cut to the positions the model has (EOS included); also
    returns how many were cut, with a warning, since the model cannot read past them."""
    limit = model.max_positions - 1
    ids = vocab.encode(sentences)
    truncated = [i for i, seq in enumerate(ids) if len(seq) > limit]
    for i in truncated:
        log.warning("input line %d has %d subword tokens; truncated to the model's %d", i + 1, len(ids[i]), limit)
        ids[i] = ids[i][:limit]
    return ids, len(truncated)


@torch.no_grad()
def translate(
    model: Transformer,
    vocab: Subwords,
    sentences: list[str],
    *,
    beam_size: int = 4,
    alpha: float = 0.6,
    max_len_offset: int = 50,
    kv_cache: bool = True,
    batch_size: int = 64,
) -> Translations:
    """Beam-search translations of ``sentences``, ``batch_size`` sentences of similar length at
    a time, returned in input order. An empty (or blank) sentence translates to ""."""
    started = time.perf_counter()
    device = next(model.parameters()).device
    texts = [""] * len(sentences)
    ids, truncated = encode_sources(model, vocab, sentences)
    todo = [i for i, (sentence, seq) in enumerate(zip(sentences, ids)) if sentence.strip() and seq]
    output_tokens = 0
    todo.sort(key=lambda i: len(ids[i]))  # similar lengths together: little padding
    collate = TranslationCollator(vocab.pad_id, vocab.bos_id, vocab.eos_id)
    for start in range(0, len(todo), batch_size):
        rows = todo[start : start + batch_size]
        src = collate([(i, ids[i], []) for i in rows])["src"]  # ids + EOS, right-padded
        hypotheses = beam_search(model, src.to(device), bos_id=vocab.bos_id, eos_id=vocab.eos_id,
                                 beam_size=beam_size, alpha=alpha, max_len_offset=max_len_offset,
                                 kv_cache=kv_cache)
        output_tokens += sum(len(h) for h in hypotheses)
        for i, text in zip(rows, vocab.decode(hypotheses)):
            texts[i] = text
    return Translations(texts, output_tokens, time.perf_counter() - started, truncated)


@torch.no_grad()
def perplexity(model: Transformer, vocab: Subwords, sources: list[str], references: list[str],
               max_tokens: int = 4096) -> tuple[float, int]:
    """Per-token perplexity of the references given the sources (teacher forcing, every target
    subword and the EOS counted, no label smoothing), and the number of tokens scored."""
    device = next(model.parameters()).device
    src_ids, _ = encode_sources(model, vocab, sources)
    tgt_ids = [seq[: model.max_positions - 1] for seq in vocab.encode(references)]
    corpus = ParallelCorpus(src_ids, tgt_ids)
    sampler = TokenBatchSampler(corpus.src_lengths, corpus.tgt_lengths, max_tokens, shuffle=False,
                                num_replicas=1, rank=0, pad_to_equal=False)
    collate = TranslationCollator(vocab.pad_id, vocab.bos_id, vocab.eos_id)
    total_nll, total_tokens = 0.0, 0
    for batch_indices in sampler:
        batch = collate([corpus[i] for i in batch_indices])
        logits = model(batch["src"].to(device), batch["tgt_in"].to(device))
        _, nll, n_tokens = label_smoothed_loss(logits, batch["tgt_out"].to(device), 0.0, vocab.pad_id)
        total_nll += float(nll)
        total_tokens += n_tokens
    return math.exp(total_nll / total_tokens), total_tokens
