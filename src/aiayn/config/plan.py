"""The plan of a training run, settled before anything is built: where it trains (:mod:`aiayn.config.hardware`),
how big a step is (:func:`step_size`), and how the run's settings become Lightning's (:func:`make_plan`), its
length and validation included (aiayn.config.trainer: ``trainer.max_steps`` follows ``optim.train_steps``).
conf/train.yaml holds it as ``plan: ${aiayn.plan:}``, a node resolved from the rest of the config and the
machine, so that ``--cfg job``, the W&B config, the checkpoint's config and the Trainer all see the same
values; train.py (aiayn.cli.train_run) prints it (:func:`describe`) before the first step.

The paper's step (§5.1): "Each training batch contained a set of sentence pairs containing approximately 25000
source tokens and 25000 target tokens", on 8 P100 GPUs. ``optim.tokens_per_step`` states a recipe's step in
padded tokens per side over all processes; the plan derives the gradient accumulation and one process's batch
from it for the processes in use, so that 1, 2, 4 or 8 GPUs train the same recipe and only the wall time
changes: for one batch size, the same batches in every step (the sampler cuts an epoch into a multiple of
processes × accumulation batches); for any, steps of about one length (a step's batches are neighbours).

How big one process's batch may be is ``task.datamodule.max_tokens``: a number, or ``auto`` (the WMT tasks'
default), which :func:`batch_limit` settles from the machine: on a GPU the largest batch that fits its memory
(aiayn.config.memory's estimate for the model, the vocabulary and the precision), up to the process's share of
the step — so that one GPU of 40 GB or more trains base and big in one batch of the whole 25,000-token step,
where eight accumulated batches of 3,125 left the GPU waiting on the host (docs/performance.md) — and on a CPU
at most :data:`PLAIN_BATCH_TOKENS`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiayn.config.checkpointing import describe as describe_checkpoints
from aiayn.config.hardware import AUTO, Machine, Placement, emulated_bf16, place
from aiayn.config.measured import THROUGHPUT_RECORDS, measured_throughput
from aiayn.config.memory import (
    MemoryEstimate,
    batch_over_memory,
    config_memory,
    gib,
    parameters,
    tokens_that_fit,
    usable,
)
from aiayn.config.schemas import PAPER_NETWORK, build_network, network_arguments
from aiayn.config.trainer import (
    check_length,
    rank_limits,
    smoke_test,
    stopped_sooner,
    validation,
    warmup_outlasts_the_run,
)
from aiayn.errors import ConfigError

PAPER_TOKENS_PER_STEP = 25_000  # §5.1: "approximately 25000 source tokens and 25000 target tokens"
# The trainer.* settings the plan reads; train.py gives Lightning the plan's values of the first seven and rank_limits'.
PLANNED_TRAINER_SETTINGS = ("accelerator", "devices", "num_nodes", "strategy", "precision", "accumulate_grad_batches",
                            "val_check_interval", "max_steps", "max_epochs", "limit_val_batches", "min_steps",
                            "min_epochs", "check_val_every_n_epoch", "max_time", "fast_dev_run", "limit_train_batches",
                            "overfit_batches", "limit_test_batches", "log_every_n_steps")
# trainer.log_every_n_steps null: every step on a CPU, every this many on GPUs, where each read-back of the logged values
# (the loss, the gradient norm, the non-finite counts) waits for the GPU and keeps the host from queueing the next step
# (as fairseq's --log-interval 100; the progress lines' default interval too). A number given wins.
GPU_LOG_EVERY_N_STEPS = 100
# max_tokens=auto where no GPU's memory sizes the batch (the WMT tasks' batch before auto): on a CPU, batches of at
# most this many tokens — a bigger batch is no faster there (a step is matrix products near the CPU's peak either way,
# docs/performance.md) and takes more of the machine's memory — and, where the recipe sets no step to split
# (optim.tokens_per_step null, or an explicit trainer.accumulate_grad_batches), batches of this many on any hardware,
# so that the hardware never changes the recipe.
PLAIN_BATCH_TOKENS = 3400
# max_tokens=auto for a GPU whose memory is not known here (planned from a login node): an "80GB" H100's, as torch
# reads it (79.6 GiB).
ASSUMED_GPU_MEMORY = 85_520_809_984


@dataclass(frozen=True)
class StepSize:
    """One optimizer step: ``processes`` × ``accumulate`` batches of at most ``tokens_per_batch``
    padded tokens per side each, ``tokens_per_step`` in all."""

    tokens_per_batch: int
    accumulate: int
    tokens_per_step: int
    derived: bool  # the accumulation and the batch come from optim.tokens_per_step


def step_size(processes: int, max_tokens: Any, max_length: Any = None, tokens_per_step: Any = None,
              accumulate: Any = None) -> StepSize:
    """The step of ``processes`` training processes. ``max_tokens`` (task.datamodule.max_tokens)
    is the most one process's batch may hold; ``accumulate`` (trainer.accumulate_grad_batches),
    when given, wins; else ``tokens_per_step`` (optim.tokens_per_step), when given, sets the
    accumulation — the fewest batches per process that keep each within ``max_tokens`` — and
    divides the step evenly between the batches; else a step is one batch of ``max_tokens`` a
    process."""
    max_tokens = _positive(max_tokens, "task.datamodule.max_tokens")
    if tokens_per_step is not None:  # checked where an explicit accumulation leaves it unused too (before: passed)
        tokens_per_step = _positive(tokens_per_step, "optim.tokens_per_step")
    if accumulate is not None:
        accumulate = _positive(accumulate, "trainer.accumulate_grad_batches")
        return StepSize(max_tokens, accumulate, processes * accumulate * max_tokens, derived=False)
    if tokens_per_step is None:
        return StepSize(max_tokens, 1, processes * max_tokens, derived=False)
    accumulate = math.ceil(tokens_per_step / (processes * max_tokens))
    batch = tokens_per_step // (processes * accumulate)
    if max_length is not None and batch < max_length + 2:
        fewer = "train on fewer processes, " if processes > 1 else ""
        raise ConfigError(
            f"optim.tokens_per_step={tokens_per_step} shared by {count(processes, 'training process')} gives batches "
            f"of {batch} tokens, too few for one pair of task.datamodule.max_length={max_length} subwords plus "
            f"BOS/EOS; {fewer}raise optim.tokens_per_step or lower task.datamodule.max_length")
    return StepSize(batch, accumulate, processes * accumulate * batch, derived=True)


@dataclass(frozen=True)
class BatchLimit:
    """The most one process's batch may hold (``tokens``), and, for ``max_tokens=auto`` on a GPU,
    the memory estimate and the GPU's memory it was settled from."""

    tokens: int
    setting: Any  # task.datamodule.max_tokens as given
    on_gpu: bool = False
    estimate: MemoryEstimate | None = None
    device_bytes: int | None = None
    assumed: bool = False  # the GPU's memory is not known here: ASSUMED_GPU_MEMORY
    whole_share: bool = False  # the process's whole share of the step fits one batch
    plain_because: str | None = None  # why auto gives PLAIN_BATCH_TOKENS on any hardware; None: no GPU to size it
    accelerator: str = "cpu"  # where a batch that no GPU's memory sized trains (cpu, mps, ...)

    def describe(self, batch: int) -> str | None:
        """Why batches of ``batch`` tokens under ``max_tokens=auto``: what fits where (None for a number)."""
        if self.setting != AUTO:
            return None
        if self.plain_because:
            return f"task.datamodule.max_tokens=auto: at most {PLAIN_BATCH_TOKENS:,} tokens a batch, as {self.plain_because}"
        if not self.on_gpu:  # (before: "without a GPU to size it", said on a GPU node too under hardware=cpu)
            on = "the CPU" if self.accelerator == "cpu" else f"the {self.accelerator} device"
            cpu = f"on {on}, batches of at most {PLAIN_BATCH_TOKENS:,} tokens"
            return "task.datamodule.max_tokens=auto: " + (
                f"the process's share of the step fits one batch ({cpu})" if self.whole_share else cpu)
        assumed = " (assumed: its memory is not known here)" if self.assumed else ""
        fits = "the process's share of the step fits one batch" if self.whole_share else \
            f"at most {self.tokens:,} tokens fit one batch"
        return (f"task.datamodule.max_tokens=auto: {fits}, ~{gib(self.estimate.at(batch), 1)} of the GPU's "
                f"{gib(self.device_bytes)}{assumed}")


def batch_limit(config: Mapping[str, Any], placement: Placement, machine: Machine) -> BatchLimit:
    """The most one process's batch may hold: ``task.datamodule.max_tokens`` as given, or for
    ``auto`` the process's share of ``optim.tokens_per_step``, on a GPU no more than fits its
    memory (aiayn.config.memory) and on a CPU no more than :data:`PLAIN_BATCH_TOKENS` (which is also
    the batch where the recipe sets no step to split)."""
    data = config["task"]["datamodule"]
    setting = data.get("max_tokens")
    if setting != AUTO:
        if isinstance(setting, bool) or not isinstance(setting, int) or setting < 1:
            raise ConfigError(f"task.datamodule.max_tokens must be a positive whole number or auto (the most the "
                              f"machine holds of the step), got {setting!r}")
        check_batch_holds_a_pair(setting, data.get("max_length"))  # (before: blamed optim.tokens_per_step)
        return BatchLimit(setting, setting)
    tokens_per_step, accumulate = config["optim"].get("tokens_per_step"), config["trainer"].get("accumulate_grad_batches")
    if tokens_per_step is None or accumulate is not None:  # on a GPU too (before: said "without a GPU to size it")
        why = "the recipe sets no optim.tokens_per_step to split" if tokens_per_step is None else (
            f"trainer.accumulate_grad_batches={accumulate} is given (auto sizes a batch to the step only where the "
            "accumulation is derived from optim.tokens_per_step)")
        return BatchLimit(PLAIN_BATCH_TOKENS, setting, plain_because=why)
    share = math.ceil(_positive(tokens_per_step, "optim.tokens_per_step") / placement.processes)
    if placement.accelerator != "gpu":
        return BatchLimit(min(share, PLAIN_BATCH_TOKENS), setting, whole_share=share <= PLAIN_BATCH_TOKENS,
                          accelerator=str(placement.accelerator))
    estimate = config_memory(config, placement.precision, placement.processes)
    device = machine.gpu_memory or ASSUMED_GPU_MEMORY
    fits = tokens_that_fit(estimate, device)
    longest = data.get("max_length")
    if fits < (longest + 2 if isinstance(longest, int) else 1):
        raise ConfigError(
            f"task.datamodule.max_tokens=auto: the model's weights and optimizer state (~{gib(estimate.fixed, 1)}) "
            f"leave room for {fits:,} tokens a batch on a GPU of {gib(device)} ({gib(usable(device), 1)} "
            "usable), too few for one training pair; train on a GPU with more memory or a smaller model")
    return BatchLimit(min(share, fits), setting, on_gpu=True, estimate=estimate, device_bytes=device,
                      assumed=machine.gpu_memory is None, whole_share=fits >= share)


def make_plan(config: Mapping[str, Any], machine: Machine, multirun: bool = False) -> dict[str, Any]:
    """The plan of a (resolved or unresolved) training config on ``machine``: ``trainer`` holds
    what Lightning's Trainer is given for the hardware and the step (validation counted in
    batches, as Lightning counts it); the rest says what that makes."""
    trainer, optim = config["trainer"], config["optim"]
    check_length(trainer, optim.get("train_steps"))  # the steps the plan says are the steps trained
    data = config["task"]["datamodule"]
    placement = place(machine, trainer.get("accelerator"), trainer.get("devices"), trainer.get("strategy"),
                      trainer.get("precision"), trainer.get("num_nodes", 1), multirun=multirun)
    limit = batch_limit(config, placement, machine)
    step = step_size(placement.processes, limit.tokens, data.get("max_length"),
                     optim.get("tokens_per_step"), trainer.get("accumulate_grad_batches"))
    limits = rank_limits(trainer, placement.processes, step.accumulate)  # each process's share of the batches
    every = interval = trainer.get("val_check_interval")
    steps = isinstance(interval, int) and not isinstance(interval, bool)
    if steps:
        interval *= step.accumulate  # steps → the batches Lightning counts
    devices = placement.devices
    warnings = [line for line in (emulated_bf16(placement, machine), warmup_outlasts_the_run(optim, trainer),
                                  _over_memory(config, placement, machine, limit, step)) if line]
    return {
        "trainer": {
            "accelerator": placement.accelerator, "devices": list(devices) if isinstance(devices, list) else devices,
            "num_nodes": placement.num_nodes, "strategy": placement.strategy, "precision": placement.precision,
            "accumulate_grad_batches": step.accumulate, "val_check_interval": interval, **limits,
            "log_every_n_steps": logged if (logged := trainer.get("log_every_n_steps")) is not None else (
                1 if placement.accelerator == "cpu" else GPU_LOG_EVERY_N_STEPS),
        },
        "processes": placement.processes,
        "device": machine.gpu_name if placement.accelerator == "gpu" else machine.cpu_name,
        "tokens_per_batch": step.tokens_per_batch,
        "tokens_per_step": step.tokens_per_step,
        "accumulation_derived": step.derived,
        "batch_limit": limit.describe(step.tokens_per_batch),
        # trainer.val_check_interval as set, in optimizer steps (the trainer's above counts batches); null: every
        # epoch, or no validation (trainer.limit_val_batches=0), as `validation` says
        "validate_every_steps": every if steps and trainer.get("limit_val_batches") != 0 else None,
        "validation": validation(trainer, every if steps else None, optim.get("train_steps")),
        **({"warnings": warnings} if warnings else {}),  # each a line of the plan printed, none refused
    }


def _over_memory(config: Mapping[str, Any], placement: Placement, machine: Machine, limit: BatchLimit,
                 step: StepSize) -> str | None:
    """The warning of a batch that the memory estimate says this GPU cannot hold, where the batch was not sized to it
    (a number given, or auto's plain batch); nothing where the GPU's memory is not known here."""
    if placement.accelerator != "gpu" or machine.gpu_memory is None or limit.on_gpu:
        return None
    derived = config["optim"].get("tokens_per_step") is not None and config["trainer"].get("accumulate_grad_batches") is None
    return batch_over_memory(config_memory(config, placement.precision, placement.processes), step.tokens_per_batch,
                             machine.gpu_memory, limit.setting, auto_fits=derived and limit.setting != AUTO)


def describe(plan: Mapping[str, Any], config: Mapping[str, Any], model: str | None = None,
             records: Path = THROUGHPUT_RECORDS) -> str:
    """The plan as a short block for the log: devices, precision, strategy, nodes; the step against
    the paper's; steps and warmup; and, where ``records`` holds a measured throughput of ``model``
    (the model group's option) on this device, the projected wall time."""
    trainer, optim = plan["trainer"], config["optim"]
    processes, nodes = plan["processes"], trainer["num_nodes"]
    accelerator = trainer["accelerator"]  # (before: mps, tpu, ... said "CPU process")
    on = "GPU" if accelerator == "gpu" else "CPU process" if accelerator == "cpu" else f"{accelerator} device"
    where = f"{count(processes, on)}" + (f" on {nodes} nodes" if nodes > 1 else "")
    device = f" ({plan['device']})" if plan.get("device") else ""
    strategy = "" if trainer["strategy"] == "auto" else f", {trainer['strategy']}"
    accumulate = trainer["accumulate_grad_batches"]
    if plan["accumulation_derived"]:
        source = f"accumulation derived from optim.tokens_per_step={optim['tokens_per_step']:,}"
    elif config["trainer"].get("accumulate_grad_batches") is not None:  # the recipe's step set aside: said so
        source = f"trainer.accumulate_grad_batches={accumulate}" + (
            f" given, not the recipe's optim.tokens_per_step={optim['tokens_per_step']:,}" if optim.get("tokens_per_step") else "")
    else:
        source = "the recipe sets no optim.tokens_per_step: one batch of task.datamodule.max_tokens a process"
    batches = f"{accumulate} accumulated batches" if accumulate > 1 else "1 batch"
    lines = [
        f"plan: {where}{device}, {trainer['precision']}{strategy}",
        f"  shown for {plan['shown_for']}" if plan.get("shown_for") else None,  # --cfg job on a login node
        (f"  step: {count(processes, 'process')} × {batches} of {plan['tokens_per_batch']:,} tokens = "
         f"{plan['tokens_per_step']:,} tokens a side ({source}; the paper's: ~{PAPER_TOKENS_PER_STEP:,}, §5.1)"),
        f"  batch: {plan['batch_limit']}" if plan.get("batch_limit") else None,
        f"  {count(optim['train_steps'], 'step')}{stopped_sooner(config['trainer'])}, warmup {optim['warmup_steps']:,}" + (
            f", validation {plan['validation']}" if plan.get("validation") else ""),
        # Lightning's smoke test saves none (its steps line says so).
        describe_checkpoints(config["checkpoint"], optim["train_steps"])
        if config.get("checkpoint") and not smoke_test(config["trainer"]) else None,
        _describe_model(config, model),
        # A fine-tuning run says what it starts from (before: only a log line after the plan, none in --cfg job).
        (f"  weights: at step 0, the model of {config['init_from']} (init_from), with Adam and the schedule started afresh there"
         if config.get("init_from") else None),
    ]
    switches = {"compile_mode": config.get("compile_mode", "default"),
                "length_buckets": bool(config["task"].get("datamodule", {}).get("length_buckets")),
                "fused_adam": bool(optim.get("fused", True)), "fused_loss": bool((config.get("loss") or {}).get("fused"))}
    measured = measured_throughput(records, model, trainer["accelerator"], plan.get("device"), trainer["precision"],
                                   config["task"]["vocab_size"], bool(config.get("compile")), plan["tokens_per_batch"],
                                   **switches)
    if measured is not None:
        # A step is `accumulate` batches of the size measured, on every device at once.
        batch_seconds = measured["step_seconds"]["mean"]
        seconds = optim["train_steps"] * accumulate * batch_seconds
        scaling = ", if the devices scale linearly" if processes > 1 else ""
        # The steps alone: the validations add their time (each validation's progress line says how much).
        lines.append(f"  projected: {_duration(seconds)} of training steps at {1000 * batch_seconds:,.0f} ms a batch, "
                     f"{measured['tgt_tokens_per_s']:,.0f} target tokens/s a device (measured "
                     f"{measured['date'][:10]}, {records.name}){scaling}; validations add to it")
    lines += [f"  warning: {line}" for line in plan.get("warnings") or ()]  # last, where they are seen
    return "\n".join(line for line in lines if line is not None)


def _describe_model(config: Mapping[str, Any], name: str | None) -> str | None:
    """The network as trained (widths divided by ``width_divisor``) and its parameters, counted from
    the config (aiayn.config.memory.parameters): what Lightning's model table said, less its FLOPs
    column, which reads 0 for a model given no example input."""
    try:
        network = network_arguments(config["model"], config.get("width_divisor", 1) or 1)
    except ValueError:
        return None  # refused where the plan is made
    target = config["model"].get("_target_", PAPER_NETWORK)
    vocab_size = int(config["task"]["vocab_size"])
    if target == PAPER_NETWORK:
        count = parameters(network, vocab_size)
    else:  # a class of one's own (docs/extending.md): its parameters counted on the meta device, none allocated
        count = sum(p.numel() for p in build_network(target, vocab_size, network, on_meta=True).parameters())
        name = f"{name + ', ' if name else ''}{target}"
    size = f"{count / 1e6:.1f}M" if count >= 1e6 else f"{count / 1e3:.1f}K" if count >= 1e3 else str(count)
    shape = ", ".join(f"{key}={network[key]}" for key in ("n_layers", "d_model", "d_ff", "n_heads", "d_k", "d_v"))
    return f"  model: {name + ' ' if name else ''}({shape}), {size} parameters"


def check_batch_holds_a_pair(max_tokens: Any, max_length: Any) -> None:
    """A ConfigError for a batch of ``max_tokens`` that cannot hold one pair of ``max_length`` subwords
    plus BOS/EOS (either not a whole number: nothing to say here)."""
    whole = [isinstance(value, int) and not isinstance(value, bool) for value in (max_tokens, max_length)]
    if all(whole) and max_tokens < max_length + 2:
        raise ConfigError(f"task.datamodule.max_tokens={max_tokens} cannot hold one pair of max_length={max_length} "
                          f"subwords plus BOS/EOS; raise max_tokens to at least {max_length + 2} or lower max_length")


def _positive(value: Any, setting: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{setting} must be a positive whole number, got {value!r}")
    return value


def count(number: int, thing: str) -> str:
    return f"{number:,} {thing}{'' if number == 1 else 'es' if thing.endswith('s') else 's'}"


def _duration(seconds: float) -> str:
    hours = seconds / 3600
    return f"{seconds / 60:.0f} min" if hours < 1 else f"{hours:.1f} h" if hours < 48 else f"{hours / 24:.1f} days"
