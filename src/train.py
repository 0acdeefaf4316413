"""Train a Transformer: `python src/train.py [task=...] [model=...] [hardware=...] [key=value ...]`.

Composes conf/train.yaml, builds the data, the model and the Lightning Trainer, trains for
trainer.max_steps, then evaluates the test split and prints its metrics.
"""

from __future__ import annotations

import logging

import hydra
import lightning as L
import torch
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from omegaconf import DictConfig, OmegaConf

from aiayn.training.module import TranslationModule

log = logging.getLogger("aiayn.train")


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
    )
    logger = hydra.utils.instantiate(cfg.logger) if cfg.logger else False
    if logger:
        logger.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))
        logger.log_hyperparams({"parameters": sum(p.numel() for p in module.model.parameters())})
    checkpoints = ModelCheckpoint(
        dirpath=f"{cfg.paths.output_dir}/checkpoints", filename="step{step:07d}", auto_insert_metric_name=False,
        every_n_train_steps=cfg.checkpoint.every_n_train_steps, save_top_k=cfg.checkpoint.save_top_k, save_last=True,
    )
    callbacks = [checkpoints] + ([LearningRateMonitor("step")] if logger else [])
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
