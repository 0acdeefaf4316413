"""Experiment loggers, and the one interface through which training reports to them.

``logger=`` picks them (conf/logger/): ``wandb`` (the default), ``mlflow``, ``csv``, ``none``, or
several at once (``logger=[wandb,mlflow]``); each is ``logger.<name>`` in the config. W&B runs online
with an API key, otherwise offline (no prompt, no network wait), written under the run directory
and uploadable later with ``wandb sync``. MLflow (:mod:`aiayn.reporting.mlflow_logger`) writes to
a local store that ``mlflow ui`` browses, no account needed.

Every logger of this module is a :class:`RunRecord`: besides Lightning's metrics and
hyper-parameters it takes the run summary, pictures, and says where its run is. Training calls
:func:`record_summary`, :func:`record_pictures`, :func:`describe_runs`, :func:`close_runs` and
:func:`run_ids` on whatever loggers it has, never asking which they are.
"""

from __future__ import annotations

import csv
import glob
import logging
import os
import shlex
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.loggers import CSVLogger, WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.loggers.logger import rank_zero_experiment

from aiayn.reporting.held_rows import HeldRows
from aiayn.reporting.wandb_history import catch_up, record_path, record_row
from aiayn.reporting.wandb_mode import check_wandb_mode, wandb_mode

log = logging.getLogger(__name__)


@runtime_checkable
class RunRecord(Protocol):
    """What a logger of this project does beyond Lightning's ``Logger``. ``run_kind`` names the
    kind of run (``wandb``, ``mlflow``, ``csv``): a checkpoint keeps each kind's run id under it,
    and a resumed run is given it back as ``resume_id``."""

    run_kind: str

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        """The run summary (:mod:`aiayn.reporting.summary`), at the end of training."""

    def log_pictures(self, key: str, paths: Sequence[Path], caption: str, step: int) -> None:
        """Pictures drawn during the run (the attention maps), under ``key``."""

    def describe(self) -> str | None:
        """One line: where the run is and how to look at it (None: nothing to say)."""

    def resumable_run_id(self) -> str | None:
        """The id a resumed run continues (None: the logger has no run to continue)."""

    def close(self, preempted_exit: int | None = None) -> None:
        """End the run (a sweep's next job starts its own). ``preempted_exit``: the run was
        preempted and exits with this status; a resumed run continues it."""


def _records(loggers: Iterable[Any]) -> list[RunRecord]:
    """The loggers that take this interface; others (a plain Lightning logger given in code) get
    Lightning's metrics only."""
    return [logger for logger in loggers if isinstance(logger, RunRecord)]


def record_summary(loggers: Iterable[Any], summary: Mapping[str, Any]) -> None:
    for logger in _records(loggers):
        logger.log_summary(summary)


def record_pictures(loggers: Iterable[Any], key: str, paths: Sequence[Path], caption: str, step: int) -> None:
    for logger in _records(loggers):
        logger.log_pictures(key, paths, caption, step)


def describe_runs(loggers: Iterable[Any]) -> list[str]:
    return [line for logger in _records(loggers) if (line := logger.describe())]


def close_runs(loggers: Iterable[Any], preempted_exit: int | None = None) -> None:
    for logger in _records(loggers):
        try:
            logger.close(preempted_exit)
        except Exception as error:  # noqa: BLE001 - the checkpoint and summary are written; a logger must not hide that
            log.warning("could not close the %s run: %s: %s", logger.run_kind, type(error).__name__, error)


def run_ids(loggers: Iterable[Any]) -> dict[str, str]:
    """``{run_kind: run id}`` of the loggers whose run a resumed run continues (kept in checkpoints)."""
    return {logger.run_kind: run for logger in _records(loggers) if (run := logger.resumable_run_id())}


# -- W&B ------------------------------------------------------------------------------------------
class WandbRunLogger(WandbLogger):
    """``logger=wandb``: Lightning's WandbLogger, online or offline (``mode``, see :func:`wandb_mode`).
    The summary goes to the run's summary, pictures to ``wandb.Image``s under their key."""

    run_kind = "wandb"

    @staticmethod
    def check_settings(section: str, settings: Mapping[str, Any]) -> None:
        """Before a run starts (aiayn.training.config_check): a ConfigError for a ``mode`` that is
        none of online/offline/auto, or online without an API key (wandb would stop the run at
        its start with a traceback, or wait for a login prompt)."""
        check_wandb_mode(settings.get("mode", "auto"), f"{section}.mode")

    @staticmethod
    def passes_keywords_to() -> Any:
        """What the settings Lightning's WandbLogger does not take go on to: ``wandb.init`` (whose
        arguments aiayn.training.config_check takes as this logger's)."""
        import wandb

        return wandb.init

    def __init__(self, project: str, save_dir: str, mode: str = "auto", resume_id: str | None = None,
                 **kwargs: Any):
        mode = wandb_mode(mode)
        os.makedirs(save_dir, exist_ok=True)
        import wandb

        # wandb's own console lines (its version, `wandb leet`, the run history at the end) are left
        # out: describe() says where the run is and how to upload it.
        kwargs.setdefault("settings", wandb.Settings(silent=True))
        if resume_id:
            kwargs.update(id=resume_id, resume="allow")  # the same W&B run goes on
        super().__init__(project=project, save_dir=save_dir, offline=(mode == "offline"), **kwargs)
        # Lightning always passes wandb.init an `anonymous` setting, which wandb 0.2x+ warns is ignored.
        if self._wandb_init.get("anonymous", "unset") is None:
            self._wandb_init.pop("anonymous")
        # Offline, every row once across the attempts of a killed run (aiayn.reporting.wandb_history):
        # what the earlier attempts' files hold, known at this attempt's first row.
        self._resumed = bool(resume_id)
        self._held: HeldRows | None = None
        self._closed = False

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled in a process of its own (a ``ddp_spawn`` rank), which attaches to the run its
        launching process started: wandb's attach takes the run's folder from the environment, not
        from the run, so it is said there (before: the pictures logged at the end of training went to
        ``<working folder>/wandb/offline-run-…/files/media``, beside no run, and out of what
        ``wandb sync`` of the run's folder uploads)."""
        self.__dict__.update(state)
        if self._save_dir:
            os.environ["WANDB_DIR"] = os.path.abspath(self._save_dir)

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Lightning's, and offline the run's record of the row; a resumed attempt first logs again the rows
        its earlier attempts' files lack, and leaves out what they hold of the steps it trains again."""
        if not self._offline:
            super().log_metrics(metrics, step)
            return
        run = self.experiment
        if self._held is None:
            self._held = HeldRows()
            if self._resumed:
                self._held = catch_up(super().log_metrics, self.save_dir, run.id, Path(run.dir).parent)
        if step is not None:
            metrics = self._held.fresh(metrics, step)
            if not metrics:
                return
        super().log_metrics(metrics, step)
        if step is not None:
            record_row(record_path(self.save_dir, run.id), metrics, step)

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        self.experiment.summary.update(dict(summary))

    def log_pictures(self, key: str, paths: Sequence[Path], caption: str, step: int) -> None:
        for path in paths:
            self.log_image(key=f"{key}/{Path(path).stem}", images=[str(path)], caption=[caption], step=step)

    def describe(self) -> str:
        return describe_wandb_run(self)

    def resumable_run_id(self) -> str | None:
        return self.version

    def close(self, preempted_exit: int | None = None) -> None:
        if self._closed:
            return
        self._closed = True
        run = self.experiment
        if preempted_exit is None:
            run.finish()
            return
        run.mark_preempting()
        run.finish(exit_code=preempted_exit)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Lightning's; a run it ends as failed (a user error in training or its test, a full disk,
        a stop on non-finite losses) is finished as failed, exit code 1, unless it was closed as
        preempted first (before: finished by wandb as the process exited, with exit code 0)."""
        super().finalize(status)
        if status == "failed" and not self._closed and self._experiment is not None:
            self._closed = True
            self._experiment.finish(exit_code=1)


def wandb_logger(project: str, save_dir: str, mode: str = "auto", **kwargs: Any) -> WandbRunLogger:
    """A :class:`WandbRunLogger` (the name configs and checkpoints written before it still use)."""
    return WandbRunLogger(project=project, save_dir=save_dir, mode=mode, **kwargs)


def describe_wandb_run(logger: WandbLogger) -> str:
    """Where a W&B run is: its page online; offline, its folder and the command that uploads it.

    A resumed run writes a folder per attempt offline (``offline-run-<time>-<id>``, one id), each
    counting W&B's ``_step`` from 0: the command names them all, and ``wandb sync`` given the folders
    of one run uploads them one after another in the order they started, each after the rows
    already there (naming the newest alone left the earlier attempts' steps out of the run)."""
    run = logger.experiment
    if getattr(run, "offline", False) or run.settings.mode == "offline":
        folder = os.path.dirname(run.dir.rstrip(os.sep))  # <save_dir>/wandb/offline-run-<time>-<id>
        parent = os.path.dirname(folder)
        attempts = glob.glob(os.path.join(glob.escape(parent), f"offline-run-*-{run.id}"))
        if len(attempts) > 1:
            every = os.path.join(shlex.quote(parent), f"offline-run-*-{run.id}")
            return (f"W&B run {run.id} (offline) in {len(attempts)} folders, one per attempt, the newest {folder}; "
                    f"upload them together, in the order they started, with `wandb sync {every}`")
        return f"W&B run {run.id} (offline) in {folder}; upload it with `wandb sync {folder}`"
    return f"W&B run {run.id}: {run.url}"


class _NoAdvertisements(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip:")


def quiet_lightning() -> None:
    """Drop Lightning's tips about its hosted products from the run's output."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).addFilter(_NoAdvertisements())


# -- CSV ------------------------------------------------------------------------------------------
class _MetricsWriter(ExperimentWriter):
    """Lightning's CSV writer, told the columns its file already has: with ``ddp_spawn`` the test
    stage runs in new processes whose writer starts with none, and Lightning's would rewrite the
    file's header with the test metrics alone and fail on the training rows."""

    def _record_new_keys(self) -> set[str]:
        if not self.metrics_keys and self._fs.isfile(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="") as file:
                self.metrics_keys.extend(next(csv.reader(file), []))
        return super()._record_new_keys()


class MetricsCSVLogger(CSVLogger):
    """``logger=csv``: Lightning's CSVLogger (``<save_dir>/<name>/version_<n>/metrics.csv``) whose
    file keeps every stage's metrics, in one process or many. The summary and the pictures are
    already files of the run directory (summary.json, attention/), so it adds nothing for them."""

    run_kind = "csv"

    def __init__(self, *args: Any, resume_id: str | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # A resumed run's attempt writes a file of its own (version_<n>), leaving out what the
        # earlier attempts' files hold of the steps it trains again (aiayn.reporting.held_rows).
        self._resume_id = resume_id
        self._held: HeldRows | None = None

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if self._resume_id and step is not None:
            if self._held is None:
                self._held = held_in_csv(Path(self.root_dir), besides=Path(self.log_dir))
            metrics = self._held.fresh(metrics, step)
            if not metrics:
                return
        super().log_metrics(metrics, step)

    @property
    @rank_zero_experiment  # as Lightning's own: another rank makes no version folder (before: an empty one)
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _MetricsWriter(log_dir=self.log_dir)
        return self._experiment

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        """summary.json in the run directory is the CSV run's summary."""

    def log_pictures(self, key: str, paths: Sequence[Path], caption: str, step: int) -> None:
        """The pictures stay where they were drawn, in the run directory."""

    def describe(self) -> str:
        return f"metrics in {Path(self.log_dir) / 'metrics.csv'}"

    def resumable_run_id(self) -> str:
        """The first attempt's folder (``version_0``), the same in every attempt of the run."""
        return self._resume_id or f"version_{self.version}"

    def close(self, preempted_exit: int | None = None) -> None:
        self.save()


def held_in_csv(root: Path, besides: Path) -> HeldRows:
    """The newest step of each metric in the ``metrics.csv`` of every attempt under ``root`` but ``besides``."""
    held = HeldRows()
    for metrics in sorted(root.glob("version_*/metrics.csv")):
        if metrics.parent.resolve() == besides.resolve():
            continue
        with open(metrics, newline="") as file:
            for row in csv.DictReader(file):
                if row.get("step"):
                    held.add([key for key, value in row.items() if value], int(float(row["step"])))
    return held
