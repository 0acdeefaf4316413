"""A run resumed on another number of processes, whose plan cannot take the checkpoint's batches or
steps, is refused with what can: the process counts that train the checkpoint's steps and the exact
overrides. Each test follows the refusal's words literally and sees the run go on from the
checkpoint with the checkpoint's batches (before: one process → two was told "give
task.datamodule.max_tokens=1024", which the two processes refused again, each process's batch being
its share of the step; a step of other tokens was told "give optim.tokens_per_step=…", which changed
optim and was refused again).

Each run is a real process (DDP needs them, and the refusal is an exit status and a line): the tiny
model, 2 steps trained, resumed for a third."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests.helpers.runs import TINY, TWO_CORES, offline_environment, train

pytestmark = [pytest.mark.cli, pytest.mark.slow, TWO_CORES]  # each case runs two CPU processes once

RUN = [*TINY, "logger=none", "visualize_at_end=false", "test_after_training=false", "trainer.limit_val_batches=1",
       "trainer.enable_progress_bar=false", "optim.train_steps=2"]
ONE_MORE_STEP = ["optim.train_steps=3", "resume=auto"]

CASES = {
    # (trained with, resumed with, the overrides the refusal gives, the resumed plan: processes × accumulated × batch)
    # 1 → 2 (as 1 → 8 GPUs: each process's share of the step is half the checkpoint's batch): only 1 process trains it
    "one process to two": (["optim.tokens_per_step=1024"], ["optim.tokens_per_step=1024", "hardware=cpu2_ddp"],
                           ["trainer.devices=1", "task.datamodule.max_tokens=1024"], (1, 1, 1024)),
    # 2 → 1: one process accumulates the checkpoint's two batches
    "two processes to one": (["optim.tokens_per_step=1024", "hardware=cpu2_ddp"], ["optim.tokens_per_step=1024"],
                             ["task.datamodule.max_tokens=512"], (1, 2, 512)),
    # 1 × 4 accumulated → 2 processes, resumed with batches of the default 1,024: two accumulate two each
    "one process accumulating to two": (
        ["optim.tokens_per_step=2048", "task.datamodule.max_tokens=512"],
        ["optim.tokens_per_step=2048", "hardware=cpu2_ddp"], ["task.datamodule.max_tokens=512"], (2, 2, 512)),
    # No optim.tokens_per_step (debug=tiny's): the step is the processes' batches, which another count changes
    "a step of one process's batch on two": ([], ["hardware=cpu2_ddp"],
                                             ["trainer.devices=1", "task.datamodule.max_tokens=1024"], (1, 1, 1024)),
    "a step of two processes' batches on one": (["hardware=cpu2_ddp"], [],
                                                ["task.datamodule.max_tokens=1024", "trainer.accumulate_grad_batches=2"],
                                                (1, 2, 1024)),
}


def _follow(command: list[str], overrides: list[str]) -> list[str]:
    """``command`` with each of ``overrides`` in place of the setting of its name, or added: as one types them."""
    command = list(command)
    for override in overrides:
        key = override.split("=", 1)[0] + "="
        given = [index for index, each in enumerate(command) if each.startswith(key)]
        if given:
            command[given[-1]] = override
        else:
            command.append(override)
    return command


@pytest.mark.parametrize("case", list(CASES))
def test_a_resume_refused_for_its_layout_says_what_trains_the_checkpoint_and_that_resumes(
        case: str, tmp_path: Path, data_root: Path, subword_cache: Path) -> None:
    trained_with, resumed_with, overrides, resumed_plan = CASES[case]
    env = {**offline_environment(), "AIAYN_DATA_ROOT": str(data_root), "AIAYN_CACHE_DIR": str(subword_cache),
           "OMP_NUM_THREADS": "1"}
    run = tmp_path / "run"
    train(run, *RUN, *trained_with, env=env, timeout=300)
    command = [*RUN, *resumed_with, *ONE_MORE_STEP]
    refused = train(run, *command, env=env, check=False, timeout=300)
    assert refused.returncode == 2, refused.stderr[-3000:]
    message = refused.stderr.strip().splitlines()[-1]
    assert message.startswith("train.py: ") and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    given = re.search(r"give ([^);]*)\)", message)
    assert given is not None, message
    hint = [word for word in given.group(1).split() if "=" in word]  # the settings it says to give, word for word

    resumed = train(run, *_follow(command, hint), env=env, check=False, timeout=300)
    assert resumed.returncode == 0, f"following {message!r}:\n{resumed.stderr[-3000:]}"
    assert hint == overrides, message
    assert f"resuming from {run / 'checkpoints' / 'step0000002.ckpt'} (step 2)" in resumed.stdout + resumed.stderr
    checkpoints = {name: torch.load(run / "checkpoints" / name, map_location="cpu", weights_only=False)
                   for name in ("step0000002.ckpt", "step0000003.ckpt")}
    plans = {name: state["hyper_parameters"]["run_config"]["plan"] for name, state in checkpoints.items()}
    assert checkpoints["step0000003.ckpt"]["global_step"] == 3
    assert (plans["step0000003.ckpt"]["processes"], plans["step0000003.ckpt"]["trainer"]["accumulate_grad_batches"],
            plans["step0000003.ckpt"]["tokens_per_batch"]) == resumed_plan
    for key in ("tokens_per_batch", "tokens_per_step"):  # the checkpoint's batches and steps, as the hint promised
        assert plans["step0000003.ckpt"][key] == plans["step0000002.ckpt"][key], key
