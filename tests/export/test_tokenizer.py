"""The exported MarianTokenizer (src/aiayn/export/tokenizer.py) tokenizes as the checkpoint's own
subword model: the same pieces and ids, EOS appended as our collator does, and decoding back."""

from __future__ import annotations

import json

import pytest

from aiayn.export.tokenizer import piece_vocabulary

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install 'aiayn[serve]')")


@pytest.mark.slow
def test_tokenizer_round_trips_the_checkpoint_pieces(hf_export, tiny_trained, multi30k_pairs):
    vocab = tiny_trained.vocab
    tokenizer = transformers.MarianTokenizer.from_pretrained(str(hf_export))
    assert (tokenizer.pad_token_id, tokenizer.unk_token_id, tokenizer.eos_token_id) == (
        vocab.pad_id, vocab.unk_id, vocab.eos_id)
    assert len(tokenizer.get_vocab()) == vocab.vocab_size
    english, german = multi30k_pairs
    for texts, encode in ((english, tokenizer), (german, lambda t: tokenizer(text_target=t))):
        ours = vocab.encode(texts)
        theirs = encode(texts)["input_ids"]
        assert theirs == [ids + [vocab.eos_id] for ids in ours]
        for ids, row in zip(ours, theirs):
            assert tokenizer.convert_ids_to_tokens(row[:-1]) == vocab.pieces(ids)
        # a decoder output: BOS first, EOS last; both dropped as ours are (<unk> aside: Hugging Face
        # drops it as a special token where sentencepiece writes " ⁇ ")
        known = [ids for ids in ours if vocab.unk_id not in ids]
        decoded = tokenizer.batch_decode([[vocab.bos_id, *ids, vocab.eos_id] for ids in known], skip_special_tokens=True)
        assert decoded == vocab.decode(known) and len(known) >= len(ours) - 1
    assert vocab.unk_id in vocab.encode([english[-1]])[0]  # the unusual line does reach <unk>


def test_vocabulary_file_is_every_piece_at_its_id(hf_export, tiny_trained):
    vocab = tiny_trained.vocab
    written = json.loads((hf_export / "vocab.json").read_text(encoding="utf-8"))
    assert written == piece_vocabulary(vocab)
    assert sorted(written.values()) == list(range(vocab.vocab_size))
    assert (hf_export / "source.spm").read_bytes() == (hf_export / "target.spm").read_bytes() == vocab.serialized()


def test_special_pieces_written_in_a_line_are_text_as_ours(hf_export, tiny_trained):
    """"</s>", "<s>", "<unk>" and "<pad>" in a line are encoded as the subword model encodes that text,
    as aiayn does (before: each became its special id, an EOS or BOS in the middle of a source)."""
    vocab = tiny_trained.vocab
    tokenizer = transformers.MarianTokenizer.from_pretrained(str(hf_export))
    lines = ["A man </s> runs.", "Click <s> here", "<unk> is unknown", "a <pad> b", "<b>bold</b> &amp; x"]
    assert tokenizer(lines)["input_ids"] == [ids + [vocab.eos_id] for ids in vocab.encode(lines)]
    assert tokenizer(text_target=lines)["input_ids"] == [ids + [vocab.eos_id] for ids in vocab.encode(lines)]
