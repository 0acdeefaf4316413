"""The files of a ``MarianTokenizer`` for a checkpoint's own subword model, so that Hugging Face
tokenizes exactly as we do: the checkpoint's sentencepiece model as both ``source.spm`` and
``target.spm`` (our vocabulary is joint), and ``vocab.json`` mapping every piece to our id.

MarianTokenizer splits text with the sentencepiece model into pieces, looks each piece up in
``vocab.json`` (a piece not there is ``<unk>``) and appends ``</s>`` (never ``<s>``, which is only
the decoder's first token and is declared so that decoding skips it): the ids our
:class:`~aiayn.data.subwords.Subwords` gives, with the EOS our collator appends to a source. A
special piece's text in a line ("</s>", "<unk>") is text, as sentencepiece reads it
(``split_special_tokens``), not the special id.
"""

from __future__ import annotations

import json
from pathlib import Path

from aiayn.data.subwords import Subwords
from aiayn.decoding.packages import require

# The pieces our sentencepiece models give the special ids (Subwords: pad 0, unk 1, bos 2, eos 3).
SPECIAL_PIECES = {"pad": "<pad>", "unk": "<unk>", "bos": "<s>", "eos": "</s>"}


def piece_vocabulary(vocab: Subwords) -> dict[str, int]:
    """Every piece of ``vocab`` and its id; ValueError if the special ids do not carry the pieces
    MarianTokenizer looks for."""
    pieces = vocab.pieces(range(vocab.vocab_size))
    for name, piece in SPECIAL_PIECES.items():
        if pieces[getattr(vocab, f"{name}_id")] != piece:
            raise ValueError(f"the subword model's {name} id {getattr(vocab, f'{name}_id')} is the piece "
                             f"{pieces[getattr(vocab, f'{name}_id')]!r}, not {piece!r}")
    return vocab.piece_ids()


def save_tokenizer(vocab: Subwords, out: Path, *, src_lang: str | None, tgt_lang: str | None,
                   max_positions: int) -> None:
    """Write source.spm, target.spm, vocab.json and the tokenizer's config into ``out``."""
    transformers = require("transformers")
    out.mkdir(parents=True, exist_ok=True)
    for name in ("source.spm", "target.spm"):
        (out / name).write_bytes(vocab.serialized())
    (out / "vocab.json").write_text(json.dumps(piece_vocabulary(vocab), ensure_ascii=False, indent=0) + "\n",
                                    encoding="utf-8")
    tokenizer = transformers.MarianTokenizer(
        str(out / "source.spm"), str(out / "target.spm"), str(out / "vocab.json"), source_lang=src_lang,
        target_lang=tgt_lang, unk_token=SPECIAL_PIECES["unk"], eos_token=SPECIAL_PIECES["eos"],
        pad_token=SPECIAL_PIECES["pad"], bos_token=SPECIAL_PIECES["bos"], model_max_length=max_positions,
        # "</s>", "<s>", "<unk>" or "<pad>" written in a line are text to sentencepiece, as to ours (the
        # default would make each the special id: an EOS, say, in the middle of a source)
        split_special_tokens=True)
    tokenizer.save_pretrained(str(out))
