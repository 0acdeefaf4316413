"""What a resumed run may change and what it may not: speed switches and the length go on, the
recipe is refused (aiayn.checkpoints.resume.config_differences), and within an epoch the settings
that cut it into batches or end it are refused, at an epoch's start said in one line."""

from __future__ import annotations

import pytest
import torch

from aiayn.checkpoints.resume import _resume
from aiayn.errors import ConfigError


def test_speed_switches_and_steps_may_change_on_resume_but_the_recipe_may_not() -> None:
    from aiayn.checkpoints.resume import config_differences

    old = {"seed": 1, "optim": {"betas": [0.9, 0.98], "lr_factor": 1.0, "train_steps": 10},  # before the switches
           "model": {"d_model": 512}, "loss": {"label_smoothing": 0.1}, "width_divisor": 1}
    saved = {"hyper_parameters": {"run_config": old}}
    faster = {"seed": 1, "optim": {"betas": [0.9, 0.98], "lr_factor": 1.0, "fused": True, "train_steps": 20},
              "model": {"d_model": 512, "attention": "explicit"}, "loss": {"label_smoothing": 0.1},
              "width_divisor": 1, "compile": True, "trainer": {"max_steps": 20, "val_check_interval": 5}}
    assert config_differences(saved, faster) == []
    changed = {**faster, "optim": {**faster["optim"], "lr_factor": 2.0}, "model": {**faster["model"], "d_model": 256},
               "loss": {"label_smoothing": 0.0}, "width_divisor": 2}
    assert config_differences(saved, changed) == [
        "model.d_model: 512 → 256",
        "width_divisor: 1 → 2",
        "loss.label_smoothing: 0.1 → 0.0",
        "optim.lr_factor: 1.0 → 2.0",
    ]


def test_the_steps_tokens_and_gradient_clipping_may_not_change_on_resume() -> None:
    """A step of other tokens (another process count or accumulation without optim.tokens_per_step,
    trainer.accumulate_grad_batches by hand) or clipping switched on is another recipe (before: resumed
    without a word); any layout of the same step's tokens is the same recipe."""
    from aiayn.checkpoints.resume import config_differences

    old = {"seed": 1, "optim": {"lr_factor": 1.0}, "plan": {"tokens_per_batch": 1024, "tokens_per_step": 1024},
           "trainer": {"gradient_clip_val": None, "gradient_clip_algorithm": None}}
    saved = {"hyper_parameters": {"run_config": old}}
    two_processes = {**old, "plan": {"tokens_per_batch": 1024, "tokens_per_step": 2048, "processes": 2}}
    clipped = {**old, "trainer": {"gradient_clip_val": 1.0, "gradient_clip_algorithm": None}}
    assert config_differences(saved, two_processes) == [
        ("plan.tokens_per_step: 1024 → 2048 (the checkpoint's step is 1 batch of 1024 tokens, which 1 process trains, "
         "not this run's 2: to go on from it, give trainer.devices=1 task.datamodule.max_tokens=1024)")]
    assert config_differences(saved, clipped) == ["trainer.gradient_clip_val: None → 1.0"]
    same_step = {**old, "plan": {"tokens_per_batch": 1024, "tokens_per_step": 1024, "processes": 2, "accumulate": 1}}
    assert config_differences(saved, same_step) == []
    # A checkpoint whose config holds neither (written before they were compared) resumes as before.
    earlier = {"seed": 1, "optim": {"lr_factor": 1.0}, "plan": {"tokens_per_batch": 1024}}
    assert config_differences({"hyper_parameters": {"run_config": earlier}},
                              two_processes | {"trainer": {"gradient_clip_val": 1.0}}) == []


def test_a_checkpoint_of_the_same_step_set_per_process_resumes_under_the_recipe_that_sets_it() -> None:
    """The default job and the Multi30k scales set no optim.tokens_per_step before 2026-12-02 (one 1,024-token batch a
    process): a run of theirs resumes under the recipe that now sets the 1,024 its one process took; one that took
    another step (two processes: 2,048) is another recipe, said."""
    from aiayn.checkpoints.resume import config_differences

    old = {"seed": 1, "optim": {"lr_factor": 0.5, "tokens_per_step": None},
           "plan": {"tokens_per_batch": 1024, "tokens_per_step": 1024}}
    now = {**old, "optim": {"lr_factor": 0.5, "tokens_per_step": 1024}}
    assert config_differences({"hyper_parameters": {"run_config": old}}, now) == []
    two = {**old, "plan": {"tokens_per_batch": 1024, "tokens_per_step": 2048, "processes": 2}}
    on_two = {**now, "plan": {"tokens_per_batch": 512, "tokens_per_step": 1024, "processes": 2}}
    refused = config_differences({"hyper_parameters": {"run_config": two}}, on_two)
    assert refused[:2] == ["plan.tokens_per_batch: 1024 → 512", "optim.tokens_per_step: None → 1024"]
    assert refused[-1].endswith("give optim.tokens_per_step=null task.datamodule.max_tokens=1024)")  # what resumes it


def test_within_an_epoch_the_settings_that_cut_it_into_batches_may_not_change(tiny_run, caplog) -> None:
    """Length buckets or another epoch length mid-epoch: the rest of the epoch would be other batches
    (some sentences trained twice, others never); another data seed, another order of every epoch
    (before: each gone on with without a word). At an epoch's start the batching may change, said."""
    saved = torch.load(tiny_run.last, map_location="cpu", weights_only=False)
    config = saved["hyper_parameters"]["run_config"]
    data = config["task"]["datamodule"]
    buckets = {**config, "task": {**config["task"], "datamodule": {**data, "length_buckets": [16, 32, 64, 129]}}}
    longer = {**config, "trainer": {**config["trainer"], "limit_train_batches": 9}}
    for changed, said in ((buckets, "task.datamodule.length_buckets: None → [16, 32, 64, 129]"),
                          (longer, "trainer.limit_train_batches: None → 9")):
        with pytest.raises(ConfigError) as refused:
            _resume(tiny_run.last, tiny_run.run_dir, saved, changed)
        assert str(refused.value) == (
            f"{tiny_run.last} stopped 4 batches into epoch 0, and {said} would make the rest of that epoch other "
            "batches than its run's; resume with the checkpoint's value, or start a fresh run with resume=null in a "
            "folder of its own")
    reseeded = {**config, "task": {**config["task"], "datamodule": {**data, "seed": 99}}}
    with pytest.raises(ConfigError, match=r"trained with other settings than this run: task.datamodule.seed: 1234 → 99;"):
        _resume(tiny_run.last, tiny_run.run_dir, saved, reseeded)
    at_start = {**saved, "Multi30kDataModule": {**saved["Multi30kDataModule"], "epoch": 1, "epoch_batches": 0}}
    with caplog.at_level("WARNING", logger="aiayn.checkpoints.resume"):
        assert _resume(tiny_run.last, tiny_run.run_dir, at_start, buckets).checkpoint == tiny_run.last
    assert "goes on with: task.datamodule.length_buckets: None → [16, 32, 64, 129]" in caplog.text
