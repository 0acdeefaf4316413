"""Lightning callbacks of the training job."""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
from lightning.pytorch.loggers import WandbLogger

log = logging.getLogger(__name__)


class AttentionPicturesCallback(L.Callback):
    """At the end of training, draw the attention maps (Figures 3–5) of one validation sentence
    into ``<trainer.default_root_dir>/attention/`` and log them to W&B when the run has a
    :class:`WandbLogger` (key ``attention/<file stem>``). Rank zero only.

    ``index`` picks the sentence: the validation split's raw source line of that index. A failure
    here is logged as a warning: the pictures are not worth losing the test evaluation for.
    """

    def __init__(self, split: str = "val", index: int = 0, folder: str = "attention"):
        self.split, self.index, self.folder = split, index, folder

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        try:
            paths, caption = self._draw(trainer, pl_module)
        except Exception as error:  # noqa: BLE001 - see the class docstring
            log.warning("could not draw the attention pictures: %s: %s", type(error).__name__, error)
            return
        log.info("attention pictures of %r written to %s", caption, paths[0].parent if paths else "-")
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                for path in paths:
                    logger.log_image(key=f"attention/{path.stem}", images=[str(path)], caption=[caption],
                                     step=trainer.global_step)

    def _draw(self, trainer: L.Trainer, pl_module: L.LightningModule) -> tuple[list[Path], str]:
        from aiayn.analysis.attention_maps import attention_maps, draw_attention  # matplotlib only when used

        datamodule = trainer.datamodule
        sentence = datamodule.sources(self.split)[self.index]
        maps = attention_maps(pl_module.model, datamodule.vocab, sentence, pl_module.decoding)
        paths = draw_attention(maps, Path(trainer.default_root_dir) / self.folder)
        return paths, f"{maps.source} → {maps.translation or '(empty translation)'}"
