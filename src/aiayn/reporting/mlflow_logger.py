"""``logger=mlflow``: the runs in MLflow, browsable without any account (``mlflow ui``).

Lightning's :class:`MLFlowLogger` on a local store: a SQLite file (``tracking_uri``, default
``sqlite:///mlruns/mlflow.db``, the folder made where the run starts, or $MLFLOW_TRACKING_URI)
and the artifacts beside it (``mlruns/artifacts``). A table's runs share one MLflow experiment named
after the table (``table3``; other runs: ``aiayn``), each run named as its W&B run and tagged
with its table, row, scale and labels. It gets what W&B gets: the whole resolved config (as
params, and whole as ``config.json``), every step's and every validation's metrics, the run
summary (as metrics, its text as tags, and ``summary.json``), the parameter count and the
attention pictures (``attention/*.png`` artifacts).

Browse: ``mlflow ui --backend-store-uri sqlite:///mlruns/mlflow.db`` and open http://127.0.0.1:5000.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Mapping, MutableSequence, Sequence
from pathlib import Path
from typing import Any

from lightning.fabric.utilities.logger import _convert_params, _flatten_dict
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment

from aiayn.reporting.held_rows import HeldRows
from aiayn.reporting.mlflow_store import DEFAULT_STORE, check_store, first_use_lock, local_store

log = logging.getLogger(__name__)


class MLflowRunLogger(MLFlowLogger):
    """Lightning's MLFlowLogger on a local store (see the module), the run's table and row as tags."""

    run_kind = "mlflow"

    @staticmethod
    def check_settings(section: str, settings: Mapping[str, Any]) -> None:
        """Before a run starts (aiayn.training.config_check): a store MLflow would fail on is refused."""
        check_store(str(settings.get("tracking_uri") or DEFAULT_STORE), f"{section}.tracking_uri")

    def __init__(self, experiment_name: str = "aiayn", run_name: str | None = None,
                 tracking_uri: str = DEFAULT_STORE, tags: Mapping[str, Any] | None = None,
                 resume_id: str | None = None):
        uri, artifacts = local_store(tracking_uri)
        # A tag is text: a list (the run's labels) joined by commas; an unset one (null) left out.
        text = {key: ",".join(map(str, value)) if isinstance(value, (MutableSequence, tuple)) else str(value)
                for key, value in (tags or {}).items() if value is not None}
        with first_use_lock(uri):  # MLflow's client opens the store (and migrates a new one) at once
            super().__init__(experiment_name=experiment_name, run_name=run_name, tracking_uri=uri, tags=text,
                             artifact_location=artifacts, run_id=resume_id)
        self._config: dict[str, Any] = {}
        self._newest_step = 0  # of the metrics logged: the step of a summary that names none
        # A resumed run leaves out what its run holds of the steps it trains again (aiayn.reporting.held_rows).
        self._resumed = bool(resume_id)
        self._held: HeldRows | None = None
        self._closed = False

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if self._resumed and step is not None:
            if self._held is None:
                run = self.experiment.get_run(self.run_id)
                self._held = HeldRows({metric.key: metric.step for metric in run.data.to_proto().metrics})
            metrics = self._held.fresh(metrics, step)
            if not metrics:
                return
        self._log_metrics(metrics, step)

    def _log_metrics(self, metrics: Mapping[str, float], step: int | None) -> None:
        super().log_metrics(metrics, step)
        self._newest_step = max(self._newest_step, int(step or 0))

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        """Lightning's: the experiment found or made and the run made or continued at the first
        use, one process at a time (:func:`first_use_lock`): two jobs would each make the experiment."""
        if self._initialized:
            return self._mlflow_client
        with first_use_lock(self._tracking_uri):
            client = MLFlowLogger.experiment.fget(self)
        if self._resumed:  # the tags (labels: the overrides) of the attempt that runs now, as W&B's
            for key, value in (self.tags or {}).items():
                client.set_tag(self.run_id, key, value)
        return client

    @rank_zero_only
    def log_hyperparams(self, params: Mapping[str, Any] | Any) -> None:
        """The config flattened into params (``model.d_model``, as the override names it), each value spelt as
        the config's YAML spells it (``null``, ``true``, ``[SIGTERM, SIGINT]``) and whole up to MLflow's
        limit (Lightning's own cuts at 250 characters); a longer one is cut with a warning, and the
        whole config is in the ``config.json`` artifact. MLflow's params never change: a resumed
        run keeps the params it has, and a setting an attempt changed (more ``optim.train_steps``
        for a finished run extended) is the tag ``changed.<name>`` with this attempt's value, said in
        a warning (and gone again in an attempt that no longer changes it)."""
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_TAG_VAL_LENGTH

        params = _convert_params(params)
        flat = {key: (yaml_text(value), str(value)) for key, value in _flatten_dict(params, delimiter=".").items()}
        run = self.experiment.get_run(self.run_id)
        logged = run.data.params
        # (a param first logged as Python spells it, None or ['SIGTERM'], is the same setting)
        # (``resume`` says how an attempt was started, which every resumed attempt changes: no setting of the run)
        changed = sorted(key for key, texts in flat.items() if key in logged and key != "resume"
                         and logged[key] not in {text[:MAX_PARAM_VAL_LENGTH] for text in texts})
        for key in changed:
            self.experiment.set_tag(self.run_id, f"changed.{key}", flat[key][0][:MAX_TAG_VAL_LENGTH])
        for key in flat.keys() - set(changed):  # an earlier attempt's change this attempt has not made
            if f"changed.{key}" in run.data.tags:
                self.experiment.delete_tag(self.run_id, f"changed.{key}")
        if changed:
            log.warning("MLflow run %s keeps its params as first logged (params do not change); this attempt's %s "
                        "are its tags changed.<name>", self.run_id,
                        ", ".join(f"{key}={flat[key][0][:40]}" for key in changed[:5])
                        + (f" and {len(changed) - 5} more" if len(changed) > 5 else ""))
        new = []
        for key, (text, _) in flat.items():
            if key in logged:
                continue
            if len(text) > MAX_PARAM_VAL_LENGTH:
                log.warning("MLflow param %s cut to %d characters (the whole config is config.json)", key,
                            MAX_PARAM_VAL_LENGTH)
                text = text[:MAX_PARAM_VAL_LENGTH]
            new.append(Param(key=key, value=text))
        for start in range(0, len(new), 100):  # MLflow takes at most 100 params a call
            self.experiment.log_batch(run_id=self.run_id, params=new[start:start + 100], **self._log_batch_kwargs)
        self._config.update(params)  # Lightning logs the data module's settings in a call of their own
        self.experiment.log_dict(self.run_id, self._config, "config.json")

    def log_summary(self, summary: Mapping[str, Any]) -> None:
        """Numbers as metrics at the run's last step (``dev/bleu``, ``train_flops`` ...; the summary's
        ``steps``, else the newest step logged), each once: one the run already holds at that value
        (the test's figures, which Lightning logged at their step; a summary given again with more
        in it) is not logged again; text as tags ``summary.<key>``; the whole as ``summary.json``."""
        step = int(summary.get("steps") or self._newest_step)
        numbers_ = {key: float(value) for key, value in summary.items()
                    if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)}
        held = self.experiment.get_run(self.run_id).data.metrics  # each metric's newest value
        new = {key: value for key, value in numbers_.items() if held.get(key) != value}
        if new:
            self._log_metrics(new, step=step)  # this attempt's, at the step a killed one may have logged
        for key, value in summary.items():
            if key not in numbers_ and value is not None:
                self.experiment.set_tag(self.run_id, f"summary.{key}", str(value))
        self.experiment.log_dict(self.run_id, dict(summary), "summary.json")

    def log_pictures(self, key: str, paths: Sequence[Path], caption: str, step: int) -> None:
        """Each picture as an artifact ``<key>/<file>``; the caption as the tag ``<key>.caption``."""
        for path in paths:
            self.experiment.log_artifact(self.run_id, str(path), artifact_path=key)
        self.experiment.set_tag(self.run_id, f"{key}.caption", caption)

    def describe(self) -> str:
        uri = self._tracking_uri
        return (f"MLflow run {self.run_id} in experiment {self._experiment_name!r}; browse it with "
                f"`mlflow ui --backend-store-uri {uri}`")

    def resumable_run_id(self) -> str | None:
        return self.run_id

    def close(self, preempted_exit: int | None = None) -> None:
        """FINISHED (Lightning's finalize does it too); KILLED when preempted, until the resumed run finishes it."""
        if self._closed:  # as it ended: preempted, or failed
            return
        self._closed = True
        self.experiment.set_terminated(self.run_id, "KILLED" if preempted_exit is not None else "FINISHED")

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        """Lightning's (FAILED for a run it ends as failed), but not over a run closed already: one
        preempted stays KILLED (before: FAILED, as Lightning finalizes after the stop's close)."""
        if not self._closed:
            super().finalize(status)
            self._closed = status == "failed"  # and stays so (a sweep's train closes every run it made)


def log_evaluation(tracking_uri: str, trained_config: Mapping[str, Any], name: str, settings: Mapping[str, Any],
                   metrics: Mapping[str, float], step: int, report: Path | None = None,
                   trained_runs: Mapping[str, str] | None = None) -> str:
    """An evaluate.py run in MLflow: a run ``eval-<name>`` (evaluate.py's: ``eval-<trained run>-<files>``,
    its W&B name) in the training run's experiment (its table's), tagged ``job_type=eval`` with the training run it scored (``trained_run``: its MLflow
    run id, from the checkpoint; ``trained_run_name``; ``trained_wandb_run``), nested under it where
    it is in this store, and with its table and row; its settings (the effective decoding
    included) as params, its figures as metrics at the checkpoint's step, its report as an
    artifact. Returns the run's id."""
    experiment = dict(trained_config.get("experiment") or {})
    runs = dict(trained_runs or {})
    trained = _run_in_store(tracking_uri, runs.get("mlflow"))
    tags = {"job_type": "eval", "trained_run": runs.get("mlflow"), "trained_wandb_run": runs.get("wandb"),
            "trained_run_name": trained.info.run_name if trained is not None else None,
            "table": experiment.get("table"), "row": experiment.get("row"), "scale": experiment.get("scale")}
    if trained is not None:
        tags["mlflow.parentRunId"] = trained.info.run_id  # the UI shows it under the run it scored
    logger = MLflowRunLogger(experiment_name=experiment.get("table") or "aiayn", run_name=f"eval-{name}",
                             tracking_uri=tracking_uri, tags=tags)
    logger.log_hyperparams(dict(settings))
    logger.log_metrics(dict(metrics), step=step)
    if report is not None:
        logger.experiment.log_artifact(logger.run_id, str(report))
    logger.close()
    return logger.run_id


def _run_in_store(tracking_uri: str, run_id: str | None) -> Any:
    """The MLflow run ``run_id`` where it is in the store of ``tracking_uri``; else None."""
    if not run_id:
        return None
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    uri, _ = local_store(tracking_uri)
    with first_use_lock(uri):
        client = MlflowClient(uri)
    try:
        return client.get_run(run_id)
    except MlflowException:
        return None


def yaml_text(value: Any) -> str:
    """``value`` as the config's YAML spells it, on one line: ``null``, ``true``, ``0.1``,
    ``[SIGTERM, SIGINT]``, ``{a: 1}`` (Python's ``str`` gives ``None``, ``True``, ``['SIGTERM', 'SIGINT']``)."""
    import yaml

    try:
        text = yaml.safe_dump(value, default_flow_style=True, width=math.inf, sort_keys=False)
    except yaml.YAMLError:  # not a value YAML holds (an object given in code)
        return str(value)
    return text.removesuffix("\n").removesuffix("\n...").strip()
