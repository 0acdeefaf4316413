"""The batches a training-throughput benchmark times (benchmarks/train_throughput.py): the sentence
lengths of the real newstest2014, in subwords; random ids of those lengths; the padding waste of
a batching, against the naive one in corpus order; and which of them warm a compiled step up."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np

from aiayn.data.corpus import ParallelCorpus
from aiayn.data.readers import read_parallel
from aiayn.data.subwords import Subwords

# Where no subword model is given: subwords per whitespace-separated word. A 37k shared BPE
# vocabulary on WMT14 EN-DE splits roughly this often; the paper gives no figure.
SUBWORDS_PER_WORD = 1.3


def sentence_lengths(data_root: Path, subwords: str | None, per_word: float,
                     pair: str = "en-de") -> tuple[list[int], list[int]]:
    """Subword lengths (no BOS/EOS) of newstest2014's sources and targets of ``pair`` (en-de, en-fr)."""
    source, target = pair.split("-")
    src, tgt = read_parallel(data_root / "wmt14" / f"newstest2014-{pair}.{source}",
                             data_root / "wmt14" / f"newstest2014-{pair}.{target}")
    if subwords:
        model = Subwords(subwords)
        return [len(ids) for ids in model.encode(src)], [len(ids) for ids in model.encode(tgt)]
    count = lambda lines: [max(1, round(len(line.split()) * per_word)) for line in lines]
    return count(src), count(tgt)


def drawn_pairs(count: int, pairs: int, seed: int) -> np.ndarray:
    """``pairs`` indices of ``count`` sentence pairs drawn with replacement (seeded): a pool whose
    token-budget batches hold sentences of about one length, as batches cut from WMT's 4.5M pairs
    do (a million: 1.3% padding at 25,000 tokens, 0.2% at 3,125), where a 25,000-token budget over
    newstest2014's 3,003 sentences spans a third of their lengths (31% padding). ``pairs`` 0: each
    pair once, in order."""
    return np.arange(count) if pairs == 0 else np.random.default_rng(seed).integers(0, count, pairs)


def resampled(src_lengths: list[int], tgt_lengths: list[int], pairs: int, seed: int) -> tuple[list[int], list[int]]:
    """The (source, target) lengths of :func:`drawn_pairs`' pool."""
    drawn = drawn_pairs(len(src_lengths), pairs, seed)
    return np.asarray(src_lengths)[drawn].tolist(), np.asarray(tgt_lengths)[drawn].tolist()


def synthetic_corpus(src_lengths: list[int], tgt_lengths: list[int], vocab_size: int, seed: int) -> ParallelCorpus:
    """Random ids (never pad/unk/BOS/EOS) of the given lengths."""
    rng = np.random.default_rng(seed)
    draw = lambda n: rng.integers(4, vocab_size, n).tolist()
    return ParallelCorpus([draw(n) for n in src_lengths], [draw(n) for n in tgt_lengths])


def padding_fraction(batches: list[list[int]], src: np.ndarray, tgt: np.ndarray) -> float:
    """Padded positions over all positions of ``batches``, source and target sides together."""
    real = padded = 0
    for batch in batches:
        for lengths in (src[batch], tgt[batch]):
            real += int(lengths.sum())
            padded += int(lengths.max()) * len(batch)
    return 1.0 - real / padded if padded else 0.0


def corpus_order_batches(src: np.ndarray, tgt: np.ndarray, max_tokens: int) -> list[list[int]]:
    """The naive batching: consecutive sentences in corpus order, as many as fit the same budget
    (batch size × longest ≤ max_tokens on each side)."""
    batches, current, longest = [], [], 0
    for index in range(len(src)):
        length = max(int(src[index]), int(tgt[index]))
        if current and (len(current) + 1) * max(longest, length) > max_tokens:
            batches.append(current)
            current, longest = [], 0
        current.append(index)
        longest = max(longest, length)
    return batches + ([current] if current else [])


def warm_up_batches(batches: list[dict], steps: int, compiled: bool, graphs: bool = False) -> list[dict]:
    """The untimed steps' batches: the first ``steps``, and for a compiled step each batch shape
    the later ones take, until it has run once (compiled, as a long run does), or twice for a step
    replayed as CUDA graphs (``graphs``: torch's CUDA graph trees run a new shape eagerly once and
    record its graph at its second run): a compilation or a recording inside the timed block would
    be no step's time."""
    warm = batches[:steps]
    if compiled:
        runs = 2 if graphs else 1
        seen = collections.Counter(shapes(batch) for batch in warm)
        for batch in batches[steps:]:
            while seen[shapes(batch)] < runs:
                seen[shapes(batch)] += 1
                warm.append(batch)
    return warm


def shapes(batch: dict) -> tuple:
    """(name, shape) of each of a batch's tensors: what a compiled step compiles and records for."""
    return tuple((name, tuple(value.shape)) for name, value in sorted(batch.items()))
