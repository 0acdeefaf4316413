"""Experiment loggers. W&B is the default: online with an API key, otherwise offline (no prompt,
no network wait), written under the run directory and uploadable later with ``wandb sync``."""

from __future__ import annotations

import csv
import logging
import netrc
import os
from typing import Any

from lightning.pytorch.loggers import CSVLogger, WandbLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter


def wandb_has_credentials() -> bool:
    """An API key in the environment or in ~/.netrc (where ``wandb login`` puts it)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def wandb_logger(project: str, save_dir: str, mode: str = "auto", **kwargs: Any) -> WandbLogger:
    """``mode``: "online", "offline", or "auto" (online only with credentials). WANDB_MODE in the
    environment, when set, wins as it does for wandb itself."""
    mode = os.environ.get("WANDB_MODE", mode)
    if mode == "auto":
        mode = "online" if wandb_has_credentials() else "offline"
    os.makedirs(save_dir, exist_ok=True)
    import wandb

    # wandb's own console lines (its version, `wandb leet`, the run history at the end) are left
    # out: describe_wandb_run says where the run is and how to upload it.
    kwargs.setdefault("settings", wandb.Settings(silent=True))
    logger = WandbLogger(project=project, save_dir=save_dir, offline=(mode == "offline"), **kwargs)
    # Lightning always passes wandb.init an `anonymous` setting, which wandb 0.2x+ warns is ignored.
    if getattr(logger, "_wandb_init", {}).get("anonymous", "unset") is None:
        logger._wandb_init.pop("anonymous")
    return logger


def describe_wandb_run(logger: WandbLogger) -> str:
    """Where a W&B run is: its page online; offline, its folder and the command that uploads it."""
    run = logger.experiment
    if getattr(run, "offline", False) or run.settings.mode == "offline":
        folder = os.path.dirname(run.dir.rstrip(os.sep))  # <save_dir>/wandb/offline-run-<time>-<id>
        return f"W&B run {run.id} (offline) in {folder}; upload it with `wandb sync {folder}`"
    return f"W&B run {run.id}: {run.url}"


class _NoAdvertisements(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip:")


def quiet_lightning() -> None:
    """Drop Lightning's tips about its hosted products from the run's output."""
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).addFilter(_NoAdvertisements())



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
    file keeps every stage's metrics, in one process or many."""

    @property
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _MetricsWriter(log_dir=self.log_dir)
        return self._experiment
