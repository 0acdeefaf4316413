"""Train a Transformer: `python src/train.py [task=...] [model=...] [hardware=...] [key=value ...]`.

Composes conf/train.yaml, builds the data, the model and the Lightning Trainer, trains for
trainer.max_steps, then evaluates the test split and prints its metrics. `resume=auto` continues
the newest checkpoint of the run (see aiayn.training.resume).
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from datetime import timedelta

import hydra
import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import WandbLogger
from omegaconf import DictConfig, OmegaConf
from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

from aiayn.data.readers import DataError
from aiayn.training.callbacks import AttentionPicturesCallback
from aiayn.training.config_check import ConfigError, check_train_config
from aiayn.training.module import NonFiniteLossError, TranslationModule, VocabularyMismatchError
from aiayn.training.resume import AtomicCheckpointIO, find_resume
from aiayn.training.run_summary import RunSummaryCallback

log = logging.getLogger("train")

# The datamodule saves and restores the position in the epoch itself (TranslationDataModule.state_dict).
warnings.filterwarnings("ignore", message="You.re resuming from a checkpoint that ended before the epoch ended")
# A step with a non-finite loss returns None on purpose; the module logs each one it skips.
warnings.filterwarnings("ignore", message="`training_step` returned `None`")


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> dict[str, float]:
    return run(cfg)


def run(cfg: DictConfig) -> dict[str, float]:
    """``train(cfg)``, with the errors a user can fix reported as one line (exit status 2; 1 for a
    run that stopped on its own)."""
    try:
        return train(cfg)
    except (ConfigError, DataError, VocabularyMismatchError) as error:
        print(f"train.py: {error}", file=sys.stderr)
        sys.exit(2)
    except NonFiniteLossError as error:
        print(f"train.py: {error}", file=sys.stderr)
        sys.exit(1)
    except (ProcessExitedException, ProcessRaisedException) as error:
        # ddp_spawn: a rank died or failed; torch has already stopped the others.
        _stop_after_failed_rank(str(error))
    except RuntimeError as error:
        if not _lost_a_peer(error):
            raise
        _stop_after_failed_rank(str(error))  # ddp: this rank's collective found another rank gone


def _lost_a_peer(error: RuntimeError) -> bool:
    """A collective that failed because another rank's process went away (gloo or NCCL)."""
    text = str(error)
    return isinstance(error, torch.distributed.DistError) or any(
        sign in text for sign in ("Connection closed by peer", "Connection reset by peer", "NCCL communicator was aborted"))


def _stop_after_failed_rank(detail: str) -> None:
    rank = os.environ.get("RANK") or os.environ.get("LOCAL_RANK")
    where = f" (seen by rank {rank})" if rank else ""
    print(f"train.py: a training process failed, so the job stopped{where}: {detail.strip().splitlines()[-1][:300]}. "
          "Continue from the newest checkpoint with resume=auto", file=sys.stderr)
    sys.exit(1)


def train(cfg: DictConfig) -> dict[str, float]:
    config = OmegaConf.to_container(cfg, resolve=True)
    check_train_config(config)
    multirun = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    resume = find_resume(cfg.resume, cfg.paths.output_dir, config, multirun=multirun)
    if resume is not None and str(resume.run_dir) != cfg.paths.output_dir:
        log.info("continuing run %s (this attempt's config and log stay in %s)", resume.run_dir, cfg.paths.output_dir)
        cfg.paths.output_dir = str(resume.run_dir)  # checkpoints and logs go on in the resumed run
        config = OmegaConf.to_container(cfg, resolve=True)

    L.seed_everything(cfg.seed, workers=True)
    datamodule = hydra.utils.instantiate(cfg.task.datamodule)
    try:
        module = TranslationModule(
            model=config["model"],
            vocab_size=cfg.task.vocab_size,
            optim=config["optim"],
            decoding=config["task"]["decoding"],
            bleu_sentences=cfg.validation.bleu_sentences,
            run_config=config,
            seed=cfg.seed,
            max_nonfinite_in_a_row=cfg.nonfinite.max_in_a_row,
            metric=cfg.task.get("metric", "bleu"),
            compile_model=cfg.compile,
        )
    except (TypeError, ValueError) as error:
        raise ConfigError(f"model: {error}") from None
    logger = _logger(cfg, resume)
    if logger:
        logger.log_hyperparams(config)
        logger.log_hyperparams({"parameters": sum(p.numel() for p in module.model.parameters())})
    checkpoints = ModelCheckpoint(
        dirpath=f"{cfg.paths.output_dir}/checkpoints", filename="step{step:07d}", auto_insert_metric_name=False,
        every_n_train_steps=cfg.checkpoint.every_n_train_steps, save_top_k=cfg.checkpoint.save_top_k, save_last=True,
    )
    callbacks = [checkpoints]
    if cfg.checkpoint.get("every_n_minutes") is not None:
        # §6.1: checkpoints every N minutes of training, the newest `keep_timed` kept, for
        # src/average.py to average (`monitor="step"` makes "newest" the ranking).
        callbacks.append(ModelCheckpoint(
            dirpath=f"{cfg.paths.output_dir}/checkpoints", filename="time-step{step:07d}",
            auto_insert_metric_name=False, train_time_interval=timedelta(minutes=cfg.checkpoint.every_n_minutes),
            save_top_k=cfg.checkpoint.keep_timed, monitor="step", mode="max",
        ))
    callbacks += [AttentionPicturesCallback()] if cfg.visualize_at_end else []  # Figures 3–5, into attention/
    callbacks.append(RunSummaryCallback(gpu=cfg.cost.gpu))  # dev PPL/BLEU, tokens, FLOPs: summary.json and W&B
    trainer_args = hydra.utils.instantiate(cfg.trainer, _convert_="all")  # a strategy may be an object
    trainer = L.Trainer(**trainer_args, logger=logger, callbacks=callbacks, plugins=[AtomicCheckpointIO()])
    trainer.fit(module, datamodule=datamodule, ckpt_path=str(resume.checkpoint) if resume else None)
    results = trainer.test(module, datamodule=datamodule)[0] if cfg.get("test_after_training", True) else {}
    if trainer.is_global_zero and results:
        print(f"test {cfg.task.datamodule.test_split}: " + "  ".join(f"{k}={v:.4g}" for k, v in results.items()))
        if module.bleu_signature:
            print(f"sacreBLEU signature: {module.bleu_signature}")
    if isinstance(logger, WandbLogger):
        logger.experiment.finish()  # under --multirun the next job starts a W&B run of its own
    return results


def _logger(cfg: DictConfig, resume) -> object:
    if not cfg.logger:
        return False
    extra = {}
    if resume is not None and resume.wandb_run_id and str(cfg.logger.get("_target_", "")).endswith("wandb_logger"):
        extra = {"id": resume.wandb_run_id, "resume": "allow"}  # the same W&B run goes on
    return hydra.utils.instantiate(cfg.logger, **extra)


if __name__ == "__main__":
    torch.set_float32_matmul_precision("high")
    main()
