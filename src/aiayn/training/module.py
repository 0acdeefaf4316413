"""The LightningModule that trains and evaluates a Transformer for translation (§5, §6.1)."""

from __future__ import annotations

import logging
import time
from typing import Any

import lightning as L
import numpy as np
import torch
import torch.distributed as dist
from torchmetrics import MeanMetric

from aiayn.checkpoints.trained import layout_difference
from aiayn.errors import DataError, UserError
from aiayn.inference import Search
from aiayn.metrics.scorers import Scorer
from aiayn.model import Transformer
from aiayn.model.loss import label_smoothed_loss
from aiayn.reporting.loggers import run_ids
from aiayn.training.schedule import transformer_scheduler

log = logging.getLogger(__name__)


class VocabularyMismatchError(UserError):
    """The checkpoint being resumed was trained with another subword model than the data's."""


class NonFiniteLossError(RuntimeError):
    """Training stopped after too many consecutive steps with a non-finite loss or gradient."""


class TranslationModule(L.LightningModule):
    """Teacher-forced training with label smoothing, Adam and the §5.3 schedule; validation and
    test report loss, per-token perplexity and the scores of beam-search output.

    ``model`` holds the Transformer's keyword arguments, widths as trained (what
    aiayn.config.schemas.network_arguments makes of a model config); ``label_smoothing`` is the
    loss's ε_ls; ``optim`` is Adam's settings and the schedule's (conf/optim/*.yaml). The
    datamodule attached to the trainer supplies ``vocab`` (to detokenize hypotheses), ``scorer()``
    (an :class:`aiayn.metrics.Scorer`: sacreBLEU for translation, EVALB's F1 for parsing) and
    ``scoring_references(split)`` (what the scorer compares hypotheses with); each of the
    scorer's figures is logged as ``{stage}/{key}``.

    Speed switches that leave the results unchanged (up to rounding): ``compile_model`` compiles
    the Transformer's forward with ``torch.compile`` when fitting starts; ``optim["fused"]`` asks
    for torch's fused Adam kernel.
    """

    def __init__(
        self,
        model: dict[str, Any],
        vocab_size: int,
        optim: dict[str, Any],
        decoding: dict[str, Any],
        label_smoothing: float = 0.1,
        pad_id: int = 0,
        bos_id: int = 2,
        eos_id: int = 3,
        bleu_sentences: int | None = None,
        run_config: dict[str, Any] | None = None,
        seed: int = 0,
        max_nonfinite_in_a_row: int = 8,
        compile_model: bool = False,
    ):
        super().__init__()
        # run_config (the whole resolved Hydra config) travels in checkpoints, not in the logger's
        # hyper-parameters: train.py logs it itself.
        self.save_hyperparameters(logger=False)
        self.label_smoothing = float(label_smoothing)
        self.model = Transformer(vocab_size, vocab_size, pad_id=pad_id, **model)
        self.optim, self.decoding = dict(optim), dict(decoding)
        self._search: Search | None = None  # how to decode, from the data's vocabulary when first needed
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.bleu_sentences = bleu_sentences
        self.eval_loss, self.eval_nll = MeanMetric(), MeanMetric()
        self.hypotheses: list[tuple[int, str]] = []
        self.scorer: Scorer | None = None  # the datamodule's, from setup() on
        self._last_batch_end: float | None = None  # for target tokens/s between batch ends
        self._tokens = 0  # target tokens of the current training batch
        self.seed = seed
        # Steps whose loss or gradient is NaN/inf are skipped (no update) and counted; after
        # `max_nonfinite_in_a_row` of them in a row training stops (NonFiniteLossError).
        self.max_nonfinite_in_a_row = max_nonfinite_in_a_row
        self.nonfinite_in_a_row = 0
        self.nonfinite_total = 0
        self.compile_model = compile_model

    def setup(self, stage: str) -> None:
        """The datamodule (set up before this) must speak the model's vocabulary, and its
        evaluation examples must fit the model's positions; it says how evaluation scores the output."""
        vocab = self.trainer.datamodule.vocab
        expected = (self.hparams.vocab_size, self.pad_id, self.bos_id, self.eos_id)
        found = (vocab.vocab_size, vocab.pad_id, vocab.bos_id, vocab.eos_id)
        if found != expected:
            raise ValueError(
                f"the data's vocabulary {vocab} has (size, pad, bos, eos) = {found} but the model expects "
                f"{expected}; set task.vocab_size to the subword model's size"
            )
        self.trainer.datamodule.check_positions(self.model.max_positions)
        self.scorer = self.trainer.datamodule.scorer()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Keep the subword model in the checkpoint, so that it translates on its own."""
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if datamodule is not None and getattr(datamodule, "vocab", None) is not None:
            checkpoint["subwords"] = datamodule.vocab.serialized()
        checkpoint["nonfinite_steps"] = {"in_a_row": self.nonfinite_in_a_row, "total": self.nonfinite_total}
        if self._trainer is not None:
            checkpoint["logger_runs"] = run_ids(self.loggers)  # a resumed run continues these runs

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Resuming: the data must be encoded with the checkpoint's own subword model."""
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        vocab = getattr(datamodule, "vocab", None)
        if vocab is not None and "subwords" in checkpoint and checkpoint["subwords"] != vocab.serialized():
            raise VocabularyMismatchError(
                f"the checkpoint's subword model differs from the one built for this data ({vocab}); the data or "
                "task.vocab_size changed since it was written: resume with the original data, or start a fresh run"
            )
        difference = layout_difference(self.state_dict(), checkpoint.get("state_dict", {}))
        if difference is not None:  # before Lightning loads it, which would print torch's list of every key
            raise DataError(f"{getattr(self.trainer, 'ckpt_path', None) or 'the checkpoint resumed'}: {difference}")
        counts = checkpoint.get("nonfinite_steps", {})
        self.nonfinite_in_a_row, self.nonfinite_total = counts.get("in_a_row", 0), counts.get("total", 0)

    # -- training -------------------------------------------------------------------------
    def on_fit_start(self) -> None:
        if self.compile_model:
            self.compile_transformer()

    def compile_transformer(self, **options: Any) -> None:
        """Compile the Transformer's forward (teacher forcing) with ``torch.compile(**options)``,
        in place: parameter names and checkpoints stay as they are; beam search keeps running
        eagerly. Batches of new shapes recompile until torch marks the lengths dynamic."""
        if getattr(self.model, "_compiled_call_impl", None) is None:
            self.model.compile(**options)

    def training_loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
        """The label-smoothed loss of one teacher-forced batch, per non-padding target token,
        and the number of those tokens."""
        logits = self.model(batch["src"], batch["tgt_in"])
        loss_sum, _, n_tokens = label_smoothed_loss(logits, batch["tgt_out"], self.label_smoothing, self.pad_id)
        return loss_sum / n_tokens, n_tokens

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # The dropout of every batch draws from a generator seeded by (seed, epoch, batch, rank),
        # as fairseq seeds each update, so a run resumed from a checkpoint repeats exactly what
        # the uninterrupted run would have done, whatever else used the global generator.
        state = np.random.SeedSequence([self.seed, self.current_epoch, batch_idx, self.global_rank])
        torch.manual_seed(int(state.generate_state(1, np.uint64)[0]))

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor | None:
        # Mean over this batch's target tokens; Lightning divides by the accumulation count and
        # DDP averages over ranks, so with token-sized batches every token weighs about the same.
        loss, n_tokens = self.training_loss(batch)
        self._tokens = n_tokens
        if not self._all_ranks_finite(loss):
            self._skip_nonfinite("loss")
            return None  # Lightning then skips backward and the update on every rank
        self.log("train/loss", loss, on_step=True, prog_bar=True, batch_size=n_tokens)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"], on_step=True, prog_bar=True)
        return loss

    def _all_ranks_finite(self, loss: torch.Tensor) -> bool:
        finite = torch.isfinite(loss.detach()).to(torch.float32)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(finite, op=dist.ReduceOp.MIN)  # every rank must skip together
        return bool(finite.item())

    def _skip_nonfinite(self, what: str) -> None:
        self.nonfinite_in_a_row += 1
        self.nonfinite_total += 1
        log.warning("step %d: non-finite %s, update skipped (%d in a row, %d in all)",
                    self.global_step, what, self.nonfinite_in_a_row, self.nonfinite_total)
        if self.nonfinite_in_a_row >= self.max_nonfinite_in_a_row:
            # The skipped steps changed nothing, so the weights and optimizer state now are those
            # from before the first of them: keep them for a restart with other settings.
            path = f"{self.trainer.default_root_dir}/checkpoints/nonfinite-step{self.global_step:07d}.ckpt"
            self.trainer.save_checkpoint(path)
            raise NonFiniteLossError(
                f"{self.nonfinite_in_a_row} steps in a row had a non-finite {what} (last at step {self.global_step}); "
                f"the state from before them is in {path}. Lower optim.lr_factor or raise optim.warmup_steps "
                f"and resume with resume={path}, or allow more with nonfinite.max_in_a_row"
            )

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        now = time.perf_counter()
        if self._last_batch_end is not None:
            self.log("train/tgt_tokens_per_sec", self._tokens / (now - self._last_batch_end), on_step=True)
        self._last_batch_end = now

    def on_train_epoch_start(self) -> None:
        self._last_batch_end = None  # the gap across validation/epoch ends is not training time

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if not grads:
            return  # the loss was not finite: training_step skipped backward
        grad_norm = torch.nn.utils.get_total_norm(grads)
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)  # fp16 (16-mixed on a GPU without bf16)
        if scaler is not None:
            # Gradients are unscaled by now. An overflow is the loss scale's, not the model's: the
            # scaler skips this update and halves the scale, as dynamic loss scaling does (a loss
            # that is itself not finite was caught in training_step).
            self.log("train/loss_scale", float(scaler.get_scale()), on_step=True)
            if not torch.isfinite(grad_norm):
                return
        if not torch.isfinite(grad_norm):  # gradients are all-reduced already: every rank agrees
            for parameter in self.parameters():
                parameter.grad = None  # Adam leaves parameters without a gradient untouched
            self._skip_nonfinite("gradient")
            return
        self.nonfinite_in_a_row = 0
        self.log("train/grad_norm", grad_norm, on_step=True)
        self.log("train/skipped_steps", float(self.nonfinite_total), on_step=True)

    def configure_optimizers(self) -> dict[str, Any]:
        # §5.3: Adam with β1 = 0.9, β2 = 0.98, ε = 1e-9; lr = 1.0 scaled by the schedule.
        # optim.fused: torch's fused Adam (one kernel for all parameters), same update.
        optimizer = torch.optim.Adam(self.parameters(), lr=1.0, betas=tuple(self.optim["betas"]),
                                     eps=self.optim["eps"], fused=bool(self.optim.get("fused", False)))
        scheduler = transformer_scheduler(optimizer, self.model.d_model, self.optim["warmup_steps"],
                                          self.optim.get("lr_factor", 1.0))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # -- evaluation -----------------------------------------------------------------------
    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, bleu_sentences=self.bleu_sentences)

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, bleu_sentences=None)

    def on_validation_epoch_end(self) -> None:
        self._log_evaluation("val")

    def on_test_epoch_end(self) -> None:
        self._log_evaluation("test")

    def _evaluate(self, batch: dict[str, torch.Tensor], bleu_sentences: int | None) -> None:
        if batch["index"].numel() == 0:  # a rank's empty share of a split with fewer batches than ranks
            for metric in (self.eval_loss, self.eval_nll):
                metric.update(torch.zeros((), device=self.device), 0)  # adds nothing; the rank took part
            return
        logits = self.model(batch["src"], batch["tgt_in"])
        loss_sum, nll_sum, n_tokens = label_smoothed_loss(logits, batch["tgt_out"], self.label_smoothing,
                                                          self.pad_id)
        self.eval_loss.update(loss_sum / n_tokens, n_tokens)
        self.eval_nll.update(nll_sum / n_tokens, n_tokens)
        selected = torch.ones_like(batch["index"], dtype=torch.bool)
        if bleu_sentences is not None:
            selected = batch["index"] < bleu_sentences
        if selected.any():
            if self._search is None:  # the tree constraint, where decoding asks for one, is built once
                self._search = Search(self.decoding, self.trainer.datamodule.vocab)
            hypotheses = self._search.best(self.model, batch["src"][selected])
            texts = self.trainer.datamodule.vocab.decode(hypotheses)
            self.hypotheses.extend(zip(batch["index"][selected].tolist(), texts))

    def _log_evaluation(self, stage: str) -> None:
        loss, nll = self.eval_loss.compute(), self.eval_nll.compute()
        self.eval_loss.reset()
        self.eval_nll.reset()
        if stage == "val":  # the step validated, not Lightning's count of the steps before it (one fewer)
            self.log("step", float(self.trainer.global_step))
        self.log(f"{stage}/loss", loss)
        self.log(f"{stage}/nll", nll)
        self.log(f"{stage}/ppl", torch.exp(nll))  # per-token perplexity of the subword model
        hypotheses = _gather(self.hypotheses)
        self.hypotheses = []
        if not hypotheses or self.trainer.sanity_checking:
            return
        indices = sorted(hypotheses)
        references = self.trainer.datamodule.scoring_references(stage)
        scores = self.scorer([hypotheses[i] for i in indices], [references[i] for i in indices])
        for key, value in scores.items():
            self.log(f"{stage}/{key}", value, prog_bar=key == self.scorer.name)
        log.info("%s %s", stage, self.scorer.describe(scores, len(indices)))


def _gather(pairs: list[tuple[int, str]]) -> dict[int, str]:
    """Every rank's (index, hypothesis) pairs, on every rank."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        gathered: list[list[tuple[int, str]]] = [[] for _ in range(dist.get_world_size())]
        dist.all_gather_object(gathered, pairs)
        pairs = [pair for part in gathered for pair in part]
    return dict(pairs)
