"""A run that starts from a trained model (``init_from=<checkpoint>``): fine-tuning on a corpus of
one's own, say, as fairseq's ``--finetune-from-model`` and eole's ``train_from`` with its optimizer
reset start.

The run is a new one: step 0, its own folder and logger runs, a fresh Adam and the §5.3 schedule
from its warmup, its own recipe (``optim.*``, ``loss.*``, the task). What it takes from the
checkpoint is the model: its weights, and the subword model its embeddings were learnt over, which
the run's data are encoded with (``task.subword_model``, written into the cache once:
:func:`start_from`). The network settings that shape the weights must be the checkpoint's; the
others (dropout, the attention's implementation or window) are the run's. A run killed midway
resumes from its own checkpoints (``resume=auto``), not from ``init_from``.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Any

import torch

from aiayn.checkpoints.digest import damaged
from aiayn.checkpoints.io import folder_given, load_lazily, read_checkpoint
from aiayn.checkpoints.job_folders import job_dirs
from aiayn.checkpoints.layout import run_dir_of
from aiayn.checkpoints.resume import newest_checkpoint, resumes_nothing
from aiayn.checkpoints.trained import model_weights, module_arguments, put_weights
from aiayn.config.hardware import first_process
from aiayn.config.schemas import PAPER_NETWORK, WIDTHS, network_arguments
from aiayn.errors import ConfigError
from aiayn.files import atomic_write

log = logging.getLogger(__name__)

# The network settings its weights are laid out by: the run's must be the checkpoint's (max_positions
# only for learned positions).
SHAPE_SETTINGS = ("n_layers", "d_model", "d_ff", "n_heads", "d_k", "d_v", "positional", "max_positions",
                  "share_embeddings")
# More of a side's subwords than this unknown (<unk>) to the checkpoint's subword model: a warning.
UNKNOWN_SHARE = 0.005


def start_from(config: dict[str, Any]) -> None:
    """Check ``init_from`` against the run's resolved ``config`` and name the checkpoint's subword
    model as the run's (``task.subword_model``: a copy in ``<paths.cache_dir>/sentencepiece/``,
    named by its SHA-256, so that every process and every later attempt names the same file). A
    ConfigError, before anything is built, for a file that is no training checkpoint, a network
    laid out otherwise, another vocabulary size, or another ``task.subword_model``."""
    given = config.get("init_from")
    if given is None:
        return
    path = Path(str(given)).expanduser().absolute()
    if path.is_dir():  # a run folder, as resume= takes one (before: "no such checkpoint file")
        raise ConfigError(f"init_from={given}: {folder_given(path, setting='init_from')}")
    if not path.is_file():
        subwords = _subwords_of_its_run(config, path)
        if subwords is None:
            raise ConfigError(f"init_from={given}: no such checkpoint file; give a checkpoint of a trained model "
                              "(<run>/checkpoints/last.ckpt, say)")
        _name_subwords(config, given, path, subwords)
        return
    damage = damaged(path)  # (before: "not an aiayn training checkpoint", as load_lazily reads no damaged file)
    if damage:
        raise ConfigError(f"init_from={given}: {damage}")
    checkpoint = load_lazily(path)  # memory-mapped: its weights are read once the run is built
    if not isinstance(checkpoint, dict) or not {"hyper_parameters", "subwords", "state_dict"} <= set(checkpoint):
        raise ConfigError(f"init_from={given}: not an aiayn training checkpoint; give one a training run wrote "
                          "(<run>/checkpoints/*.ckpt, or average.py's file): export.py's exports are not trained on")
    trained = module_arguments(checkpoint["hyper_parameters"])
    network = network_arguments(config["model"], config["width_divisor"])
    # Sinusoids are no weights (§3.5): their table is computed for the run's max_positions, which may
    # cover longer sentences than the checkpoint's (before: refused as another network).
    computed = {"max_positions"} if trained["model"].get("positional") == network.get("positional") == "sinusoidal" else set()
    differences = [f"model.{key} {trained['model'].get(key)!r} → {network.get(key)!r}" for key in SHAPE_SETTINGS
                   if key not in computed and trained["model"].get(key) != network.get(key)]
    classes = (trained["model"].get("_target_", PAPER_NETWORK), config["model"].get("_target_", PAPER_NETWORK))
    if classes[0] != classes[1]:  # weights of one class of network read by another (docs/extending.md)
        differences.insert(0, f"model._target_ {classes[0]} → {classes[1]}")
    if trained.get("vocab_size") != config["task"]["vocab_size"]:
        differences.append(f"task.vocab_size {trained.get('vocab_size')} → {config['task']['vocab_size']}")
    if differences:
        raise ConfigError(f"init_from={given}: this run's network is not the checkpoint's ({'; '.join(differences)}); "
                          f"give the checkpoint's model settings: {' '.join(_its_settings(trained, network, config))}")
    _name_subwords(config, given, path, bytes(checkpoint["subwords"]))


def _its_settings(trained: dict[str, Any], network: dict[str, Any], config: dict[str, Any]) -> list[str]:
    """The overrides that give this run the checkpoint's network: each setting that differs, and where
    the run divides its widths (``width_divisor``), every width, undivided (before: "give the
    checkpoint's model settings", naming none)."""
    divided = config["width_divisor"] != 1
    keys = [key for key in SHAPE_SETTINGS if trained["model"].get(key) != network.get(key) or divided and key in WIDTHS]
    overrides = ["width_divisor=1"] if divided else []
    if trained["model"].get("_target_", PAPER_NETWORK) != config["model"].get("_target_", PAPER_NETWORK):
        overrides.append(f"model._target_={trained['model'].get('_target_', PAPER_NETWORK)}")
    overrides += [f"model.{key}={_as_given(trained['model'].get(key))}" for key in keys
                  if key != "max_positions" or trained["model"].get("positional") != "sinusoidal"]
    if trained.get("vocab_size") != config["task"]["vocab_size"]:
        overrides.append(f"task.vocab_size={trained.get('vocab_size')}")
    return overrides


def _as_given(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _name_subwords(config: dict[str, Any], given: Any, path: Path, subwords: bytes) -> None:
    """``subwords`` (the checkpoint's subword model) as the run's ``task.subword_model``, and
    ``path`` as its ``init_from``; a ConfigError for another ``task.subword_model`` given."""
    named = config["task"].get("subword_model")
    if named is not None and (not Path(named).is_file() or Path(named).read_bytes() != subwords):
        raise ConfigError(f"init_from={given}: task.subword_model={named} is not the checkpoint's subword model, which "
                          "the run's data are encoded with; leave task.subword_model out")
    copy = subword_copy(subwords, config["paths"]["cache_dir"])
    config["init_from"] = str(path)
    config["task"]["subword_model"] = config["task"]["datamodule"]["subword_model"] = str(copy)


def subword_copy(subwords: bytes, cache_dir: str | Path) -> Path:
    """``<cache_dir>/sentencepiece/given-<SHA-256>.model`` holding ``subwords`` (a checkpoint's subword
    model), written once: the file its run's ``task.subword_model`` names, on any machine."""
    copy = Path(cache_dir) / "sentencepiece" / f"given-{hashlib.sha256(subwords).hexdigest()[:20]}.model"
    if not copy.is_file() or copy.read_bytes() != subwords:
        copy.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(copy, lambda file: file.write(subwords))
    return copy


def _subwords_of_its_run(config: dict[str, Any], path: Path) -> bytes | None:
    """A run resumed (``resume=auto`` or a path) after the checkpoint it started from is gone (a
    scratch disk cleaned, its run's older steps removed): the subword model of the newest checkpoint
    of the run it resumes that started from ``path``, which it goes on from without reading ``path``
    (before: "no such checkpoint file", and without init_from, "trained with other settings").
    None for a run that resumes nothing or finds no such checkpoint."""
    spec = config.get("resume")
    if resumes_nothing(spec):
        return None
    if str(spec) == "auto":
        folders = job_dirs(Path(config["paths"]["output_dir"]), multirun=False)
    else:
        folders = [Path(str(spec)) if Path(str(spec)).is_dir() else run_dir_of(Path(str(spec)))]
    for folder in folders:
        newest = newest_checkpoint(folder)
        saved = load_lazily(newest) if newest is not None else None
        run_config = ((saved or {}).get("hyper_parameters") or {}).get("run_config") or {}
        if run_config.get("init_from") == str(path) and saved.get("subwords") is not None:
            log.info("init_from=%s is gone; the run that started from it goes on from %s, with its subword model",
                     path, newest)
            return bytes(saved["subwords"])
    return None


def initial_weights(model: torch.nn.Module, init_from: str, datamodule: Any = None) -> None:
    """Put the weights of the checkpoint ``init_from`` (checked by :func:`start_from`) into ``model``;
    with the run's ``datamodule``, warn where its subword model leaves much of the corpus unknown
    (:func:`unknown_subwords`)."""
    checkpoint = read_checkpoint(init_from)
    put_weights(model, model_weights(checkpoint["state_dict"]), f"init_from={init_from}")
    averaged = checkpoint.get("averaged_steps") or []  # average.py's (before: said to be its newest step's)
    which = (f"the average of steps {averaged[0]:,}–{averaged[-1]:,}" if len(averaged) > 1
             else f"step {int(checkpoint.get('global_step', 0)):,}")
    log.info("starting from the model of %s (%s): its weights and subword model; a fresh optimizer and "
             "schedule from step 0", init_from, which)
    if datamodule is not None and first_process():
        for line in unknown_subwords(datamodule):
            log.warning("init_from=%s: %s", init_from, line)


def unknown_subwords(datamodule: Any) -> list[str]:
    """What the checkpoint's subword model (the run's, ``task.subword_model``) does not know of the
    run's validation split, a line for each side of which more than :data:`UNKNOWN_SHARE` of the
    subwords are ``<unk>`` (a corpus in another language or script than the checkpoint's: French
    accents under a Multi30k en-de model), naming its characters; [] where all is known, or where
    the split cannot be read before the data is prepared (WMT14's)."""
    if datamodule.preparation_needed() is not None:
        return []
    vocab, split = datamodule.load_vocab(), datamodule.splits["val"]
    sources, targets, _ = datamodule.evaluation_data(split)
    found = []
    for side, lines in ((getattr(datamodule, "src_lang", "source"), sources),
                        (getattr(datamodule, "tgt_lang", "target"), targets)):
        ids = [token for line in vocab.encode(lines) for token in line]
        unknown = sum(token == vocab.unk_id for token in ids)
        if ids and unknown / len(ids) > UNKNOWN_SHARE:
            characters = _unknown_characters(vocab, lines)
            shown = " ".join(characters[:20]) + (f" and {len(characters) - 20} more" if len(characters) > 20 else "")
            found.append(f"its subword model does not know {unknown / len(ids):.1%} of the {side} side's subwords in "
                         f"the {split} split (the characters {shown}): they train and decode as <unk>; a checkpoint "
                         "whose subword model was learnt over this corpus's languages, or a run from scratch (without "
                         "init_from), learns them")
    return found


def _unknown_characters(vocab: Any, lines: list[str]) -> list[str]:
    """The characters of ``lines`` that ``vocab`` encodes as ``<unk>``, in order."""
    characters = sorted({c for line in lines for c in set(line) if not c.isspace()})
    return [c for c, ids in zip(characters, vocab.encode(characters)) if vocab.unk_id in ids]

