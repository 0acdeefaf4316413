"""aiayn.decoding.translator's Translator: sentences streamed in chunks, translations given back in input
order as soon as every one before them is done, on the session's tiny trained run (real
checkpoint, real sentencepiece)."""

from __future__ import annotations

import logging

import pytest

from aiayn.checkpoints.trained import TrainedModel, load_trained
from aiayn.decoding.translator import Translator, translate
from tests.helpers.runs import TrainedRun

# A length penalty this strong keeps the 4-step model from ending every translation at once (its
# translations with the task's α are all empty), so each line gets a translation of its own and a
# line given back in the wrong place shows; beam 1 keeps it quick.
SETTINGS = {"beam_size": 1, "alpha": 20.0, "max_len_offset": 5}


@pytest.fixture(scope="module")
def trained(tiny_run: TrainedRun, single_thread) -> TrainedModel:
    return load_trained(tiny_run.last)


def alone(trained: TrainedModel, sentence: str) -> str:
    """The translation of ``sentence`` in a batch of its own: what any batching must give."""
    return translate(trained.model, trained.vocab, [sentence], SETTINGS).texts[0]


def test_each_batch_gives_back_the_complete_run_from_the_start_in_input_order(trained: TrainedModel) -> None:
    short, long_, short2 = "A dog.", "A man in a blue shirt is riding a bike down the busy street at night.", "Two cats."
    medium = "A woman sings on a stage."
    lines = [short, long_, "", short2, medium]
    lengths = [len(ids) for ids in trained.vocab.encode([short, short2, medium, long_])]
    assert lengths == sorted(lengths) and lengths[0] <= lengths[1] < lengths[2] < lengths[3]  # the batches' order
    translator = Translator(trained.model, trained.vocab, SETTINGS, batch_size=1)

    groups = list(translator.stream([lines]))

    # Batches go shortest first: line 1 is out after the first; lines 4 and 5 are done next but
    # wait for line 2, the last batch, and come out with it and the empty line 3.
    expected = [alone(trained, line) if line else "" for line in lines]
    assert all(expected[i] for i in (0, 1, 3, 4))
    assert groups == [expected[:1], expected[1:]]
    assert translator.sentences == 5 and translator.truncated == 0 and translator.output_tokens > 0


def test_chunks_follow_one_another_and_lines_are_numbered_across_them(trained: TrainedModel, caplog) -> None:
    chunks = [["A dog runs.", ""], ["Two cats.", " ".join(["word"] * 400)], ["", ""]]
    translator = Translator(trained.model, trained.vocab, SETTINGS, batch_size=8)

    with caplog.at_level(logging.WARNING, logger="aiayn.decoding.translator"):
        texts = [text for group in translator.stream(chunks) for text in group]

    assert texts == translate(trained.model, trained.vocab, [line for chunk in chunks for line in chunk],
                              SETTINGS).texts
    assert texts[1] == texts[4] == texts[5] == "" and texts[0] and texts[2]
    assert translator.sentences == 6 and translator.truncated == 1
    assert "input line 4 has" in caplog.text  # the 2nd line of the 2nd chunk
    assert translator.seconds > 0 and translator.sentences_per_second > 0


def test_translate_of_a_whole_list_matches_each_line_alone(trained: TrainedModel) -> None:
    lines = ["A man is riding a bike.", "  ", "Two dogs play in the snow.", "A woman sings."]
    result = translate(trained.model, trained.vocab, lines, SETTINGS, batch_size=3)
    assert result.texts == [alone(trained, line) if line.strip() else "" for line in lines]
    assert result.output_tokens > 0 and result.truncated == 0 and result.sentences_per_second > 0
