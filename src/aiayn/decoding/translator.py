"""Translating and scoring raw sentences with a trained model: what evaluate.py and translate.py
share (the search itself: :mod:`aiayn.decoding.search`).

:class:`Translator` translates a stream of sentences (read in chunks: a file's windows, the lines
typed so far) and gives each translation back as soon as it and every one before it are done, in
input order, so that a writer never holds more than a batch's worth of finished work and output
can be written while the input is still being read. :func:`translate` is the whole-list form.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from aiayn.config.tools import DecodeSwitches
from aiayn.data.batching import TokenBatchSampler
from aiayn.data.corpus import ParallelCorpus, TranslationCollator
from aiayn.data.subwords import Subwords
from aiayn.decoding.search import Search
from aiayn.decoding.settings import Decoding
from aiayn.errors import ConfigError
from aiayn.model import Transformer
from aiayn.model.loss import label_smoothed_loss
from aiayn.model.search import OutputConstraint

log = logging.getLogger(__name__)


class RawTextForm(Protocol):
    """How a task reads lines of text and writes its outputs where that is its own (a parser:
    aiayn.data.parsing.raw_text.RawText), not encoded and decoded as text."""

    def encode(self, sentences: Sequence[str]) -> list[list[int]]:
        """The source ids of each line, without BOS/EOS."""

    def output(self, sentence: str, tokens: Sequence[int]) -> tuple[str, str | None]:
        """The output ``tokens`` of ``sentence`` as text, and what had to be repaired (None: nothing)."""

    def decode(self, outputs: Sequence[Sequence[int]]) -> list[str]:
        """Each output's tokens as the text its scorer reads (a parser's: its linearisation, a word
        a leaf), where the vocabulary's decoding would not do."""


@dataclass(frozen=True)
class Scored:
    """One hypothesis of an input as text, with its scores (aiayn.model.Hypothesis)."""

    text: str
    score: float  # log_prob / lp(|Y|): what the search ranks by
    log_prob: float  # log P(Y|X)


@dataclass
class Translations:
    texts: list[str]  # one per input sentence, in input order
    output_tokens: int  # subword tokens generated (EOS not counted)
    seconds: float  # wall time of encoding, search and decoding
    truncated: int  # inputs cut to the model's maximum length
    nbest: list[list[Scored]]  # each input's hypotheses, best first (decoding.nbest of them)

    @property
    def sentences_per_second(self) -> float:
        return len(self.texts) / self.seconds if self.seconds else float("nan")

    @property
    def tokens_per_second(self) -> float:
        return self.output_tokens / self.seconds if self.seconds else float("nan")


def encode_sources(model: Transformer, vocab: Subwords, sentences: Sequence[str],
                   first_line: int = 1, raw_text: RawTextForm | None = None, name_cut: bool = True,
                   ) -> tuple[list[list[int]], int]:
    """:func:`encode_lines` cut to the positions ``model`` has (EOS included)."""
    return encode_lines(vocab, sentences, model.max_positions - 1, first_line, raw_text, name_cut)


def encode_lines(vocab: Subwords, sentences: Sequence[str], limit: int, first_line: int = 1,
                 raw_text: RawTextForm | None = None, name_cut: bool = True) -> tuple[list[list[int]], int]:
    """Subword ids of each sentence (as ``raw_text`` encodes them, where given), cut to ``limit``
    (a model's positions, less EOS); also returns how many were cut, with a warning naming the input
    line (``first_line`` is the number of ``sentences[0]``), since the model cannot read past them
    (none with ``name_cut`` False: another pass over the same lines names them)."""
    ids = (raw_text or vocab).encode(list(sentences))
    truncated = [i for i, seq in enumerate(ids) if len(seq) > limit]
    for i in truncated:
        if name_cut:
            log.warning("input line %d has %d subword tokens; truncated to the model's %d", first_line + i,
                        len(ids[i]), limit)
        ids[i] = ids[i][:limit]
    return ids, len(truncated)


def output_texts(vocab: Subwords, outputs: Sequence[Sequence[Sequence[int]]], sentences: Sequence[str],
                 lines: Sequence[int], raw_text: RawTextForm | None = None, decoder: RawTextForm | None = None,
                 unconstrained: str = "") -> list[str]:
    """Every hypothesis of ``outputs`` (each input's token lists, best first) as text, in order: as
    ``raw_text`` writes it for its input line (a parser's tree over the line's words), with a warning
    naming the line (``lines``: each input's number) for each it had to repair, ``unconstrained``
    added (why the decoder did not keep it a tree); else as ``decoder`` (None: ``vocab``) decodes it.
    What both aiayn's :class:`Translator` and translate.py's CTranslate2 engine write."""
    if raw_text is None:
        return (decoder or vocab).decode([tokens for hypotheses in outputs for tokens in hypotheses])
    texts = []
    for sentence, line, hypotheses in zip(sentences, lines, outputs):
        for rank, tokens in enumerate(hypotheses, start=1):
            text, repaired = raw_text.output(sentence, tokens)
            if repaired is not None:
                which = f", hypothesis {rank}" if len(hypotheses) > 1 else ""
                log.warning("input line %d%s: %s%s", line, which, repaired, unconstrained)
            texts.append(text)
    return texts


class Translator:
    """Translation of sentences that arrive in chunks, given back in input order, with the
    ``decoding`` settings and the task's output ``constraint`` (:class:`~aiayn.decoding.search.Search`).
    With ``raw_text`` (a parser's) the lines are encoded and the outputs written its way, each
    repair it makes named in a warning with the input line; with ``decoder`` (a parser's too) the
    lines are encoded as text and the outputs written as its ``decode`` writes them (evaluate.py's
    hypotheses, each leaf of a tree one word) (:func:`output_texts`).

    Each chunk is sorted by length and cut into batches of ``batch_size`` sentences (similar
    lengths together: little padding); after each batch, :meth:`stream` yields the longest run of
    translations, in input order, that is now complete, so a chunk's translations are all out
    by the time the next chunk is asked for. An empty (or blank) sentence translates to "".

    The counters add up over everything streamed: ``sentences``, ``output_tokens`` (EOS not
    counted), ``truncated`` (inputs cut to the model's maximum length) and ``seconds``, the wall
    time of encoding, search and decoding only (not the time spent waiting for input or writing)."""

    def __init__(self, model: Transformer, vocab: Subwords, decoding: Decoding | Mapping[str, Any] | None = None,
                 constraint: OutputConstraint | None = None, *, batch_size: int = DecodeSwitches.batch_size,
                 raw_text: RawTextForm | None = None, decoder: RawTextForm | None = None):
        self.model, self.vocab, self.batch_size, self.raw_text = model, vocab, batch_size, raw_text
        self.decoder = decoder
        self.search = Search(decoding, vocab, constraint).fitting(model)
        self.nbest = self.search.nbest  # hypotheses an input
        self.collate = TranslationCollator(vocab.pad_id, vocab.bos_id, vocab.eos_id)
        self.sentences = self.output_tokens = self.truncated = 0
        self.seconds = 0.0

    @property
    def sentences_per_second(self) -> float:
        return self.sentences / self.seconds if self.seconds else 0.0  # 0.0: nothing translated yet

    def stream(self, chunks: Iterable[Sequence[str]]) -> Iterator[list[str]]:
        """For each chunk of sentences, after each of its batches: the translations newly
        complete from the start of the input on (never an empty list)."""
        for ready in self.stream_nbest(chunks):
            yield [hypotheses[0].text for hypotheses in ready]

    @torch.inference_mode()
    def stream_nbest(self, chunks: Iterable[Sequence[str]]) -> Iterator[list[list[Scored]]]:
        """:meth:`stream` with each input's hypotheses (``decoding.nbest``, best first) and their
        scores; an empty input has as many, each "" scored 0 (n lines an input in the n-best format)."""
        for chunk in chunks:
            started = time.perf_counter()
            for ready in self._chunk(chunk):
                self.seconds += time.perf_counter() - started
                yield ready
                started = time.perf_counter()
            self.seconds += time.perf_counter() - started

    def translations(self, sentences: list[str]) -> Translations:
        """``sentences`` translated, returned in input order (``texts``: the best of each; ``nbest``:
        all of each, with scores). An empty (or blank) sentence translates to ""."""
        nbest = [hypotheses for ready in self.stream_nbest([sentences]) for hypotheses in ready]
        return Translations([hypotheses[0].text for hypotheses in nbest], self.output_tokens, self.seconds,
                            self.truncated, nbest)

    def _chunk(self, sentences: Sequence[str]) -> Iterator[list[list[Scored]]]:
        device = next(self.model.parameters()).device
        first_line = self.sentences + 1
        ids, truncated = encode_sources(self.model, self.vocab, sentences, first_line, self.raw_text)
        self.sentences += len(sentences)
        self.truncated += truncated
        texts: list[list[Scored] | None] = [None] * len(sentences)
        todo = []
        for i, (sentence, seq) in enumerate(zip(sentences, ids)):
            if sentence.strip() and seq:
                todo.append(i)
            else:
                texts[i] = [Scored("", 0.0, 0.0)] * self.nbest  # as many as any input: the n-best lines stay aligned
        todo.sort(key=lambda i: len(ids[i]))
        written = 0  # translations of this chunk yielded so far

        def complete() -> list[list[Scored]]:
            nonlocal written
            end = written
            while end < len(texts) and texts[end] is not None:
                end += 1
            ready, written = texts[written:end], end
            return ready

        if ready := complete():  # empty lines before the first one to translate
            yield ready
        for start in range(0, len(todo), self.batch_size):
            rows = todo[start : start + self.batch_size]
            src = self.collate([(i, ids[i], []) for i in rows])["src"]  # ids + EOS, right-padded
            found = self.search(self.model, src.to(device))  # each row's hypotheses, best first
            self.output_tokens += sum(len(hypotheses[0].tokens) for hypotheses in found)
            outputs = [[h.tokens for h in hypotheses] for hypotheses in found]
            decoded = iter(output_texts(self.vocab, outputs, [sentences[i] for i in rows],
                                        [first_line + i for i in rows], self.raw_text, self.decoder))
            for i, hypotheses in zip(rows, found):
                texts[i] = [Scored(next(decoded), h.score, h.log_prob) for h in hypotheses]
            if ready := complete():
                yield ready


def translate(model: Transformer, vocab: Subwords, sentences: list[str],
              decoding: Decoding | Mapping[str, Any] | None = None, constraint: OutputConstraint | None = None, *,
              batch_size: int = DecodeSwitches.batch_size) -> Translations:
    """Translations of ``sentences`` with the ``decoding`` settings (None: the defaults),
    ``batch_size`` sentences of similar length at a time (:meth:`Translator.translations`)."""
    return Translator(model, vocab, decoding, constraint, batch_size=batch_size).translations(sentences)


def nbest_lines(nbest: Sequence[Sequence[Scored]], first_index: int = 0) -> list[str]:
    """The n-best format (docs/evaluation.md): one line per hypothesis, best first within each
    input, ``<input index>\t<score>\t<log-prob>\t<text>``; the index counts input lines from
    ``first_index`` (0: the first line), the score is log-prob / lp(|Y|), what the search ranks by.
    Every input has as many lines (an empty one: ``""`` scored 0, each of them)."""
    return [f"{first_index + i}\t{h.score:.4f}\t{h.log_prob:.4f}\t{h.text}"
            for i, hypotheses in enumerate(nbest) for h in hypotheses]


@torch.inference_mode()
def perplexity(model: Transformer, vocab: Subwords, sources: list[str], references: list[str],
               max_tokens: int = 4096, name_cut_sources: bool = True, setting: str = "max_tokens") -> tuple[float, int]:
    """Per-token perplexity of the references given the sources (teacher forcing, every target
    subword and the EOS counted, no label smoothing), and the number of tokens scored. A reference
    longer than the model's positions is scored on its first subwords, with a warning naming its
    line (before: cut in silence, its other tokens left out of the count); a source so cut is named
    too, unless ``name_cut_sources`` is False (a translation of the same sources names each).
    ``setting``: what a batch too small for a pair is named by."""
    device = next(model.parameters()).device
    src_ids, _ = encode_sources(model, vocab, sources, name_cut=name_cut_sources)
    tgt_ids = vocab.encode(references)
    limit = model.max_positions - 1
    for number, seq in enumerate(tgt_ids, start=1):
        if len(seq) > limit:
            log.warning("reference line %d has %d subword tokens; perplexity scores its first %d (the model's "
                        "positions)", number, len(seq), limit)
            tgt_ids[number - 1] = seq[:limit]
    corpus = ParallelCorpus(src_ids, tgt_ids)
    longest = max((max(pair) for pair in zip(corpus.src_lengths, corpus.tgt_lengths)), default=0)
    if max_tokens < longest:  # every pair is scored: a batch must hold the longest
        raise ConfigError(f"{setting}={max_tokens} is less than the longest sentence pair of the split ({longest} "
                          f"tokens with BOS/EOS), which a batch of the perplexity pass must hold; give {setting}="
                          f"{longest} or more")
    sampler = TokenBatchSampler(corpus.src_lengths, corpus.tgt_lengths, max_tokens, shuffle=False,
                                num_replicas=1, rank=0, pad_to_equal=False)
    collate = TranslationCollator(vocab.pad_id, vocab.bos_id, vocab.eos_id)
    total_nll, total_tokens = 0.0, 0
    for batch_indices in sampler:
        batch = collate([corpus[i] for i in batch_indices])
        logits = model(batch["src"].to(device), batch["tgt_in"].to(device))
        _, nll, n_tokens = label_smoothed_loss(logits, batch["tgt_out"].to(device), 0.0, vocab.pad_id)
        total_nll += float(nll)
        total_tokens += int(n_tokens)
    return math.exp(total_nll / total_tokens), total_tokens
