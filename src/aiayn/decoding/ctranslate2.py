"""Translating with a CTranslate2 export of a checkpoint (src/export.py format=ctranslate2) as
aiayn's translate.py does (``engine=ctranslate2``): the same reading, batching and counters as
aiayn.decoding.translator.Translator, CTranslate2's search.

CTranslate2's beam search normalises a hypothesis's score by |Y|^α, not GNMT's ((5 + |Y|) / 6)^α
(see the model card); its maximum output length is one number per batch, so each output is cut
at its own sentence's limit (input length + ``max_len_offset``) as aiayn's is.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from aiayn.config.schemas import decoding_settings
from aiayn.data.subwords import Subwords
from aiayn.decoding.packages import require
from aiayn.errors import DataError

# What aiayn needs besides CTranslate2's own files: the decoding settings and the model's positions.
SETTINGS_FILE = "aiayn.json"
SUBWORDS_FILE = "source.spm"


class CTranslate2Translator:
    """Translates sentences with an exported CTranslate2 model: the counterpart of
    :class:`aiayn.inference.Translator` (the same ``stream`` and counters), for translate.py's
    ``engine=ctranslate2``. Each chunk is translated ``batch_size`` sentences at a time in input
    order, and each batch's translations are yielded as soon as it is done.

    ``beam_size``, ``alpha`` and ``max_len_offset`` default to the exported model's decoding
    settings; ``threads`` is CTranslate2's intra-op threads (0: its default); ``compute_type`` the
    type it computes in (CTranslate2's ``compute_type``: "default" keeps the weights' own type,
    else e.g. "float32", "bfloat16", "float16", "int8")."""

    def __init__(self, folder: str | Path, *, beam_size: int | None = None, alpha: float | None = None,
                 max_len_offset: int | None = None, batch_size: int = 64, threads: int = 0, device: str = "cpu",
                 compute_type: str = "default"):
        ctranslate2 = require("ctranslate2")
        folder = Path(folder)
        if not (folder / SETTINGS_FILE).is_file() or not (folder / "model.bin").is_file():
            raise DataError(f"model_dir={folder}: not a CTranslate2 export of aiayn ({SETTINGS_FILE} or model.bin missing); "
                            "write one with src/export.py format=ctranslate2")
        settings = json.loads((folder / SETTINGS_FILE).read_text(encoding="utf-8"))
        decoding = decoding_settings(settings.get("decoding"), {"beam_size": beam_size, "alpha": alpha,
                                                                "max_len_offset": max_len_offset})
        self.beam_size, self.alpha, self.max_len_offset = decoding["beam_size"], decoding["alpha"], decoding["max_len_offset"]
        self.max_positions = int(settings["max_positions"])
        self.batch_size = batch_size
        self.vocab = Subwords(folder / SUBWORDS_FILE)
        self.piece_ids = self.vocab.piece_ids()
        self.translator = ctranslate2.Translator(str(folder), device=device, compute_type=compute_type,
                                                 inter_threads=1, intra_threads=threads)
        self.sentences = self.output_tokens = self.truncated = 0
        self.seconds = 0.0

    @property
    def sentences_per_second(self) -> float:
        return self.sentences / self.seconds if self.seconds else 0.0

    def translate_ids(self, sources: Sequence[Sequence[int]]) -> list[list[int]]:
        """The output ids (no BOS/EOS) of each source's ids (no EOS), each cut at its own maximum
        length as aiayn's search cuts it: source length with EOS + max_len_offset, at most the
        model's positions."""
        if not sources:
            return []
        limits = [min(len(ids) + 1 + self.max_len_offset, self.max_positions) for ids in sources]
        tokens = [self.vocab.pieces(ids) + [self.vocab.pieces([self.vocab.eos_id])[0]] for ids in sources]
        results = self.translator.translate_batch(
            tokens, beam_size=self.beam_size, length_penalty=self.alpha, max_decoding_length=max(limits),
            max_batch_size=self.batch_size)
        return [[self.piece_ids[piece] for piece in result.hypotheses[0]][:limit]
                for result, limit in zip(results, limits)]

    def stream(self, chunks: Iterable[Sequence[str]]) -> Iterator[list[str]]:
        """For each chunk, after each batch: that batch's translations, in input order."""
        limit = self.max_positions - 1
        for chunk in chunks:
            for start in range(0, len(chunk), self.batch_size):
                started = time.perf_counter()
                sentences = list(chunk[start : start + self.batch_size])
                ids = self.vocab.encode(sentences)
                for i, seq in enumerate(ids):
                    if len(seq) > limit:
                        ids[i], self.truncated = seq[:limit], self.truncated + 1
                todo = [i for i, (text, seq) in enumerate(zip(sentences, ids)) if text.strip() and seq]
                outputs = self.translate_ids([ids[i] for i in todo])
                texts = [""] * len(sentences)
                for i, text in zip(todo, self.vocab.decode(outputs)):
                    texts[i] = text
                self.output_tokens += sum(map(len, outputs))
                self.sentences += len(sentences)
                self.seconds += time.perf_counter() - started
                yield texts
