"""Checks of a whole training config before anything is built or written, so that a bad setting
is reported at once, as one line naming it and saying what to change — not as a traceback from
deep inside torch or Lightning, and not hours into a run at its first validation.

Keys and types of ``model``, ``optim``, ``loss``, ``decoding`` and ``checkpoint`` are the schemas'
business (aiayn.config.schemas). Here: keys everywhere else (the root, ``validation``, ``trainer`` against
Lightning's Trainer, ``task.datamodule`` against its class, and what only the class knows), ranges
and one setting against another. (What this machine can run: the plan, aiayn.config.plan.)
"""

from __future__ import annotations

import difflib
import inspect
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from aiayn.config.plan import check_batch_holds_a_pair
from aiayn.config.schemas import build_network, check_against_schemas, constructor_arguments, network_arguments
from aiayn.config.trainer import check_lightning_values, check_validation_interval
from aiayn.data.task import task_module
from aiayn.decoding.settings import Decoding
from aiayn.errors import ConfigError
from aiayn.reporting.flops import PAPER_GPU, sustained_tflops
from aiayn.training.compiling import COMPILE_MODES, CUDA_GRAPH_MODES
from aiayn.training.distributed import check_timeout
from aiayn.training.schedule import check_schedule

# The settings at the root of conf/train.yaml and its groups (tests/training/test_config_check.py checks them).
ROOT_SETTINGS = (
    "task", "model", "optim", "loss", "paths", "callbacks", "trainer", "logger", "seed", "run_name", "run_group",
    "width_divisor", "compile", "compile_mode", "resume", "nonfinite", "cost", "test_after_training", "validation",
    "visualize_at_end", "checkpoint", "distributed", "experiment", "plan", "decoding", "init_from",
)
PATHS = ("data_root", "cache_dir", "output_dir")  # conf/paths/default.yaml
TASK_SETTINGS = ("name", "vocab_size", "subword_model", "datamodule", "raw_dir", "data_dir", "src_lang", "tgt_lang", "split",
                 "splits")


def check_train_config(config: Mapping[str, Any]) -> None:
    """Raise ConfigError for the first impossible setting of a resolved training config."""
    _known("", config, ROOT_SETTINGS)
    _check_scale(config.get("experiment") or {})
    typed = check_against_schemas(config)
    network = _check_network(typed["model"], config.get("width_divisor", 1))
    _check_recipe(typed)
    optim = typed["optim"]  # a schedule of one's own (optim.schedule) gives a rate at its first and last step
    check_schedule(optim["schedule"], network["d_model"], optim["warmup_steps"], optim["lr_factor"],
                   optim["train_steps"])
    check_task(config.get("task") or {})
    _check_positions(typed["model"], (config.get("task") or {}).get("datamodule") or {})
    _check_decoding(typed["decoding"], config.get("task") or {}, typed["model"])
    _check_run(config)
    _check_trainer(config.get("trainer") or {})
    _check_adam_in_half(typed["optim"], config.get("trainer") or {})


def _check_scale(experiment: Mapping[str, Any]) -> None:
    """The scales (conf/scale/) put a translation row on Multi30k: a row of another table (Table 4's
    parsing) would become a half-parser on translation data."""
    scale, table = experiment.get("scale"), experiment.get("table")
    if scale and scale != "paper" and table not in (None, "table2", "table3"):
        raise ConfigError(f"+scale={scale} is for the translation rows of Tables 2 and 3, and "
                          f"experiment={table}_{experiment.get('row')} is {table.replace('table', 'Table ')}'s; "
                          f"drop +scale (that row's config is its scale)")


def _check_network(model: dict[str, Any], width_divisor: Any) -> dict[str, Any]:
    """The network's arguments, widths as trained (:func:`network_arguments`), once it is one that can be built."""
    if model["n_layers"] < 1:
        raise ConfigError(f"model.n_layers must be at least 1 (N: the layers of each stack), got {model['n_layers']}")
    try:
        network = network_arguments(model, width_divisor)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    try:  # the network's own checks (a class of one's own: its too), without allocating its weights
        build_network(model.get("_target_"), 8, network, on_meta=True)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"model: {error}") from None
    return network


def _check_recipe(typed: dict[str, dict[str, Any]]) -> None:
    smoothing = typed["loss"]["label_smoothing"]
    if not 0.0 <= smoothing < 1.0:
        raise ConfigError(f"loss.label_smoothing must be in [0.0, 1.0), got {smoothing!r}")
    optim = typed["optim"]
    for key in ("train_steps", "warmup_steps"):
        if optim[key] < 1:
            raise ConfigError(f"optim.{key} must be a positive whole number, got {optim[key]!r}")
    if not optim["lr_factor"] > 0:
        raise ConfigError(f"optim.lr_factor must be positive, got {optim['lr_factor']!r}")
    beta1, beta2 = (list(optim["betas"]) + [None, None])[:2]
    if len(optim["betas"]) != 2 or not all(0.0 <= b < 1.0 for b in (beta1, beta2)):
        raise ConfigError(f"optim.betas must be two numbers in [0, 1) (Adam's β1, β2), got {optim['betas']!r}")
    if not optim["eps"] > 0:
        raise ConfigError(f"optim.eps must be positive, got {optim['eps']!r}")


def _check_adam_in_half(optim: Mapping[str, Any], trainer: Mapping[str, Any]) -> None:
    """``trainer.precision=16-true`` keeps the weights and Adam's moments in fp16. torch's plain Adam
    then computes its update in fp16 too, where ε=1e-9 and the square of a gradient below ~2e-4 are 0:
    its first step makes NaN and inf weights (measured, torch 2.13). Fused Adam computes in fp32."""
    if str(trainer.get("precision")) == "16-true" and not optim.get("fused", True):
        raise ConfigError("trainer.precision=16-true with optim.fused=false: torch's plain Adam updates fp16 weights in "
                          f"fp16, where optim.eps={optim.get('eps')} and small squared gradients are 0, and its first "
                          "step makes NaN weights; give optim.fused=true (it computes in fp32) or trainer.precision="
                          "16-mixed (fp32 weights)")


def check_task(task: Mapping[str, Any]) -> None:
    """The ``task`` section's settings (train.py's and prepare.py's): ConfigError naming the first wrong one."""
    _known("task", task, TASK_SETTINGS)
    if not _whole(task.get("vocab_size")) or task["vocab_size"] < 8:
        raise ConfigError(f"task.vocab_size must be a whole number of at least 8, got {task.get('vocab_size')!r}")
    data = task.get("datamodule") or {}
    _check_target_keys("task.datamodule", data)
    for key in ("max_tokens", "eval_max_tokens", "max_length", "subword_sample_pairs"):
        value = data.get(key)
        if key == "max_tokens" and value == "auto":
            continue  # settled by the plan (aiayn.config.plan.batch_limit)
        if key in data and value is not None and (not _whole(value) or value < 1):
            also = " or auto (sized by the plan from the step and the GPU's memory)" if key == "max_tokens" else ""
            raise ConfigError(f"task.datamodule.{key} must be a positive whole number{also}, got {value!r}")
    check_batch_holds_a_pair(data.get("max_tokens"), data.get("max_length"))
    max_length = data.get("max_length")
    buckets = data.get("length_buckets")
    if buckets is not None:
        if isinstance(buckets, (str, bytes)) or not isinstance(buckets, Sequence) or not buckets or \
                not all(_whole(b) and b > 0 for b in buckets) or list(buckets) != sorted(set(buckets)):
            raise ConfigError(f"task.datamodule.length_buckets must be ascending positive lengths (e.g. [32,64,128,256]) "
                              f"or null, got {buckets!r}")
        if _whole(max_length) and buckets[-1] < max_length + 1:
            raise ConfigError(f"task.datamodule.length_buckets ends at {buckets[-1]}, below the longest training sequence "
                              f"(max_length={max_length} subwords plus EOS); end it at {max_length + 1} or more")
    workers = data.get("prepare_workers")
    if workers is not None and (not _whole(workers) or workers < 1):  # before: 0 and -2 alike made one per CPU
        raise ConfigError(f"task.datamodule.prepare_workers must be a positive whole number, or null for one encoding "
                          f"process per CPU, got {workers!r}")
    if _whole(data.get("num_workers")) and data["num_workers"] < 0:
        raise ConfigError(f"task.datamodule.num_workers must be 0 or more, got {data['num_workers']}")
    if "download" in data and not isinstance(data["download"], bool):
        raise ConfigError(f"task.datamodule.download must be true or false, got {data['download']!r}")


def _check_positions(model: Mapping[str, Any], data: Mapping[str, Any]) -> None:
    """The positional encodings must cover the longest training sequence: ``max_length``
    subwords and the EOS (source) or BOS (decoder input)."""
    max_length, positions = data.get("max_length"), model.get("max_positions")
    if _whole(max_length) and _whole(positions) and positions < max_length + 1:
        raise ConfigError(
            f"model.max_positions={positions} is below the longest training sequence, task.datamodule.max_length="
            f"{max_length} subwords plus EOS; raise model.max_positions to at least {max_length + 1} or lower "
            f"task.datamodule.max_length to at most {positions - 1}")


def _check_decoding(decoding: Mapping[str, Any], task: Mapping[str, Any], model: Mapping[str, Any]) -> None:
    settings = Decoding.of(None, decoding)  # as validation makes it (training.module), and every tool
    if _whole(model.get("max_positions")) and _whole(task.get("vocab_size")):  # as the search checks the model
        settings.fit(model["max_positions"], task["vocab_size"])
    if decoding.get("constrained") and ((kind := task_module(task)) is None or kind.OUTPUT_CONSTRAINT is None):
        raise ConfigError(f"decoding.constrained=true decodes linearised trees, for parsing tasks; task "
                          f"{task.get('name')} has no trees: set it to false")


def _check_target_keys(section: str, entry: Mapping[str, Any]) -> None:
    """Every key of ``entry`` (a config Hydra instantiates: the data module, a callback, the
    logger) is an argument of the class or function its ``_target_`` names."""
    target = entry.get("_target_")
    if not target:
        raise ConfigError(f"{section}._target_ is missing: name the class to build (see conf/)")
    import hydra

    hydra_log = logging.getLogger("hydra.utils")  # get_object logs the import error (3 lines) before it raises
    quiet, hydra_log.disabled = hydra_log.disabled, True
    try:
        kind = hydra.utils.get_object(target)
    except Exception:  # noqa: BLE001 - Hydra wraps the import error in its own
        raise ConfigError(f"{section}._target_={target}: no such class or function; give the dotted path of one "
                          "whose module is on PYTHONPATH (see conf/; one of your own: docs/extending.md)") from None
    finally:
        hydra_log.disabled = quiet
    check_settings = getattr(kind, "check_settings", None)  # what only the class knows (a logger's mode)
    if callable(check_settings):
        check_settings(section, entry)
    named, takes_any = constructor_arguments(kind)  # a class's **kwargs followed to the class it passes them on to
    if takes_any:
        return
    _known(section, {k: v for k, v in entry.items() if not k.startswith("_")}, sorted(named),
           what=f"argument of {kind.__name__}")


def _check_run(config: Mapping[str, Any]) -> None:
    validation = config.get("validation") or {}
    _known("validation", validation, ("bleu_sentences",))
    bleu = validation.get("bleu_sentences")
    if bleu is not None and (not _whole(bleu) or bleu < 0):
        raise ConfigError(f"validation.bleu_sentences must be a whole number, 0 or more (null: every validation "
                          f"sentence), got {bleu!r}")
    checkpoint = config.get("checkpoint") or {}
    for key in ("every_n_train_steps", "average_every_n_steps"):
        every = checkpoint.get(key)
        if every is not None and (not _whole(every) or every < 1):
            raise ConfigError(f"checkpoint.{key} must be a positive whole number of steps, got {every!r}")
    keep = checkpoint.get("save_top_k")
    if keep is not None and (not _whole(keep) or keep == 0 or keep < -1):
        raise ConfigError(f"checkpoint.save_top_k must be how many checkpoints to keep, 1 or more (-1: all), got {keep!r}")
    count = checkpoint.get("average_last")
    if count is not None and (not _whole(count) or count < 1):
        raise ConfigError(f"checkpoint.average_last must be how many checkpoints §6.1 averages, 1 or more (null: no "
                          f"window), got {count!r}")
    if (count is None) != (checkpoint.get("average_every_n_steps") is None):
        raise ConfigError("checkpoint.average_last and checkpoint.average_every_n_steps make §6.1's window together: "
                          "give both, or null both for none")
    for key in ("compile", "test_after_training", "visualize_at_end"):
        if key in config and not isinstance(config[key], bool):
            raise ConfigError(f"{key} must be true or false, got {config[key]!r}")
    if config.get("compile_mode", "default") not in COMPILE_MODES:
        raise ConfigError(f"compile_mode must be one of {', '.join(COMPILE_MODES)}, got {config['compile_mode']!r}")
    _check_graphs_accumulating(config)
    seed = config.get("seed", 0)
    if not _whole(seed) or not 0 <= seed < 2**32:  # what numpy's generator, which Lightning seeds too, accepts
        raise ConfigError(f"seed must be a whole number from 0 to {2**32 - 1}, got {seed!r}")
    files = {"init_from": (config.get("init_from"), "a model initialised afresh"),
             "task.subword_model": ((config.get("task") or {}).get("subword_model"), "one learnt from the training split")}
    for key, (path, otherwise) in files.items():
        if path is not None and (not isinstance(path, str) or not path.strip()):
            raise ConfigError(f"{key} must be the path of a file (null: {otherwise}), got {path!r}")
    resume = config.get("resume")
    if resume is not None and (not isinstance(resume, str) or not resume.strip()):
        raise ConfigError(f"resume must be auto (the newest checkpoint of this run) or the path of a run directory or "
                          f"checkpoint file (null: a fresh run), got {resume!r}")
    for section, keys in (("cost", ("gpu",)), ("nonfinite", ("max_in_a_row",)), ("distributed", ("timeout_minutes",))):
        _known(section, config.get(section) or {}, keys)
    paths = config.get("paths") or {}  # one's own keys are welcome (for one's own configs); a near miss of ours is not
    _known("paths", {key: 0 for key in paths if difflib.get_close_matches(key, PATHS, n=1, cutoff=0.75)}, PATHS)
    gpu = (config.get("cost") or {}).get("gpu", PAPER_GPU)
    try:
        sustained_tflops(gpu)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    nonfinite = config.get("nonfinite") or {}
    if not _whole(nonfinite.get("max_in_a_row", 1)) or nonfinite.get("max_in_a_row", 1) < 1:
        raise ConfigError(f"nonfinite.max_in_a_row must be at least 1, got {nonfinite['max_in_a_row']}")
    check_timeout((config.get("distributed") or {}).get("timeout_minutes"))
    callbacks = config.get("callbacks") or {}
    for name, entry in callbacks.items():
        if entry is not None and not (isinstance(entry, Mapping) and entry.get("_target_")):
            raise ConfigError(f"callbacks.{name} must be null or have a _target_ (see conf/callbacks/default.yaml), "
                              f"got {entry!r}")
        if entry is not None:
            _check_target_keys(f"callbacks.{name}", entry)
    for name, entry in (config.get("logger") or {}).items():  # logger.<name>: logger=[wandb,mlflow]
        if not isinstance(entry, Mapping) or not entry.get("_target_"):
            raise ConfigError(f"logger.{name} must have a _target_ (see conf/logger/; several: logger=[wandb,mlflow]), "
                              f"got {entry!r}")
        _check_target_keys(f"logger.{name}", entry)
    progress = callbacks.get("progress_log")
    every = progress.get("every_n_steps", 1) if isinstance(progress, Mapping) else 1
    if not _whole(every) or every < 1:
        raise ConfigError(f"callbacks.progress_log.every_n_steps must be a positive whole number of steps (a progress "
                          f"line every that many; callbacks.progress_log=null: none), got {every!r}")
    stopping = callbacks.get("early_stopping")
    if isinstance(stopping, Mapping):
        from aiayn.training.early_stopping import check_settings

        check_settings(dict(stopping))
        if stopping.get("patience") is not None and (config.get("trainer") or {}).get("limit_val_batches") == 0:
            raise ConfigError("callbacks.early_stopping.patience stops on validation's figures, which "
                              "trainer.limit_val_batches=0 turns off; give trainer.limit_val_batches>0 (null: every "
                              "batch) or callbacks.early_stopping.patience=null")
        if stopping.get("patience") is not None and stopping.get("metric", "score") == "score" and \
                validation.get("bleu_sentences") == 0:
            raise ConfigError("callbacks.early_stopping.metric=score: validation.bleu_sentences=0 scores no "
                              "sentence at validation; give validation.bleu_sentences>0 or "
                              "callbacks.early_stopping.metric=loss")
    preemption = callbacks.get("preemption")
    if isinstance(preemption, Mapping) and preemption.get("enabled", True):
        from aiayn.training.preemption import signal_numbers

        signals = preemption.get("signals")
        if signals is not None and not isinstance(signals, (list, tuple)):
            raise ConfigError(f"callbacks.preemption.signals must be a list of signal names, e.g. [SIGTERM] or "
                              f"[SIGTERM,SIGUSR1], got {signals!r}")

        signal_numbers(preemption.get("signals") or ())  # ConfigError naming a signal that is not one


def _check_graphs_accumulating(config: Mapping[str, Any]) -> None:
    """CUDA graphs of the step replay into the same output memory, and torch's CUDA graph trees
    take the first batch's gradients as the weights' .grad without a copy: a step of several
    accumulated batches sums gradients that the next batch's replay overwrites (wrong gradients,
    or torch's error of an overwritten output; pytorch/pytorch#169545). Refused on GPUs, where the
    graphs are replayed; a CPU's plan (its own accumulation) compiles without them."""
    plan = (config.get("plan") or {}).get("trainer") or {}
    accumulate, mode = plan.get("accumulate_grad_batches") or 1, config.get("compile_mode", "default")
    if config.get("compile") and mode in CUDA_GRAPH_MODES and plan.get("accelerator") == "gpu" and accumulate > 1:
        raise ConfigError(f"compile_mode={mode} replays CUDA graphs, which overwrite gradients accumulated over a step's "
                          f"{accumulate} batches: give a batch that holds the step's share of one GPU "
                          "(task.datamodule.max_tokens, or more GPUs), or compile_mode=default")


def _check_trainer(trainer: Mapping[str, Any]) -> None:
    """Keys against Lightning's Trainer; the counts Lightning would only refuse later. (The
    processes and devices this machine has: the plan, aiayn.config.hardware.)"""
    from lightning.pytorch import Trainer

    parameters = [name for name in inspect.signature(Trainer.__init__).parameters if name != "self"]
    # train.py passes these itself.
    _known("trainer", trainer, [p for p in parameters if p not in ("logger", "callbacks", "plugins")],
           what="Lightning Trainer argument")
    for key in ("accumulate_grad_batches", "num_nodes"):
        value = trainer.get(key)
        if value is not None and (not _whole(value) or value < 1):
            raise ConfigError(f"trainer.{key} must be a positive whole number, got {value!r}")
    logged = trainer.get("log_every_n_steps")  # Lightning's 0 logs no training figure at all, without a word
    if logged is not None and (not _whole(logged) or logged < 1):
        raise ConfigError(f"trainer.log_every_n_steps must be a whole number of steps, 1 or more (1: every step; "
                          f"null: train.py's, every step on a CPU and every 100 on GPUs), got {logged!r}")
    clip = trainer.get("gradient_clip_val")
    if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or clip < 0):
        raise ConfigError(f"trainer.gradient_clip_val must be a number, 0 or more (null: no clipping, as in the "
                          f"paper), got {clip!r}")
    check_validation_interval(trainer)
    check_lightning_values(trainer)  # what Lightning refuses only as a run builds its Trainer


def _known(section: str, values: Mapping[str, Any], settings: Iterable[str], what: str = "setting") -> None:
    """Raise ConfigError naming the first key of ``values`` that is not one of ``settings``,
    with the nearest known ones."""
    settings = list(settings)
    unknown = sorted(set(values) - set(settings))
    if not unknown:
        return
    key = unknown[0]
    name = f"{section}.{key}" if section else key
    close = difflib.get_close_matches(key, settings, n=3, cutoff=0.75) or [
        setting for setting in settings if setting.startswith(key) or key.startswith(setting)][:3]
    head, of, rest = what.partition(" of ")  # the plural of "argument of X" is "arguments of X"
    hint = f"did you mean {' or '.join(close)}?" if close else f"the {head}s{of}{rest} are {', '.join(sorted(settings))}"
    article = "an" if what[0] in "aeiou" else "a"
    where = f" in {section}" if section and what == "setting" else ""
    raise ConfigError(f"{name} is not {article} {what}{where}; {hint}")


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
