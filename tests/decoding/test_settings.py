"""aiayn.decoding.settings and .declarations: one checked decoding object, made once, that names and
describes itself, and engines that serve a setting (passing it on under their own names) or refuse
it in one line naming the engine and the setting: never drop it. The field walk goes through every
setting of the schema, so a setting added there without its row, its name or an engine's say
fails here."""

from __future__ import annotations

import dataclasses
import re

import pytest

from aiayn.config.schemas import DecodingConfig
from aiayn.decoding.declarations import BEAM, CTRANSLATE2, ENGINES, HF, MODES, SAMPLING, SETTINGS, arguments
from aiayn.decoding.settings import NAMES, Decoding, asked
from aiayn.errors import ConfigError

# A value other than the default for every setting of the schema.
OTHER = {"beam_size": 8, "alpha": 1.0, "max_len_offset": 7, "min_len": 3, "kv_cache": False, "constrained": True, "stop": "first_k",
         "nbest": 2, "sampling": True, "temperature": 0.5, "top_k": 5, "top_p": 0.9, "seed": 3}
# Each engine as a tool picks it: its name for Decoding.of, and the speed switches.
RUNS = {"aiayn": ("aiayn", {}), "onnxruntime": ("aiayn", {"onnxruntime": True}), "ctranslate2": ("ctranslate2", {}),
        "ctranslate2 export": ("ctranslate2 export", {}), "hf export": ("hf export", {})}
# What each engine cannot serve, said once here: every other pair below is served and passed on.
REFUSED = {("onnxruntime", "kv_cache"), ("ctranslate2", "kv_cache"), ("ctranslate2", "constrained"),
           ("ctranslate2 export", "kv_cache"), ("ctranslate2 export", "constrained"), ("hf export", "max_len_offset"),
           ("hf export", "constrained"), ("hf export", "seed")}


def handed(run: str, decoding) -> dict:
    """What the engine of ``run`` is handed: aiayn's searches (with ONNX Runtime's step too) the
    arguments of their mode (aiayn.decoding.search.Search), CTranslate2 its translate_batch's
    (aiayn.decoding.ctranslate2), the Hugging Face export the generation config's, and the
    CTranslate2 export what CTranslate2 is handed from the settings it records."""
    if run in ("aiayn", "onnxruntime"):
        return arguments(SAMPLING if decoding.sampling else BEAM, decoding)
    if run == "ctranslate2 export":
        return arguments(CTRANSLATE2, Decoding.of(decoding.settings(), engine="ctranslate2"))
    return arguments(CTRANSLATE2 if run == "ctranslate2" else HF, decoding)


def test_every_setting_changes_the_tag_and_every_engine_serves_it_or_refuses_it() -> None:
    assert set(OTHER) == set(NAMES) == set(SETTINGS) == {f.name for f in dataclasses.fields(DecodingConfig)}
    refused = set()
    for key, value in OTHER.items():
        # a setting beam search has no use for is walked where it is used: with sampling
        handed_over = {"sampling": True} if SETTINGS[key].serves[BEAM].values == (None,) else {}
        plain = Decoding.of(handed_over)
        assert Decoding.of(handed_over, {key: value}).tag() != plain.tag(), key
        for run, (engine, switches) in RUNS.items():
            names = [MODES[True].name, MODES[False].name, *(e.name for chain in ENGINES.values() for e in chain)]
            try:
                made = Decoding.of(handed_over, {key: value}, engine=engine, switches=switches)
            except ConfigError as error:  # refused in one line that names the engine (or mode) and the setting
                assert any(str(error).startswith(f"{name} cannot serve decoding.{key}=") for name in names), error
                refused.add((run, key))
                continue
            default = Decoding.of(handed_over, engine=engine, switches=switches)
            assert getattr(made, key) == value, (run, key)  # served as asked, not replaced
            # ... and passed on, unless the engine does so already of its own (CTranslate2's first_k)
            assert handed(run, made) != handed(run, default) or getattr(default, key) == value, (run, key)
    assert refused == REFUSED


def test_the_settings_are_the_schemas_defaults_checked_once_each() -> None:
    assert Decoding.of().settings() == {**{f.name: f.default for f in dataclasses.fields(DecodingConfig)},
                                        "temperature": None, "top_k": None, "top_p": None, "seed": None}
    wanted = asked({"beam_size": 5, "alpha": None})
    assert dict(wanted.values) == {"beam_size": 5}
    with pytest.raises(ConfigError, match="decoding.top_p must be above 0 and at most 1"):
        asked({"top_p": 1.5})
    with pytest.raises(ConfigError, match=r"the checkpoint's decoding.beam_size must be a whole number of at least 1"):
        Decoding.of({"beam_size": 0}, where="the checkpoint's decoding.")
    with pytest.raises(dataclasses.FrozenInstanceError):
        Decoding.of().beam_size = 5


def test_a_setting_asked_for_that_the_mode_has_no_use_for_is_refused_and_one_handed_over_is_set_aside() -> None:
    parser = {"beam_size": 21, "alpha": 0.3, "max_len_offset": 300, "stop": "paper"}
    sampled = Decoding.of(parser, {"sampling": True})  # the checkpoint's beam: no use to sampling
    assert sampled.beam_size is None and sampled.stop is None and sampled.alpha == 0.3
    for wanted, message in [({"sampling": True, "beam_size": 8}, "sampling cannot serve decoding.beam_size=8"),
                            ({"sampling": True, "stop": "first_k"}, "sampling cannot serve decoding.stop=first_k"),
                            ({"top_p": 0.9}, "beam search cannot serve decoding.top_p=0.9"),
                            ({"seed": 4}, "beam search cannot serve decoding.seed=4")]:
        with pytest.raises(ConfigError, match=message):
            Decoding.of(parser, wanted)
    assert Decoding.of(parser, {"beam_size": 21}).beam_size == 21  # what it was handed, asked again: no change



@pytest.mark.parametrize(("wanted", "engine", "message"), [
    ({"sampling": True, "beam_size": 4}, "aiayn", "sampling cannot serve decoding.beam_size=4"),
    ({"sampling": True, "stop": "paper"}, "aiayn", "sampling cannot serve decoding.stop=paper"),
    ({"seed": 0}, "aiayn", "beam search cannot serve decoding.seed=0"),
    ({"temperature": 1.0}, "aiayn", "beam search cannot serve decoding.temperature=1.0"),
    ({"max_len_offset": 50}, "hf export", "the Hugging Face export cannot serve decoding.max_len_offset=50"),
])
def test_a_setting_a_command_line_asks_for_is_asked_for_at_the_value_handed_too(wanted: dict, engine: str,
                                                                                  message: str) -> None:
    """A command line's ``decoding.*`` (:func:`asked`) is asked for, each setting, at the
    checkpoint's value or the default too: one the mode or engine cannot serve is refused as any
    other value is (before: set aside without a word, since it was the value there anyway; the HF
    export wrote its own maximum length where ``decoding.max_len_offset`` was asked for)."""
    with pytest.raises(ConfigError, match=re.escape(message)):
        Decoding.of({"max_len_offset": 50}, asked(wanted), engine=engine)


def test_a_whole_config_asks_for_what_it_changes() -> None:
    """A training run's decoding (every setting, most at the default) asks for those it changes:
    with ``sampling`` on, its default beam is set aside, not refused."""
    sampled = Decoding.of(None, {**dataclasses.asdict(DecodingConfig()), "sampling": True})
    assert sampled.sampling and sampled.beam_size is None and sampled.stop is None

def test_onnx_runtime_without_the_kv_cache_is_refused_and_ctranslate2_stops_as_first_k() -> None:
    with pytest.raises(ConfigError, match=r"ONNX Runtime cannot serve decoding.kv_cache=false \(its decoder step is "
                                          r"the cached one\); decode with onnxruntime=false"):
        Decoding.of(None, {"kv_cache": False}, switches={"onnxruntime": True})
    assert Decoding.of(None, {"kv_cache": False}).kv_cache is False  # torch's own search serves it
    ctranslate2 = Decoding.of(None, {"stop": "first_k", "nbest": 3, "sampling": False}, engine="ctranslate2")
    assert ctranslate2.stop == "first_k" and arguments(CTRANSLATE2, ctranslate2) == {
        "beam_size": 4, "length_penalty": 0.6, "max_len_offset": 50, "min_decoding_length": 0, "num_hypotheses": 3}
    assert Decoding.of(None, engine="ctranslate2").describe() == "beam 4, α 0.6, +50, stop first_k"  # its own rule
    sampled = Decoding.of(None, {"sampling": True, "top_k": 10, "top_p": 0.8, "temperature": 0.7, "seed": 5},
                          engine="ctranslate2")
    assert arguments(CTRANSLATE2, sampled) == {"sampling_temperature": 0.7, "sampling_topk": 10, "sampling_topp": 0.8,
                                               "seed": 5, "beam_size": 1, "length_penalty": 0.6,
                                               "max_len_offset": 50, "min_decoding_length": 0, "num_hypotheses": 1}


def test_the_tag_names_every_setting_switch_and_member_and_keeps_the_earlier_names() -> None:
    assert Decoding.of().tag() == "beam4.alpha0.6.len+50"
    assert Decoding.of(None, {"stop": "first_k", "nbest": 2, "kv_cache": False}).tag() == \
        "beam4.alpha0.6.len+50.first_k.nbest2.nokv"
    assert Decoding.of(None, {"sampling": True, "top_p": 0.9}).tag() == "sample.t1.topk0.topp0.9.seed0.alpha0.6.len+50"
    assert Decoding.of(switches={"precision": "bf16"}).tag() == "beam4.alpha0.6.len+50.bf16"
    assert Decoding.of(switches={"compile": True}).tag() == "beam4.alpha0.6.len+50.compile"
    one, two = Decoding.of(members=("a", "b")), Decoding.of(members=("a", "c"))
    assert one.tag().startswith("beam4.alpha0.6.len+50.ens2-") and one.tag() != two.tag()
    assert Decoding.of(members=("a",)).tag() == "beam4.alpha0.6.len+50"  # one checkpoint: no ensemble
    assert one.describe() == "beam 4, α 0.6, +50, stop paper, ensemble of 2" and not one.plain
    assert Decoding.of(switches={"onnxruntime": True}).describe() == "beam 4, α 0.6, +50, stop paper, onnxruntime"


def test_a_shortest_output_or_a_beam_the_model_cannot_hold_is_refused() -> None:
    """:meth:`Decoding.fit`, which the search, train's config check and the CTranslate2 engine call
    with their model's positions and vocabulary."""
    Decoding.of({}, {"min_len": 511, "max_len_offset": 600}).fit(512, 500)  # EOS at the last position
    Decoding.of({}, {"beam_size": 500}).fit(512, 500)
    Decoding.of({}, {"sampling": True, "nbest": 600}).fit(512, 500)  # samples are no beam
    with pytest.raises(ConfigError, match=r"^decoding\.min_len=512 cannot be met: the model's max_positions=512 hold "
                                          r"at most 511 output tokens before EOS; lower min_len to at most 511$"):
        Decoding.of({}, {"min_len": 512, "max_len_offset": 600}).fit(512, 500)
    with pytest.raises(ConfigError, match=r"^decoding\.beam_size=501 is wider than the model's vocabulary of 500 "
                                          r"subwords; give at most 500 \(the paper's beam is 4\)$"):
        Decoding.of({}, {"beam_size": 501}).fit(512, 500)


def test_a_shortest_output_longer_than_a_short_inputs_limit_is_refused() -> None:
    """An output is cut at its input's length + max_len_offset: a min_len above the offset could not
    be met for a short input (before: asked for, named in the report, and not met, outputs cut short)."""
    assert Decoding.of({}, {"min_len": 50}).min_len == 50  # the paper's +50 holds 50 tokens for any input
    with pytest.raises(ConfigError, match=r"^decoding\.min_len=100 is more than decoding\.max_len_offset=50: .*; raise "
                                          r"max_len_offset to at least 100, or lower min_len$"):
        Decoding.of({}, {"min_len": 100})
    with pytest.raises(ConfigError, match=r"^decoding\.min_len=10 is more than decoding\.max_len_offset=9"):
        Decoding.of({"max_len_offset": 9}, {"min_len": 10})  # the checkpoint's offset, the command's min_len
