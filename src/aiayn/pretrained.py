"""aiayn from Python: a trained checkpoint loaded once, then translated with, scored for
perplexity and looked inside, by the tools' own code under the tools' own setting names
(docs/python.md).

    import aiayn

    model = aiayn.load("run/checkpoints/last.ckpt")          # or src/average.py's file; device="cuda"
    model.translate(["A man is riding a bike."])              # the checkpoint's beam search (§6.1)
    model.translate(["A man is riding a bike."], beam_size=8)  # any decoding.* setting, by its name

:func:`load` is translate.py's loading (``ckpt``, ``average_last``, ``device``: the same settings,
the same checks, the same defaults); :class:`Pretrained` decodes as translate.py does
(aiayn.decoding.translator.Translator: the checkpoint's decoding settings with those given laid
over them, checked by aiayn.decoding.settings.Decoding, its task's output constraint: a parser
writes trees), scores perplexity as evaluate.py does and draws on visualize.py's attention maps.
The decoding settings' names and defaults are aiayn.config.schemas.DecodingConfig's alone; the
other defaults are the tools' (aiayn.config.tools). Importing this imports torch, never Lightning;
the attention maps import matplotlib when first asked for.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from aiayn.checkpoints.averaging import average_into, window_ending_at
from aiayn.checkpoints.given import averaged_count, checkpoint_list
from aiayn.checkpoints.trained import TrainedModel, load_ensemble
from aiayn.config.tools import EvaluateConfig, TranslateConfig
from aiayn.data.batching import evaluation_tokens
from aiayn.decoding.settings import Asked, Decoding, from_python
from aiayn.decoding.speed import for_decoding
from aiayn.decoding.switches import DEFAULTS, check_device, switches_of
from aiayn.decoding.translator import Scored, Translator, perplexity
from aiayn.errors import ConfigError

if TYPE_CHECKING:
    from aiayn.analysis.attention_maps import AttentionMaps

# Where a decoding setting the checkpoint holds is named in an error (as the tools name it).
HANDED = "the checkpoint's decoding."


def load(ckpt: str | os.PathLike | Sequence[str | os.PathLike], *, average_last: int | None = None,
         device: str = TranslateConfig.device) -> Pretrained:
    """The trained model of ``ckpt``, as translate.py's ``ckpt=``, ``average_last=`` and ``device=``
    load it: one checkpoint (a run's ``checkpoints/last.ckpt``, a step's, src/average.py's average),
    or a list of several, decoding together as an ensemble (the mean of their log-probabilities);
    ``average_last=k``: the average of ``ckpt`` and the k - 1 checkpoints before it by step in its
    folder (§6.1); ``device``: ``auto`` (a GPU where there is one), ``cpu``, ``cuda`` or
    ``cuda:<index>``. A checkpoint written on a GPU loads on any device. What cannot be loaded is
    a :class:`aiayn.errors.UserError` (a ValueError) whose one line names the file or setting and
    what to do: a ``DataError`` for a file that is missing, damaged or no training checkpoint,
    a ``ConfigError`` for a setting."""
    check_device(device)
    if isinstance(ckpt, os.PathLike):
        ckpt = os.fspath(ckpt)
    elif not isinstance(ckpt, str) and isinstance(ckpt, Sequence):
        ckpt = [os.fspath(path) if isinstance(path, os.PathLike) else path for path in ckpt]
    paths = checkpoint_list(ckpt)  # ConfigError: names no checkpoint
    k = averaged_count(average_last, len(paths))
    if device.startswith("cuda") and not (torch.cuda.is_available()
                                          and int(device.partition(":")[2] or 0) < torch.cuda.device_count()):
        found = f"{torch.cuda.device_count()} usable CUDA GPU(s)" if torch.cuda.is_available() else "no usable CUDA GPU"
        raise ConfigError(f"device={device}: this machine has {found}; use device=cpu, or device=auto (a GPU where "
                          "there is one)")
    window = window_ending_at(Path(paths[0]), k)  # DataError: fewer than k, before anything is loaded
    trained = load_ensemble(ckpt, device)
    return Pretrained(trained, average_into(trained, window))


class Pretrained:
    """A trained model, loaded by :func:`load`: its network (``network``: aiayn.model's plain
    torch.nn Transformer, in eval mode; an ensemble's: an aiayn.model.Ensemble), its subword
    vocabulary (``vocab``), the training run's resolved config (``config``), its ``step`` and the
    steps whose weights it holds (``steps``: several for an average).

    Every method that decodes takes the ``decoding.*`` settings of the tools as keyword arguments
    (``beam_size=8``, ``alpha=1.0``, ``stop="first_k"``, ``sampling=True``, ``seed=1`` …); each
    left out is the checkpoint's own (:attr:`decoding`). A setting that does not exist, or a value
    it cannot take, is a ConfigError naming it, before anything is decoded."""

    def __init__(self, trained: TrainedModel, steps: Sequence[int]):
        self.trained = trained
        self.steps = tuple(steps)

    network = property(lambda self: self.trained.model, doc="The network (torch.nn, eval mode) on its device.")
    vocab = property(lambda self: self.trained.vocab, doc="The subword vocabulary (aiayn.data.subwords.Subwords).")
    config = property(lambda self: self.trained.config, doc="The training run's resolved config ({}: none kept).")
    step = property(lambda self: self.trained.step, doc="The training step of its (newest) weights.")

    @property
    def device(self) -> torch.device:
        return next(self.network.parameters()).device

    @property
    def decoding(self) -> Decoding:
        """The checkpoint's own decoding settings (those it trained with, over the schema's
        defaults: §6.1's beam 4, α 0.6, input + 50 for translation), checked."""
        return self.settings()

    def settings(self, decoding: Decoding | Asked | Mapping[str, Any] | None = None, *,
                 switches: Mapping[str, Any] | None = None) -> Decoding:
        """The settings ``decoding`` laid over the checkpoint's own, checked, with the speed
        ``switches`` (aiayn.decoding.switches: precision, int8, compile, onednn, onnxruntime).
        Each setting a mapping gives is asked for, as on translate.py's command line: one the
        search cannot serve is refused, even at the checkpoint's value. A :class:`Decoding` (this
        model's :attr:`decoding`, another's) is a whole config: what it changes is asked for."""
        wanted = decoding.settings() if isinstance(decoding, Decoding) else from_python(decoding)
        return Decoding.of(self.trained.decoding, wanted, switches=switches, members=self.trained.members,
                           where=HANDED)

    def translator(self, decoding: Decoding | Asked | Mapping[str, Any] | None = None, *,
                   switches: Mapping[str, Any] | None = None,
                   batch_size: int = TranslateConfig.batch_size) -> Translator:
        """translate.py's :class:`~aiayn.decoding.translator.Translator` of this model: ``decoding``
        over the checkpoint's settings, the speed ``switches`` applied to a copy of the network,
        the task's output constraint built once (a parser's: its outputs written as trees over
        each line's words)."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"batch_size must be a whole number of at least 1, got {batch_size!r}")
        unknown = sorted(set(switches or {}) - set(DEFAULTS))
        if unknown:
            raise ConfigError(f"{unknown[0]} is not a speed switch; the switches are {', '.join(DEFAULTS)}")
        settings = self.settings(decoding, switches=switches_of(switches or {}))
        model = for_decoding(self.network, **settings.switches)  # ConfigError: int8 off the CPU
        constraint = self.trained.output_constraint(settings)
        return Translator(model, self.vocab, settings, constraint, batch_size=batch_size,
                          raw_text=self.trained.raw_text(constraint))

    def translate(self, sentences: str | Sequence[str], *, batch_size: int = TranslateConfig.batch_size,
                  **decoding: Any) -> str | list[str]:
        """The best translation of each sentence, in input order (one string for one string), as
        translate.py writes them; an empty or blank sentence translates to "". For each input's
        ``nbest`` hypotheses with their scores: :meth:`generate`."""
        if decoding.get("nbest") not in (None, 1):
            raise ConfigError(f"decoding.nbest={decoding['nbest']!r}: translate gives each sentence's best "
                              f"translation; generate(sentences, nbest={decoding['nbest']!r}) gives the hypotheses")
        found = self.generate(sentences, batch_size=batch_size, **{**decoding, "nbest": 1})
        return found[0].text if isinstance(sentences, str) else [hypotheses[0].text for hypotheses in found]

    def generate(self, sentences: str | Sequence[str], *, batch_size: int = TranslateConfig.batch_size,
                 **decoding: Any) -> list[Scored] | list[list[Scored]]:
        """Each sentence's ``nbest`` hypotheses (the checkpoint's own unless given: 1), best first
        (those cut at the length limit after every finished one), each with its text, ``score``
        (log-prob / lp(|Y|), what beam search ranks by) and ``log_prob``; with ``sampling=True``,
        that many samples. One list for one string."""
        lines = _lines(sentences)
        found = self.translator(decoding, batch_size=batch_size).translations(lines).nbest
        return found[0] if isinstance(sentences, str) else found

    def perplexity(self, sources: Sequence[str], references: Sequence[str], *,
                   max_tokens: int | None = EvaluateConfig.max_tokens) -> float:
        """Per-subword perplexity of ``references`` given ``sources`` (teacher forcing, the EOS
        counted, no label smoothing), as evaluate.py reports it; ``max_tokens``: evaluate.py's
        batch of its perplexity pass (None: its task's evaluation batch, ``eval_max_tokens``)."""
        sources, references = _lines(sources, "sources"), _lines(references, "references")
        if len(sources) != len(references) or not sources:
            raise ConfigError(f"perplexity needs one reference for each source, and at least one: got "
                             f"{len(sources)} sources and {len(references)} references")
        task = (self.trained.config.get("task") or {}).get("datamodule") or {}
        batch = max_tokens or evaluation_tokens(task.get("max_tokens"), task.get("eval_max_tokens"))
        return perplexity(self.network, self.vocab, sources, references,
                          **({"max_tokens": batch} if batch else {}))[0]  # (none: perplexity's own)

    def attention(self, text: str, **decoding: Any) -> AttentionMaps:
        """Every attention weight of ``text`` and its translation (visualize.py's maps, the paper's
        Figures 3–5: encoder self-attention, decoder self-attention and encoder-decoder attention,
        each (layers, heads, queries, keys)); aiayn.analysis.draw_attention draws them."""
        from aiayn.analysis.attention_maps import attention_maps  # matplotlib: only when asked for

        if not isinstance(text, str):
            raise TypeError(f"text must be one sentence (a str), got {type(text).__name__}")
        if not text.strip():  # as visualize.py's text= (before: the maps of an input of EOS alone)
            raise ConfigError("text is empty: give the sentence whose attention to draw")
        if len(self.trained.members) > 1:
            raise ConfigError("attention maps are of one model; load one checkpoint, not an ensemble")
        if decoding.get("nbest") not in (None, 1):  # as visualize.py's (before: ignored, the best one drawn)
            raise ConfigError(f"decoding.nbest={decoding['nbest']!r}: the attention maps are of one translation, the "
                              "best; leave nbest out")
        settings = self.settings(decoding)
        constraint = self.trained.output_constraint(settings)
        return attention_maps(self.network, self.vocab, text, settings, constraint, self.trained.raw_text(constraint))

    def __repr__(self) -> str:
        steps = f"steps {self.steps[0]}–{self.steps[-1]} averaged" if len(self.steps) > 1 else f"step {self.step}"
        members = f", ensemble of {len(self.trained.members)}" if len(self.trained.members) > 1 else ""
        return f"<aiayn.Pretrained {steps}{members} on {self.device}: {self.decoding.describe()}>"


def _lines(sentences: str | Sequence[str], what: str = "sentences") -> list[str]:
    """``sentences`` as a list of strings (one string: a list of it); a TypeError names an element
    that is not a string (bytes, None), which the subword model would misread or fail on, and
    what is neither a string nor sentences in an order (bytes, a dict or a set, a number)."""
    if isinstance(sentences, str):
        return [sentences]
    if isinstance(sentences, (bytes, bytearray, Mapping, set, frozenset)) or not isinstance(sentences, Iterable):
        decode = "; decode them first (.decode('utf-8'))" if isinstance(sentences, (bytes, bytearray)) else ""
        raise TypeError(f"{what} must be a string or a list of strings, got {type(sentences).__name__}{decode}")
    lines = list(sentences)
    for number, line in enumerate(lines):
        if not isinstance(line, str):
            raise TypeError(f"{what} must be strings; element {number} is {type(line).__name__}")
    return lines
