"""CTranslate2: converting an exported MarianMT folder into a CTranslate2 model (optionally with
int8 weights), and translating with it as aiayn's translate.py does (``engine=ctranslate2``).

The conversion is CTranslate2's own converter of Hugging Face BART-family models, with the
settings of ours rather than those of Marian's checkpoints, which CTranslate2's Marian loader
assumes: it starts the decoder from a zero vector and drops a last vocabulary row (the pad id that
Marian's checkpoints append); ours starts the decoder with BOS and has no such row. So the loader
here is CTranslate2's BART loader with post-norm, no embedding LayerNorm, and BOS as the
decoder's first token: greedy output equals aiayn's (tests/export/test_ctranslate2.py).

CTranslate2's beam search normalises a hypothesis's score by |Y|^α, not GNMT's ((5 + |Y|) / 6)^α
(see the model card); its maximum output length is one number per batch, so each output is cut
at its own sentence's limit (input length + ``max_len_offset``) as aiayn's is.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from aiayn.checkpoints.trained import TrainedModel
from aiayn.config.schemas import decoding_settings
from aiayn.data.subwords import Subwords
from aiayn.errors import ConfigError, DataError
from aiayn.export.huggingface import card_facts, replacing_folder, save_huggingface
from aiayn.export.marian import model_sizes, require
from aiayn.export.tokenizer import piece_vocabulary

# CTranslate2's weight types (``quantization=``); null keeps float32.
QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")
# What aiayn needs besides CTranslate2's own files: the decoding settings and the model's positions.
SETTINGS_FILE = "aiayn.json"
SUBWORDS_FILE = "source.spm"


def _converter(hf_folder: Path):
    """A CTranslate2 converter of the MarianMT folder ``hf_folder`` with the loader described above."""
    require("ctranslate2")
    transformers = require("transformers")
    from ctranslate2.converters import Converter
    from ctranslate2.converters.transformers import BartLoader

    class AiaynMarianLoader(BartLoader):
        @property
        def architecture_name(self):
            return "MarianMTModel"

        def get_model_spec(self, model):
            model.config.normalize_before = False  # post-norm (§3.1)
            model.config.normalize_embedding = False  # no LayerNorm on the embeddings
            return super().get_model_spec(model)

        def set_config(self, config, model, tokenizer):
            pieces = tokenizer.convert_ids_to_tokens
            config.bos_token = pieces(model.config.bos_token_id)
            config.eos_token = tokenizer.eos_token
            config.unk_token = tokenizer.unk_token
            config.decoder_start_token = pieces(model.config.decoder_start_token_id)  # BOS, as ours

    class AiaynConverter(Converter):
        def _load(self):
            model = transformers.MarianMTModel.from_pretrained(str(hf_folder)).eval()
            tokenizer = transformers.MarianTokenizer.from_pretrained(str(hf_folder))
            spec = AiaynMarianLoader()(model, tokenizer)
            for name in (SUBWORDS_FILE, SETTINGS_FILE, "README.md"):
                spec.register_file(str(hf_folder / name))
            return spec

    return AiaynConverter()


def export_ctranslate2(trained: TrainedModel, out: Path, *, ckpt: Path, steps: list[int],
                       quantization: str | None = None) -> Path:
    """Export ``trained`` as a MarianMT folder (in a scratch folder) and convert that into a
    CTranslate2 model in ``out``, with ``quantization``'s weights (None: float32)."""
    require("ctranslate2")
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ConfigError(f"quantization={quantization} is not one of CTranslate2's: {', '.join(QUANTIZATIONS)} "
                          "(null: float32)")
    facts = card_facts(trained, ckpt, steps)
    with replacing_folder(out) as scratch, tempfile.TemporaryDirectory(prefix="aiayn-hf-") as hf:
        hf_folder = Path(hf)
        save_huggingface(trained, hf_folder, facts, str(ckpt))
        settings = {"decoding": facts.decoding, "max_positions": model_sizes(trained.model)["max_positions"],
                    "src_lang": facts.src_lang, "tgt_lang": facts.tgt_lang, "quantization": quantization or "float32"}
        (hf_folder / SETTINGS_FILE).write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
        _converter(hf_folder).convert(str(scratch), quantization=quantization, force=True)
    return out


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
        self.piece_ids = piece_vocabulary(self.vocab)
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
