"""Where training is in its epoch, in a form that holds on any number of processes: a checkpoint
records how many batches of the epoch's order (:class:`aiayn.data.batching.TokenBatchSampler`)
every rank together has trained on, with the layout that trained them; a run resumed on another
number of processes, whose step takes the same batches (``optim.tokens_per_step``), goes on with
the next one, and Lightning's own batch counters are brought to its layout.

Rank ``r`` of ``P`` trains batches ``r, r + P, ...`` of the order, so after ``n`` batches of its
own the ranks together have trained the first ``n × P``; step ``k`` of ``P`` processes × ``A``
accumulated batches trains batches ``k × P × A`` to ``(k + 1) × P × A − 1`` however ``P`` and ``A``
share them. A position of ``G`` batches is therefore ``G ÷ P`` of the new rank's own, exact when
``G`` is a whole number of the new layout's steps. Another step (another ``P × A``) cuts the epoch
into other batches (the sampler splits batches until their number is a multiple of the step's), so
a run resumed mid-epoch with one is refused; at an epoch's end it starts the next epoch whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiayn.errors import ConfigError


@dataclass(frozen=True)
class Position:
    """``epoch_batches`` batches of epoch ``epoch``'s order trained, by ``processes`` processes of
    ``accumulate`` batches a step; ``trained`` batches in all epochs (over every rank)."""

    epoch: int
    epoch_batches: int
    processes: int
    accumulate: int
    trained: int | None = None
    # Whether the epoch's order shuffles whole steps (aiayn.data.batching); False in checkpoints
    # written before it did, whose epoch goes on in the order it began.
    by_steps: bool = True


def layout(trainer: Any) -> tuple[int, int]:
    """(processes, batches a process accumulates a step) of ``trainer``'s run."""
    return int(trainer.world_size), int(getattr(trainer, "accumulate_grad_batches", 1) or 1)


def saved_position(trainer: Any, old_order_epoch: int | None = None) -> dict[str, Any]:
    """The position of ``trainer``'s run as a checkpoint keeps it, with the epoch's batch order:
    "batches" in ``old_order_epoch``, the epoch an older checkpoint's run goes on in the order it
    began (so that a checkpoint written in it resumes that order too), else "steps"."""
    processes, accumulate = layout(trainer)
    progress = trainer.fit_loop.epoch_loop.batch_progress
    epoch = trainer.fit_loop.epoch_progress.current.processed
    return {"epoch": epoch, "epoch_batches": progress.current.processed * processes,
            "trained": progress.total.processed * processes, "processes": processes, "accumulate": accumulate,
            "order": "batches" if epoch == old_order_epoch else "steps"}


def read_position(state: dict[str, Any], trainer: Any) -> Position | None:
    """The position a checkpoint's data module state holds; None for none. Checkpoints written
    before it was kept in this form hold a rank's own count (``batches_done``): multiplied by the
    processes of the run that wrote it (its config's plan), or, where that is not recorded, by
    this run's (as they were read before)."""
    if not state:
        return None
    if "epoch_batches" in state:
        return Position(int(state["epoch"]), int(state["epoch_batches"]), int(state["processes"]),
                        int(state["accumulate"]), state.get("trained"), state.get("order") == "steps")
    processes, accumulate = _written_layout(trainer) or layout(trainer)
    return Position(int(state["epoch"]), int(state["batches_done"]) * processes, processes, accumulate,
                    by_steps=False)


def stopped_within(state: Any) -> tuple[int, int] | None:
    """(epoch, batches of it trained) where ``state``, a data module's state in a checkpoint, stopped
    within an epoch (over every rank; a rank's own count in older ones); None at an epoch's start or
    for what is no such state."""
    if not isinstance(state, dict) or not ("epoch_batches" in state or "batches_done" in state):
        return None
    batches = int(state.get("epoch_batches", state.get("batches_done")) or 0)
    return (int(state.get("epoch") or 0), batches) if batches else None


def rank_batches(position: Position, trainer: Any) -> int:
    """How many batches of its own share this run's every rank has trained of ``position``'s epoch;
    a ConfigError, naming the settings, where this run's layout differs and its step would take
    other batches there (in the same layout a rank's count is its own, as it always was)."""
    processes, accumulate = layout(trainer)
    if (processes, accumulate) == (position.processes, position.accumulate):
        return position.epoch_batches // processes
    step, saved_step = processes * accumulate, position.processes * position.accumulate
    if position.epoch_batches and (step != saved_step or position.epoch_batches % step):
        why = "which cuts the epoch into other batches" if step != saved_step else "and it stopped within a step"
        raise ConfigError(
            f"the checkpoint stopped {position.epoch_batches} batches into epoch {position.epoch}, trained by "
            f"{position.processes} process(es) × {position.accumulate} batch(es) a step; this run's step is "
            f"{processes} × {accumulate}, {why}: resume on {position.processes} process(es) × {position.accumulate} "
            "(hardware, trainer.devices, trainer.num_nodes, trainer.accumulate_grad_batches, optim.tokens_per_step), "
            "or from a checkpoint written at an epoch's end")
    return position.epoch_batches // processes


def align_progress(position: Position, trainer: Any) -> None:
    """Lightning's restored batch counters (a rank's own, which decide the epoch's end and when
    validation runs) as this run's layout counts the same steps: the epoch's from the position;
    the run's from ``trained``, or, for checkpoints that lack it, from the ratio of processes."""
    processes, _ = layout(trainer)
    if processes == position.processes:
        return
    progress = trainer.fit_loop.epoch_loop.batch_progress
    _shift(progress.current, position.epoch_batches // processes)
    trained = position.trained if position.trained is not None else progress.total.processed * position.processes
    _shift(progress.total, trained // processes)


def _shift(counts: Any, processed: int) -> None:
    """``counts`` (ready, started, processed, completed) moved together so ``processed`` is
    ``processed``: a checkpoint written in a step's end has one batch processed but not completed."""
    delta = processed - counts.processed
    counts.ready += delta
    counts.started += delta
    counts.processed += delta
    counts.completed += delta


def _written_layout(trainer: Any) -> tuple[int, int] | None:
    """(processes, accumulate) of the run that wrote the checkpoint being resumed, from its config's
    plan; None where it is not recorded. Read from the checkpoint Lightning has loaded to restore
    this run (the data module's state is a part of it), not from its file a second time."""
    saved = getattr(getattr(trainer, "_checkpoint_connector", None), "_loaded_checkpoint", None)
    try:
        plan = ((saved.get("hyper_parameters") or {}).get("run_config") or {}).get("plan")
        return int(plan["processes"]), int(plan["trainer"]["accumulate_grad_batches"])
    except (AttributeError, TypeError, KeyError, ValueError):
        return None
