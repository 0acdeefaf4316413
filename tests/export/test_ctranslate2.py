"""A checkpoint converted to CTranslate2 (src/aiayn/export/ctranslate2.py) translates as ours:
identical greedy outputs on real Multi30k sentences; int8 weights load and translate; the
translator streams in input order as aiayn's does."""

from __future__ import annotations

import json

import pytest

from aiayn.checkpoints.trained import load_trained
from aiayn.data.corpus import TranslationCollator
from aiayn.data.readers import read_lines
from aiayn.decoding.search import Search
from aiayn.decoding.settings import Decoding
from aiayn.errors import ConfigError, DataError
from aiayn.model import greedy_search

pytest.importorskip("transformers", reason="transformers is not installed (pip install 'aiayn[serve]')")
pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed (pip install 'aiayn[serve]')")

from aiayn.decoding.ctranslate2 import CTranslate2Translator, ctranslate2_device
from aiayn.export.ctranslate2 import export_ctranslate2

pytestmark = pytest.mark.usefixtures("single_thread")
OFFSET = 8


@pytest.fixture(scope="module")
def ct2_export(tiny_run, tiny_trained, tmp_path_factory):
    out = tmp_path_factory.mktemp("ct2") / "float32"
    return export_ctranslate2(load_trained(tiny_run.last, "cpu"), out, ckpt=tiny_run.last, steps=[tiny_trained.step])


@pytest.fixture(scope="module")
def random_export(tiny_run, tmp_path_factory):
    """The tiny run's network with random weights, N(0, 0.3), and its export: every output of it
    runs to its limit."""
    import torch

    trained = load_trained(tiny_run.last, "cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in trained.model.parameters():
            parameter.normal_(0, 0.3)
    return trained, export_ctranslate2(trained, tmp_path_factory.mktemp("ct2") / "random", ckpt=tiny_run.last,
                                       steps=[trained.step])

def ours_greedy(trained, sentences):
    vocab = trained.vocab
    src = TranslationCollator(vocab.pad_id, vocab.bos_id, vocab.eos_id)(
        [(i, ids, []) for i, ids in enumerate(vocab.encode(sentences))])["src"]
    return greedy_search(trained.model, src, bos_id=vocab.bos_id, eos_id=vocab.eos_id, max_len_offset=OFFSET)


def test_greedy_outputs_are_ours(ct2_export, tiny_trained, multi30k_pairs):
    english, _ = multi30k_pairs
    translator = CTranslate2Translator(ct2_export, beam_size=1, max_len_offset=OFFSET, threads=1)
    ours = ours_greedy(tiny_trained, english)
    assert translator.translate_ids(tiny_trained.vocab.encode(english)) == ours
    assert sum(map(len, ours)) > len(english)  # real outputs, not all empty


def test_min_len_is_served_as_ours(ct2_export, tiny_trained, multi30k_pairs):
    """decoding.min_len reaches CTranslate2 as min_decoding_length: its greedy outputs with a minimum
    are aiayn's (beam 1, α 0) with the same minimum."""
    english, _ = multi30k_pairs
    vocab = tiny_trained.vocab
    src = TranslationCollator(vocab.pad_id, vocab.bos_id, vocab.eos_id)(
        [(i, ids, []) for i, ids in enumerate(vocab.encode(english))])["src"]
    wanted = {"beam_size": 1, "alpha": 0.0, "max_len_offset": OFFSET, "min_len": 6}
    ours = Search(Decoding.of(tiny_trained.decoding, wanted), vocab).best(tiny_trained.model, src)
    translator = CTranslate2Translator(ct2_export, wanted, threads=1)
    assert translator.arguments["min_decoding_length"] == 6
    assert translator.translate_ids(vocab.encode(english)) == ours and min(map(len, ours)) >= 6


def test_stream_keeps_input_order_and_empty_lines(ct2_export, tiny_trained, multi30k_pairs):
    english, _ = multi30k_pairs
    lines = ["", english[0], "   ", *english[1:5]]
    translator = CTranslate2Translator(ct2_export, beam_size=1, max_len_offset=OFFSET, batch_size=2, threads=1)
    batches = list(translator.stream([lines[:4], lines[4:]]))
    assert [len(batch) for batch in batches] == [2, 2, 2, 1]  # each batch given back as soon as it is done
    expected = tiny_trained.vocab.decode(ours_greedy(tiny_trained, english[:5]))
    assert [text for batch in batches for text in batch] == ["", expected[0], "", *expected[1:]]
    assert translator.sentences == len(lines) and translator.output_tokens > 0 and translator.seconds > 0


def test_each_output_is_searched_within_its_own_sentences_limit(random_export, data_root):
    """CTranslate2's maximum length is one number per search: a batch's outputs are each their
    sentence's search within its own limit (input + max_len_offset, as the paper's), the same as
    that sentence searched alone (before: the batch searched to its longest sentence's limit, each
    output cut to its own after, and with a beam that went on past a limit the cut one was often
    not the search's best within it). Random weights: every output runs to its limit."""
    trained, export = random_export
    translator = CTranslate2Translator(export, beam_size=4, max_len_offset=OFFSET, threads=1)
    # newstest2014's first sentences (3 to 165 subwords), each of its own length (its own limit)
    english = read_lines(data_root / "wmt14" / "newstest2014-en-de.en")[:20]
    sources = list({len(ids): ids for ids in trained.vocab.encode(english)}.values())
    together = translator.translate_ids(sources)
    assert together == [translator.translate_ids([ids])[0] for ids in sources]
    assert [len(output) for output in together] == [len(ids) + 1 + OFFSET for ids in sources]



def _log_prob(model, vocab, source: list[int], output: list[int], ended: bool) -> float:
    """log P(output | source) by teacher forcing, with the EOS where the output ended with one."""
    import torch

    target = [*output, vocab.eos_id] if ended else output
    with torch.no_grad():
        logits = model(torch.tensor([[*source, vocab.eos_id]]), torch.tensor([[vocab.bos_id, *target[:-1]]]))
    return float(logits.log_softmax(-1)[0].gather(1, torch.tensor(target)[:, None]).sum())


def test_an_nbest_log_prob_counts_the_eos_only_where_the_output_ended_with_one(random_export, tiny_trained, ct2_export,
                                                                               multi30k_pairs):
    """The n-best list's log-prob column is aiayn's: an output cut at its limit has no EOS, and
    none is counted (before: CTranslate2's score of it with its end token, several nats lower).
    Random weights run every output to its limit; the trained model ends its outputs."""
    english = multi30k_pairs[0][:4]
    trained, random = random_export
    for model, export, cut in [(trained.model, random, True), (tiny_trained.model, ct2_export, False)]:
        translator = CTranslate2Translator(export, beam_size=2, nbest=2, max_len_offset=OFFSET, threads=1)
        for source in trained.vocab.encode(english):
            outputs = [ids for ids, _ in translator._search([source], scores=True)[0]]
            assert all((len(output) == len(source) + 1 + OFFSET) == cut for output in outputs), (cut, outputs)
            expected = [_log_prob(model, trained.vocab, source, output, ended=not cut) for output in outputs]
            assert translator._log_probs(source, outputs) == pytest.approx(expected, rel=1e-4, abs=1e-4)

def test_export_carries_settings_subwords_and_card(ct2_export, tiny_trained):
    settings = json.loads((ct2_export / "aiayn.json").read_text())
    served = Decoding.of(tiny_trained.decoding, engine="ctranslate2 export").settings()
    assert settings["decoding"] == served and served["stop"] == "first_k"  # the rule CTranslate2 stops by
    assert settings["max_positions"] == tiny_trained.model.max_positions and settings["quantization"] == "float32"
    assert (ct2_export / "source.spm").read_bytes() == tiny_trained.vocab.serialized()
    assert "|Y|^α" in (ct2_export / "README.md").read_text(encoding="utf-8")
    config = json.loads((ct2_export / "config.json").read_text())
    assert config["decoder_start_token"] == "<s>" and config["eos_token"] == "</s>"


def test_int8_weights_load_and_translate(ct2_export, tiny_run, tiny_trained, tmp_path, multi30k_pairs):
    english, _ = multi30k_pairs
    out = export_ctranslate2(load_trained(tiny_run.last, "cpu"), tmp_path / "int8", ckpt=tiny_run.last,
                             steps=[tiny_trained.step], quantization="int8")
    assert json.loads((out / "aiayn.json").read_text())["quantization"] == "int8"
    # at least a token each (the 4-step model ends at once otherwise, as ours does: CTranslate2's own
    # minimum of 1 no longer stands in for decoding.min_len=0)
    texts = [text for batch in CTranslate2Translator(out, min_len=1, threads=1).stream([english[:4]]) for text in batch]
    assert len(texts) == 4 and all(texts)
    assert (out / "model.bin").stat().st_size < 0.6 * (ct2_export / "model.bin").stat().st_size  # 8-bit weights


def test_unknown_quantization_and_foreign_folder_are_refused(tiny_trained, tiny_run, tmp_path):
    with pytest.raises(ConfigError, match="quantization=int3 is not one of"):
        export_ctranslate2(tiny_trained, tmp_path / "x", ckpt=tiny_run.last, steps=[1], quantization="int3")
    assert not (tmp_path / "x").exists()
    with pytest.raises(DataError, match="not a CTranslate2 export of aiayn"):
        CTranslate2Translator(tmp_path)


def test_a_gpu_index_is_given_to_ctranslate2_apart_and_one_it_does_not_find_is_refused(ct2_export, monkeypatch):
    """CTranslate2 takes a device and a GPU index apart: device=cuda:1 is ("cuda", 1) (before: "cuda:1" handed on
    as the device). No GPU needed: CTranslate2's Translator is a stand-in that records what it was given."""
    import ctranslate2

    assert [ctranslate2_device(d) for d in ("cuda:1", "cuda", "cpu", "auto")] == [
        ("cuda", 1), ("cuda", 0), ("cpu", 0), ("auto", 0)]
    given = {}
    monkeypatch.setattr(ctranslate2, "Translator", lambda folder, **arguments: given.update(arguments))
    monkeypatch.setattr(ctranslate2, "get_cuda_device_count", lambda: 2)
    CTranslate2Translator(ct2_export, device="cuda:1", threads=1)
    assert (given["device"], given["device_index"]) == ("cuda", 1)
    with pytest.raises(ConfigError) as refused:
        CTranslate2Translator(ct2_export, device="cuda:2", threads=1)
    assert str(refused.value) == ("device=cuda:2: CTranslate2 finds 2 CUDA GPUs (cuda:0 to cuda:1) on this machine; "
                                  "give device=cpu or one of those, or device=auto")
    monkeypatch.setattr(ctranslate2, "get_cuda_device_count", lambda: 0)
    with pytest.raises(ConfigError, match=r"^device=cuda:1: CTranslate2 finds no CUDA GPU on this machine; give "
                                          r"device=cpu, or device=auto$"):
        CTranslate2Translator(ct2_export, device="cuda:1", threads=1)
