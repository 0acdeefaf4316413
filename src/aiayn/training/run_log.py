"""One log for a training job, however many processes it has: what train.py prints on stdout and
writes to the run folder's ``train.log`` (Hydra's job logging: a handler for each on the root
logger).

* **Rank zero speaks for the job.** The project's records below WARNING (loggers ``aiayn.*`` and
  ``train``) from a process whose rank is above 0 are dropped, so that 8 processes print one plan,
  one validation line and one summary, not 8. Warnings and errors of every rank stay: they may be
  that rank's own. The rank is read as each record is emitted (Lightning's ``rank_zero_only.rank``,
  which the strategy sets to the process's global rank, and the launchers' rank variables), so
  processes launched by ``ddp``, srun or torchrun, processes started by ``ddp_spawn`` and the
  process that starts a later node's ranks are treated alike. Lightning's own lines are left
  as they are (its ``Initializing distributed: GLOBAL_RANK …`` is each rank's).
* **Lightning's lines are in it too** (the seed, the devices used, each rank's ``Initializing
  distributed``, the checkpoints it restores): Lightning gives its loggers a console handler of
  their own and cuts them off from the root logger when it is imported before logging is set up,
  as train.py imports it; :func:`lightning_into_the_run_log` joins them to the root's handlers
  (Hydra's console and train.log) instead.
* **The progress lines stay off a terminal**, where the progress bar shows the same
  (:mod:`aiayn.training.progress`); train.log, and stdout when it is a file or a pipe, get them.
* **The processes ``ddp_spawn`` starts log as the launching process does.** They are new
  interpreters, without Hydra's handlers. :class:`SpawnedRanksLog`, a callback train.py gives every
  Trainer, carries a description of the launching process's handlers to them (pickled with the
  Trainer) and, as it is unpickled there, before the rank logs anything, installs the same
  handlers: the ranks' lines reach stdout and train.log like the launching process's.
"""

from __future__ import annotations

import logging
import sys
import warnings
from typing import Any

import lightning as L
from lightning.fabric.utilities.rank_zero import rank_zero_only

from aiayn.config.hardware import first_process

PROJECT_LOGGERS = ("aiayn", "train")
# Lightning's top loggers: where it adds a console handler of its own at import (see the module).
LIGHTNING_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric")
# A record with this attribute true (``log.info(..., extra={BAR_SHOWS_IT: True})``) is not printed
# on a terminal: the progress bar shows it there.
BAR_SHOWS_IT = "bar_shows_it"


class RunLogFilter(logging.Filter):
    """A handler's filter: the project's records below WARNING of ranks above 0 are dropped, and on
    a ``terminal`` handler the records the progress bar shows."""

    def __init__(self, terminal: bool):
        super().__init__()
        self.terminal = terminal

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING and _projects(record.name) and not _rank_zero():
            return False
        return not (self.terminal and getattr(record, BAR_SHOWS_IT, False))


def filter_the_run_log() -> None:
    """Give each handler of the root logger (Hydra's console and train.log) a :class:`RunLogFilter`."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(each, RunLogFilter) for each in handler.filters):
            handler.addFilter(RunLogFilter(terminal=_is_terminal(handler)))


def lightning_into_the_run_log() -> None:
    """Lightning's loggers write through the root logger's handlers (Hydra's console and
    train.log), not a console handler of their own; nothing changes while the root has no handler
    (their lines would be lost)."""
    if not logging.getLogger().handlers:
        return
    for name in LIGHTNING_LOGGERS:
        logger = logging.getLogger(name)
        for handler in [each for each in logger.handlers if type(each) is logging.StreamHandler]:
            logger.removeHandler(handler)
        logger.propagate = True


class SpawnedRanksLog(L.Callback):
    """Carries this process's root handlers (files, stdout, stderr: their format and level) to the
    processes ``ddp_spawn`` starts, and installs them there, filtered as here, when it is unpickled
    in a process whose root logger has no handlers (a new interpreter). No hooks: nothing else."""

    def __init__(self) -> None:
        root = logging.getLogger()
        self.level = root.level
        self.handlers = [described for handler in root.handlers if (described := _describe(handler))]

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        root = logging.getLogger()
        if root.handlers or not self.handlers:
            return  # this process has a log of its own (the launching process, a copy in it)
        for described in self.handlers:
            root.addHandler(_build(described))
        root.setLevel(self.level)
        lightning_into_the_run_log()
        ignore_moot_warnings()


def _rank_zero() -> bool:
    """Lightning's rank of this process (the global rank, once the strategy has set it up), and the
    launchers' variables: a later node's first process is no rank yet but not the job's first."""
    return rank_zero_only.rank == 0 and first_process()


def _projects(name: str) -> bool:
    return any(name == project or name.startswith(project + ".") for project in PROJECT_LOGGERS)


def is_terminal(stream: Any) -> bool:
    """Whether ``stream`` (sys.stdout, a handler's) is a terminal."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a stream without one (replaced by another object), or closed
        return False


def _is_terminal(handler: logging.Handler) -> bool:
    if isinstance(handler, logging.FileHandler) or not isinstance(handler, logging.StreamHandler):
        return False
    return is_terminal(handler.stream)


def _describe(handler: logging.Handler) -> dict[str, Any] | None:
    """What rebuilds ``handler`` in another process: a file handler's path, or which standard stream
    a stream handler writes to; None for any other (it stays in this process)."""
    formatter = handler.formatter
    described = {"level": handler.level, "format": getattr(formatter, "_fmt", None),
                 "datefmt": getattr(formatter, "datefmt", None)}
    if isinstance(handler, logging.FileHandler):
        return {**described, "file": handler.baseFilename, "encoding": handler.encoding}
    if isinstance(handler, logging.StreamHandler):
        try:
            descriptor = handler.stream.fileno()
        except (AttributeError, ValueError, OSError):
            return None
        if descriptor in (1, 2):
            return {**described, "stream": "stdout" if descriptor == 1 else "stderr"}
    return None


def _build(described: dict[str, Any]) -> logging.Handler:
    if "file" in described:  # appended to, beside the launching process's handler of the same file
        handler: logging.Handler = logging.FileHandler(described["file"], mode="a", encoding=described["encoding"],
                                                       delay=True)
    else:
        handler = logging.StreamHandler(sys.stdout if described["stream"] == "stdout" else sys.stderr)
    handler.setLevel(described["level"])
    handler.setFormatter(logging.Formatter(described["format"], described["datefmt"]))
    handler.addFilter(RunLogFilter(terminal=_is_terminal(handler)))
    return handler


def ignore_moot_warnings() -> None:
    """Lightning's warnings that say nothing a user of a run can act on. Set as train.py's run
    (aiayn.cli.train_run) is imported, in the processes ``ddp`` launches too, by each run (which
    may come after a caller's ``warnings.catch_warnings()`` put the filters of the import back), and
    in each process ``ddp_spawn`` starts (:class:`SpawnedRanksLog`), which imports neither."""
    # The datamodule saves and restores the position in the epoch itself (TranslationDataModule.state_dict).
    warnings.filterwarnings("ignore", message="You.re resuming from a checkpoint that ended before the epoch ended")
    # A step with a non-finite loss returns None on purpose; the module logs each one it skips.
    warnings.filterwarnings("ignore", message="`training_step` returned `None`")
    # The evaluation metrics logged are already the same on every rank (torchmetrics syncs the losses;
    # the hypotheses are gathered before scoring), so Lightning's advice to sync them again is moot.
    warnings.filterwarnings("ignore", message=".*when logging on epoch level in distributed setting")
    # A resumed run saves into the folder of its earlier checkpoints, as it means to (aiayn.training.saving).
    warnings.filterwarnings("ignore", message="Checkpoint directory .* exists and is not empty")
    # torch's own deprecation inside Lightning's pytree helper: nothing a user can act on.
    warnings.filterwarnings("ignore", message=".*isinstance\\(treespec, LeafSpec\\)` is deprecated")
