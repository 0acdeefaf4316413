"""Train a Transformer: `python src/train.py [task=...] [model=...] [hardware=...] [key=value ...]`.

Composes conf/train.yaml, builds the data, the model and the Lightning Trainer, trains for
trainer.max_steps, then evaluates the test split and prints its metrics.
"""

from __future__ import annotations

from datetime import timedelta

import hydra
import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import DictConfig, OmegaConf

from aiayn.training.callbacks import AttentionPicturesCallback
from aiayn.training.module import TranslationModule



@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> dict[str, float]:
    L.seed_everything(cfg.seed, workers=True)
    datamodule = hydra.utils.instantiate(cfg.task.datamodule)
    module = TranslationModule(
        model=OmegaConf.to_container(cfg.model, resolve=True),
        vocab_size=cfg.task.vocab_size,
        optim=OmegaConf.to_container(cfg.optim, resolve=True),
        decoding=OmegaConf.to_container(cfg.task.decoding, resolve=True),
        bleu_sentences=cfg.validation.bleu_sentences,
        run_config=OmegaConf.to_container(cfg, resolve=True),
        metric=cfg.task.get("metric", "bleu"),
    )
    logger = hydra.utils.instantiate(cfg.logger) if cfg.logger else False
    if logger:
        logger.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
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
    trainer = L.Trainer(**cfg.trainer, logger=logger, callbacks=callbacks)
    trainer.fit(module, datamodule=datamodule)
    results = trainer.test(module, datamodule=datamodule)[0]
    if trainer.is_global_zero:
        print(f"test {cfg.task.datamodule.test_split}: " + "  ".join(f"{k}={v:.4g}" for k, v in results.items()))
        if module.bleu_signature:
            print(f"sacreBLEU signature: {module.bleu_signature}")
    return results


if __name__ == "__main__":
    torch.set_float32_matmul_precision("high")
    main()
