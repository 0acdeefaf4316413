"""Translating with a CTranslate2 export of a checkpoint (src/export.py format=ctranslate2) as
aiayn's translate.py does (``engine=ctranslate2``): the same reading, batching and counters as
aiayn.decoding.translator.Translator, CTranslate2's search, with the decoding settings it serves.

CTranslate2's beam search normalises a hypothesis's score by |Y|^α, not GNMT's ((5 + |Y|) / 6)^α
(see the model card). Its maximum output length is one number per search, so a batch's sentences
are searched in groups of one limit each: every output is searched within its own sentence's limit
(input length + ``max_len_offset``), as aiayn's is, not cut from a search that went on to a longer
sentence's limit.

A parser's export (its task recorded in ``aiayn.json``) reads lines and writes trees over their
words as aiayn's translator does (the task's raw-text form, through
:func:`~aiayn.decoding.translator.output_texts`). CTranslate2 cannot constrain its search to trees
(it takes no mask of allowed tokens a step), so its outputs are read back through the repair of
``delinearize`` more often, each repaired one said in a warning that says so.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from aiayn.config.tools import DecodeSwitches
from aiayn.data.parsing.constraints import has_tree_symbols
from aiayn.data.subwords import Subwords
from aiayn.data.task import raw_text_of
from aiayn.decoding.declarations import CTRANSLATE2, arguments
from aiayn.decoding.packages import require
from aiayn.decoding.settings import Asked, Decoding, asked
from aiayn.decoding.translator import Scored, encode_lines, output_texts
from aiayn.errors import ConfigError, DataError

log = logging.getLogger(__name__)

# What aiayn needs besides CTranslate2's own files: the decoding settings and the model's positions.
SETTINGS_FILE = "aiayn.json"
SUBWORDS_FILE = "source.spm"
# Said in the warning of each parser's output that had to be repaired: why it was not a tree.
UNCONSTRAINED = ("; CTranslate2 cannot constrain its output to trees (engine=aiayn ckpt=<file.ckpt> decodes "
                 "within the tree constraint)")


def ctranslate2_device(device: str) -> tuple[str, int]:
    """CTranslate2's device and device index for the tools' ``device`` setting (auto, cpu, cuda,
    cuda:<index>, aiayn.decoding.switches.check_device): CTranslate2 takes the GPU's index apart,
    ``cuda:1`` as ``("cuda", 1)``; ``cuda`` is GPU 0, as torch has it."""
    kind, _, index = device.partition(":")
    return kind, int(index) if index else 0


class CTranslate2Translator:
    """Translates sentences with an exported CTranslate2 model: the counterpart of
    :class:`aiayn.decoding.translator.Translator` (the same ``stream``, ``stream_nbest`` and
    counters), for translate.py's ``engine=ctranslate2``. Each chunk is translated ``batch_size``
    sentences at a time in input order, and each batch's translations are yielded as soon as it
    is done.

    ``wanted`` (and ``settings``, keyword by keyword) are the decoding settings asked for, laid
    over the exported model's as CTranslate2 serves them (aiayn.decoding.declarations: beam
    search or sampling, n-best lists, stopping as ``first_k``; what it cannot serve is refused),
    then handed to it as its own arguments (:attr:`arguments`). ``device``: auto, cpu, cuda or
    cuda:<index> (:func:`ctranslate2_device`; a GPU CTranslate2 does not find is refused). ``threads`` is CTranslate2's
    intra-op threads (0: its default); ``compute_type`` the type it computes in (CTranslate2's
    ``compute_type``: "default" keeps the weights' own type, else e.g. "float32", "bfloat16",
    "float16", "int8")."""

    def __init__(self, folder: str | Path, wanted: Asked | Mapping[str, Any] | None = None, *,
                 batch_size: int = DecodeSwitches.batch_size,
                 threads: int = 0, device: str = "cpu", compute_type: str = "default", **settings: Any):
        ctranslate2 = require("ctranslate2")
        folder = Path(folder)
        if not (folder / SETTINGS_FILE).is_file() or not (folder / "model.bin").is_file():
            raise DataError(f"model_dir={folder}: not a CTranslate2 export of aiayn ({SETTINGS_FILE} or model.bin missing); "
                            "write one with src/export.py format=ctranslate2")
        exported = json.loads((folder / SETTINGS_FILE).read_text(encoding="utf-8"))
        wanted = asked({**asked(wanted).values, **settings}) if settings else asked(wanted)  # each asked for
        self.decoding = Decoding.of(exported.get("decoding"), wanted, engine="ctranslate2",
                                    where=f"{folder / SETTINGS_FILE}: decoding.")
        self.arguments = arguments(CTRANSLATE2, self.decoding)  # translate_batch's, but these two:
        self.max_len_offset = self.arguments.pop("max_len_offset")  # each sentence searched within its own limit
        seed = self.arguments.pop("seed", None)
        if seed is not None:  # samples drawn as the seed says, one stream for the process
            ctranslate2.set_random_seed(seed)
        self.nbest = self.decoding.nbest
        self.max_positions = int(exported["max_positions"])
        self.batch_size = batch_size
        self.vocab = Subwords(folder / SUBWORDS_FILE)
        self.decoding.fit(self.max_positions, self.vocab.vocab_size)  # as aiayn's search checks its model
        self.piece_ids = self.vocab.piece_ids()
        # a parser's way with lines and outputs, as its task hands it over (None: text, a translation's)
        self.raw_text = raw_text_of(exported.get("task") or {}, self.vocab)
        if "task" not in exported and has_tree_symbols(self.vocab):  # said, not guessed: which task is not recorded
            log.warning("model_dir=%s: its %s records no task (an export made before exports recorded it) and its "
                        "vocabulary has a parser's tree symbols, so each output is written as its tokens decode (for "
                        "a parser, the linearised tree, not a tree over the line's words); export the checkpoint "
                        "again (src/export.py ckpt=<file.ckpt> format=ctranslate2) for the trees", folder, SETTINGS_FILE)
        kind, index = ctranslate2_device(device)
        if kind == "cuda" and index >= (gpus := ctranslate2.get_cuda_device_count()):
            found = ("no CUDA GPU" if not gpus else "1 CUDA GPU (cuda:0)" if gpus == 1 else
                     f"{gpus} CUDA GPUs (cuda:0 to cuda:{gpus - 1})")
            raise ConfigError(f"device={device}: CTranslate2 finds {found} on this machine; give device=cpu"
                              f"{' or one of those' if gpus else ''}, or device=auto")
        self.translator = ctranslate2.Translator(str(folder), device=kind, device_index=index, compute_type=compute_type,
                                                 inter_threads=1, intra_threads=threads)
        self.sentences = self.output_tokens = self.truncated = 0
        self.seconds = 0.0

    @property
    def sentences_per_second(self) -> float:
        return self.sentences / self.seconds if self.seconds else 0.0

    def translate_ids(self, sources: Sequence[Sequence[int]]) -> list[list[int]]:
        """The best output's ids (no BOS/EOS) of each source's ids (no EOS)."""
        return [hypotheses[0][0] for hypotheses in self._search(sources)]

    def _search(self, sources: Sequence[Sequence[int]], scores: bool = False) -> list[list[tuple[list[int], float]]]:
        """Each source's hypotheses (ids, CTranslate2's score), best first, each searched within its own
        maximum length as aiayn's search is: source length with EOS + max_len_offset, at most the
        model's positions (CTranslate2's ``max_decoding_length``: the output's tokens, the end token
        not counted)."""
        limits = [self._limit(ids) for ids in sources]
        found: list[list[tuple[list[int], float]]] = [[] for _ in sources]
        # CTranslate2's maximum length is one number per search: the sources of one limit are searched
        # together, each group with its own, so that each output is the search's within its sentence's limit
        # (a cut of a longer search's output is not: its beam went on past the limit, and ranked otherwise).
        for limit in sorted(set(limits)):
            rows = [i for i, each in enumerate(limits) if each == limit]
            results = self.translator.translate_batch([self._pieces(sources[i]) for i in rows],
                                                      max_decoding_length=limit, max_batch_size=self.batch_size,
                                                      return_scores=scores, **self.arguments)
            for i, result in zip(rows, results):
                found[i] = [([self.piece_ids[piece] for piece in hypothesis], score) for hypothesis, score
                            in zip(result.hypotheses, result.scores or [0.0] * len(result.hypotheses))]
        return found

    def _pieces(self, ids: Sequence[int]) -> list[str]:
        return self.vocab.pieces([*ids, self.vocab.eos_id])

    def stream(self, chunks: Iterable[Sequence[str]]) -> Iterator[list[str]]:
        """For each chunk, after each batch: that batch's translations, in input order."""
        for ready in self._batches(chunks, nbest=False):
            yield [hypotheses[0].text for hypotheses in ready]

    def stream_nbest(self, chunks: Iterable[Sequence[str]]) -> Iterator[list[list[Scored]]]:
        """:meth:`stream` with each input's ``nbest`` hypotheses, in CTranslate2's order, each with
        CTranslate2's score (what it ranks by: log P / |Y|^α) and log P(Y|X) (CTranslate2's
        scoring of the hypothesis and EOS); an empty input has as many, each "" scored 0."""
        return self._batches(chunks, nbest=True)

    def _batches(self, chunks: Iterable[Sequence[str]], nbest: bool) -> Iterator[list[list[Scored]]]:
        for chunk in chunks:
            for start in range(0, len(chunk), self.batch_size):
                started = time.perf_counter()
                sentences = list(chunk[start : start + self.batch_size])
                first_line = self.sentences + 1
                ids, truncated = encode_lines(self.vocab, sentences, self.max_positions - 1, first_line, self.raw_text)
                self.truncated += truncated
                todo = [i for i, (text, seq) in enumerate(zip(sentences, ids)) if text.strip() and seq]
                found = self._search([ids[i] for i in todo], scores=nbest)
                outputs = [[tokens for tokens, _ in hypotheses] for hypotheses in found]
                texts = iter(output_texts(self.vocab, outputs, [sentences[i] for i in todo],
                                          [first_line + i for i in todo], self.raw_text, unconstrained=UNCONSTRAINED))
                ready = [[Scored("", 0.0, 0.0)] * self.nbest for _ in sentences]  # an empty input's, as many as any's
                for i, hypotheses, tokens in zip(todo, found, outputs):
                    log_probs = self._log_probs(ids[i], tokens) if nbest else [0.0] * len(tokens)
                    ready[i] = [Scored(next(texts), score, log_prob)
                                for (_, score), log_prob in zip(hypotheses, log_probs)]
                self.output_tokens += sum(len(hypotheses[0][0]) for hypotheses in found)
                self.sentences += len(sentences)
                self.seconds += time.perf_counter() - started
                yield ready

    def _limit(self, source: Sequence[int]) -> int:
        """The most tokens an output of ``source`` (its ids, no EOS) may have, its EOS included."""
        return min(len(source) + 1 + self.max_len_offset, self.max_positions)

    def _log_probs(self, source: Sequence[int], outputs: list[list[int]]) -> list[float]:
        """log P(output | source) of each output, as CTranslate2 scores it, its EOS counted where it
        ended with one, as aiayn's search counts it: not for one cut at its limit (CTranslate2
        scores every target with its end token, the last of its log-probabilities)."""
        scored = self.translator.score_batch([self._pieces(source)] * len(outputs),
                                             [self.vocab.pieces(output) for output in outputs])
        limit = self._limit(source)
        return [float(sum(result.log_probs[:-1] if len(output) >= limit else result.log_probs))
                for output, result in zip(outputs, scored)]
