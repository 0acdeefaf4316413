"""aiayn.decoding.translator (translation and perplexity) and constrained decoding would run right on a GPU,
checked on the CPU (tests/helpers/devices.py says how), with a real sentencepiece vocabulary
trained on Multi30k with a parser's tree symbols and a small random Transformer.

What is host-side by design is run as host code: the collator (numpy → torch on the CPU, moved
to the model's device by inference.py) and the tables of a TreeConstraint (built once on the
CPU and copied to each device as it is asked for, TreeConstraint.tables)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

import aiayn.decoding.translator
from aiayn.data.corpus import TranslationCollator
from aiayn.data.parsing.constraints import SPACE, TreeConstraint
from aiayn.data.readers import read_lines
from aiayn.data.subwords import Subwords, train_or_load
from aiayn.decoding.translator import Translator, perplexity, translate
from aiayn.model import Transformer, beam_search, greedy_search
from tests.helpers.devices import count_host_syncs, host_tensors, on_the_host, tensors_name_their_device

pytestmark = pytest.mark.usefixtures("single_thread")

SMALL = {"n_layers": 2, "d_model": 32, "d_ff": 64, "n_heads": 4, "d_k": 8, "d_v": 8, "dropout": 0.0,
         "max_positions": 128}
TREE_SYMBOLS = ["XX", "(S", ")S", "(NP", ")NP", "(VP", ")VP", "(PP", ")PP"]
SENTENCES = ["A dog runs on the grass .", "", "Two men are playing guitars on a stage while people watch .",
             "A child .", "A woman in a red coat walks down a busy street in the city ."]
# The waits of one search outside its loop: the length limits (beam search: all of them, one tolist;
# greedy search: the longest, an int), then the outputs and their lengths (two tolist).
FIXED_WAITS = {"beam_search": {"tolist": 3}, "greedy_search": {"_local_scalar_dense": 1, "tolist": 2}}


@pytest.fixture(scope="module")
def vocab(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Subwords:
    """A 400-piece vocabulary of 3,000 Multi30k English lines, with a parser's output symbols."""
    lines = read_lines(data_root / "multi30k" / "train.en.gz")[:3000]
    return train_or_load(lines, 400, tmp_path_factory.mktemp("spm"),
                         user_defined_symbols=[SPACE + symbol for symbol in TREE_SYMBOLS])


@pytest.fixture(scope="module")
def model(vocab: Subwords) -> Transformer:
    torch.manual_seed(0)
    return Transformer(vocab.vocab_size, vocab.vocab_size, pad_id=vocab.pad_id, **SMALL).eval()


class HostCollator(TranslationCollator):
    """The real collator, run as host code: its tensors are made on the CPU and marked as host
    tensors, so that a batch used without ``.to(device)`` fails the check. Counts its batches."""

    batches = 0

    def __call__(self, items):
        type(self).batches += 1
        with on_the_host():
            return host_tensors(super().__call__(items))


def host_tables(constraint: TreeConstraint) -> TreeConstraint:
    """``constraint`` with its tables marked as the host tensors they are (used only through
    ``tables(device)``, which moves them)."""
    host_tensors([constraint.kind, constraint.label, constraint.starts_word])
    return constraint


def searched(search, model: Transformer, src: torch.Tensor, **settings) -> tuple[list[list[int]], dict[str, int], int]:
    """The outputs of one search, its host waits by kind, and its steps (the decoder's calls)."""
    steps = 0
    decode = model.decode

    def counted(*args, **kwargs):
        nonlocal steps
        steps += 1
        return decode(*args, **kwargs)

    model.decode = counted
    try:
        with count_host_syncs() as syncs:
            outputs = search(model, src, **settings)
    finally:
        del model.decode
    return outputs, dict(syncs.kinds), steps


def test_streamed_translation_names_its_devices(model: Transformer, vocab: Subwords):
    """Translator.stream (sources moved to the model's device, beam search, decoding to text)
    creates no tensor without a device and translates as outside the check."""
    settings = {"beam_size": 3, "alpha": 0.6, "max_len_offset": 5}
    expected = translate(model, vocab, SENTENCES, settings, batch_size=2).texts
    translator = Translator(model, vocab, settings, batch_size=2)
    translator.collate = HostCollator(vocab.pad_id, vocab.bos_id, vocab.eos_id)
    with tensors_name_their_device():
        texts = [text for ready in translator.stream([SENTENCES[:2], SENTENCES[2:]]) for text in ready]
    assert texts == expected and any(texts)
    assert translator.sentences == len(SENTENCES) and translator.output_tokens > 0


def test_constrained_translation_names_its_devices(model: Transformer, vocab: Subwords):
    """Translating with the tree constraint (its per-hypothesis counters and masks on the model's
    device) creates no tensor without a device and gives what it gives outside the check: trees."""
    settings = {"beam_size": 2, "alpha": 0.6, "max_len_offset": 30, "constrained": True}
    expected = translate(model, vocab, SENTENCES, settings, TreeConstraint(vocab), batch_size=4).texts
    translator = Translator(model, vocab, settings, TreeConstraint(vocab), batch_size=4)  # tables on the host, as a task hands them over
    translator.collate = HostCollator(vocab.pad_id, vocab.bos_id, vocab.eos_id)
    host_tables(translator.search.constraint)
    with tensors_name_their_device():
        texts = [text for ready in translator.stream([SENTENCES]) for text in ready]
    assert texts == expected
    for sentence, tree in zip(SENTENCES, texts):
        assert tree.split().count("XX") == len(sentence.split())  # one leaf per word: the constraint held


@pytest.mark.parametrize("kv_cache", [True, False])
@pytest.mark.parametrize("search", [beam_search, greedy_search])
def test_constrained_search_names_its_devices_and_waits_once_per_step(model: Transformer, vocab: Subwords,
                                                                      search, kv_cache):
    """Beam and greedy search under the tree constraint create no tensor without a device, give
    the same outputs as outside the check, and wait on the device once per step (the stopping
    test's ``nonzero``): the constraint's masks, advances and reorderings add no wait."""
    items = [(i, ids, []) for i, ids in enumerate(vocab.encode([s for s in SENTENCES if s]))]
    src = TranslationCollator(vocab.pad_id, vocab.bos_id, vocab.eos_id)(items)["src"]
    settings = dict(bos_id=vocab.bos_id, eos_id=vocab.eos_id, max_len_offset=30, kv_cache=kv_cache,
                    **({"beam_size": 3, "alpha": 0.6} if search is beam_search else {}))
    expected, kinds, steps = searched(search, model, src, constraint=TreeConstraint(vocab), **settings)
    constraint = host_tables(TreeConstraint(vocab))  # built on the host, as Translator builds it
    with tensors_name_their_device():
        outputs = search(model, src, constraint=constraint, **settings)
    assert outputs == expected
    assert kinds == {**FIXED_WAITS[search.__name__], "nonzero": steps} and steps > 10
    leaves = [tree.split().count("XX") for tree in vocab.decode(outputs)]
    assert leaves == [len(s.split()) for s in SENTENCES if s]  # one leaf per word: the constraint held


def test_perplexity_names_its_devices(model: Transformer, vocab: Subwords, monkeypatch: pytest.MonkeyPatch):
    """perplexity (batches moved to the model's device, teacher forcing, the loss) creates no
    tensor without a device, gives the same number as outside the check, and waits on the device
    twice per batch: the loss's token count and the batch's NLL, both read back as numbers."""
    references = ["Ein Hund rennt .", "Zwei Männer spielen Gitarre .", "Ein Kind .", "Eine Frau geht ."]
    sources = [s for s in SENTENCES if s]
    expected = perplexity(model, vocab, sources, references, max_tokens=40)
    monkeypatch.setattr(aiayn.decoding.translator, "TranslationCollator", HostCollator)
    HostCollator.batches = 0
    with tensors_name_their_device():
        got = perplexity(model, vocab, sources, references, max_tokens=40)
    assert got == expected and HostCollator.batches > 1
    HostCollator.batches = 0
    with count_host_syncs() as syncs:
        perplexity(model, vocab, sources, references, max_tokens=40)
    assert dict(syncs.kinds) == {"_local_scalar_dense": 2 * HostCollator.batches}


def test_perplexity_names_a_reference_longer_than_the_models_positions(model: Transformer, vocab: Subwords, caplog):
    """A reference cut to the model's positions (127 subwords and the EOS) is named, its line and length."""
    long = " ".join(["Two men are playing guitars on a stage while people watch ."] * 12)
    length = len(vocab.encode([long])[0])
    assert length > 127
    with caplog.at_level(logging.WARNING, logger="aiayn.decoding"):
        _, tokens = perplexity(model, vocab, ["A dog .", "A dog runs ."], ["A dog .", long], max_tokens=512)
    assert f"reference line 2 has {length} subword tokens; perplexity scores its first 127" in caplog.text
    assert tokens == len(vocab.encode(["A dog ."])[0]) + 1 + 128
