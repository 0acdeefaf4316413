"""Continuing a killed or preempted run from its newest checkpoint (checkpoints are written
atomically, :mod:`aiayn.checkpoints.io`, so a kill never leaves the newest one half-written).

``resume=auto`` looks in the run's own directory first, then in earlier directories of the same
job (``outputs/<run name>/<date>_<time>`` for a single run; for a sweep's job, the job folders of
earlier sweeps, ``multirun/*/*``, of a job with its overrides) whose checkpoints were trained with
the same settings; a run in a folder named otherwise (``hydra.run.dir=``) resumes only its own.
``resume=<file.ckpt or run dir>`` names one. What a resumed run may change and goes on with (its
scoring: :data:`UNCHECKED_KEYS`) is said in one line as it resumes.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiayn.checkpoints.io import checkpoints_dir, list_checkpoints, load_lazily
from aiayn.checkpoints.job_folders import job_dirs
from aiayn.checkpoints.layout import run_dir_of
from aiayn.config.identity import (
    LENGTH_KEYS,
    SPEED_KEYS,
    setting_differences,
    setting_value,
    step_as_set,
    trained_step,
)
from aiayn.data.position import stopped_within
from aiayn.errors import ConfigError

log = logging.getLogger(__name__)

# Settings a resumed run must share with the run that wrote the checkpoint (dotted paths into the
# resolved config): the seed, the task and its vocabulary, one process's batch (the plan's: which
# sentences make up each batch, however many processes share a step), the network, the loss and
# the optimiser (its step's tokens and gradient clipping among it). Everything else — where a corpus lies (Multi30k's data_root, WMT's raw_dir),
# logging, hardware, validation — may change between the two. A corpus of one's own
# (task=parallel_text) is whatever its folder holds: its task.datamodule.data_dir is the corpus.
# The model a run started from (init_from) too: a run started from another (or from none) is another
# run, whose resumed weights would stand in silently for the model asked for.
IDENTITY_KEYS = (
    "seed", "task.name", "task.vocab_size", "task.datamodule.src_lang", "task.datamodule.tgt_lang",
    "task.datamodule.data_dir", "plan.tokens_per_batch", "task.datamodule.max_length", "model", "width_divisor",
    "loss", "optim", "plan.tokens_per_step", "trainer.gradient_clip_val", "trainer.gradient_clip_algorithm",
    "init_from", "task.datamodule.seed",
)
# The step's tokens over all processes (processes × accumulation × batch; optim.tokens_per_step keeps
# it on any layout) and gradient clipping are the optimiser's recipe too. Compared where the
# checkpoint's config holds them (checkpoints from before they were compared may not).
_WHERE_SAVED = ("plan.tokens_per_step", "trainer.gradient_clip_val", "trainer.gradient_clip_algorithm", "init_from")
# The plan's differences name no setting of their own: a step's layout (processes × accumulated batches × one
# process's batch) comes from the processes, task.datamodule.max_tokens, the accumulation and optim.tokens_per_step
# together, so what to do about them is said once, by _layout_hint, for the layouts that train the checkpoint's steps.
_LAYOUT_KEYS = ("plan.tokens_per_batch", "plan.tokens_per_step")
# What a resumed run may change and goes on with, said in one line as it resumes: how it is scored (its
# decoding, the dev sentences BLEU reads, the dev and test splits and the share of them evaluated). A
# longer run (LENGTH_KEYS) is what resume=auto is given for, and goes unsaid.
UNCHECKED_KEYS = ("decoding", "validation", "trainer.limit_val_batches", "trainer.limit_test_batches",
                  "task.datamodule.val_split", "task.datamodule.test_split")
# How an epoch is cut into batches and where it ends: another value goes on at an epoch's start (said, as
# UNCHECKED_KEYS are), but within an epoch the rest of it would be other batches than the run's (before:
# gone on with without a word, some of the epoch's sentences trained twice and others never).
BATCHING_KEYS = ("task.datamodule.length_buckets", "trainer.limit_train_batches")
# Speed switches (config.identity.SPEED_KEYS) change how the same numbers are computed, not which: a
# run may resume with them switched either way (and from checkpoints written before they existed).


@dataclass
class Resume:
    checkpoint: Path  # the file to continue from
    run_dir: Path  # the run it belongs to: checkpoints and logs go on there
    logger_runs: dict[str, str]  # the loggers' runs it continues, by kind: {"wandb": id, "mlflow": id}
    step: int = 0  # the checkpoint's
    trained_config: dict[str, Any] = field(default_factory=dict)  # the resolved config of the run that wrote it

    @property
    def wandb_run_id(self) -> str | None:
        return self.logger_runs.get("wandb")


def resumes_nothing(spec: str | None) -> bool:
    """Whether ``resume=`` asks for a fresh run: null, none, false or empty."""
    return spec is None or str(spec).strip().lower() in ("none", "null", "false", "")


def find_resume(spec: str | None, output_dir: str | os.PathLike, config: dict[str, Any],
                multirun: bool, job: Sequence[str] | None = None, left_out: Sequence[str] = ()) -> Resume | None:
    """The checkpoint ``spec`` asks for: None/"none" → a fresh run; "auto" → the newest readable
    checkpoint of this run (None when there is none yet; a sweep's ``job`` and ``left_out``: see
    :func:`job_dirs`); else a checkpoint file or run dir."""
    if resumes_nothing(spec):
        return None
    output_dir = Path(output_dir)
    if str(spec) == "auto":
        for run_dir in job_dirs(output_dir, multirun, job, left_out):
            found = _newest(run_dir)
            if found is None:
                continue
            checkpoint, saved = found
            differences = config_differences(saved, config)
            if differences and run_dir != output_dir:
                log.info("not resuming from %s: trained with other settings (%s)", checkpoint, "; ".join(differences))
                continue
            past = _past_train_steps(saved, config)
            if multirun and run_dir != output_dir and past:  # a longer job, not this one
                log.info("not resuming from %s: at step %d, past this job's optim.train_steps=%d", checkpoint, *past)
                continue
            return _resume(checkpoint, run_dir, saved, config)
        log.info("resume=auto: no checkpoint of this run yet; starting from scratch")
        return None
    path = Path(spec)
    if path.is_dir():
        found = _newest(path)
        if found is None:
            raise ConfigError(f"resume={spec}: no readable checkpoint in {checkpoints_dir(path)}")
        checkpoint, saved = found
    elif path.is_file():
        checkpoint, saved = path, _load(path)
        if saved is None:
            raise ConfigError(f"resume={spec}: {checkpoint} is not a readable checkpoint")
        if "optimizer_states" not in saved:  # best.ckpt (callbacks.early_stopping): the weights alone
            raise ConfigError(f"resume={spec}: {checkpoint} holds a model's weights alone, not the optimizer's state a run "
                              f"goes on from; resume from a step checkpoint or the run folder ({run_dir_of(checkpoint)})")
        averaged = saved.get("averaged_steps") or []
        if len(averaged) > 1:  # average.py's: its Adam state is the newest member's, not the averaged weights'
            raise ConfigError(f"resume={spec}: {checkpoint} is the average of steps {averaged[0]}–{averaged[-1]} (§6.1), a "
                              "model to evaluate, not a state a run goes on from; resume from the run folder, or train "
                              f"on from these weights with a fresh optimizer: init_from={checkpoint}")
        _refuse_rewinding(spec, checkpoint, int(saved.get("global_step") or 0))
    else:
        raise ConfigError(f"resume={spec}: no such checkpoint file or run directory")
    return _resume(checkpoint, run_dir_of(checkpoint), saved, config)


def _past_train_steps(saved: dict[str, Any], config: dict[str, Any]) -> tuple[int, int] | None:
    """(the checkpoint's step, this run's optim.train_steps) where the checkpoint is past them."""
    step, steps = int(saved.get("global_step") or 0), (config.get("optim") or {}).get("train_steps")
    return (step, steps) if isinstance(steps, int) and step > steps else None


def _refuse_rewinding(spec: str, checkpoint: Path, step: int) -> None:
    """A checkpoint its run went on from: going on from it in the run's folder would write a second
    history over the first (its summary, its later steps' checkpoints, its logger runs)."""
    run_dir = run_dir_of(checkpoint)
    later = [(at, path) for at, path in list_checkpoints(run_dir) if at > step]
    if later:
        raise ConfigError(
            f"resume={spec}: its run went on past step {step} to step {later[-1][0]} ({later[-1][1].name}), and going "
            f"on from step {step} in its folder would write over that history; to train on from step {step} apart, "
            f"copy {run_dir} without its checkpoints after step {step} and resume=<the copy>, or start a new run "
            f"from its weights with init_from={checkpoint}; to go on from the newest: resume={run_dir}")


def _resume(checkpoint: Path, run_dir: Path, saved: dict[str, Any] | None, config: dict[str, Any]) -> Resume:
    differences = config_differences(saved, config)
    if differences:
        raise ConfigError(
            f"{checkpoint} was trained with other settings than this run: {'; '.join(differences)}; "
            "resume with the checkpoint's settings, or start a fresh run with resume=null in a folder of its own "
            "(another hydra.run.dir, where one is given)"
        )
    past = _past_train_steps(saved, config)
    if past:
        step, steps = past
        raise ConfigError(f"{checkpoint} is at step {step}, past this run's optim.train_steps={steps}: a run cannot "
                          f"train back; give optim.train_steps={step} or more to go on from it (at {step} it is tested "
                          "alone), or start a new run from its weights with init_from=")
    within, old = _within_an_epoch(saved), _run_config(saved)
    cut = setting_differences(old, config, BATCHING_KEYS) if within and old else []
    if cut:
        raise ConfigError(f"{checkpoint} stopped {within[1]} batches into epoch {within[0]}, and {'; '.join(cut)} "
                          "would make the rest of that epoch other batches than its run's; resume with the "
                          "checkpoint's value, or start a fresh run with resume=null in a folder of its own")
    log.info("resuming from %s (step %s)", checkpoint, saved.get("global_step"))
    changed = unchecked_differences(saved, config)
    if changed:
        log.warning("resuming %s with settings other than its run's that a resumed run may change, and this one "
                    "goes on with: %s", run_dir, "; ".join(changed))
    runs = dict(saved.get("logger_runs") or {})
    if saved.get("wandb_run_id"):  # checkpoints written before logger_runs
        runs.setdefault("wandb", saved["wandb_run_id"])
    return Resume(checkpoint, run_dir, runs, int(saved.get("global_step") or 0), _run_config(saved))


def remove_stale_temporaries(run_dir: str | os.PathLike) -> None:
    """Remove the temporary files of saves that were killed (``checkpoints/.*.tmp``): called by the
    run that holds ``run_dir`` (aiayn.cli.run_folder.hold), never while another may be saving."""
    for stale in checkpoints_dir(Path(run_dir)).glob(".*.tmp"):
        stale.unlink(missing_ok=True)


def newest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The newest step checkpoint of ``run_dir`` (a run dir or its checkpoints/) that loads;
    unreadable ones (a copy cut short, say) are skipped with a warning."""
    found = _newest(Path(run_dir))
    return found[0] if found else None


def _newest(run_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """:func:`newest_checkpoint` and its contents (memory-mapped), read once."""
    if not run_dir.is_dir():
        return None
    for _, path in reversed(list_checkpoints(run_dir)):
        saved = _load(path)
        if saved is not None and "optimizer_states" in saved:
            return path, saved
        log.warning("%s: not a readable training checkpoint; trying an older one", path)
    return None


def config_differences(saved: dict[str, Any] | None, config: dict[str, Any], advice: bool = True) -> list[str]:
    """``key: checkpoint's value → this run's`` for every identity setting that differs; with ``advice``,
    a difference of layout says what resumes the checkpoint (not for average.py, which resumes nothing)."""
    old = _run_config(saved)
    if not old:
        return []  # a checkpoint without its config (written by other code): nothing to compare
    keys = [key for key in IDENTITY_KEYS if key not in _WHERE_SAVED or _held(old, key)]
    old = step_as_set(old, setting_value(config, "optim.tokens_per_step"))  # the same step, written before it was set
    differences = setting_differences(old, config, keys, SPEED_KEYS + LENGTH_KEYS)
    layout = [index for index, difference in enumerate(differences) if difference.split(":", 1)[0] in _LAYOUT_KEYS]
    hint = _layout_hint(old, config) if layout and advice else None
    if hint:
        differences[layout[-1]] += f" ({hint})"
    return differences


def unchecked_differences(saved: dict[str, Any] | None, config: dict[str, Any]) -> list[str]:
    """``key: checkpoint's value → this run's`` for each setting of :data:`UNCHECKED_KEYS` (and of
    :data:`BATCHING_KEYS`, at an epoch's start) that differs: what a resumed run may change (its
    scoring) and goes on with, said as it resumes."""
    old = _run_config(saved)
    keys = [key for key in (*UNCHECKED_KEYS, *BATCHING_KEYS) if setting_value(old, key.split(".")[0]) is not None]
    return setting_differences(old, config, keys, SPEED_KEYS) if old else []


def _run_config(saved: dict[str, Any] | None) -> dict[str, Any]:
    return ((saved or {}).get("hyper_parameters") or {}).get("run_config") or {}


def _within_an_epoch(saved: dict[str, Any]) -> tuple[int, int] | None:
    """(epoch, batches of it trained) where the checkpoint stopped within an epoch, from its data
    module's state (aiayn.data.position.stopped_within); None else."""
    return next((found for value in saved.values() if (found := stopped_within(value))), None)


def _layout_hint(old: dict[str, Any], config: dict[str, Any]) -> str | None:
    """What trains the checkpoint's steps, ``n`` batches of ``B`` tokens each: ``p`` processes × ``n / p``
    accumulated batches for each ``p`` that divides ``n``, with task.datamodule.max_tokens=``B`` (and the
    accumulation given where optim.tokens_per_step does not derive it); the exact overrides for the most
    processes of those that this run's count allows (before: "give task.datamodule.max_tokens=25000", which
    8 processes refused again, each process's batch being its share of the step)."""
    from aiayn.config.plan import count, step_size  # only where a resume is refused

    plan, now = old.get("plan") or {}, config.get("plan") or {}
    batch, step = plan.get("tokens_per_batch"), trained_step(old)  # (a plan from before the step was recorded too)
    if not isinstance(batch, int) or not isinstance(step, int) or batch < 1 or step < batch or step % batch:
        return None  # a checkpoint whose plan says too little to tell
    batches, processes = step // batch, int(now.get("processes") or 1)
    counts = [number for number in range(1, batches + 1) if batches % number == 0]
    chosen = max(number for number in counts if number <= processes)
    # A recipe that set no step then (one batch a process: the small recipe before 2026-12-02) and sets one now.
    unset = setting_value(old, "optim.tokens_per_step") is None and setting_value(config, "optim.tokens_per_step")
    overrides = [*_processes_overrides(chosen, processes, int((now.get("trainer") or {}).get("num_nodes") or 1)),
                 *(["optim.tokens_per_step=null"] if unset else []), f"task.datamodule.max_tokens={batch}"]
    accumulate = batches // chosen
    try:
        derived = step_size(chosen, batch, setting_value(old, "task.datamodule.max_length"),
                            setting_value(old, "optim.tokens_per_step"))
    except ConfigError:
        derived = None
    if setting_value(config, "trainer.accumulate_grad_batches") is not None or derived is None or (
            derived.tokens_per_batch, derived.tokens_per_step) != (batch, step):
        overrides.append(f"trainer.accumulate_grad_batches={accumulate}")
    layout = f"the checkpoint's step is {batches} {'batch' if batches == 1 else 'batches'} of {batch} tokens"
    if chosen == processes:
        return f"{layout}: to train them on this run's {count(processes, 'process')}, give {' '.join(overrides)}"
    trained_by = " or ".join(filter(None, (", ".join(map(str, counts[:-1])), str(counts[-1]))))
    return (f"{layout}, which {trained_by} {'process trains' if batches == 1 else 'processes train'}, not this run's "
            f"{processes}: to go on from it, give {' '.join(overrides)}")


def _processes_overrides(processes: int, now: int, nodes: int) -> list[str]:
    """The overrides that make this run (``now`` processes on ``nodes`` nodes) ``processes`` processes."""
    if processes == now:
        return []
    if processes % nodes == 0:
        return [f"trainer.devices={processes // nodes}"]
    return [f"trainer.devices={processes}", "trainer.num_nodes=1"]


def _held(config: dict[str, Any], key: str) -> bool:
    """Whether ``config`` holds the dotted ``key`` (its value may be null)."""
    *parents, name = key.split(".")
    for parent in parents:
        config = config.get(parent) if isinstance(config, dict) else None
    return isinstance(config, dict) and name in config


def _load(path: Path) -> dict[str, Any] | None:
    saved = load_lazily(path)  # memory-mapped: only the parts read are loaded
    return saved if isinstance(saved, dict) else None
