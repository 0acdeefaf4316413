"""CTranslate2: converting an exported MarianMT folder into a CTranslate2 model (optionally with
int8 weights), which aiayn.decoding.ctranslate2 translates with (translate.py ``engine=ctranslate2``).

The conversion is CTranslate2's own converter of Hugging Face BART-family models, with the
settings of ours rather than those of Marian's checkpoints, which CTranslate2's Marian loader
assumes: it starts the decoder from a zero vector and drops a last vocabulary row (the pad id that
Marian's checkpoints append); ours starts the decoder with BOS and has no such row. So the loader
here is CTranslate2's BART loader with post-norm, no embedding LayerNorm, and BOS as the
decoder's first token: greedy output equals aiayn's (tests/export/test_ctranslate2.py).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import replace
from pathlib import Path

from aiayn.checkpoints.trained import TrainedModel
from aiayn.decoding.ctranslate2 import SETTINGS_FILE, SUBWORDS_FILE
from aiayn.decoding.declarations import CTRANSLATE2, arguments
from aiayn.decoding.packages import require
from aiayn.decoding.settings import Decoding
from aiayn.errors import ConfigError
from aiayn.export.folder import replacing_folder
from aiayn.export.huggingface import card_facts, save_huggingface
from aiayn.export.marian import model_sizes

# CTranslate2's weight types (``quantization=``); null keeps float32.
QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")


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
                       quantization: str | None = None, decoding: Decoding | None = None) -> Path:
    """Export ``trained`` as a MarianMT folder (in a scratch folder) and convert that into a
    CTranslate2 model in ``out``, with ``quantization``'s weights (None: float32), to decode with
    ``decoding`` (made for the ``ctranslate2 export`` engine; None: the checkpoint's own settings,
    as CTranslate2 serves them), which its ``aiayn.json`` records with its task (what names the
    task's data module: a parser's export writes trees, aiayn.decoding.ctranslate2)."""
    require("ctranslate2")
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ConfigError(f"quantization={quantization} is not one of CTranslate2's: {', '.join(QUANTIZATIONS)} "
                          "(null: float32)")
    decoding = decoding or Decoding.of(trained.decoding, engine="ctranslate2 export",
                                       where="the checkpoint's decoding.")
    # the card of this folder: how CTranslate2 is called to decode as aiayn.json says, and the weights' type
    facts = replace(card_facts(trained, ckpt, steps, decoding), format="ctranslate2", quantization=quantization,
                    serving=arguments(CTRANSLATE2, decoding))
    with replacing_folder(out, "ctranslate2") as scratch, tempfile.TemporaryDirectory(prefix="aiayn-hf-") as hf:
        hf_folder = Path(hf)
        save_huggingface(trained, hf_folder, facts, str(ckpt))
        settings = {"decoding": decoding.settings(), "max_positions": model_sizes(trained.model)["max_positions"],
                    "src_lang": facts.src_lang, "tgt_lang": facts.tgt_lang, "quantization": quantization or "float32",
                    # what names the task's data module: a parser's export reads lines and writes trees as aiayn's
                    "task": {"name": facts.task, "datamodule": {"_target_": facts.data.get("_target_")}}}
        (hf_folder / SETTINGS_FILE).write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
        _converter(hf_folder).convert(str(scratch), quantization=quantization, force=True)
    return out
