"""Where evaluate.py logs an evaluation, and the runs it logs there: W&B and MLflow.

By default an evaluation goes where its training run went (the checkpoint holds which runs it
logged to, by kind, and its config the MLflow store): W&B where the run logged to W&B (``wandb=auto``:
online with an API key, else offline), the run's MLflow store where it logged to MLflow, neither
where it logged to neither (``logger=csv``, ``logger=none``). ``wandb=`` and ``mlflow=`` (or
``$MLFLOW_TRACKING_URI``) say otherwise. Each run is named after the training run it scored.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from aiayn.checkpoints.layout import run_dir_of
from aiayn.cli.errors import is_composition_error
from aiayn.config.identity import MODIFIED, run_folder_changes
from aiayn.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Trackers:
    """Where an evaluation is logged: W&B's mode (``disabled``: not at all) and the MLflow store (None: none)."""

    wandb: str
    mlflow: str | None


def given_trackers(cfg: DictConfig) -> None:
    """A ConfigError, before anything is loaded, for a ``wandb=`` mode or ``mlflow=`` store that is
    given and would fail once the split is decoded (W&B's refusal without an API key, a store MLflow
    cannot write)."""
    from aiayn.reporting.mlflow_store import check_store
    from aiayn.reporting.wandb_mode import check_wandb_mode

    if cfg.wandb not in (None, "disabled"):
        check_wandb_mode(cfg.wandb, "wandb", ("auto", "online", "offline", "disabled"))
    if cfg.mlflow:
        check_store(str(cfg.mlflow), "mlflow")


def trackers(cfg: DictConfig, trained_config: dict, trained_runs: dict[str, str]) -> Trackers:
    """Where this evaluation is logged: ``wandb=`` and ``mlflow=`` where given, else as its training
    run was (``trained_runs``: the checkpoint's runs by kind; ``trained_config``: the run's config)."""
    mode = cfg.wandb if cfg.wandb is not None else ("auto" if "wandb" in trained_runs else "disabled")
    store = str(cfg.mlflow) if cfg.mlflow else None
    if store is None and "mlflow" in trained_runs:
        store = trained_store(trained_config)
    return Trackers(mode, store)


def trained_store(config: dict) -> str | None:
    """The MLflow store the run of ``config`` logged to, where it can be written here; None, said in
    a warning, where it cannot: a SQLite file not here (a run trained on another machine, or a
    relative path from another folder: MLflow's own reading of one), a server that does not answer."""
    from hydra.utils import get_object

    from aiayn.reporting.mlflow_store import check_store

    for name, entry in (config.get("logger") or {}).items():
        try:
            kind = getattr(get_object(entry["_target_"]), "run_kind", None)
        except ImportError:  # a logger class of one's own not importable here: not MLflow's
            continue
        if kind != "mlflow" or not entry.get("tracking_uri"):
            continue
        store = str(entry["tracking_uri"])
        fix = "give mlflow=<its store> to log this evaluation there"
        if store.startswith("sqlite:///") and not Path(store[len("sqlite:///"):]).is_file():
            log.warning("the training run's MLflow store (logger.%s.tracking_uri=%s) is not here; %s", name, store, fix)
            return None
        try:
            check_store(store, f"logger.{name}.tracking_uri")
        except ConfigError as error:
            log.warning("the training run's MLflow store cannot be written: %s; %s", error, fix)
            return None
        return store
    return None


def trained_run_name(config: dict) -> str:
    """The name a training run has in W&B and MLflow (``${aiayn.run:name}``: its run name, scale and
    overrides), as its config keeps it; ``run_name`` for a run trained without either logger."""
    loggers = config.get("logger") or {}
    named = [(loggers.get("wandb") or {}).get("name"), (loggers.get("mlflow") or {}).get("run_name")]
    return next((str(each) for each in named if each), str(config.get("run_name") or "run"))


def log_to_wandb(mode: str, cfg: DictConfig, trained: Any, ckpt: Path, out_dir: Path, name: str,
                 metrics: dict[str, float], decoding: dict, summary: dict, weights: dict) -> None:
    """The evaluation as a W&B run (``mode``: auto, online or offline) ``eval-<training run>-<name>``,
    ``job_type=eval``, in the group named by the training run's ``run_name`` (where the tables look
    evaluations up; a sweep job's training run is in its sweep's group); prints where it is."""
    # Tagged `modified` as its training run is (a paper row's run changed from its row), so that the
    # tables' W&B reports leave both out alike. A row this checkout no longer composes (the run is
    # older) is said in a warning; the evaluation is logged untagged.
    try:
        modified = run_folder_changes(trained.config, run_dir_of(ckpt.resolve()))
    except Exception as error:
        if not is_composition_error(error):
            raise
        log.warning("could not compare %s's run with its row (%s); its W&B evaluation is not tagged", ckpt, error)
        modified = []
    from aiayn.reporting.loggers import wandb_logger

    # Named after the training run it scored (the sweep's jobs' evaluations were all eval-<files>, in
    # one group), whose W&B id it holds as MLflow's evaluation does (trained_wandb_run).
    trained_name = trained_run_name(trained.config)
    logger = wandb_logger(project="aiayn", save_dir=str(out_dir), mode=mode, name=f"eval-{trained_name}-{name}",
                          job_type="eval", group=trained.config.get("run_name"), tags=[MODIFIED] if modified else None)
    # decoding: the settings decoded with (the checkpoint's own where the command left them null);
    # weights: the ensemble's checkpoints and the steps averaged (an average.py file's too), as the report's.
    logger.log_hyperparams({"evaluate": OmegaConf.to_container(cfg, resolve=True), "train": trained.config,
                            "decoding": decoding, "trained_run_name": trained_name,
                            "trained_wandb_run": trained.logger_runs.get("wandb"), **weights})
    logger.log_metrics(metrics, step=trained.step)
    logger.experiment.summary.update({**metrics, **summary})
    print(f"  {logger.describe()}")  # where it is, and offline the command that uploads it
    logger.experiment.finish()


def log_to_mlflow(store: str, cfg: DictConfig, trained: Any, name: str, metrics: dict[str, float], decoding: dict,
                  report: Path) -> None:
    """The evaluation as an MLflow run in ``store``, under the training run it scored where that is there."""
    from aiayn.reporting.mlflow_logger import log_evaluation  # mlflow only when asked for

    settings = {"evaluate": OmegaConf.to_container(cfg, resolve=True), "decoding": decoding}
    # Named as in W&B (before: eval-<files> alone, the same for every run a sweep's evaluations scored).
    run_id = log_evaluation(store, trained.config, f"{trained_run_name(trained.config)}-{name}", settings, metrics,
                            trained.step, report, trained_runs=trained.logger_runs)
    print(f"  MLflow run {run_id} in {store}")
