"""The typed settings (conf/): the network (``model``), the optimiser and its schedule
(``optim``), the loss (``loss``) and decoding (``decoding``, every tool's), as dataclasses, and
the function that turns a model config into the network's arguments (decoding settings are
checked and served by aiayn.decoding.settings).

Importing this module (any of ``aiayn.config``) registers the dataclasses in Hydra's ConfigStore
as the schemas ``schema/model``, ``schema/optim``, ``schema/loss``, ``schema/decoding`` and
``schema/decoding_overrides`` (the tools'), ``schema/trainer`` (Lightning's Trainer arguments,
aiayn.config.trainer), ``schema/progress_log`` (the progress lines of a training run,
``callbacks.progress_log``), ``schema/experiment`` (a paper table's row, aiayn.config.experiment),
and the plan's resolvers; and the resolvers ``${aiayn.folder:}``
(:func:`absolute_folder`) and ``${aiayn.per_head:}`` (:func:`per_head`).
conf/model/*.yaml and conf/optim/*.yaml start from theirs (``defaults: [/schema/model@_here_,
_self_]``) and conf/train.yaml puts the loss schema under ``loss``, so Hydra rejects a key that is
not a field, or a value of the wrong type, while composing. Code that composes conf/train.yaml
itself imports ``aiayn.config`` first. What types cannot say (ranges, one setting against
another) is checked by :mod:`aiayn.training.config_check`.
"""

from __future__ import annotations

import importlib
import inspect
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass, make_dataclass
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from aiayn.config.experiment import ExperimentConfig
from aiayn.config.trainer import TrainerConfig
from aiayn.errors import ConfigError, user_error_behind


def per_head(d_model: Any, n_heads: Any) -> int:
    """``${aiayn.per_head:${.d_model},${.n_heads}}``, the default of ``model.d_k`` and ``model.d_v``:
    d_model / h (§3.2.2: "d_k = d_v = d_model/h = 64"), for any width and number of heads; a
    ConfigError where h does not divide d_model, saying to give both. The network applies the same
    rule to a Transformer built in Python (aiayn.model.transformer.head_widths); the settings keep
    their own copy so that composing them needs no torch."""
    if any(isinstance(size, bool) or not isinstance(size, int) or size < 1 for size in (d_model, n_heads)):
        return 1  # a stand-in: the network's own checks name the impossible d_model or n_heads (aiayn.model)
    if d_model % n_heads:
        raise ConfigError(f"model.d_k and model.d_v are d_model / n_heads unless given (§3.2.2), and "
                          f"model.n_heads={n_heads!r} does not divide model.d_model={d_model!r}: give "
                          "model.d_k=N model.d_v=N, or another n_heads")
    return d_model // n_heads


PER_HEAD = "${aiayn.per_head:${.d_model},${.n_heads}}"


@dataclass
class ModelConfig:
    """The Transformer's constructor arguments (aiayn.model.Transformer; the vocabulary sizes and
    the padding id come from the task), so that ``hydra.utils.instantiate(cfg.model,
    src_vocab_size=V, tgt_vocab_size=V, pad_id=0)`` builds it. The defaults are the base model."""

    # The network's class: aiayn.model.Transformer, or a subclass of one's own on PYTHONPATH
    # (docs/extending.md), built with these settings and any of its own given as +model.<key>=<value>.
    _target_: str = "aiayn.model.Transformer"
    n_layers: int = 6  # N: layers of the encoder stack and of the decoder stack
    d_model: int = 512  # the width of the embeddings and of every sub-layer's output
    d_ff: int = 2048  # the inner width of the position-wise feed-forward networks (Eq. 2)
    n_heads: int = 8  # h: attention heads
    # The width of each head's queries and keys, and of its values: d_model / h unless given (§3.2.2,
    # as tensor2tensor's attention_key_channels=0), so that `model.n_heads=16` is Table 3's row (A).
    d_k: int = PER_HEAD  # type: ignore[assignment]  # an interpolation, an int once resolved
    d_v: int = PER_HEAD  # type: ignore[assignment]
    dropout: float = 0.1  # P_drop: on each sub-layer's output and on the embedding sums (§5.4)
    attention_dropout: float = 0.0  # on the attention weights (§5.4 gives none; §6.3 tuned one, value not given)
    attention: str = "sdpa"  # Eq. 1 fused by torch (sdpa) or written out (explicit); same results
    positional: str = "sinusoidal"  # sinusoidal (§3.5) or learned (Table 3 row E)
    max_positions: int = 1024  # the longest sequence the positional encodings cover
    share_embeddings: bool = True  # one matrix for both embeddings and the pre-softmax projection (§3.4); false: the source embedding its own
    # Restricted self-attention (§4): each position sees r positions on each side (the decoder's the
    # r before it); null: every position, as in the paper's models.
    attention_window: int | None = None


@dataclass
class OptimConfig:
    """Adam and the learning-rate schedule of §5.3 (Eq. 3), and how long to train. The defaults
    are the base model's recipe."""

    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])  # Adam's β1, β2
    eps: float = 1e-9  # Adam's ε
    fused: bool = True  # torch's fused Adam: the same update in one kernel, a non-finite step skipped on the device
    warmup_steps: int = 4000  # Eq. 3's warmup_steps: the rate rises linearly for this many steps
    lr_factor: float = 1.0  # scales Eq. 3 (1.0: the paper)
    # The learning rate at each step: null, Eq. 3; or the dotted path of a function of one's own,
    # rate(step, d_model, warmup_steps, factor, train_steps) with those it names (docs/extending.md).
    schedule: Optional[str] = None  # noqa: UP045
    train_steps: int = 100000  # steps to train (trainer.max_steps; Table 3's "train steps")
    # Padded tokens per side in one step over every process and accumulated batch (§5.1: "approximately
    # 25000 source tokens and 25000 target tokens"); the accumulation and each process's batch are
    # derived from it (aiayn.config.plan). None: a step is one batch of task.datamodule.max_tokens
    # a process.
    tokens_per_step: int | None = 25000


@dataclass
class LossConfig:
    """The training loss: cross-entropy with label smoothing (§5.4)."""

    label_smoothing: float = 0.1  # ε_ls: the share of each target's probability spread over the vocabulary
    # The same loss computed with its gradient a block of rows at a time, keeping that gradient in the
    # logits' dtype instead of fp32 log-probabilities over the vocabulary: less memory a token, so
    # bigger batches fit (aiayn.model.loss). A speed switch: the same numbers up to rounding.
    fused: bool = False


@dataclass
class DecodingConfig:
    """How every tool decodes (§6.1): beam search with a beam of ``beam_size``, the length
    penalty's exponent ``alpha`` and outputs of at most the input's length + ``max_len_offset`` —
    the one place these defaults live (the paper's translation settings; conf/decoding/parsing.yaml
    sets §6.3's). Under ``decoding.*`` in train (the task picks conf/decoding/<option>), evaluate,
    translate, export and visualize."""

    # Each may be null: the default here (in a tool: the checkpoint's own).
    beam_size: Optional[int] = 4  # §6.1: "beam search with a beam size of 4"  # noqa: UP045
    alpha: Optional[float] = 0.6  # §6.1: "length penalty α = 0.6" (GNMT's ((5+|Y|)/6)^α)  # noqa: UP045
    max_len_offset: Optional[int] = 50  # §6.1: "maximum output length ... input length + 50"  # noqa: UP045
    min_len: Optional[int] = 0  # the shortest output, in tokens before EOS (0: any; fairseq's --min-len)  # noqa: UP045
    # Reuse the decoder's self-attention keys/values (the same outputs; tensor2tensor's fast decoding).
    kv_cache: Optional[bool] = True  # noqa: UP045
    constrained: Optional[bool] = False  # only well-formed trees over the input's words (parsing; ours)  # noqa: UP045
    # When a sentence's beam search stops (the paper is silent): "paper", tensor2tensor's bound (its
    # stop_early; the paper's 2017 code bounded by the worst finished one, the same best output): once
    # no live hypothesis, even at the largest length penalty, can beat the best finished one;
    # "first_k": once beam_size hypotheses have finished (fairseq's and CTranslate2's).
    stop: Optional[str] = "paper"  # noqa: UP045
    # The k best hypotheses per input (k ≤ beam_size; with sampling, k samples), each with its scores.
    nbest: Optional[int] = 1  # noqa: UP045
    # Ancestral sampling instead of beam search: each token drawn from the model's distribution
    # divided by `temperature`, cut to its `top_k` most probable tokens (0: all) and to the fewest
    # whose probabilities add up to `top_p` (1.0: all); `seed` seeds the draws (reproducible).
    sampling: Optional[bool] = False  # noqa: UP045
    temperature: Optional[float] = 1.0  # noqa: UP045
    top_k: Optional[int] = 0  # noqa: UP045
    top_p: Optional[float] = 1.0  # noqa: UP045
    seed: Optional[int] = 0  # noqa: UP045


@dataclass
class ProgressLogConfig:
    """``callbacks.progress_log``: plain progress lines of a training run (as fairseq's
    ``--log-format simple --log-interval N``), aiayn.training.progress.ProgressLog; null: none.
    conf/callbacks/default.yaml starts from this, so its default lives here alone."""

    _target_: str = "aiayn.training.progress.ProgressLog"
    # A line every this many optimizer steps (fairseq's --log-interval default), and one at the
    # last step: 20 lines over the default job's 2,000 steps.
    every_n_steps: int = 100


@dataclass
class CheckpointConfig:
    """The checkpoints a run writes: resume points and §6.1's window to average
    (aiayn.config.checkpointing). conf/checkpoint/<model>.yaml starts from this; the defaults are
    the base model's (conf/checkpoint/base.yaml says why)."""

    every_n_train_steps: int = 1000  # a resume point every this many steps, and the last step
    save_top_k: int = 5  # the newest kept (-1: all), never fewer than average_last
    # §6.1's window: the last average_last checkpoints, average_every_n_steps apart, the last at the
    # last step (base 5 × 1,500, big 20 × 600); null both: none
    average_last: Optional[int] = 5  # noqa: UP045
    average_every_n_steps: Optional[int] = 1500  # noqa: UP045
    in_background: bool = True  # saved by a background thread while training goes on


def overrides_of(schema: type) -> type:
    """``schema`` with every field None by default: a tool's overrides of settings a checkpoint
    stores (None: the checkpoint's), typed by the one schema; a subclass, so that Hydra merges it
    over a node of ``schema`` (evaluate.py task=<name> brings the task's decoding)."""
    hints = typing.get_type_hints(schema)
    return make_dataclass(f"{schema.__name__}Overrides",
                          [(f.name, hints[f.name], field(default=None)) for f in fields(schema)], bases=(schema,))


DecodingOverrides = overrides_of(DecodingConfig)

SCHEMAS = {"model": ModelConfig, "optim": OptimConfig, "loss": LossConfig, "decoding": DecodingConfig,
           "checkpoint": CheckpointConfig, "experiment": ExperimentConfig}

for _name, _schema in {**SCHEMAS, "decoding_overrides": DecodingOverrides, "trainer": TrainerConfig,
                       "progress_log": ProgressLogConfig}.items():
    ConfigStore.instance().store(group="schema", name=_name, node=_schema)


# The widths width_divisor divides; N and h stay.
WIDTHS = ("d_model", "d_ff", "d_k", "d_v")


def network_arguments(model: Mapping[str, Any], width_divisor: int = 1) -> dict[str, Any]:
    """The Transformer's keyword arguments a model config asks for (``_target_`` left out), every
    width divided by ``width_divisor`` (conf/scale/multi30k_cpu.yaml sets 4; 1 in every paper
    setting). The one place the divisor is applied: the module is built from what this returns,
    so its checkpoint's hyper-parameters hold the widths trained."""
    network = {key: value for key, value in model.items() if key != "_target_"}
    if isinstance(width_divisor, bool) or not isinstance(width_divisor, int) or width_divisor < 1:
        raise ValueError(f"width_divisor must be a positive whole number, got {width_divisor!r}")
    if width_divisor != 1:
        for key in WIDTHS:
            if key in network:
                if network[key] % width_divisor:
                    raise ValueError(f"width_divisor={width_divisor} does not divide model.{key}={network[key]}")
                network[key] //= width_divisor
    return network


def check_against_schemas(config: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``model``, ``optim``, ``loss``, ``decoding``, ``checkpoint`` and ``experiment`` of ``config``
    as their schemas type them (missing keys at their defaults). Raises ConfigError for a key a
    schema lacks, or a value it cannot take: what Hydra already refuses for ``key=value``, here also
    for ``+key=value`` and for configs written in code. A model class of one's own (``model._target_``)
    also takes the keys its constructor names, as given (:func:`network_class`)."""
    typed = {}
    for section, schema in SCHEMAS.items():
        values = dict(config.get(section) or {})
        settings = sorted(f.name for f in fields(schema) if f.name != "_target_")
        own, of = {}, ""
        if section == "model" and values.get("_target_", PAPER_NETWORK) != PAPER_NETWORK:
            kind = network_class(values["_target_"])
            own = {key: values.pop(key) for key in _own_arguments(kind, values)}
            theirs = sorted(constructor_arguments(kind)[0] - set(settings) - {"_target_", *BUILT_WITH})  # before: unsaid
            of = (f"; nor is it an argument of model._target_={values['_target_']}"
                  + (f", whose own are {', '.join(theirs)}" if theirs else ""))
        unknown = sorted(set(values) - set(settings) - {"_target_"})
        if unknown:
            raise ConfigError(f"{section}.{unknown[0]} is not a{'n' if section[0] in 'aeio' else ''} {section} "
                              f"setting{of}; the settings are {', '.join(settings)}")
        hints = typing.get_type_hints(schema)  # a section within (experiment.paper): its keys named as well
        for name in [f.name for f in fields(schema) if is_dataclass(hints[f.name]) and values.get(f.name) is not None]:
            inner, given = sorted(f.name for f in fields(hints[name])), values[name]
            wrong = sorted(set(given) - set(inner)) if isinstance(given, Mapping) else [f"={given!r}"]
            if wrong:
                raise ConfigError(f"{section}.{name}{'.' if isinstance(given, Mapping) else ''}{wrong[0]}: "
                                  f"{section}.{name}'s settings are {', '.join(inner)}")
        try:  # resolved: d_k and d_v are d_model / n_heads unless given (PER_HEAD)
            merged = OmegaConf.merge(OmegaConf.structured(schema), values)
            typed[section] = {**OmegaConf.to_container(merged, resolve=True), **own}
        except OmegaConfBaseException as error:
            if (raised := user_error_behind(error)) is not None:  # per_head's: h does not divide d_model
                raise raised from None
            key = getattr(error, "full_key", None) or "?"
            raise ConfigError(f"{section}.{key}: {str(getattr(error, 'msg', error)).splitlines()[0]}") from None
    return typed


# What build_network gives a network class itself, from the task's vocabulary: no setting of the model.
BUILT_WITH = ("src_vocab_size", "tgt_vocab_size", "pad_id")
# The network of the paper (ModelConfig._target_'s default).
PAPER_NETWORK = "aiayn.model.Transformer"


def network_class(target: str | None, setting: str = "model._target_",
                  where: str = "give the dotted path of a subclass of aiayn.model.Transformer whose module is on "
                               "PYTHONPATH") -> type:
    """The class ``target`` names, a dotted path (None: :data:`PAPER_NETWORK`): aiayn.model.Transformer
    or a subclass of it, which search, checkpoints and the tools call as they call the paper's
    (docs/extending.md). A ConfigError naming ``setting`` and what to do (``where``) when there is
    none there, or it is not such a class; an import that fails inside the module found is that
    module's own error."""
    target = target or PAPER_NETWORK
    found = named_object(target, setting, where)
    from aiayn.model import Transformer  # here: importing it imports torch, which checking settings may not need

    if not (isinstance(found, type) and issubclass(found, Transformer)):
        raise ConfigError(f"{setting}={target} is not a subclass of aiayn.model.Transformer; {where} "
                          "(docs/extending.md)")
    return found


def build_network(target: str | None, vocab_size: int, network: Mapping[str, Any], pad_id: int = 0, *,
                  on_meta: bool = False, **named: str) -> Any:
    """The network the class ``target`` names (:func:`network_class`, ``named`` its ``setting`` and
    ``where``), over one vocabulary of ``vocab_size``, with the arguments ``network``
    (:func:`network_arguments`); ``on_meta``: on torch's meta device, its shapes and checks without
    its weights allocated."""
    kind = network_class(target, **named)
    if not on_meta:
        return kind(vocab_size, vocab_size, pad_id=pad_id, **network)
    import torch

    with torch.device("meta"):
        return kind(vocab_size, vocab_size, pad_id=pad_id, **network)


def named_object(path: str, setting: str, where: str) -> Any:
    """What the dotted ``path`` names (a class, a function of one's own on PYTHONPATH); a ConfigError
    naming ``setting`` and what to do (``where``) where its module or the name in it is not there.
    An import that fails inside the module found is that module's own error."""
    module_name, _, name = str(path).rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), name) if module_name else None
    except ModuleNotFoundError as error:
        if not module_name.startswith(str(error.name)):
            raise  # the module is there, and imports what is not: its own error
        raise ConfigError(f"{setting}={path}: there is no module {error.name} on PYTHONPATH; {where}") from None
    except AttributeError:
        raise ConfigError(f"{setting}={path}: module {module_name} has no {name}; {where}") from None


def _own_arguments(kind: type, values: Mapping[str, Any]) -> list[str]:
    """The keys of ``values`` that ``kind``, a model class of one's own, takes besides ModelConfig's
    fields: those its constructor, or one it passes ``**kwargs`` on to, names."""
    named, _ = constructor_arguments(kind)
    fields_of = {f.name for f in fields(ModelConfig)}
    return [key for key in values if key not in fields_of and key in named]


def constructor_arguments(kind: Any) -> tuple[set[str], bool]:
    """The arguments ``kind`` (a class, or a function) takes by name, and whether it takes any other
    name too. A class's are its ``__init__``'s and, where that passes ``**kwargs`` on, those of the
    ``__init__`` of the classes it inherits from, up to one that takes no ``**kwargs``. Where the
    ``**kwargs`` go on to something else (a factory's to its class, W&B's logger's to
    ``wandb.init``), ``kind.passes_keywords_to()`` names it, and its arguments are taken too."""
    inits = [vars(each)["__init__"] for each in kind.__mro__ if "__init__" in vars(each)] if inspect.isclass(kind) \
        else [kind]
    named: set[str] = set()
    for init in inits:
        parameters = inspect.signature(init).parameters.values()
        named |= {p.name for p in parameters if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            return named, False
    passes_to = getattr(kind, "passes_keywords_to", None)
    if passes_to is None:
        return named, True
    theirs, takes_any = constructor_arguments(passes_to())
    return named | theirs, takes_any


def absolute_folder(path: str | None) -> str | None:
    """``${aiayn.folder:<path>}``: a folder or file setting as the run reads it, ``~`` expanded and
    made absolute against the folder the command ran in, so that the run's config (its checkpoints',
    which evaluate.py and translate.py read) names it from anywhere; null stays null."""
    return str(Path(str(path)).expanduser().absolute()) if path is not None else None


OmegaConf.register_new_resolver("aiayn.folder", absolute_folder, replace=True)
OmegaConf.register_new_resolver("aiayn.per_head", per_head, replace=True)
