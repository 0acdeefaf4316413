"""The decoding settings as one frozen object, checked once where it is made and trusted after.

:meth:`Decoding.of` lays the settings a tool was asked for (a command line's ``decoding.*``:
:func:`asked`, checked before anything is loaded) over those it was handed (a checkpoint's, an
export's; checked there) over the schema's defaults (aiayn.config.schemas.DecodingConfig, their one
home), for one engine (aiayn's own search, with its speed switches; CTranslate2; an export). Each
value is checked once, against its row of aiayn.decoding.declarations; then the mode (beam search
or sampling) and the engine serve what they can: a setting asked for that one of them cannot
serve is refused in one line naming it, and one only handed over is replaced by the engine's own
(sampling has no beam: a checkpoint's beam size becomes None there). What comes out names itself
(:meth:`~Decoding.tag`: every setting that changes an output, the switches and every ensemble
member, for a report's file name) and describes itself (:meth:`~Decoding.describe`).
"""

from __future__ import annotations

import hashlib
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, fields, make_dataclass
from types import MappingProxyType
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from aiayn.config.schemas import DecodingConfig
from aiayn.decoding.declarations import ENGINES, MODES, SETTINGS
from aiayn.decoding.switches import DEFAULTS, SPELLING, own_arithmetic
from aiayn.errors import ConfigError

NAMES = tuple(f.name for f in fields(DecodingConfig))


@dataclass(frozen=True)
class Asked:
    """The decoding settings a command line asks for (its overrides; None left out), checked."""

    values: Mapping[str, Any]


def asked(overrides: Asked | Mapping[str, Any] | None, where: str = "decoding.") -> Asked:
    """``overrides`` (a tool's ``decoding`` node: None means "the checkpoint's own") checked, so that
    a bad value is refused before anything is loaded; an :class:`Asked` as it is."""
    if isinstance(overrides, Asked):
        return overrides
    return Asked(MappingProxyType(_checked({k: v for k, v in (overrides or {}).items() if v is not None}, where)))


def from_python(settings: Mapping[str, Any] | None) -> Asked:
    """:func:`asked` of settings handed from Python (the API's keyword arguments), where each value
    must already be of its setting's type: a TypeError names one that is not (``beam_size="4"``,
    ``kv_cache=1``), which a command line's text would be converted from, but a Python caller
    means something else by (a whole number for a float setting is taken, as Python takes it)."""
    if isinstance(settings, Asked):
        return settings
    plain = dict(settings or {})
    for key, value in plain.items():
        kind = _KINDS.get(key)
        if kind is None or value is None:
            continue  # not a setting (asked's line names it) or the checkpoint's own
        if kind is bool and getattr(getattr(value, "dtype", None), "kind", None) == "b":
            value = bool(value)  # numpy's bool, as its numbers are taken
        takes = {bool: bool, int: numbers.Integral, float: numbers.Real, str: str}[kind]
        if (isinstance(value, bool) and kind is not bool) or not isinstance(value, takes):
            raise TypeError(f"decoding.{key} must be {_KIND_NAMES[kind]}, got {type(value).__name__} {value!r}")
        plain[key] = kind(value)  # numpy's numbers as Python's, which the schema holds
    return asked(plain)


# Each setting's Python type, from the schema's annotations (Optional[int] and the like).
_KINDS = {f.name: next(t for t in (bool, int, float, str) if t.__name__ in str(f.type)) for f in fields(DecodingConfig)}
_KIND_NAMES = {bool: "True or False", int: "a whole number (int)", float: "a number", str: "a string"}


def _checked(layer: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``layer``'s settings typed by the schema and each within what its row takes; a ConfigError
    names a key that is not a setting, a value of the wrong type or out of range."""
    unknown = sorted(set(layer) - set(NAMES))
    if unknown:
        raise ConfigError(f"{where}{unknown[0]} is not a decoding setting; the settings are {', '.join(sorted(NAMES))}")
    try:
        typed = OmegaConf.to_container(OmegaConf.merge(OmegaConf.structured(DecodingConfig), dict(layer)))
    except OmegaConfBaseException as error:
        first = str(getattr(error, "msg", error)).strip().splitlines()[0]
        raise ConfigError(f"{where}{getattr(error, 'full_key', None) or '?'}: {first}") from None
    for key in layer:
        if not SETTINGS[key].takes(typed[key]):
            raise ConfigError(f"{SETTINGS[key].must.format(key=where + key)}, got {typed[key]!r}")
    return {key: typed[key] for key in layer}


class _Decoding:
    """The methods of :data:`Decoding` (a frozen dataclass of every DecodingConfig field, plus
    ``engine``, ``switches`` and ``members``)."""

    @classmethod
    def of(cls, handed: Mapping[str, Any] | None = None, wanted: Asked | Mapping[str, Any] | None = None, *,
           engine: str = "aiayn", switches: Mapping[str, Any] | None = None, members: tuple[str, ...] = (),
           where: str = "decoding.") -> Decoding:
        """The settings ``wanted`` (a command line's :func:`asked`, every one of them asked for; or a
        whole config's, checked here, asking for those it changes) laid over those ``handed`` (a
        checkpoint's; ``where`` names them in an error) over the schema's defaults, as ``engine``
        serves them (``aiayn``, ``ctranslate2``, ``ctranslate2 export``, ``hf export``) with the
        speed ``switches`` (as aiayn.decoding.switches.switches_of gives them); ``members``: the
        identities of the checkpoints decoding together."""
        values = {**OmegaConf.to_container(OmegaConf.structured(DecodingConfig)),
                  **_checked({k: v for k, v in (handed or {}).items() if v is not None}, where)}
        if isinstance(wanted, Asked):  # asked for, each of them, even at the value handed or the default
            changed = dict(wanted.values)
        else:  # a whole config's settings (a training run's): those it changes are what it asks for
            changed = {key: value for key, value in asked(wanted).values.items() if value != values[key]}
        values.update(changed)
        switches = {**DEFAULTS, **(switches or {})}
        runs_on = ENGINES["onnxruntime" if engine == "aiayn" and switches["onnxruntime"] else engine]
        for declared in (MODES[values["sampling"]], *runs_on):
            declared.serve(values, changed)
        if values["beam_size"] is not None and values["nbest"] > values["beam_size"]:
            raise ConfigError(f"decoding.nbest={values['nbest']} asks for more hypotheses than the beam holds "
                              f"(decoding.beam_size={values['beam_size']}); raise beam_size to at least "
                              f"{values['nbest']}, or lower nbest")
        shortest, offset = values["min_len"], values["max_len_offset"]
        if shortest and offset is not None and shortest > offset:  # an output is cut at its input's length + offset
            raise ConfigError(f"decoding.min_len={shortest} is more than decoding.max_len_offset={offset}: an output is "
                              f"cut at its input's length + max_len_offset, so a short input's could never reach "
                              f"min_len; raise max_len_offset to at least {shortest}, or lower min_len")
        return cls(**values, engine=engine, switches=MappingProxyType(switches), members=tuple(members))

    def fit(self, max_positions: int, vocab_size: int) -> None:
        """A ConfigError for settings a model of ``max_positions`` positions and ``vocab_size``
        subwords cannot meet: a ``min_len`` its positions cannot hold (every output would be cut
        at them, shorter than asked, with no word), a beam wider than its vocabulary (a bound no
        search needs to pass, and a typo's: beam × vocabulary scores a step, 29 GB for a beam of
        100000 over 500 subwords; a beam under it may still not fit the memory)."""
        if self.min_len and self.min_len >= max_positions:
            raise ConfigError(f"decoding.min_len={self.min_len} cannot be met: the model's max_positions="
                              f"{max_positions} hold at most {max_positions - 1} output tokens before EOS; lower "
                              f"min_len to at most {max_positions - 1}")
        if self.beam_size is not None and self.beam_size > vocab_size:
            raise ConfigError(f"decoding.beam_size={self.beam_size} is wider than the model's vocabulary of "
                              f"{vocab_size} subwords; give at most {vocab_size} (the paper's beam is 4)")

    def settings(self) -> dict[str, Any]:
        """Every decoding setting (None: one the engine has no use for), as a report records them."""
        return {name: getattr(self, name) for name in NAMES}

    def tag(self) -> str:
        """The settings' part of a report's file name: every setting that changes an output (each
        as its row spells it), the speed switches that are on and, for an ensemble, its size and a
        digest of its members, e.g. ``beam4.alpha0.6.len+50.int8.ens2-1f0c3a9e``."""
        pieces = [SETTINGS[key].tag(value) for key, value in self._in_order()]
        pieces += [SPELLING[key](value) for key, value in self.switches.items()]
        if len(self.members) > 1:
            digest = hashlib.blake2b("\n".join(self.members).encode(), digest_size=4).hexdigest()
            pieces.append(f"ens{len(self.members)}-{digest}")
        return ".".join(piece for piece in pieces if piece)

    def describe(self) -> str:
        """The settings in words, e.g. ``beam 4, α 0.6, +50, stop paper``; the switches that are on
        and the ensemble after them."""
        pieces = [SETTINGS[key].words(value) for key, value in self._in_order()]
        pieces += [SPELLING[key](value) for key, value in self.switches.items()]
        pieces.append(f"ensemble of {len(self.members)}" if len(self.members) > 1 else None)
        return ", ".join(piece for piece in pieces if piece)

    @property
    def plain(self) -> bool:
        """Whether these outputs are the model's own: one model, beam search, its fp32 arithmetic."""
        return not self.sampling and len(self.members) <= 1 and own_arithmetic(dict(self.switches))

    def _in_order(self) -> list[tuple[str, Any]]:
        return [(key, getattr(self, key)) for key in SETTINGS if getattr(self, key) is not None]


Decoding = make_dataclass(
    "Decoding", [*((name, Any) for name in NAMES), ("engine", str), ("switches", Mapping), ("members", tuple)],
    bases=(_Decoding,), frozen=True)
Decoding.__module__ = __name__
Decoding.__doc__ = """Decoding settings, checked, as one engine serves them: every field of
aiayn.config.schemas.DecodingConfig (None: one the engine has no use for), ``engine``, the speed
``switches`` and the ensemble's ``members``. Made by :meth:`Decoding.of` only."""
