"""A training run killed with SIGKILL mid-epoch and resumed with resume=auto goes on exactly as
the uninterrupted run: the same loss at every later step, one W&B run; checkpoints are written
atomically, so a kill during a save leaves the newest one whole."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from aiayn.checkpoints.averaging import average_checkpoints
from aiayn.checkpoints.background import AtomicCheckpointIO
from aiayn.checkpoints.io import list_checkpoints
from aiayn.checkpoints.resume import find_resume, newest_checkpoint
from aiayn.errors import ConfigError
from tests.helpers.runs import REPO, TINY_MODEL, popen, run_command
from tests.helpers.wandb_offline import read_run

# 12 batches an epoch, a checkpoint every 5 steps, validation at each epoch's end: a run of 30
# steps crosses two epoch ends, and a kill after step 15 lands mid-epoch (epoch 1, batch 3).
RUN = [
    *TINY_MODEL, "model.dropout=0.3", "task.datamodule.max_tokens=512", "decoding.max_len_offset=5",
    "optim.warmup_steps=10", "optim.train_steps=30", "trainer.limit_train_batches=12", "trainer.val_check_interval=12",
    "trainer.limit_val_batches=1", "trainer.limit_test_batches=1", "trainer.num_sanity_val_steps=0",
    "checkpoint.every_n_train_steps=5", "visualize_at_end=false",
    "logger=wandb", "run_name=resume-test",
]


def _command(run_dir: Path, *overrides: str) -> list[str]:
    return [sys.executable, "src/train.py", *RUN, f"hydra.run.dir={run_dir}", *overrides]


@pytest.fixture(scope="module")
def environment(tmp_path_factory: pytest.TempPathFactory, data_root: Path, subword_cache: Path) -> dict[str, str]:
    home = tmp_path_factory.mktemp("home")  # no ~/.netrc: W&B runs offline
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    return {**env, "HOME": str(home), "WANDB_SILENT": "true", "AIAYN_DATA_ROOT": str(data_root),
            "AIAYN_CACHE_DIR": str(subword_cache), "OMP_NUM_THREADS": "1"}


def _run(command: list[str], env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess:
    return run_command(command, env=env, check=check)


def _losses(run_file: Path) -> dict[int, float]:
    history = read_run(run_file, strict=False).history
    return {int(row["trainer/global_step"]): row["train/loss"] for row in history if "train/loss" in row}


@pytest.mark.cli
@pytest.mark.slow
def test_sigkill_mid_epoch_then_resume_repeats_the_uninterrupted_run(tmp_path: Path, environment) -> None:
    whole = tmp_path / "whole"
    _run(_command(whole), environment)
    expected = _losses(whole)
    assert sorted(expected) == list(range(30)), "one loss per step (logged at steps 0..29)"

    killed = tmp_path / "killed"
    process = popen(_command(killed), cwd=REPO, env=environment,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not (killed / "checkpoints" / "step0000015.ckpt").exists():
        assert process.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline, "no checkpoint at step 15 within 5 minutes"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL
    newest = newest_checkpoint(killed)
    stopped_at = torch.load(newest, map_location="cpu", weights_only=False)["global_step"]
    assert 15 <= stopped_at < 30 and stopped_at % 12 != 0, "killed mid-epoch, after step 15"

    resumed = _run(_command(killed, "resume=auto"), environment)
    assert "test test_2016_flickr:" in resumed.stdout

    runs = sorted((killed / "wandb").glob("offline-run-*"))
    assert len(runs) == 2, "the first attempt and the resumed one"
    second = read_run(runs[1], strict=False)
    assert {r.name.rsplit("-", 1)[1] for r in runs} == {second.run_id}, "one W&B run, continued"
    # The killed attempt's own .wandb file may hold few of its steps or none (W&B writes it in 32 KiB
    # blocks and every 15 s): the resumed attempt logs again what it lacks, and no step twice.
    before, after = _losses(runs[0]), _losses(runs[1])
    assert not before.keys() & after.keys() and sorted(before | after) == list(range(30))
    assert set(range(stopped_at, 30)) <= after.keys()
    for step, loss in (before | after).items():  # same data order, dropout draws, learning rate and optimizer state
        assert loss == expected[step], f"step {step}: {loss} after resuming, {expected[step]} without"
    assert second.exit_code == 0 and "test/bleu" in second.summary
    # The run summary (aiayn.reporting.summary) counts on across the kill: tokens seen and
    # training FLOPs come out as without it, and the training time adds up both attempts.
    whole_summary = json.loads((whole / "summary.json").read_text())
    resumed_summary = json.loads((killed / "summary.json").read_text())
    for key in ("steps", "tokens_seen", "src_tokens_seen", "train_flops", "dev/ppl", "dev/step"):
        assert resumed_summary[key] == whole_summary[key], key
    assert resumed_summary["train_flops"] > 0 and resumed_summary["training_time_s"] > 0
    assert second.summary["tokens_seen"] == whole_summary["tokens_seen"]


@pytest.mark.cli
@pytest.mark.slow
def test_resume_auto_without_a_checkpoint_starts_afresh_and_a_changed_model_is_refused(tmp_path: Path, environment) -> None:
    config = {"seed": 1, "model": {"d_model": 32}}
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    assert find_resume("auto", fresh, config, multirun=False) is None
    assert find_resume(None, tmp_path, config, multirun=False) is None

    run_dir = tmp_path / "run"
    _run(_command(run_dir, "optim.train_steps=5", "logger=none"), environment)
    result = _run(_command(run_dir, "resume=auto", "model.d_model=64", "model.d_k=32", "logger=none"), environment,
                  check=False)
    assert result.returncode == 2
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("train.py: ") and "model.d_model: 32 → 64" in message and "resume=null" in message
    assert "Traceback" not in result.stderr


_SAVER = """
import sys, torch
from aiayn.checkpoints.averaging import average_checkpoints
from aiayn.checkpoints.background import AtomicCheckpointIO
from aiayn.checkpoints.io import list_checkpoints
io = AtomicCheckpointIO()
big = {"state_dict": {"w": torch.zeros(64 * 2**20)}, "optimizer_states": [], "global_step": 2}
print("saving", flush=True)
while True:  # until killed: each save replaces the file
    io.save_checkpoint(big, sys.argv[1])
"""


@pytest.mark.cli
def test_kill_during_save_leaves_the_newest_checkpoint_whole(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    target = folder / "step0000002.ckpt"
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(3)}, "optimizer_states": [],
                                          "global_step": 1}, target)
    saver = tmp_path / "saver.py"
    saver.write_text(_SAVER)
    # A process of its own, started from the preloaded interpreter (tests/helpers/preloaded.py).
    process = popen([sys.executable, str(saver), str(target)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "saving"
    deadline = time.monotonic() + 120
    while not any(p.stat().st_size > 2**20 for p in folder.glob(".*.tmp") if p.exists()):
        assert time.monotonic() < deadline and process.poll() is None
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)  # mid-write: the temporary file is over 1 MiB of 256 MiB
    process.wait()
    assert list(folder.glob(".*.tmp")), "the kill did land during a save"
    saved = torch.load(target, weights_only=False)  # the previous checkpoint, whole
    assert saved["global_step"] == 1 and torch.equal(saved["state_dict"]["w"], torch.ones(3))
    assert newest_checkpoint(tmp_path) == target


def test_newest_checkpoint_skips_a_truncated_file(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoints"
    io = AtomicCheckpointIO()
    for step in (5, 10):
        io.save_checkpoint({"state_dict": {"w": torch.full((1000,), float(step))}, "optimizer_states": [],
                            "global_step": step}, folder / f"step{step:07d}.ckpt")
    newest = folder / "step0000010.ckpt"
    newest.write_bytes(newest.read_bytes()[:2000])  # e.g. a copy that was cut short
    assert newest_checkpoint(tmp_path) == folder / "step0000005.ckpt"


def test_a_checkpoint_its_run_went_on_from_or_past_the_runs_steps_is_refused(tiny_run, tmp_path: Path) -> None:
    """resume= an older step of a run that went on (before: trained on in the run's folder, writing a
    second history over the first: its summary, its later checkpoints); a run shorter than the
    checkpoint's step (before: the plan said 2 steps and the step-4 model was tested)."""
    config = torch.load(tiny_run.last, map_location="cpu", weights_only=False)["hyper_parameters"]["run_config"]
    older = tiny_run.checkpoints / "step0000003.ckpt"
    with pytest.raises(ConfigError) as refused:
        find_resume(str(older), tmp_path / "attempt", config, multirun=False)
    assert str(refused.value).startswith(
        f"resume={older}: its run went on past step 3 to step 4 (step0000004.ckpt), and going on from step 3 in its "
        f"folder would write over that history; to train on from step 3 apart, copy {tiny_run.run_dir} without its "
        f"checkpoints after step 3 and resume=<the copy>, or start a new run from its weights with init_from={older}")
    shorter = {**config, "optim": {**config["optim"], "train_steps": 2}}
    with pytest.raises(ConfigError) as refused:
        find_resume(str(tiny_run.run_dir), tmp_path / "attempt", shorter, multirun=False)
    assert "is at step 4, past this run's optim.train_steps=2: a run cannot train back" in str(refused.value)
    found = find_resume(str(tiny_run.run_dir), tmp_path / "attempt", config, multirun=False)  # the newest: goes on
    assert found is not None and found.checkpoint.name == "step0000004.ckpt"


def test_resume_auto_looks_through_the_earlier_runs_of_its_run_name_only(tiny_run, tmp_path: Path) -> None:
    """outputs/<run name>/<date>_<time>: a new folder of the same run name goes on from the newest
    earlier one with the same settings; a folder named by hand (a table row's) is its run's only one."""
    config = torch.load(tiny_run.last, map_location="cpu", weights_only=False)["hyper_parameters"]["run_config"]
    earlier = tmp_path / "outputs" / "run" / "2026-01-01_00-00-00"
    shutil.copytree(tiny_run.checkpoints, earlier / "checkpoints")
    found = find_resume("auto", tmp_path / "outputs" / "run" / "2026-01-02_09-30-00-2", config, multirun=False)
    assert found is not None and found.run_dir == earlier and found.checkpoint.name == "step0000004.ckpt"
    rows = tmp_path / "table"
    shutil.copytree(tiny_run.checkpoints, rows / "first" / "checkpoints")
    assert find_resume("auto", rows / "second", config, multirun=False) is None


def test_a_sweep_job_resumes_the_earlier_job_of_its_own_overrides_whatever_its_number(
        tiny_run, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """multirun/<date>/<n>_<row>: a sweep run again with a job added before (numbers shifted) finds
    each job's earlier run by its overrides, not by its folder's name (before: job #1 took #1's folder,
    another job's run of the same network, beam 4 for beam 1). A setting resume does not compare
    (decoding) changed since is said in one line as the run goes on (before: without a word)."""
    config = torch.load(tiny_run.last, map_location="cpu", weights_only=False)["hyper_parameters"]["run_config"]
    earlier = tmp_path / "multirun" / "2026-01-01_00-00-00"
    for number, beam in enumerate((1, 4)):  # the earlier sweep: decoding.beam_size=1,4
        shutil.copytree(tiny_run.checkpoints, earlier / f"{number}_row" / "checkpoints")
        (earlier / f"{number}_row" / ".hydra").mkdir()
        (earlier / f"{number}_row" / ".hydra" / "overrides.yaml").write_text(
            f"- debug=tiny\n- decoding.beam_size={beam}\n- logger=csv\n")
    later = tmp_path / "multirun" / "2026-01-02_00-00-00" / "1_row"  # seed=2 added before: job #0
    job = ["debug=tiny", "decoding.beam_size=1", "resume=auto", "logger=none"]
    found = find_resume("auto", later, config, multirun=True, job=job, left_out=["resume", "logger"])
    assert found is not None and found.run_dir == earlier / "0_row"
    assert find_resume("auto", later, config, multirun=True, job=[*job, "seed=3"], left_out=["resume", "logger"]) is None
    # (and another dev split: before, its figures went on in the run's dev figures without a word)
    task = config["task"]
    wider = {**config, "decoding": {**config["decoding"], "beam_size": 7},
             "task": {**task, "datamodule": {**task["datamodule"], "val_split": "test_2016_flickr"}}}
    with caplog.at_level("WARNING", logger="aiayn.checkpoints.resume"):
        find_resume("auto", later, wider, multirun=True, job=job, left_out=["resume", "logger"])
    [said] = [record.getMessage() for record in caplog.records if record.levelname == "WARNING"]
    assert said == (f"resuming {earlier / '0_row'} with settings other than its run's that a resumed run may change, "
                    f"and this one goes on with: decoding.beam_size: {config['decoding']['beam_size']} → 7; "
                    "task.datamodule.val_split: 'val' → 'test_2016_flickr'")


def test_a_sweep_job_asked_to_train_longer_resumes_its_earlier_job_trained_furthest(tiny_run, tmp_path: Path) -> None:
    """A sweep extended with resume=auto optim.train_steps=N: each job goes on from its earlier job,
    whose folder's name held the shorter length (before: none matched, and every job trained again
    from scratch in a new folder). Its very overrides come first; of the jobs that differ in length
    alone, the one trained furthest; one trained past the asked steps is another job, not resumed."""
    config = torch.load(tiny_run.last, map_location="cpu", weights_only=False)["hyper_parameters"]["run_config"]
    earlier = tmp_path / "multirun" / "2026-01-01_00-00-00"
    for number, steps in enumerate((2, 4)):  # the earlier sweep: optim.train_steps=2,4
        folder = earlier / f"{number}_optim.train_steps={steps}"
        shutil.copytree(tiny_run.checkpoints, folder / "checkpoints",  # its steps up to ``steps``
                        ignore=lambda _, names, steps=steps: [n for n in names if not n.startswith("step")
                                                               or int(re.sub(r"\D", "", n)) > steps])
        (folder / ".hydra").mkdir()
        (folder / ".hydra" / "overrides.yaml").write_text(f"- debug=tiny\n- optim.train_steps={steps}\n")
    later = tmp_path / "multirun" / "2026-01-02_00-00-00"
    left_out = ["resume", "logger"]

    def resumed(steps: int | None) -> Path | None:
        job = ["debug=tiny", "resume=auto", *([f"optim.train_steps={steps}"] if steps else [])]
        found = find_resume("auto", later / "0_job", {**config, "optim": {**config["optim"], "train_steps": steps or 4}},
                            multirun=True, job=job, left_out=left_out)
        return found and found.run_dir

    assert resumed(8) == earlier / "1_optim.train_steps=4"  # of steps 2 and 4, the furthest
    assert resumed(None) == earlier / "1_optim.train_steps=4"  # the length left to its default (4)
    assert resumed(2) == earlier / "0_optim.train_steps=2"  # its very overrides
    assert resumed(3) == earlier / "0_optim.train_steps=2"  # step 4 is past 3: the job at step 2
    assert find_resume("auto", later / "0_job", config, multirun=True, job=["debug=tiny", "seed=3"],
                       left_out=left_out) is None  # another setting: another job


def test_an_averaged_checkpoint_is_refused_as_a_state_to_resume_from(tiny_run, tmp_path: Path) -> None:
    """average.py's file holds the averaged weights beside the newest member's Adam state: a run
    resumed from it went on with the two mismatched (before: accepted, "resuming from … (step 4)")."""
    config = torch.load(tiny_run.last, map_location="cpu", weights_only=False)["hyper_parameters"]["run_config"]
    averaged = tmp_path / "avg.ckpt"
    torch.save(average_checkpoints(path for _, path in list_checkpoints(tiny_run.run_dir)[-2:]), averaged)
    with pytest.raises(ConfigError, match=rf"^resume={re.escape(str(averaged))}: .* is the average of steps 3–4 "
                                          rf"\(§6\.1\), a model to evaluate.*: init_from={re.escape(str(averaged))}$"):
        find_resume(str(averaged), tmp_path / "run", config, multirun=False)


def _layout(processes: int, accumulate: int, batch: int, tokens_per_step: int | None, nodes: int = 1,
            given_accumulation: int | None = None) -> dict:
    """A run's config as the layout check reads it: its step's settings and its plan."""
    return {"seed": 1, "optim": {"tokens_per_step": tokens_per_step}, "task": {"datamodule": {"max_length": 100}},
            "trainer": {"accumulate_grad_batches": given_accumulation},
            "plan": {"processes": processes, "trainer": {"accumulate_grad_batches": accumulate, "num_nodes": nodes},
                     "tokens_per_batch": batch, "tokens_per_step": processes * accumulate * batch}}


def test_a_refused_layout_names_the_process_counts_that_train_the_checkpoints_steps() -> None:
    """The hint names the process counts whose plan takes the checkpoint's batches and steps, and the overrides for
    the most of them this run allows (before: "give task.datamodule.max_tokens=25000", refused again on 8 GPUs)."""
    from aiayn.checkpoints.resume import config_differences

    def hint(saved: dict, run: dict) -> str:
        return "; ".join(config_differences({"hyper_parameters": {"run_config": saved}}, run))

    assert hint(_layout(1, 1, 25_000, 25_000), _layout(8, 1, 3125, 25_000)) == (  # model=big task=wmt_en_fr, 1 → 8
        "plan.tokens_per_batch: 25000 → 3125 (the checkpoint's step is 1 batch of 25000 tokens, which 1 process "
        "trains, not this run's 8: to go on from it, give trainer.devices=1 task.datamodule.max_tokens=25000)")
    assert hint(_layout(8, 1, 3125, 25_000), _layout(3, 1, 8333, 25_000)).endswith(
        "(the checkpoint's step is 8 batches of 3125 tokens, which 1, 2, 4 or 8 processes train, not this run's 3: "
        "to go on from it, give trainer.devices=2 task.datamodule.max_tokens=3125)")
    # 3 × 8,333 = 24,999 tokens: optim.tokens_per_step=25000 on 1 process would derive 4 batches of 6,250
    assert hint(_layout(3, 1, 8333, 25_000), _layout(1, 1, 25_000, 25_000)).endswith(
        "(the checkpoint's step is 3 batches of 8333 tokens: to train them on this run's 1 process, give "
        "task.datamodule.max_tokens=8333 trainer.accumulate_grad_batches=3)")
    assert hint(_layout(1, 1, 25_000, 25_000), _layout(16, 1, 1562, 25_000, nodes=2)).endswith(
        "give trainer.devices=1 trainer.num_nodes=1 task.datamodule.max_tokens=25000)")
    assert hint(_layout(2, 2, 1024, 4096), _layout(2, 1, 2048, 4096, given_accumulation=1)).endswith(
        "to train them on this run's 2 processes, give task.datamodule.max_tokens=1024 trainer.accumulate_grad_batches=2)")
    # A checkpoint from before its step's tokens were recorded: its processes and accumulation tell them.
    earlier = _layout(1, 1, 25_000, 25_000)
    del earlier["plan"]["tokens_per_step"]
    assert hint(earlier, _layout(8, 1, 3125, 25_000)).endswith("give trainer.devices=1 task.datamodule.max_tokens=25000)")
    assert hint({**_layout(1, 1, 1024, 1024), "plan": {"tokens_per_batch": 1024}}, _layout(2, 1, 512, 1024)) == (
        "plan.tokens_per_batch: 1024 → 512")  # nothing to tell which layouts train it: no hint rather than a wrong one
