"""The checkpoint settings (conf/checkpoint/): §6.1's averaging window, which steps a run saves
for the average it is scored with; how many checkpoints a run keeps; the plan's line about them.

"For the base models, we used a single model obtained by averaging the last 5 checkpoints, which
were written at 10-minute intervals. For the big models, we averaged the last 20 checkpoints."
Ten minutes were a count of steps on the paper's hardware (§5.2: a base step took ~0.4 s on its 8
P100s, a big step 1.0 s): 1,500 base steps, 600 big ones. Counted in minutes the window would change
with the hardware (on an H100 node ten minutes span several times as many steps, and a fast run
of big's 300K steps would average 20 checkpoints spread over most of its training), so it is
counted in steps here: ``checkpoint.average_last`` checkpoints, ``checkpoint.average_every_n_steps``
apart, the last at the last step (``optim.train_steps``), as tensor2tensor's last checkpoint was
written when training ended. Inside the window only its steps are saved, so that the run's newest
``average_last`` checkpoints are the window (``average_last=k`` of evaluate.py, export.py and
average.py averages the newest k); before it, the step checkpoints of
``checkpoint.every_n_train_steps``. A run shorter than its window has none: its step checkpoints
are all it saves.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from itertools import islice
from typing import Any


def window_steps(train_steps: int, average_last: int | None, every: int | None) -> range | None:
    """The steps of the window, oldest first (the last is ``train_steps``); None where there is
    none: no ``average_last`` or ``every``, or a run shorter than the window."""
    if not average_last or not every or train_steps < average_last * every:
        return None
    return range(train_steps - (average_last - 1) * every, train_steps + 1, every)


def kept(checkpoint: Mapping[str, Any]) -> int:
    """How many step checkpoints a run keeps: ``checkpoint.save_top_k`` (-1: all), and never fewer
    than the window's ``average_last``."""
    keep = checkpoint["save_top_k"]
    return keep if keep == -1 else max(keep, checkpoint.get("average_last") or 0)


def saved_before(step: int, every: int | None, window: range | None) -> Iterator[int]:
    """The steps before ``step`` that a run saves, newest first: its ``window``'s (of
    :func:`window_steps`), and before the window every ``every``-th (none without ``every``). The
    last step, which a run also saves, ends the window; a run without one never trains past it."""
    below = step
    if window is not None:
        yield from (saved for saved in reversed(window) if saved < step)
        below = min(step, window.start)
    if every and every > 0:
        yield from range((below - 1) // every * every, 0, -every)


def kept_before(step: int, keep: int, every: int | None, window: range | None) -> set[int]:
    """The steps before ``step`` whose checkpoints a run that has just saved ``step`` keeps: the
    newest ``keep - 1`` of :func:`saved_before` (``keep`` counts ``step``'s own; -1: all of them).
    What an uninterrupted run keeps, whatever earlier attempts of it saved."""
    older = saved_before(step, every, window)
    return set(older if keep == -1 else islice(older, max(keep - 1, 0)))


def describe(checkpoint: Mapping[str, Any], train_steps: int) -> str:
    """The plan's line about the run's checkpoints, e.g. ``checkpoints: every 1,000 steps, the
    newest 20 kept; §6.1's last 20, every 600 steps from step 288,600, to average``."""
    keep = kept(checkpoint)
    line = (f"  checkpoints: every {checkpoint['every_n_train_steps']:,} steps, "
            + ("all kept" if keep == -1 else f"the newest {keep:,} kept"))
    count, every = checkpoint.get("average_last"), checkpoint.get("average_every_n_steps")
    steps = window_steps(train_steps, count, every)
    if steps is not None:
        return f"{line}; §6.1's last {count}, every {every:,} steps from step {steps[0]:,}, to average"
    if count and every:
        return f"{line}; no §6.1 window: {count} checkpoints {every:,} steps apart need {count * every:,} steps"
    return line
