"""The typed parts of the training config (conf/train.yaml): the network (``model``), the
optimiser and its schedule (``optim``) and the loss (``loss``), as dataclasses, and the one
function that turns a model config into the network's arguments.

Importing this module (any of ``aiayn.config``) registers the dataclasses in Hydra's ConfigStore
as the schemas ``schema/model``, ``schema/optim`` and ``schema/loss``, and the plan's resolvers.
conf/model/*.yaml and conf/optim/*.yaml start from theirs (``defaults: [/schema/model@_here_,
_self_]``) and conf/train.yaml puts the loss schema under ``loss``, so Hydra rejects a key that is
not a field, or a value of the wrong type, while composing. Code that composes conf/train.yaml
itself imports ``aiayn.config`` first. What types cannot say (ranges, one setting against
another) is checked by :mod:`aiayn.training.config_check`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from aiayn.errors import ConfigError


@dataclass
class ModelConfig:
    """The Transformer's constructor arguments (aiayn.model.Transformer; the vocabulary sizes and
    the padding id come from the task), so that ``hydra.utils.instantiate(cfg.model,
    src_vocab_size=V, tgt_vocab_size=V, pad_id=0)`` builds it. The defaults are the base model."""

    _target_: str = "aiayn.model.Transformer"
    n_layers: int = 6  # N: layers of the encoder stack and of the decoder stack
    d_model: int = 512  # the width of the embeddings and of every sub-layer's output
    d_ff: int = 2048  # the inner width of the position-wise feed-forward networks (Eq. 2)
    n_heads: int = 8  # h: attention heads
    d_k: int = 64  # the width of each head's queries and keys
    d_v: int = 64  # the width of each head's values
    dropout: float = 0.1  # P_drop: on each sub-layer's output and on the embedding sums (§5.4)
    attention_dropout: float = 0.0  # on the attention weights (not in the paper)
    attention: str = "sdpa"  # Eq. 1 fused by torch (sdpa) or written out (explicit); same results
    positional: str = "sinusoidal"  # sinusoidal (§3.5) or learned (Table 3 row E)
    max_positions: int = 1024  # the longest sequence the positional encodings cover
    share_embeddings: bool = True  # one matrix for both embeddings and the pre-softmax projection (§3.4)
    # Restricted self-attention (§4): each position sees r positions on each side (the decoder's the
    # r before it); null: every position, as in the paper's models.
    attention_window: int | None = None


@dataclass
class OptimConfig:
    """Adam and the learning-rate schedule of §5.3 (Eq. 3), and how long to train. The defaults
    are the base model's recipe."""

    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])  # Adam's β1, β2
    eps: float = 1e-9  # Adam's ε
    fused: bool = False  # torch's fused Adam kernel: the same update in one pass; helps on GPU
    warmup_steps: int = 4000  # Eq. 3's warmup_steps: the rate rises linearly for this many steps
    lr_factor: float = 1.0  # scales Eq. 3 (1.0: the paper)
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


SCHEMAS = {"model": ModelConfig, "optim": OptimConfig, "loss": LossConfig}

for _name, _schema in SCHEMAS.items():
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
    """``model``, ``optim`` and ``loss`` of ``config`` as their schemas type them (missing keys
    at their defaults). Raises ConfigError for a key a schema lacks, or a value it cannot take:
    what Hydra already refuses for ``key=value``, here also for ``+key=value`` and for configs
    written in code."""
    typed = {}
    for section, schema in SCHEMAS.items():
        values = config.get(section) or {}
        settings = sorted(f.name for f in fields(schema) if f.name != "_target_")
        unknown = sorted(set(values) - set(settings) - {"_target_"})
        if unknown:
            raise ConfigError(f"{section}.{unknown[0]} is not a{'n' if section[0] in 'aeio' else ''} {section} "
                              f"setting; the settings are {', '.join(settings)}")
        try:
            typed[section] = OmegaConf.to_container(OmegaConf.merge(OmegaConf.structured(schema), values))
        except OmegaConfBaseException as error:
            key = getattr(error, "full_key", None) or "?"
            raise ConfigError(f"{section}.{key}: {getattr(error, 'msg', error)}") from None
    return typed
