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
from aiayn.config.schemas import build_network
from aiayn.decoding.search import Search
from aiayn.errors import DataError, UserError
from aiayn.metrics.scorers import Scorer
from aiayn.model.loss import label_smoothed_loss
from aiayn.reporting.loggers import run_ids
from aiayn.training import logged_step
from aiayn.training.compiling import CUDA_GRAPH_MODES, compile_options
from aiayn.training.nonfinite import NonFiniteSteps
from aiayn.training.schedule import rate_of, transformer_scheduler

log = logging.getLogger(__name__)


class VocabularyMismatchError(UserError):
    """The checkpoint being resumed was trained with another subword model than the data's."""


class TranslationModule(L.LightningModule):
    """Teacher-forced training with label smoothing, Adam and the §5.3 schedule; validation and
    test report loss, per-token perplexity and the scores of beam-search output.

    ``model`` holds the Transformer's keyword arguments, widths as trained (what
    aiayn.config.schemas.network_arguments makes of a model config), and its class as
    ``_target_`` where it is one of one's own (aiayn.config.schemas.network_class); ``label_smoothing`` is the
    loss's ε_ls; ``optim`` is Adam's settings and the schedule's (conf/optim/*.yaml). The
    datamodule attached to the trainer supplies ``vocab`` (to detokenize hypotheses), ``scorer()``
    (an :class:`aiayn.metrics.Scorer`: sacreBLEU for translation, EVALB's F1 for parsing) and
    ``scoring_references(split)`` (what the scorer compares hypotheses with); each of the
    scorer's figures is logged as ``{stage}/{key}``.

    Speed switches that leave the results unchanged (up to rounding): ``compile_model`` compiles
    the Transformer's forward with ``torch.compile`` when fitting starts; ``optim["fused"]`` asks
    for torch's fused Adam kernel.

    The loss of a step is the label-smoothed loss summed over every target token of the step —
    all its accumulated batches, on every process — divided by their number (:meth:`training_step`,
    :meth:`on_before_optimizer_step`). The paper is silent on this; tensor2tensor (its
    ``average_sharded_losses``: the GPUs' summed losses over their summed token counts) and fairseq
    (the step's sample size) normalise the same way, so one batch of
    25,000 tokens and the same sentences in 8 accumulated batches of any sizes give the same
    gradient; ``train/loss``, logged once a step, is that loss. A step reads nothing back from the
    device (CUDA can run ahead of Python, or replay a captured graph): token counts, the gradient's
    norm and the non-finite check stay tensors, a non-finite step is skipped by fused Adam itself
    (its ``found_inf``), and the counts are read back when Lightning reads its logged values
    (``trainer.log_every_n_steps``; in train.py every step on a CPU, every 100 on GPUs). With
    ``optim.fused`` false the check reads the step's flag back at every step.
    """

    def __init__(
        self,
        model: dict[str, Any],
        vocab_size: int,
        optim: dict[str, Any],
        decoding: dict[str, Any],
        label_smoothing: float = 0.1,
        fused_loss: bool = False,
        pad_id: int = 0, bos_id: int = 2, eos_id: int = 3,
        bleu_sentences: int | None = None,
        run_config: dict[str, Any] | None = None,
        seed: int = 0,
        max_nonfinite_in_a_row: int = 8,
        compile_model: bool = False,
        compile_mode: str = "default",
    ):
        super().__init__()
        # run_config (the whole resolved Hydra config) travels in checkpoints, not in the logger's
        # hyper-parameters: train.py logs it itself.
        self.save_hyperparameters(logger=False)
        self.label_smoothing, self.fused_loss = float(label_smoothing), bool(fused_loss)
        # model._target_: the paper's Transformer, or a subclass of one's own (docs/extending.md)
        network = {key: value for key, value in model.items() if key != "_target_"}
        self.model = build_network(model.get("_target_"), vocab_size, network, pad_id)
        self.optim, self.decoding = dict(optim), dict(decoding)
        self._search: Search | None = None  # how to decode, from the data's vocabulary when first needed
        self._decoder: Any = None  # and how outputs become text: the vocabulary, or a parser's as evaluate writes them
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.bleu_sentences = bleu_sentences
        self.eval_loss, self.eval_nll = MeanMetric(), MeanMetric()
        self.hypotheses: list[tuple[int, str]] = []
        self.scorer: Scorer | None = None  # the datamodule's, from setup() on
        self._last_step_end: float | None = None  # for target tokens/s between step ends
        self.seed = seed
        # Steps whose loss or gradient is NaN/inf are skipped (no update) and counted; after
        # `max_nonfinite_in_a_row` of them in a row training stops (NonFiniteLossError).
        self.nonfinite = NonFiniteSteps(max_nonfinite_in_a_row)
        self._step_tokens: torch.Tensor | int = 0  # target tokens of the step's batches so far, on the device
        self._step_loss_sum: torch.Tensor | int = 0  # their label-smoothed loss summed, on the device
        # The last step's (loss summed over its tokens, tokens), every process's; whether a batch just ended it.
        self.step_loss: torch.Tensor | None = None
        self._stepped = False
        self._step_loss_finite: torch.Tensor | bool = True  # every batch of the step had a finite loss
        self.compile_model, self.compile_mode = compile_model, compile_mode

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
        checkpoint["nonfinite_steps"] = self.nonfinite.state()
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
        self.nonfinite.load(checkpoint.get("nonfinite_steps", {}))

    # -- training -------------------------------------------------------------------------
    def on_fit_start(self) -> None:
        if self.compile_model:
            self.compile_transformer(**compile_options(self.compile_mode))

    def compile_transformer(self, **options: Any) -> None:
        """Compile the Transformer's forward (teacher forcing) with ``torch.compile(**options)``,
        in place: parameter names and checkpoints stay as they are; beam search keeps running
        eagerly. Batches of new shapes recompile until torch marks the lengths dynamic."""
        if getattr(self.model, "_compiled_call_impl", None) is None:
            self.model.compile(**options)

    def summed_loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The label-smoothed loss of one teacher-forced batch summed over its non-padding target
        tokens, and the number of those tokens (a tensor: nothing is read back)."""
        logits = self.model(batch["src"], batch["tgt_in"])
        loss_sum, _, n_tokens = label_smoothed_loss(logits, batch["tgt_out"], self.label_smoothing, self.pad_id,
                                                    fused=self.fused_loss)
        return loss_sum, n_tokens

    def training_loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """The loss of a step of this one batch: per non-padding target token, and their number."""
        loss_sum, n_tokens = self.summed_loss(batch)
        return loss_sum / n_tokens, n_tokens

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # Dropout draws from a generator seeded by (seed, epoch, the batch's place in the epoch's order:
        # rank r of P trains places r, r + P, ..., aiayn.data.batching), as fairseq seeds each update: a
        # resumed run repeats the uninterrupted one exactly, on any number of processes (not the rank's).
        place = batch_idx * self.trainer.world_size + self.global_rank
        state = np.random.SeedSequence([self.seed, self.current_epoch, place])
        torch.manual_seed(int(state.generate_state(1, np.uint64)[0]))
        logged_step.align(self.trainer)  # this step's rows at this step, in a resumed run too
        if self.compile_model and self.compile_mode in CUDA_GRAPH_MODES:
            torch.compiler.cudagraph_mark_step_begin()  # the last step's graph outputs are no longer read

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> dict[str, torch.Tensor]:
        # The loss summed over this batch's target tokens, in a unit fixed for the whole run (the
        # plan's batch), so that its size stays that of a per-token mean (fp16's loss scale);
        # on_before_optimizer_step turns the step's gradient into the mean over all its tokens.
        loss_sum, n_tokens = self.summed_loss(batch)
        self._step_tokens = self._step_tokens + n_tokens
        self._step_loss_sum = loss_sum.detach() + self._step_loss_sum
        self._step_loss_finite = torch.isfinite(loss_sum.detach() / n_tokens) & self._step_loss_finite
        return {"loss": loss_sum / self._loss_unit()}

    def _loss_unit(self) -> float:
        """The run's constant divisor of a batch's summed loss: the plan's tokens a batch."""
        tokens = getattr(getattr(self._trainer, "datamodule", None), "max_tokens", None)
        return float(tokens) if isinstance(tokens, int) and tokens > 0 else 1.0

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not self._stepped:
            return  # a batch accumulated into a step still to come
        self._stepped = False
        now = time.perf_counter()
        if self._last_step_end is not None:  # the step's tokens stay on the device until logged
            self.log("train/tgt_tokens_per_sec", self.step_loss[1] / (now - self._last_step_end), on_step=True)
        self._last_step_end = now

    def on_train_epoch_start(self) -> None:
        self._last_step_end = None  # the gap across validation/epoch ends is not training time

    def on_validation_end(self) -> None:  # the next step's time starts here, as its progress line's does
        self._last_step_end = time.perf_counter() if self._last_step_end is not None else None

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        loss_sum, tokens, loss_finite = self._step_loss_sum, self._step_tokens, self._step_loss_finite
        self._step_loss_sum, self._step_tokens, self._step_loss_finite = 0, 0, True
        # The step's loss summed over its tokens and their number, every process's (one collective
        # of two numbers; the host does not wait): the step's train/loss, its gradient's divisor,
        # and what the progress line (aiayn.training.progress.ProgressLog) adds up.
        device = grads[0].device if grads else self.device
        step = torch.stack([torch.as_tensor(each, device=device).to(torch.float32) for each in (loss_sum, tokens)])
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(step)
        self.step_loss, self._stepped = step, True
        self.log("train/loss", step[0] / step[1], on_step=True, prog_bar=True)
        # A host tensor: a number logged as such would be copied to the device, which waits for it.
        self.log("train/lr", torch.tensor(float(optimizer.param_groups[0]["lr"])), on_step=True, prog_bar=True)
        if not grads:
            return
        # The gradient summed over the step's tokens, per token: Lightning divided each batch's
        # loss by the accumulation and DDP averaged the processes' gradients.
        tokens = step[1]
        processes = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        torch._foreach_mul_(grads, self.trainer.accumulate_grad_batches * processes * self._loss_unit() / tokens)
        grad_norm = torch.nn.utils.get_total_norm(grads)
        scaler = getattr(self.trainer.precision_plugin, "scaler", None)  # fp16 (16-mixed on a GPU without bf16)
        if scaler is not None:
            # An overflow is the loss scale's, not the model's: the scaler skips the update and halves
            # the scale, as dynamic loss scaling does. Only a non-finite loss counts as the model's.
            self.log("train/loss_scale", float(scaler.get_scale()), on_step=True)
            bad = ~torch.as_tensor(loss_finite, device=grad_norm.device)
            if not _fused(optimizer):  # its gradients are unscaled by now (with fused Adam, in its step)
                self.log("train/grad_norm", grad_norm, on_step=True)
        else:
            # Gradients are all-reduced already: every process finds the same.
            bad = ~torch.isfinite(grad_norm)
            if _fused(optimizer):
                optimizer.found_inf = bad.to(torch.float32)  # fused Adam skips the update on the device
            elif bad.item():  # plain Adam: leaves parameters without a gradient untouched
                for parameter in self.parameters():
                    parameter.grad = None
            self.log("train/grad_norm", grad_norm, on_step=True)
        skipped = self.nonfinite.count(bad, ~torch.as_tensor(loss_finite, device=bad.device))
        self.log("train/skipped_steps", skipped.to(torch.float32), on_step=True)
        step = self.global_step + 1  # the step being taken
        if step % max(1, self.trainer.log_every_n_steps) == 0:  # where Lightning reads its logged values back
            self.nonfinite.read(step, self.trainer.save_checkpoint, self.trainer.default_root_dir)

    def on_train_end(self) -> None:  # the counts as they ended, for the summary and the last checkpoint
        self.nonfinite.read(self.global_step, self.trainer.save_checkpoint, self.trainer.default_root_dir)

    def configure_optimizers(self) -> dict[str, Any]:
        # §5.3: Adam with β1 = 0.9, β2 = 0.98, ε = 1e-9; lr = 1.0 scaled by the schedule.
        # optim.fused (the default): torch's fused Adam (one kernel for all parameters), same update.
        optimizer = torch.optim.Adam(self.parameters(), lr=1.0, betas=tuple(self.optim["betas"]),
                                     eps=self.optim["eps"], fused=bool(self.optim.get("fused", True)))
        scheduler = transformer_scheduler(optimizer, self.model.d_model, self.optim["warmup_steps"],
                                          self.optim.get("lr_factor", 1.0), rate_of(self.optim.get("schedule")),
                                          self.optim.get("train_steps"))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # -- evaluation -----------------------------------------------------------------------
    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, bleu_sentences=self.bleu_sentences)

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._evaluate(batch, bleu_sentences=None)

    def _start_evaluation(self) -> None:
        """Each evaluation starts from nothing: under ddp_spawn the test's ranks start from the
        launching process's module, whose sums held the last validation's (before: the test's loss
        and perplexity were those of the test and that validation together)."""
        for metric in (self.eval_loss, self.eval_nll):
            metric.reset()
        self.hypotheses = []

    on_validation_epoch_start = on_test_epoch_start = _start_evaluation

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
        loss_sum, nll_sum, n_tokens = label_smoothed_loss(logits, batch["tgt_out"], self.label_smoothing, self.pad_id)
        self.eval_loss.update(loss_sum / n_tokens, n_tokens)
        self.eval_nll.update(nll_sum / n_tokens, n_tokens)
        selected = torch.ones_like(batch["index"], dtype=torch.bool)
        if bleu_sentences is not None:
            selected = batch["index"] < bleu_sentences
        if selected.any():
            if self._search is None:  # the task's output constraint, where decoding asks for one, is built once
                data = self.trainer.datamodule
                constraint = data.output_constraint(data.vocab)
                self._search = Search(self.decoding, data.vocab, constraint).fitting(self.model)
                self._decoder = data.raw_text(data.vocab, constraint) or data.vocab
            texts = self._decoder.decode(self._search.best(self.model, batch["src"][selected]))
            self.hypotheses.extend(zip(batch["index"][selected].tolist(), texts))

    def _log_evaluation(self, stage: str) -> None:
        loss, nll = self.eval_loss.compute(), self.eval_nll.compute()
        self.eval_loss.reset()
        self.eval_nll.reset()
        # The step evaluated, not Lightning's count of the steps before it (aiayn.training.logged_step).
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
        if stage == "test":  # the sentences scored (trainer.limit_test_batches may leave some out): summary.json
            self.log("test/sentences", float(len(indices)))
        log.info("%s %s", stage, self.scorer.describe(scores, len(indices)))


def _fused(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` is torch's fused Adam, which takes ``found_inf`` (skips on the device)."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


def _gather(pairs: list[tuple[int, str]]) -> dict[int, str]:
    """Every rank's (index, hypothesis) pairs, on every rank."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        gathered: list[list[tuple[int, str]]] = [[] for _ in range(dist.get_world_size())]
        dist.all_gather_object(gathered, pairs)
        pairs = [pair for part in gathered for pair in part]
    return dict(pairs)
