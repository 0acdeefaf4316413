"""Every decoding setting's row: what values it takes, how it names itself (in a report's file name
and in words), and what each engine and mode serves of it, as data.

The columns are the two modes of aiayn's own search (beam search, sampling: ``decoding.sampling``
picks one), ONNX Runtime (``onnxruntime=true``: the same searches with the decoder step run by
ONNX Runtime), CTranslate2 (translate.py ``engine=ctranslate2`` and the CTranslate2 export) and
the Hugging Face export. A cell says which values the engine serves (``ALL``; or a list whose
first value is what the engine does of its own) and, for an engine that takes arguments of its
own, the argument the setting is passed on as. :class:`aiayn.decoding.settings.Decoding` refuses
a value asked for that an engine does not serve, in one line naming the engine and the setting,
and puts the engine's own value in place of one it was only handed (a checkpoint's beam size
when sampling). A setting is added here, in the schema (aiayn.config.schemas.DecodingConfig) and
in what consumes it; tests/decoding/test_settings.py walks every row through every column.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiayn.errors import ConfigError

# The columns.
BEAM, SAMPLING, ONNX_RUNTIME, CTRANSLATE2, HF = "beam search", "sampling", "ONNX Runtime", "CTranslate2", "hf"


@dataclass(frozen=True)
class Serves:
    """What one engine serves of one setting: ``values`` (None: every value the setting takes; a
    tuple: those, the engine's own first), passed on as its argument ``to`` (None: nothing of its
    own to pass), with ``value`` (None: the setting's value); ``why`` says why it serves no more."""

    values: tuple | None = None
    to: str | None = None
    value: Callable[[Any], Any] | None = None
    why: str = ""


ALL = Serves()


def does_not_use(why: str) -> Serves:
    """A setting the engine has no use for: its value there is None."""
    return Serves((None,), why=why)


def _whole(least: int) -> Callable[[Any], bool]:
    return lambda v: not isinstance(v, bool) and isinstance(v, int) and v >= least


@dataclass(frozen=True)
class Setting:
    """One row: what the setting takes (``takes``, and the sentence ``must`` of a refusal, with
    ``{key}``), its piece of a report's name (``tag``) and of the description (``words``), None for
    nothing, and what each column serves of it."""

    takes: Callable[[Any], bool]
    must: str
    tag: Callable[[Any], str | None]
    words: Callable[[Any], str | None]
    serves: Mapping[str, Serves] = field(default_factory=dict)


def _beams_only(key: str) -> Callable[[Any], Any]:
    """transformers' ``generate`` takes the length penalty and the stopping rule for beams of 2 or
    more only (one beam is its greedy search; a sample is drawn alone); else nothing is passed."""
    return lambda d: getattr(d, key) if (d.beam_size or 1) > 1 else None


NO_BEAM = does_not_use("each sample is drawn alone, with no beam")
SAMPLING_ONLY = does_not_use("it applies to sampling only")
STOPPING_RULES = ("paper", "first_k")
EARLY_STOPPING = {"first_k": True, "paper": "never"}  # transformers' names of the two stopping rules

# In the order of a report's name and of the description.
SETTINGS: dict[str, Setting] = {
    "sampling": Setting(
        lambda v: isinstance(v, bool), "{key} must be true or false",
        lambda v: "sample" if v else None, lambda v: "sampling" if v else None,
        {BEAM: Serves((False,)), SAMPLING: Serves((True,)), ONNX_RUNTIME: ALL, CTRANSLATE2: ALL,
         HF: Serves(to="do_sample")}),
    "temperature": Setting(
        lambda v: isinstance(v, (int, float)) and 0 < v < math.inf,
        "{key} must be above 0 and finite (1.0: the model's own distribution)",
        lambda v: f"t{float(v):g}", lambda v: f"temperature {float(v):g}",
        {BEAM: SAMPLING_ONLY, SAMPLING: Serves(to="temperature"), ONNX_RUNTIME: ALL,
         CTRANSLATE2: Serves(to="sampling_temperature"), HF: Serves(to="temperature")}),
    "top_k": Setting(
        _whole(0), "{key} must be a whole number of at least 0",
        lambda v: f"topk{v}", lambda v: f"top-k {v}",
        {BEAM: SAMPLING_ONLY, SAMPLING: Serves(to="top_k"), ONNX_RUNTIME: ALL, CTRANSLATE2: Serves(to="sampling_topk"),
         HF: Serves(to="top_k")}),
    "top_p": Setting(
        lambda v: isinstance(v, (int, float)) and 0 < v <= 1, "{key} must be above 0 and at most 1 (1.0: no cut)",
        lambda v: f"topp{float(v):g}", lambda v: f"top-p {float(v):g}",
        {BEAM: SAMPLING_ONLY, SAMPLING: Serves(to="top_p"), ONNX_RUNTIME: ALL, CTRANSLATE2: Serves(to="sampling_topp"),
         HF: Serves(to="top_p")}),
    "seed": Setting(
        _whole(0), "{key} must be a whole number of at least 0",
        lambda v: f"seed{v}", lambda v: f"seed {v}",
        {BEAM: SAMPLING_ONLY, SAMPLING: Serves(to="seed"), ONNX_RUNTIME: ALL, CTRANSLATE2: Serves(to="seed"),
         HF: does_not_use("a generation config holds no seed")}),
    "beam_size": Setting(
        _whole(1), "{key} must be a whole number of at least 1",
        lambda v: f"beam{v}", lambda v: f"beam {v}",
        {BEAM: Serves(to="beam_size"), SAMPLING: NO_BEAM, ONNX_RUNTIME: ALL,
         CTRANSLATE2: Serves(to="beam_size", value=lambda d: d.beam_size or 1),
         HF: Serves(to="num_beams", value=lambda d: d.beam_size or 1)}),
    "alpha": Setting(
        lambda v: not isinstance(v, bool) and isinstance(v, (int, float)) and 0 <= v < math.inf,
        "{key} (the length penalty's exponent) must be a finite number, 0 or more",
        lambda v: f"alpha{float(v):g}", lambda v: f"α {float(v):g}",
        {BEAM: Serves(to="alpha"), SAMPLING: Serves(to="alpha"), ONNX_RUNTIME: ALL,
         CTRANSLATE2: Serves(to="length_penalty"), HF: Serves(to="length_penalty", value=_beams_only("alpha"))}),
    "max_len_offset": Setting(
        _whole(0), "{key} must be a whole number of at least 0",
        lambda v: f"len+{v}", lambda v: f"+{v}",
        {BEAM: Serves(to="max_len_offset"), SAMPLING: Serves(to="max_len_offset"), ONNX_RUNTIME: ALL,
         CTRANSLATE2: Serves(to="max_len_offset"),
         HF: does_not_use("generate has one maximum length for a batch, not each input's length + an offset")}),
    "min_len": Setting(
        _whole(0), "{key} must be a whole number of at least 0",
        lambda v: f"minlen{v}" if v else None, lambda v: f"at least {v} tokens" if v else None,
        {BEAM: Serves(to="min_len"), SAMPLING: Serves(to="min_len"), ONNX_RUNTIME: ALL,
         CTRANSLATE2: Serves(to="min_decoding_length"),  # (its own default is 1: passed even at 0)
         HF: Serves(to="min_new_tokens", value=lambda d: d.min_len or None)}),
    "stop": Setting(
        lambda v: v in STOPPING_RULES, "{key} must be paper (tensor2tensor's bound, the paper's) or first_k (stop "
        "after beam_size finished hypotheses, fairseq's and CTranslate2's)",
        lambda v: None if v == "paper" else v, lambda v: f"stop {v}",
        {BEAM: Serves(to="stop"), SAMPLING: does_not_use("it applies to beam search only"), ONNX_RUNTIME: ALL,
         CTRANSLATE2: Serves(("first_k", None), why="it stops once beam_size hypotheses have finished"),
         HF: Serves(to="early_stopping", value=lambda d: EARLY_STOPPING.get(_beams_only("stop")(d)))}),
    "nbest": Setting(
        _whole(1), "{key} must be a whole number of at least 1",
        lambda v: f"nbest{v}" if v > 1 else None, lambda v: f"{v}-best" if v > 1 else None,
        {BEAM: Serves(to="nbest"), SAMPLING: Serves(to="samples"), ONNX_RUNTIME: ALL,
         CTRANSLATE2: Serves(to="num_hypotheses"), HF: Serves(to="num_return_sequences")}),
    "kv_cache": Setting(
        lambda v: isinstance(v, bool), "{key} must be true or false",
        lambda v: None if v else "nokv", lambda v: None if v else "no kv cache",
        {BEAM: Serves(to="kv_cache"), SAMPLING: Serves(to="kv_cache"),
         ONNX_RUNTIME: Serves((True,), why="its decoder step is the cached one"),
         CTRANSLATE2: Serves((True,), why="it always keeps the keys and values"), HF: Serves(to="use_cache")}),
    "constrained": Setting(
        lambda v: isinstance(v, bool), "{key} must be true or false",
        lambda v: "constrained" if v else None, lambda v: "constrained to trees" if v else None,
        {BEAM: Serves(to="constrained"), SAMPLING: Serves(to="constrained"), ONNX_RUNTIME: ALL,
         CTRANSLATE2: Serves((False,), why="it cannot constrain its output"),
         HF: Serves((False,), why="generate cannot constrain its output")}),
}


@dataclass(frozen=True)
class Engine:
    """A column: the engine's name as a refusal says it, the column of :data:`SETTINGS` it serves
    by, and what a refusal suggests instead (``{key}``: the setting)."""

    name: str
    column: str
    instead: str

    def serve(self, values: dict[str, Any], asked: Mapping[str, Any]) -> None:
        """Refuse in ``values`` what this engine does not serve and ``asked`` asked for (ConfigError);
        put the engine's own value in place of any other it does not serve."""
        for key, setting in SETTINGS.items():
            served = setting.serves[self.column]
            if served.values is None or values[key] in served.values:
                continue
            if key in asked:
                shown = str(values[key]).lower() if isinstance(values[key], bool) else values[key]
                why = served.why or "it serves " + " or ".join(f"{key}={v}" for v in served.values if v is not None)
                raise ConfigError(f"{self.name} cannot serve decoding.{key}={shown} ({why}); "
                                  + self.instead.format(key=key))
            values[key] = served.values[0]


MODES = {False: Engine("beam search", BEAM, "add decoding.sampling=true, or leave {key} out"),
         True: Engine("sampling", SAMPLING, "leave decoding.{key} out, or search by beams with decoding.sampling=false")}
ENGINES = {
    "aiayn": (),
    "onnxruntime": (Engine("ONNX Runtime", ONNX_RUNTIME, "decode with onnxruntime=false for that"),),
    "ctranslate2": (Engine("CTranslate2", CTRANSLATE2, "use engine=aiayn ckpt=<file.ckpt> for that"),),
    "ctranslate2 export": (Engine("the CTranslate2 export", CTRANSLATE2,
                                  "leave decoding.{key} out; aiayn's own tools decode with it"),),
    "hf export": (Engine("the Hugging Face export", HF, "leave decoding.{key} out; aiayn's own tools decode with it"),),
}


def arguments(column: str, decoding: Any) -> dict[str, Any]:
    """What ``decoding`` hands the engine of ``column``: each setting it passes on, under the
    engine's own name (a value of None is not passed)."""
    handed = {}
    for key, setting in SETTINGS.items():
        served = setting.serves[column]
        value = served.value(decoding) if served.value else getattr(decoding, key)
        if served.to and value is not None:
            handed[served.to] = value
    return handed
