"""aiayn.decoding.search's Search on the session's tiny trained run: each setting it is handed
reaches the search; here ``decoding.min_len``, the shortest output (fairseq's --min-len), in beam
search and in sampling. The 4-step model ends its translations at once with the task's α (tests/
decoding/test_translator.py), so a minimum shows."""

from __future__ import annotations

import pytest

from aiayn.checkpoints.trained import TrainedModel, load_trained
from aiayn.data.corpus import TranslationCollator
from aiayn.decoding.search import Search
from aiayn.decoding.settings import Decoding
from tests.helpers.runs import TrainedRun

SENTENCES = ["A man is riding a bike.", "Two dogs play in the snow.", "A woman sings."]


@pytest.fixture(scope="module")
def trained(tiny_run: TrainedRun, single_thread) -> TrainedModel:
    return load_trained(tiny_run.last)


@pytest.mark.parametrize("mode", [{"beam_size": 3, "nbest": 3}, {"sampling": True, "nbest": 4, "seed": 1}])
def test_no_hypothesis_is_shorter_than_min_len(trained: TrainedModel, mode: dict) -> None:
    vocab = trained.vocab
    src = TranslationCollator(vocab.pad_id, vocab.bos_id, vocab.eos_id)(
        [(i, ids, []) for i, ids in enumerate(vocab.encode(SENTENCES))])["src"]

    def lengths(min_len: int) -> list[int]:
        search = Search(Decoding.of(trained.decoding, {**mode, "max_len_offset": 12, "min_len": min_len}), vocab)
        return [len(h.tokens) for hypotheses in search(trained.model, src) for h in hypotheses]

    assert min(lengths(0)) < 5  # without a minimum some end sooner
    assert min(lengths(5)) >= 5 and len(lengths(5)) == len(lengths(0))
