"""A checkpoint exported as MarianMT (src/aiayn/export/marian.py, huggingface.py) computes our function
after ``from_pretrained``: identical teacher-forced logits and greedy outputs on real Multi30k
sentences; what Marian cannot express is refused, naming the setting."""

from __future__ import annotations

import pytest
import torch

from aiayn.data.corpus import TranslationCollator
from aiayn.decoding.packages import require
from aiayn.errors import ConfigError
from aiayn.export.marian import check_expressible, marian_order
from aiayn.model import Transformer, greedy_search

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install 'aiayn[serve]')")

pytestmark = pytest.mark.usefixtures("single_thread")


def reloaded(folder):
    return (transformers.MarianMTModel.from_pretrained(str(folder)).eval(),
            transformers.MarianTokenizer.from_pretrained(str(folder)))


def test_teacher_forced_logits_are_ours_after_reloading(hf_export, tiny_trained, multi30k_pairs):
    english, german = multi30k_pairs
    vocab, model = tiny_trained.vocab, tiny_trained.model
    batch = TranslationCollator(vocab.pad_id, vocab.bos_id, vocab.eos_id)(
        list(zip(range(len(english)), vocab.encode(english), vocab.encode(german))))
    marian, tokenizer = reloaded(hf_export)
    inputs = tokenizer(english, return_tensors="pt", padding=True)
    assert torch.equal(inputs["input_ids"], batch["src"])  # the tokenizer gives our ids, EOS appended, pad 0
    with torch.no_grad():
        ours = model(batch["src"], batch["tgt_in"])
        theirs = marian(**inputs, decoder_input_ids=batch["tgt_in"]).logits
    real = batch["tgt_in"] != vocab.pad_id
    torch.testing.assert_close(theirs[real], ours[real], rtol=1e-5, atol=5e-5)
    assert ours[real].std() > 0.1  # a trained model's logits, not a constant


def test_greedy_outputs_are_ours(hf_export, tiny_trained, multi30k_pairs):
    english, _ = multi30k_pairs
    vocab, model = tiny_trained.vocab, tiny_trained.model
    marian, tokenizer = reloaded(hf_export)
    inputs = tokenizer(english, return_tensors="pt", padding=True)
    offset = 8
    ours = greedy_search(model, inputs["input_ids"], bos_id=vocab.bos_id, eos_id=vocab.eos_id, max_len_offset=offset)
    limits = (inputs["attention_mask"].sum(-1) + offset).tolist()
    with torch.no_grad():
        out = marian.generate(**inputs, num_beams=1, do_sample=False, max_new_tokens=max(limits))
    assert (out[:, 0] == vocab.bos_id).all()  # the decoder starts with BOS, as ours
    theirs = []
    for row, limit in zip(out[:, 1:].tolist(), limits):  # generate runs the batch to one maximum; ours each to its own
        row = row[:limit]
        theirs.append(row[: row.index(vocab.eos_id)] if vocab.eos_id in row else row)
    assert theirs == ours
    assert sum(map(len, ours)) > len(english)  # real outputs, not all empty
    decoded = tokenizer.batch_decode([[vocab.bos_id, *ids, vocab.eos_id] for ids in theirs], skip_special_tokens=True)
    assert decoded == vocab.decode(ours)


def test_positions_need_no_fix_after_reloading(hf_export, tiny_trained):
    """Marian recomputes its (sines, then cosines) table on loading: it is ours with d_model reordered."""
    marian, _ = reloaded(hf_export)
    table = tiny_trained.model.src_positions.table
    order = marian_order(tiny_trained.model.d_model)
    for stack in (marian.model.encoder, marian.model.decoder):
        positions = stack.embed_positions.weight
        torch.testing.assert_close(positions, table[: positions.size(0), order], rtol=1e-5, atol=1e-5)
    assert marian.config.decoder_start_token_id == tiny_trained.vocab.bos_id
    assert marian.config.pad_token_id == tiny_trained.vocab.pad_id
    assert marian.config.eos_token_id == tiny_trained.vocab.eos_id
    assert not marian.final_logits_bias.any()


def test_model_card_states_task_data_steps_and_the_length_penalty(hf_export, tiny_trained):
    card = (hf_export / "README.md").read_text(encoding="utf-8")
    assert "multi30k_en_de" in card and "en→de" in card and "- en\n- de" in card
    assert f"{tiny_trained.step:,} steps" in card
    assert "((5 + |Y|) / 6)^α" in card and "|Y|^α" in card  # ours (GNMT) against Marian's
    assert "d_model: 32" in card and "beam_size: 4" in card
    assert "Multi30kDataModule" in card and "500 joint sentencepiece subwords" in card


TINY = {"n_layers": 1, "d_model": 32, "d_ff": 64, "n_heads": 2, "d_k": 16, "d_v": 16, "max_positions": 64}


@pytest.mark.parametrize("settings, named", [
    ({"positional": "learned"}, "model.positional=learned"),
    ({"d_k": 8, "d_v": 8}, "model.d_k=8"),
    ({"d_v": 8}, "model.d_v=8"),
    ({"attention_window": 3}, "model.attention_window=3"),
])
def test_what_marian_cannot_express_is_refused_by_name(settings, named):
    torch.manual_seed(0)
    model = Transformer(40, 40, **{**TINY, **settings})
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")) as refused:
        check_expressible(model, "run.ckpt")
    assert str(refused.value).startswith("run.ckpt ")
    assert check_expressible(Transformer(40, 40, **TINY))["d_model"] == 32  # the same sizes otherwise pass


def test_a_missing_serving_package_is_one_line_saying_how_to_install_it():
    with pytest.raises(ConfigError, match=r"the no_such_serving_package package, which is not installed; "
                                          r"pip install 'aiayn\[serve\]'"):
        require("no_such_serving_package")
    assert require("transformers").__name__ == transformers.__name__ == "transformers"
