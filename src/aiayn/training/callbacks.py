"""Lightning callbacks of the training job: the step checkpoints (§6.1's to average among them),
the attention pictures at the end of training, the run summary (dev PPL/BLEU, parameters,
tokens, FLOPs) in summary.json and W&B. conf/callbacks/default.yaml lists what a run uses; the
factories here return None for a callback switched off, which then adds none.

Settings of the run that a callback reads are not repeated in conf/callbacks/: :func:`build_callbacks`
gives each factory the run settings its parameters name (:func:`run_settings`: ``checkpoint``,
``dirpath``, ``resume``, ``visualize_at_end``, ``cost``, ``trainer``), so each setting has one
address (``checkpoint.every_n_train_steps``, not also a callback's).
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import lightning as L
import torch

from aiayn.checkpoints.layout import STEP_STEM, checkpoint_folder
from aiayn.config.checkpointing import kept
from aiayn.errors import ConfigError
from aiayn.reporting.flops import (
    PAPER_GPU,
    Shapes,
    paper_estimate,
    sustained_tflops,
    training_flops,
)
from aiayn.reporting.loggers import record_pictures, record_summary
from aiayn.reporting.summary import device_name, write_summary
from aiayn.training.early_stopping import EarlyStopping
from aiayn.training.saving import StepCheckpoint

log = logging.getLogger(__name__)


def run_settings(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of a training config (conf/train.yaml, resolved or not) that callbacks read, by
    the parameter names that take them."""
    return {"checkpoint": cfg["checkpoint"], "dirpath": str(checkpoint_folder(cfg['paths']['output_dir'])),
            "resume": cfg.get("resume"), "visualize_at_end": cfg.get("visualize_at_end", True),
            "cost": cfg.get("cost") or {}, "trainer": cfg.get("trainer") or {}}


def build_callbacks(entries: Mapping[str, Any], settings: Mapping[str, Any]) -> list[L.Callback]:
    """The callbacks of conf/callbacks/ (``entries``, each with a ``_target_``; null: none), each
    factory given the ``settings`` (:func:`run_settings`) its parameters name and its entry does not
    set; those that come back None are left out."""
    import hydra

    built = []
    for entry in entries.values():
        if entry is None:
            continue
        target = hydra.utils.get_object(entry["_target_"])
        parameters = inspect.signature(target).parameters
        given = {name: value for name, value in settings.items() if name in parameters and name not in entry}
        callback = hydra.utils.instantiate(entry, **given)
        if callback is not None:
            built.append(callback)
    return built


def step_checkpoints(checkpoint: Mapping[str, Any], dirpath: str) -> StepCheckpoint:
    """Every ``checkpoint.every_n_train_steps`` steps, ``<dirpath>/step<N>.ckpt``, and the last step;
    in §6.1's window before the last step, its ``checkpoint.average_last`` steps
    ``checkpoint.average_every_n_steps`` apart instead (aiayn.config.checkpointing). The newest
    ``checkpoint.save_top_k`` are kept (-1: all), never fewer than the window's; ``last.ckpt`` always
    names the newest. A step that is validated is saved after its validation (aiayn.training.saving)."""
    keep = kept(checkpoint)
    # Lightning keeps more than one but not all only by a monitored value: the step, so the newest.
    ranking = {"monitor": "step", "mode": "max"} if keep > 1 else {}
    return StepCheckpoint(dirpath=dirpath, filename=STEP_STEM, auto_insert_metric_name=False,
                          every_n_train_steps=checkpoint["every_n_train_steps"], save_top_k=keep, save_last="link",
                          save_last_step=True, average_last=checkpoint.get("average_last"),
                          average_every_n_steps=checkpoint.get("average_every_n_steps"), **ranking)


def attention_pictures(visualize_at_end: bool, **options: Any) -> AttentionPicturesCallback | None:
    """An AttentionPicturesCallback(**options), or None when not ``visualize_at_end``."""
    return AttentionPicturesCallback(**options) if visualize_at_end else None


attention_pictures.passes_keywords_to = lambda: AttentionPicturesCallback  # the names config_check takes


def _check_attention_pictures(section: str, settings: Mapping[str, Any]) -> None:
    """Before a run starts (aiayn.training.config_check, which calls a target's ``check_settings``):
    a ConfigError for ``layers`` other than paper or all, or an ``index`` that is no line number."""
    layers, index = settings.get("layers", "paper"), settings.get("index", 0)
    if layers not in ("paper", "all"):
        raise ConfigError(f"{section}.layers must be paper or all, got {layers!r}")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ConfigError(f"{section}.index must be a whole number, 0 or more (a line of the split), got {index!r}")


attention_pictures.check_settings = _check_attention_pictures


def run_summary(cost: Mapping[str, Any]) -> RunSummaryCallback:
    """The :class:`RunSummaryCallback`, its paper's estimate with the sustained TFLOPS of ``cost.gpu``."""
    return RunSummaryCallback(gpu=cost.get("gpu", PAPER_GPU))


class AttentionPicturesCallback(L.Callback):
    """At the end of training, draw the attention maps (Figures 3–5) of one validation sentence
    into ``<trainer.default_root_dir>/attention/`` and give them to the run's loggers (W&B: key
    ``attention/<file stem>``; MLflow: artifacts ``attention/``). Rank zero only.

    ``index`` picks the sentence: the validation split's raw source line of that index; ``layers``
    which layers: ``paper`` the one the paper's Figures 3–5 show (layer 5 of 6: three pictures, a
    few seconds for the big model), ``all`` every one (src/visualize.py draws any). A failure here
    is logged as a warning: the pictures are not worth losing the test evaluation for.
    """

    def __init__(self, split: str = "val", index: int = 0, folder: str = "attention", layers: str = "paper"):
        _check_attention_pictures("callbacks.attention_pictures", {"layers": layers, "index": index})
        self.split, self.index, self.folder, self.layers = split, index, folder, layers

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        try:
            paths, caption = self._draw(trainer, pl_module)
        except Exception as error:  # noqa: BLE001 - see the class docstring
            log.warning("could not draw the attention pictures: %s: %s", type(error).__name__, error)
            return
        log.info("attention pictures of %r written to %s", caption, paths[0].parent if paths else "-")
        record_pictures(trainer.loggers, "attention", paths, caption, trainer.global_step)

    def _draw(self, trainer: L.Trainer, pl_module: L.LightningModule) -> tuple[list[Path], str]:
        from aiayn.analysis.attention_maps import (  # matplotlib only when used
            attention_maps,
            draw_attention,
            paper_layer,
        )

        datamodule = trainer.datamodule
        sentence = datamodule.sources(self.split)[self.index]
        constraint = datamodule.output_constraint(datamodule.vocab)  # a parser's tree written as translate.py's
        maps = attention_maps(pl_module.model, datamodule.vocab, sentence, pl_module.decoding, constraint,
                              datamodule.raw_text(datamodule.vocab, constraint))
        layers = None if self.layers == "all" else [paper_layer(maps.n_layers)]
        paths = draw_attention(maps, Path(trainer.default_root_dir) / self.folder, layers)
        return paths, f"{maps.source} → {maps.translation or '(empty translation)'}"


class RunSummaryCallback(L.Callback):
    """Counts every training batch (source and target tokens, FLOPs of its forward and backward
    from the padded batch shape, see :mod:`aiayn.reporting.flops`), summed over all ranks, and
    keeps the newest validation's perplexity and BLEU. At the end of training, rank zero writes
    them to ``<trainer.default_root_dir>/summary.json`` and to the run's loggers (W&B: the run's
    summary; MLflow: metrics and tags). Each validation also logs ``val/train_flops``.

    Summary keys: every figure of the last validation (at step ``dev/step``) as ``dev/<figure>``:
    ``dev/loss``, ``dev/ppl``, the scorer's (``dev/bleu`` (sacreBLEU), ``dev/tokenized_bleu`` (the
    paper's BLEU, Table 3's), ``dev/chrf``, …; ``dev/f1`` for parsing; a scorer of one's own's),
    ``parameters``, ``steps``, ``training_time_s`` (wall time from the start to the end of
    training, validation included, as the paper's 12 hours for 100K steps), ``tokens_seen``
    (target tokens, padding left out), ``src_tokens_seen``, ``train_flops`` (counted),
    ``flops_per_token`` (per target token), ``train_flops_paper_estimate`` (training time × processes
    × the sustained TFLOPS of ``gpu``: the cost as if each process were that GPU; the paper: P100),
    ``processes``, ``gpu_for_estimate``, ``device_name`` (the accelerator, else the CPU) and
    ``finished_at`` (UTC), ``init_from`` (the checkpoint the run started from, or None); with ``callbacks.early_stopping``, ``stopped_early_at`` (the step, or
    None), ``dev/best_<figure>`` and ``dev/best_step``.

    The counts travel in checkpoints, so a resumed run goes on counting where it stopped.
    """

    def __init__(self, gpu: str | float = PAPER_GPU):
        self.gpu = gpu
        self.tflops = sustained_tflops(gpu)  # a bad setting fails before training starts
        self.totals: torch.Tensor | None = None  # (source tokens, target tokens, FLOPs), all ranks
        self.restored_totals = torch.zeros(3, dtype=torch.float64)
        self.seconds_before = 0.0  # training time of the earlier attempts of a resumed run
        self.started: float | None = None
        self.trained_until: float | None = None  # the end of the newest batch or validation
        self.dev: dict[str, float] = {}
        self.shapes: Shapes | None = None
        self.device: str | None = None

    # -- counting ---------------------------------------------------------------------------
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.shapes = Shapes.from_config(pl_module.hparams.model, pl_module.hparams.vocab_size)
        self.device = device_name(pl_module.device)  # before fit's teardown moves the model off the GPU

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # A copy of this process's own: under ddp_spawn on the CPU the callback reaches every rank
        # through torch.multiprocessing, which puts its tensors in memory the ranks share, so that
        # each rank would add every reduced batch once more into one count (Lightning unshares a
        # module's tensors, not a callback's).
        self.totals = self.restored_totals.to(pl_module.device, copy=True)
        self.started, self.trained_until = time.perf_counter(), None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        src, tgt = batch["src"], batch["tgt_out"]
        flops = training_flops(self.shapes, src.size(0), src.size(1), tgt.size(1))
        # On the device, so that counting never waits for it; one small sum over the ranks per batch.
        # Rows added to fill a length bucket's shape (index -1) hold no example: their tokens are not counted.
        real_rows = (batch["index"] >= 0)[:, None]
        counts = torch.stack([((src != pl_module.pad_id) & real_rows).sum(),
                              (tgt != pl_module.pad_id).sum()]).to(torch.float64)
        # The FLOPs from the host without waiting (a copy of a number made on the device would wait).
        flops = torch.tensor([float(flops)], dtype=torch.float64).to(counts.device, non_blocking=True)
        batch_totals = torch.cat([counts, flops])
        if trainer.world_size > 1:
            batch_totals = trainer.strategy.reduce(batch_totals, reduce_op="sum")
        self.totals += batch_totals
        self.trained_until = time.perf_counter()

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """``val/train_flops``: the FLOPs counted up to this validation, beside its ``val/*``
        scores (the same logged row), so that a curve can be drawn against training compute."""
        if trainer.sanity_checking or self.totals is None:
            return
        pl_module.log("val/train_flops", float(self.totals[2]), on_step=False, on_epoch=True, rank_zero_only=True)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        self.trained_until = time.perf_counter()
        metrics = trainer.callback_metrics
        # every figure of the validation (the loss, perplexity and whatever the task's scorer gives:
        # chrF, a scorer of one's own) but the running total of FLOPs, which the summary has itself
        self.dev = {"dev/step": trainer.global_step, **{
            f"dev/{key[4:]}": float(value) for key, value in metrics.items()
            if key.startswith("val/") and key != "val/train_flops"}}

    def training_seconds(self) -> float:
        """The earlier attempts' time and this one's up to the end of its newest batch or validation:
        what follows training (the pictures, the test) is not training, and a checkpoint saved after
        the last step holds what the summary says (Lightning runs checkpoint callbacks after this
        one), so a run resumed for its test alone says it too (before: counted to the end of fit,
        and the resumed run's figure was seconds smaller)."""
        if self.started is None:
            return self.seconds_before
        return self.seconds_before + ((self.trained_until or time.perf_counter()) - self.started)

    # -- the summary ------------------------------------------------------------------------
    def summary(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        totals = (self.totals if self.totals is not None else self.restored_totals).tolist()
        seconds = self.training_seconds()
        stopping = next((each for each in trainer.callbacks if isinstance(each, EarlyStopping)), None)
        return {
            **self.dev,
            **(stopping.summary() if stopping is not None else {}),
            "parameters": sum(p.numel() for p in pl_module.model.parameters()),
            "steps": trainer.global_step,
            "training_time_s": seconds,
            "src_tokens_seen": int(totals[0]),
            "tokens_seen": int(totals[1]),
            "train_flops": totals[2],
            "flops_per_token": totals[2] / totals[1] if totals[1] else None,
            "train_flops_paper_estimate": paper_estimate(seconds, trainer.world_size, self.tflops),
            "processes": trainer.world_size,
            "gpu_for_estimate": self.gpu,
            "device_name": self.device or device_name(pl_module.device),
            "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            # The checkpoint a fine-tuning run started from (null: from scratch), beside its figures.
            "init_from": (pl_module.hparams.get("run_config") or {}).get("init_from"),
        }

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # At the end of fit, not of training: a resumed run whose checkpoint is the last step's
        # (killed after saving it) trains nothing, and Lightning calls no training hook, but owes
        # the summary. A preempted run ends fit with an exception: no summary, it has not finished.
        summary = self.summary(trainer, pl_module)
        if not trainer.is_global_zero:
            return
        path = write_summary(trainer.default_root_dir, summary)
        record_summary(trainer.loggers, summary)
        log.info("run summary in %s: %s", path, summary)

    # -- resuming ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        totals = self.totals if self.totals is not None else self.restored_totals
        return {"totals": totals.detach().cpu().tolist(), "training_time_s": self.training_seconds(),
                "dev": dict(self.dev)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.restored_totals = torch.tensor(state_dict["totals"], dtype=torch.float64)
        self.seconds_before = float(state_dict["training_time_s"])
        self.dev = dict(state_dict.get("dev", {}))
