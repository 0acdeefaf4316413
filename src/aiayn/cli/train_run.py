"""The run of train.py's composed config (:mod:`aiayn.cli.train`, which imports this module once
Hydra has composed it): resolved and checked once, then the data, the model, the Lightning Trainer,
training, and the test of its weights; ``--cfg job``'s check of what it shows."""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import sys
from pathlib import Path

import hydra
import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.types import RunMode
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.fabric.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import InterpolationResolutionError

from aiayn.checkpoints.background import AtomicCheckpointIO, BackgroundCheckpointIO
from aiayn.checkpoints.init_from import initial_weights, start_from
from aiayn.checkpoints.layout import LAST, checkpoint_folder
from aiayn.checkpoints.resume import find_resume, remove_stale_temporaries
from aiayn.cli import run_folder
from aiayn.cli.finished_run import nothing_left
from aiayn.cli.rank_errors import os_error_of_a_rank, report_dead_ranks_before_lightning_kills, user_error_of_a_rank
from aiayn.cli.typos import left_out_as_the_run_meets_it
from aiayn.cli.unresolved import left_out, user_error_within
from aiayn.cli.weights_tested import Tested, tested, weights_before_test
from aiayn.config.hardware import first_process
from aiayn.config.identity import MODIFIED, left_out_of_names, row_changes
from aiayn.config.plan import describe
from aiayn.config.schemas import network_arguments  # importing aiayn.config registers the schemas and resolvers
from aiayn.config.trainer import smoke_test
from aiayn.errors import ConfigError, UserError
from aiayn.reporting.loggers import close_runs, describe_runs, quiet_lightning, record_summary
from aiayn.reporting.summary import note_continued, read_summary, write_summary
from aiayn.training.after_training import Stopped, StopsAfterTraining
from aiayn.training.before_training import SettingUp, StoppedSettingUp, stops_while_setting_up
from aiayn.training.callbacks import build_callbacks, run_settings
from aiayn.training.config_check import check_train_config
from aiayn.training.distributed import strategy_with_timeout
from aiayn.training.logged_step import without_step
from aiayn.training.module import TranslationModule
from aiayn.training.preemption import Preempted
from aiayn.training.ranks_step import BringsTheStepBack, take_the_ranks_step
from aiayn.training.run_log import SpawnedRanksLog, filter_the_run_log, ignore_moot_warnings, lightning_into_the_run_log

log = logging.getLogger("train")


ignore_moot_warnings()  # as imported: in the processes Lightning's ddp launches too (aiayn.training.run_log)

def run(cfg: DictConfig) -> dict[str, float]:
    """The process set up for a run (the run log, Lightning's messages, the ranks' errors), then
    :func:`train`."""
    ignore_moot_warnings()
    torch.set_float32_matmul_precision("high")
    quiet_lightning()
    filter_the_run_log()  # ranks above 0 print no INFO of ours; progress lines stay off a terminal
    lightning_into_the_run_log()  # the seed, the devices, the ranks: in train.log too
    report_dead_ranks_before_lightning_kills()
    return train(cfg)


def train(cfg: DictConfig) -> dict[str, float]:
    """The run of the composed ``cfg``: resolved and checked once (:func:`_before_training`), and
    from there on its one resolved config alone."""
    run_dir = Path(cfg.paths.output_dir)
    # A signal before the first step: one line (StoppedSettingUp becomes StoppedBeforeTraining as it leaves).
    with stops_while_setting_up(cfg) as setting_up, contextlib.ExitStack() as held:
        try:
            setting_up.give_held()  # a signal that came as train started (aiayn.training.starting): now
            config, resume, datamodule = _before_training(cfg)
            if (finished := nothing_left(config, resume)) is not None:
                return finished  # trained and tested as asked: said in one line, its test's figures given back
            setting_up.resumed = resume is not None
            output_dir = config["paths"]["output_dir"]  # the resumed run's, when one is resumed
            # The folder the checkpoints go to (the resumed run's): this run's alone while it lives.
            held.enter_context(run_folder.hold(output_dir))
            remove_stale_temporaries(output_dir)  # of saves killed in an earlier attempt
            module = _module(config)
            if config.get("init_from") and resume is None:  # a resumed run's own weights replace them anyway
                initial_weights(module.model, config["init_from"], datamodule)
            loggers = _loggers(config, resume)  # nothing written until their first use, below
            trainer = _trainer(config, loggers)
            setting_up.attach(trainer)
        except (UserError, StoppedSettingUp):
            run_folder.remove_unstarted(run_dir)  # a run that never started leaves no folder behind
            raise
        before, saved = set(run_dir.iterdir()), run_folder.checkpoints_saved(output_dir)
        try:
            return _fit_and_test(config, resume, datamodule, module, loggers, trainer, setting_up)
        except (UserError, StoppedSettingUp) as error:
            # Refused (or stopped by a signal) as the data was loaded (an evaluation example longer than a batch may be),
            # before the first step of a run that resumed nothing: what this attempt's loggers
            # made goes too. (The step is the ranks' under ddp_spawn too, once fit has returned:
            # aiayn.training.ranks_step; a folder with a checkpoint of this attempt is kept whatever it says.)
            if resume is None and trainer.global_step == 0:
                close_runs(loggers)
                run_folder.remove_unstarted(run_dir, made_since=before)
            raise run_folder.said_how_to_continue(error, output_dir, saved)  # after a save: resume=auto


def _fit_and_test(config: dict, resume, datamodule, module, loggers, trainer, setting_up: SettingUp) -> dict[str, float]:
    if rank_zero_only.rank == 0:
        log.info("%s", describe(config["plan"], config, model=_choice("model")))
    for each in loggers:
        each.log_hyperparams({**config, "parameters": sum(p.numel() for p in module.model.parameters())})
    if loggers and rank_zero_only.rank == 0:
        for line in describe_runs(loggers):
            log.info(line)
    stops = next((each for each in trainer.callbacks if isinstance(each, StopsAfterTraining)), None)
    try:
        with stops.around_the_training(trainer) if stops else contextlib.nullcontext():
            trainer.fit(module, datamodule=datamodule, ckpt_path=str(resume.checkpoint) if resume else None)
        take_the_ranks_step(trainer)  # ddp_spawn: the step its ranks reached (the test's rows are at it)
        setting_up.close()  # (a fit with no step to take never hands over to training's handlers)
        results = {}
        if config.get("test_after_training", True):
            with stops.around_the_test(trainer) if stops else contextlib.nullcontext():
                # printed below, in one line
                results = without_step(trainer.test(module, datamodule=datamodule, verbose=False)[0])
    except Stopped as stopped:  # a signal after training, in a single process (aiayn.training.after_training)
        raise Preempted(str(stopped)) from None
    except Exception as error:  # ddp_spawn: a rank's own error, which reaches this process as its traceback's text
        if (raised := user_error_of_a_rank(error) or os_error_of_a_rank(error)) is None:
            raise
        raise raised from error  # the user's error (or a full disk, a path not there), as one process raises it
    if trainer.is_global_zero and results:
        weights = tested(config)  # §6.1's average or the best validation's model (WeightsBeforeTest); None: the last
        which = f" ({weights.described()})" if weights else ""
        print(f"test {config['task']['datamodule']['test_split']}{which}: "
              + "  ".join(f"{k}={v:.4g}" for k, v in results.items()))
        if module.scorer is not None and module.scorer.signature:
            print(f"sacreBLEU signature: {module.scorer.signature}")
        _record_test(trainer, loggers, results, weights)
    if trainer.is_global_zero:
        close_runs(loggers)  # under --multirun the next job starts runs of its own
    return results


def _record_test(trainer: L.Trainer, loggers: list, results: dict, weights: Tested | None) -> None:
    """The test's figures, the weights it scored (last, average or best) and how many checkpoints it
    averaged (1 but for §6.1's average) beside the run's summary (summary.json, the loggers' run
    summary), where the tables read them. The loggers get the whole summary again, the test's
    added: each keeps one summary (MLflow's summary.json artifact is the last it was given)."""
    test = {**results, "test_weights": weights.kind if weights else "last",
            "test_averaged": len(weights.paths) if weights and weights.kind == "average" else 1}
    summary = read_summary(trainer.default_root_dir)
    if summary is not None:  # callbacks.run_summary=null writes none
        test = {**summary, **test}
        write_summary(trainer.default_root_dir, test)
    record_summary(loggers, test)


def _stops_after_training(config: dict) -> list[StopsAfterTraining]:
    """From the end of training through the test: a preemption signal or Ctrl-C stops the run in
    one line (training is saved; resume=auto runs only the test), in every process of the run."""
    preemption = config["callbacks"].get("preemption") or {}
    if not preemption.get("enabled", False) or not config.get("test_after_training", True):
        return []
    return [StopsAfterTraining(preemption.get("signals", ()), checkpoint_folder(config["paths"]["output_dir"]) / LAST)]


def _before_training(cfg: DictConfig):
    """Every check that needs no training: the whole config, the checkpoint to resume, and the
    data files of every split the run will read. Returns (config, resume, datamodule)."""
    config = checked_config(cfg)
    run_folder.refuse_another_runs(cfg.paths.output_dir, cfg.resume)  # before Hydra wrote there, when it ran the run
    _warn_if_not_its_row(config)
    job = HydraConfig.get() if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN else None
    resume = find_resume(cfg.resume, cfg.paths.output_dir, config, multirun=job is not None,  # a sweep job: by its overrides
                         job=list(job.overrides.task) if job else None, left_out=left_out_of_names(job) if job else ())
    if resume is not None and str(resume.run_dir) != cfg.paths.output_dir:
        note_continued(cfg.paths.output_dir, resume.run_dir)  # said in the log, and noted in this attempt's folder
        cfg.paths.output_dir = str(resume.run_dir)  # checkpoints and logs go on in the resumed run
        config = checked_config(cfg)
    L.seed_everything(config["seed"], workers=True)
    # One process's batch: the plan's share of optim.tokens_per_step, at most task.datamodule.max_tokens.
    datamodule = _datamodule(config["task"]["datamodule"], max_tokens=config["plan"]["tokens_per_batch"])
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:  # the other ranks of a node see the same files
        datamodule.check_files()  # train, dev and test: all there (fetched where allowed) before any folder is made
    return config, resume, datamodule


def _datamodule(entry: dict, **kwargs) -> L.LightningDataModule:
    """The task's data module; a setting it refuses as it is built is that UserError itself, not
    inside Hydra's InstantiationException, so that the folder of the run that never started goes."""
    try:
        return hydra.utils.instantiate(entry, **kwargs)
    except InstantiationException as error:
        if isinstance(error.__cause__, UserError):
            raise error.__cause__ from None
        raise


def checked_config(cfg: DictConfig) -> dict:
    """The whole config resolved and checked (config_check): what train refuses before it builds anything."""
    config = _resolved(cfg)
    check_train_config(config)
    start_from(config)  # init_from: its network checked, its subword model the run's data's
    return config


def check_shown(root: DictConfig, plan: dict) -> None:
    """``--cfg job`` refuses what the run would refuse of its config (a model it cannot build,
    say), in the same line: :func:`checked_config` of ``root`` holding ``plan``; else it prints the
    plan as the run prints it before its first step, on stderr (stdout is the config's YAML)."""
    shown = copy.deepcopy(root)
    with open_dict(shown), read_write(shown):
        shown.plan = plan
        shown.pop("hydra", None)  # --cfg all shows Hydra's settings too; a run's config has none
    # A setting left out that only another reads: Hydra's resolving in place made both ???; the run's names it.
    if "???" in OmegaConf.to_yaml(shown) and (error := left_out(left_out_as_the_run_meets_it())) is not None:
        raise error
    config = checked_config(shown)
    print(describe(config["plan"], config, model=_choice("model")), file=sys.stderr, flush=True)


def _warn_if_not_its_row(config: dict) -> None:
    """One warning when a paper row's run (``experiment=table3_A_h1``) changed its network,
    recipe, task or scoring from the row's (``model=big``, ``decoding.beam_size=1``): it is no longer that row."""
    choices = dict(HydraConfig.get().runtime.choices) if HydraConfig.initialized() else {}
    changes = row_changes(config, choices)
    if changes and first_process():
        shown = "; ".join(changes[:6]) + (f"; and {len(changes) - 6} more" if len(changes) > 6 else "")
        log.warning("experiment=%s: this run is no longer that row (%s); its W&B and MLflow runs are tagged `%s` "
                    "and the tables leave it out", choices["experiment"], shown, MODIFIED)


def _resolved(cfg: DictConfig) -> dict:
    """The whole config resolved; what the plan (a resolver) refuses is the ConfigError it raised,
    and so is a mandatory setting left out that another setting reads."""
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except InterpolationResolutionError as error:
        within = user_error_within(error)
        if within is not None:
            raise within from None
        raise


def _choice(group: str) -> str | None:
    """The option chosen for a config group (``model=big``: ``big``), when Hydra ran the tool."""
    return HydraConfig.get().runtime.choices.get(group) if HydraConfig.initialized() else None


def _module(config: dict) -> TranslationModule:
    try:
        return TranslationModule(
            model={**network_arguments(config["model"], config["width_divisor"]),  # the widths trained
                   **({"_target_": config["model"]["_target_"]} if "_target_" in config["model"] else {})},
            vocab_size=config["task"]["vocab_size"],
            optim=config["optim"],
            label_smoothing=config["loss"]["label_smoothing"],
            fused_loss=config["loss"].get("fused", False),
            decoding=config["decoding"],
            bleu_sentences=config["validation"]["bleu_sentences"],
            run_config=config,
            seed=config["seed"],
            max_nonfinite_in_a_row=config["nonfinite"]["max_in_a_row"],
            compile_model=config["compile"],
            compile_mode=config["compile_mode"],
        )
    except (TypeError, ValueError) as error:
        raise ConfigError(f"model: {error}") from None


def _trainer(config: dict, loggers: list) -> L.Trainer:
    """Lightning's Trainer from ``trainer.*`` with the plan's hardware, accumulation and validation
    interval (``plan.trainer``), the callbacks of conf/callbacks/ (built after a resume has moved
    paths.output_dir to the resumed run) and atomic checkpoint writes. A setting Lightning refuses
    is a ConfigError naming it, before anything is written."""
    callbacks = build_callbacks(config["callbacks"], run_settings(config))
    trainer_args = hydra.utils.instantiate(config["trainer"], _convert_="all")  # a strategy may be an object
    planned = config["plan"]["trainer"]
    if not isinstance(trainer_args.get("strategy"), str):  # a Strategy object given in code: kept
        planned = {key: value for key, value in planned.items() if key != "strategy"}
    trainer_args.update(planned)
    # A hung rank ends the job after distributed.timeout_minutes, not Lightning's 30 minutes.
    trainer_args["strategy"] = strategy_with_timeout(trainer_args["strategy"], config["distributed"]["timeout_minutes"],
                                                     config["plan"]["processes"])
    try:
        # SpawnedRanksLog: the ranks ddp_spawn starts print and write train.log as this process does;
        # BringsTheStepBack: and give it the step they reached.
        return L.Trainer(**trainer_args, logger=loggers or False,
                         callbacks=[*callbacks, SpawnedRanksLog(), BringsTheStepBack(), *_stops_after_training(config),
                                    *weights_before_test(config)],
                         plugins=[_checkpoint_writer(config)])
    except (TypeError, ValueError, MisconfigurationException) as error:
        raise ConfigError(f"trainer: {str(error).strip()}") from None


def _checkpoint_writer(config: dict) -> AtomicCheckpointIO:
    """Atomic saves (aiayn.checkpoints.io), in a background thread with checkpoint.in_background."""
    return BackgroundCheckpointIO() if config["checkpoint"].get("in_background") else AtomicCheckpointIO()


def _loggers(config: dict, resume) -> list:
    """The loggers of ``logger.<name>`` (``logger=[wandb,mlflow]``: both), in that order. A resumed
    run gives each the id of the run it continues (kept in the checkpoint by kind: wandb, mlflow).
    None for Lightning's smoke test (trainer.fast_dev_run), which logs nothing, as its plan says."""
    if smoke_test(config["trainer"]):
        return []
    built = []
    for entry in (config.get("logger") or {}).values():  # logger=[] (none chosen) leaves no logger key
        kind = getattr(hydra.utils.get_object(entry["_target_"]), "run_kind", None)
        continued = resume.logger_runs.get(kind) if resume is not None and kind else None
        built.append(hydra.utils.instantiate(entry, **({"resume_id": continued} if continued else {})))
    return built

