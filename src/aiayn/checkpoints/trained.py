"""Loading a trained model back from a Lightning checkpoint written by src/train.py.

A checkpoint holds the model weights, the module's hyper-parameters (model config, vocabulary
size, decoding settings and the run's whole resolved config) and the serialized subword model,
so nothing else is needed to translate with it. The Transformer is built from its saved
arguments directly: inference needs no LightningModule.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch

from aiayn.checkpoints.digest import identity
from aiayn.checkpoints.given import checkpoint_list
from aiayn.checkpoints.io import read_checkpoint
from aiayn.config.schemas import build_network, network_arguments
from aiayn.data.subwords import Subwords
from aiayn.data.task import raw_text_of, task_module
from aiayn.errors import ConfigError, DataError
from aiayn.model import Ensemble, Transformer

# What a model config held besides the network before the recipe moved to optim/loss: such
# checkpoints keep it in hyper_parameters["model"] (with the widths before width_divisor).
OLD_RECIPE_KEYS = ("name", "label_smoothing", "train_steps", "warmup_steps", "lr_factor", "validate_every_n_steps",
                   "width_divisor")
# Classes a run's config names (``_target_``) that have moved since: a checkpoint written before
# the move still evaluates (src/evaluate.py instantiates its task's data module).
MOVED_TARGETS = {
    "aiayn.data.datamodule.Multi30kDataModule": "aiayn.data.multi30k.Multi30kDataModule",
    "aiayn.data.wmt_datamodule.WMTDataModule": "aiayn.data.wmt.datamodule.WMTDataModule",
    "aiayn.data.parsing.ParsingDataModule": "aiayn.data.parsing.datamodule.ParsingDataModule",
    "aiayn.training.loggers.wandb_logger": "aiayn.reporting.loggers.wandb_logger",
}


# The Transformer's weights in a training checkpoint's state dict: the LightningModule's "model." ones.
MODEL_PREFIX = "model."


@dataclass
class TrainedModel:
    model: Transformer  # in eval mode
    vocab: Subwords
    decoding: dict[str, Any]  # the decoding settings it was trained with (aiayn.config.schemas.DecodingConfig's)
    config: dict[str, Any]  # the training run's resolved config ({} for old checkpoints)
    step: int
    # What identifies each checkpoint decoding together (an ensemble: model is an aiayn.model.Ensemble;
    # aiayn.checkpoints.digest.identity); () for one.
    members: tuple[str, ...] = ()
    # the training run's runs in the trackers, by kind ({"mlflow": id, "wandb": id}), as its checkpoint keeps them
    logger_runs: dict[str, str] = field(default_factory=dict)
    # average.py's checkpoint: the steps whose weights it averages (§6.1), its newest last; () for one step's weights
    averaged_steps: tuple[int, ...] = ()

    def output_constraint(self, decoding: Any = None) -> Any:
        """The constraint its task puts on its outputs, for its vocabulary, as the task's data
        module hands it over (None: none, or a checkpoint that names no task). With ``decoding``
        (aiayn.decoding.settings.Decoding) that is not constrained, None without asking the task,
        whose data module's import is Lightning's: translate.py of a translation model starts without it."""
        if decoding is not None and not decoding.constrained:
            return None
        kind = task_module(self.config.get("task") or {})
        return kind.output_constraint(self.vocab) if kind is not None else None

    def raw_text(self, constraint: Any = None) -> Any:
        """How its task reads lines of text and writes outputs, as the task's data module hands it
        over (aiayn.data.task.raw_text_of; None: as text, a translation's), reading outputs with
        ``constraint`` (its :meth:`output_constraint`, where one is built already)."""
        return raw_text_of(self.config.get("task") or {}, self.vocab, constraint)

    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Put a training checkpoint's weights (an average of several, say) into the model."""
        put_weights(self.model, model_weights(state_dict), "the averaged checkpoints")


def load_trained(path: str | os.PathLike, map_location: str | torch.device = "cpu",
                 state_dict: dict[str, torch.Tensor] | None = None) -> TrainedModel:
    """Rebuild the Transformer of ``path`` (with ``state_dict``'s weights instead, if given: an
    average of several checkpoints, say) on ``map_location`` ("auto": a GPU if there is one)."""
    if map_location == "auto":
        map_location = "cuda" if torch.cuda.is_available() else "cpu"
    checkpoint = read_checkpoint(path)
    arguments = module_arguments(checkpoint["hyper_parameters"])
    vocab_size = arguments["vocab_size"]
    network = dict(arguments["model"])
    # The class it was trained as: the paper's Transformer, or one of one's own (its module on PYTHONPATH here too).
    model = build_network(network.pop("_target_", None), vocab_size, network, arguments.get("pad_id", 0),
                          setting=f"{path}: its model._target_", where="the class it was trained as is needed to "
                          "load it: put the folder of its module on PYTHONPATH")
    put_weights(model, model_weights(state_dict if state_dict is not None else checkpoint["state_dict"]), str(path))
    model.to(map_location).eval()
    config = _moved_targets(dict(checkpoint["hyper_parameters"].get("run_config") or {}))
    # Its settings (aiayn.decoding.settings checks them where it lays a tool's over them); a checkpoint
    # from before constrained decoding: on where its task has an output constraint, as its config now says.
    decoding = dict(arguments.get("decoding") or {})
    if "constrained" not in decoding:
        kind = task_module(config.get("task") or {})
        decoding = {"constrained": kind is not None and kind.OUTPUT_CONSTRAINT is not None, **decoding}
    runs = {**({"wandb": checkpoint["wandb_run_id"]} if checkpoint.get("wandb_run_id") else {}),
            **(checkpoint.get("logger_runs") or {})}
    return TrainedModel(model=model, vocab=Subwords(proto=checkpoint["subwords"]), decoding=decoding, config=config,
                        step=int(checkpoint.get("global_step", 0)), logger_runs=runs,
                        averaged_steps=tuple(int(step) for step in checkpoint.get("averaged_steps") or ()))


def load_ensemble(ckpt: Any, map_location: str | torch.device = "cpu") -> TrainedModel:
    """The checkpoint of ``ckpt``, or (several: aiayn.checkpoints.given) their ensemble
    (aiayn.model.Ensemble: the mean of their log-probabilities at every step) with the first's
    vocabulary, decoding settings, config and step; refused in one line when their vocabularies
    or tasks differ."""
    paths = checkpoint_list(ckpt)
    members = [load_trained(path, map_location) for path in paths]
    if len(members) == 1:
        return members[0]
    first = members[0]
    for path, member in zip(paths[1:], members[1:]):
        if member.vocab.serialized() != first.vocab.serialized():
            raise ConfigError(f"ckpt: {path} has another subword vocabulary than {paths[0]}; an ensemble's "
                              "checkpoints must share one (models of the same task and data)")
        task, first_task = (member.config.get("task") or {}), (first.config.get("task") or {})
        if _task_of(task) != _task_of(first_task):
            raise ConfigError(f"ckpt: {path} was trained on task {_task_of(task)}, {paths[0]} on {_task_of(first_task)}; "
                              "an ensemble's checkpoints must share one task")
    return TrainedModel(model=Ensemble([member.model for member in members]), vocab=first.vocab,
                        decoding=first.decoding, config=first.config, step=first.step,
                        members=tuple(identity(path) for path in paths))


def _task_of(task: dict[str, Any]) -> str:
    """A task's name and languages: what ensembled checkpoints must share."""
    datamodule = task.get("datamodule") or {}
    return f"{task.get('name')} ({datamodule.get('src_lang')}→{datamodule.get('tgt_lang')})"


def put_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor], source: str) -> None:
    """Load ``weights`` into ``model``; a DataError naming ``source`` when they are laid out
    otherwise (:func:`layout_difference`) rather than torch's list of every key."""
    difference = layout_difference(model.state_dict(), weights)
    if difference is not None:
        raise DataError(f"{source}: {difference}")
    model.load_state_dict(weights)


def layout_difference(expected: dict[str, torch.Tensor], weights: dict[str, torch.Tensor]) -> str | None:
    """What differs between the weights a network has (``expected``) and those of a checkpoint:
    names missing, names it does not have, other shapes (a few of each); None when nothing does.
    Its settings built the network, so a difference means another version of aiayn wrote it."""
    missing = [name for name in expected if name not in weights]
    unexpected = [name for name in weights if name not in expected]
    reshaped = [f"{name} {tuple(weights[name].shape)} for {tuple(expected[name].shape)}" for name in expected
                if name in weights and weights[name].shape != expected[name].shape]
    parts = [f"{what} {len(names)} ({', '.join(names[:2])}{', …' if len(names) > 2 else ''})"
             for what, names in (("missing", missing), ("not this network's", unexpected), ("other shapes", reshaped))
             if names]
    if not parts:
        return None
    return (f"its weights are laid out otherwise than the network its settings describe is built by this version "
            f"of aiayn ({'; '.join(parts)}): another version wrote it; use that version with it")


def model_weights(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The Transformer's own weights of a training checkpoint's state dict (its "model." entries)."""
    return {key[len(MODEL_PREFIX):]: value for key, value in state_dict.items() if key.startswith(MODEL_PREFIX)}


def module_arguments(hyper_parameters: dict[str, Any]) -> dict[str, Any]:
    """The training module's arguments saved in a checkpoint (``model``: the Transformer's
    keyword arguments; ``vocab_size``, ``pad_id``, ``decoding``, ...); for a checkpoint written while the model
    config still carried the recipe, its network's arguments and label smoothing taken apart."""
    if "metric" in hyper_parameters:  # written while the module chose its scores by name; the data module does now
        hyper_parameters = {k: v for k, v in hyper_parameters.items() if k != "metric"}
    model = hyper_parameters.get("model") or {}
    if "label_smoothing" in hyper_parameters or not any(key in model for key in OLD_RECIPE_KEYS):
        return hyper_parameters
    network = network_arguments({k: v for k, v in model.items() if k not in OLD_RECIPE_KEYS},
                                model.get("width_divisor", 1))
    return {**hyper_parameters, "model": network, "label_smoothing": model.get("label_smoothing", 0.1)}


def _moved_targets(config: Any) -> Any:
    """``config`` with every ``_target_`` of :data:`MOVED_TARGETS` renamed to where it lives now."""
    if isinstance(config, dict):
        return {key: MOVED_TARGETS.get(value, value) if key == "_target_" else _moved_targets(value)
                for key, value in config.items()}
    if isinstance(config, list):
        return [_moved_targets(value) for value in config]
    return config
