"""The step ``ddp_spawn``'s ranks trained to, known in the process that launched them.

Under ``ddp_spawn`` (Lightning's multiprocessing launcher, whatever its start method) ``fit`` runs
in processes of their own. The launcher brings back to the launching process the last weights, the
trainer's state and ``trainer.callback_metrics``, not the loops' counters: there the trainer's
``global_step`` stayed 0 after training. The test's ranks start from that process's trainer, so
the test's rows (the module logs ``step``, the trainer's, aiayn.training.logged_step) fell at step
0 of metrics.csv and W&B instead of the run's last step, as one process or ``ddp`` logs them; and
train's rule for a run that fails before its first step (its new files go: aiayn.cli.train_run) read
"step 0" of a run that had trained.

:class:`BringsTheStepBack` puts the fit loop's progress counters (steps, batches, epochs) among the
callback metrics as ``fit`` ends in a rank (``teardown``, its last hook), and
:func:`take_the_ranks_step` loads them into the launching process's loops once ``fit`` has
returned: its ``global_step`` is then the ranks', as after a fit in that process. A process that
trained itself (one process, ``ddp``'s ranks) is left as it is.
"""

from __future__ import annotations

import operator
import os
from typing import Any

import lightning as L

from aiayn.training.logged_step import align

# The callback metric that carries the ranks' progress to the launching process, taken out there.
PROGRESS = "aiayn/fit_progress"


class BringsTheStepBack(L.Callback):
    """In a rank started in a process of its own: the fit loop's progress, as ``fit`` ends, where
    Lightning's launcher sends it to the launching process (:func:`take_the_ranks_step`)."""

    def __init__(self) -> None:
        self.launching_process = os.getpid()  # the ranks get a copy of this callback, pickled

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit" and os.getpid() != self.launching_process:
            trainer.callback_metrics[PROGRESS] = progress(trainer)


def progress(trainer: L.Trainer) -> dict[str, Any]:
    """The fit loop's progress counters by their attribute paths (``epoch_progress``,
    ``epoch_loop.automatic_optimization.optim_progress``, ...), as its checkpoint holds them; not
    the loops' own state (where the data loaders are)."""
    return {key: value for key, value in trainer.fit_loop.state_dict().items() if not key.endswith("state_dict")}


def take_the_ranks_step(trainer: L.Trainer) -> None:
    """After ``fit``: where ranks of their own trained, the launching process's loop counters are
    theirs (its ``global_step`` the step they reached), and the loggers' step with them."""
    counters = trainer.callback_metrics.pop(PROGRESS, None)
    if counters is None:  # this process trained, or the ranks sent nothing
        return
    for path, state in counters.items():
        operator.attrgetter(path)(trainer.fit_loop).load_state_dict(state)
    align(trainer)
