"""A training run told to go (SIGTERM, SLURM's SIGUSR1, submitit's SIGUSR2) saves the step it has
reached, finishes its W&B run, requeues its SLURM job and exits with status 75 and one line; the
same command with resume=auto then goes on exactly as the uninterrupted run. In DDP every rank
stops after the same step, whichever process got the signal."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from lightning.fabric.plugins.environments import SLURMEnvironment

from aiayn.cli.naming import CONFIG_DIR
from aiayn.errors import ConfigError
from aiayn.training.preemption import EXIT_STATUS, PreemptionCallback, signal_numbers
from tests.helpers.runs import REPO, TINY_MODEL, TWO_CORES, children, popen, run_command
from tests.helpers.signals import signal_at
from tests.helpers.slurm import SLURM, fake_scontrol
from tests.helpers.wandb_offline import read_run

# As tests/checkpoints/test_resume.py: 12 batches an epoch, a checkpoint every 5 steps, 30 steps.
RUN = [
    *TINY_MODEL, "model.dropout=0.3", "task.datamodule.max_tokens=512", "decoding.max_len_offset=5",
    "optim.warmup_steps=10", "optim.train_steps=30", "trainer.limit_train_batches=12", "trainer.val_check_interval=12",
    "trainer.limit_val_batches=1", "trainer.limit_test_batches=1", "trainer.num_sanity_val_steps=0",
    "checkpoint.every_n_train_steps=5", "visualize_at_end=false",
    "trainer.enable_progress_bar=false", "run_name=preemption-test",
]
LINE = re.compile(r"^train\.py: preempted by (SIG\w+) at step (\d+); saved (\S+); (.*)$")


def _command(run_dir: Path, *overrides: str) -> list[str]:
    return [sys.executable, "src/train.py", *RUN, f"hydra.run.dir={run_dir}", *overrides]


@pytest.fixture(scope="module")
def environment(tmp_path_factory: pytest.TempPathFactory, data_root: Path, subword_cache: Path) -> dict[str, str]:
    home = tmp_path_factory.mktemp("home")  # no ~/.netrc: W&B runs offline
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "SLURM_"))}
    return {**env, "HOME": str(home), "WANDB_SILENT": "true", "AIAYN_DATA_ROOT": str(data_root),
            "AIAYN_CACHE_DIR": str(subword_cache), "OMP_NUM_THREADS": "1"}


def _signal_after(command: list[str], env: dict[str, str], checkpoint: Path, signum: int,
                  victims=lambda process: [process.pid]) -> subprocess.CompletedProcess:
    """Start ``command`` (in a process group of its own), send ``signum`` to ``victims(process)``
    (process ids; minus the group's to signal every process of it) once ``checkpoint`` exists (the
    run is training), and wait for the run to end."""
    process = popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                    start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not checkpoint.exists():
            assert process.poll() is None, f"the run ended before the signal:\n{process.stderr.read()[-3000:]}"
            assert time.monotonic() < deadline, f"no {checkpoint.name} within 5 minutes"
            time.sleep(0.05)
        for pid in victims(process):
            os.kill(pid, signum)
        stdout, stderr = process.communicate(timeout=300)  # a hang fails here
    finally:
        if process.poll() is None:
            process.kill()
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _preempted(result: subprocess.CompletedProcess, signum: int) -> tuple[int, Path, str]:
    """(step, checkpoint, how to go on) from the run's last line on stderr, checked."""
    assert result.returncode == EXIT_STATUS, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    match = LINE.match(result.stderr.strip().splitlines()[-1])
    assert match, result.stderr[-3000:]
    assert match.group(1) == signal.Signals(signum).name
    return int(match.group(2)), Path(match.group(3)), match.group(4)


def _saved_step(checkpoint: Path) -> int:
    return torch.load(checkpoint, map_location="cpu", weights_only=False)["global_step"]


def _losses(run: Path, strict: bool = False) -> dict[int, float]:
    history = read_run(run, strict=strict).history
    return {int(row["trainer/global_step"]): row["train/loss"] for row in history if "train/loss" in row}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, environment) -> tuple[dict[int, float], dict]:
    """The run without a signal: its loss at every step and its run summary."""
    run_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    run_command(_command(run_dir, "logger=wandb"), env=environment)
    losses = _losses(run_dir)
    assert sorted(losses) == list(range(30)), "one loss per step (logged at steps 0..29)"
    return losses, json.loads((run_dir / "summary.json").read_text())


def _check_preempted_then_resumed(run_dir: Path, step: int, checkpoint: Path, environment, uninterrupted) -> None:
    """The preempted attempt saved ``step`` whole and finished its W&B run with every step it
    trained; resume=auto continues the same W&B run, and the two attempts' losses and counts are
    the uninterrupted run's."""
    expected, summary = uninterrupted
    assert checkpoint == run_dir / "checkpoints" / f"step{step:07d}.ckpt" and _saved_step(checkpoint) == step
    assert _saved_step(run_dir / "checkpoints" / "last.ckpt") == step  # a link to it, or the step checkpoints' copy
    first = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(first) == 1
    assert read_run(first[0], strict=True).exit_code == EXIT_STATUS  # a complete file: the run was finished
    before = _losses(first[0], strict=True)
    assert sorted(before) == list(range(step))

    resumed = run_command(_command(run_dir, "logger=wandb", "resume=auto"), env=environment)
    assert "test test_2016_flickr:" in resumed.stdout
    runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and len({r.name.rsplit("-", 1)[1] for r in runs}) == 1, "one W&B run, continued"
    assert read_run(runs[1], strict=False).exit_code == 0
    after = _losses(runs[1])
    assert sorted(after) == list(range(step, 30))
    for at, loss in {**before, **after}.items():  # the same data, dropout, learning rate and Adam state
        assert loss == expected[at], f"step {at}: {loss} with the preemption, {expected[at]} without"
    # The checkpoint holds the other callbacks' state after the step: the counts come out the same.
    resumed_summary = json.loads((run_dir / "summary.json").read_text())
    for key in ("steps", "tokens_seen", "src_tokens_seen", "train_flops", "dev/step", "dev/ppl", "dev/bleu"):
        assert resumed_summary[key] == summary[key], key
    assert summary["dev/step"] == 30, "the last step is validated"


@pytest.mark.cli
@pytest.mark.slow
def test_sigterm_saves_the_step_reached_and_resume_repeats_the_uninterrupted_run(
        tmp_path: Path, environment, uninterrupted) -> None:
    run_dir = tmp_path / "run"
    result = _signal_after(_command(run_dir, "logger=wandb"), environment, run_dir / "checkpoints" / "step0000005.ckpt",
                           signal.SIGTERM)
    step, checkpoint, go_on = _preempted(result, signal.SIGTERM)
    assert 5 <= step < 30
    assert go_on == "continue with the same command and resume=auto"
    _check_preempted_then_resumed(run_dir, step, checkpoint, environment, uninterrupted)


@pytest.mark.cli
@pytest.mark.slow
def test_a_signal_during_a_step_that_is_validated_validates_it_then_saves_it(
        tmp_path: Path, environment, uninterrupted) -> None:
    """Step 12 ends epoch 0 and is followed by a validation: the run validates step 12, then saves
    it and stops (a checkpoint never stands before its step's validation, which a resume would
    skip); the dev point is logged once, and the resumed run goes on as the uninterrupted one."""
    run_dir = tmp_path / "run"
    result = run_command(_command(run_dir, "logger=wandb", *signal_at(12, "SIGUSR2")),
                         env={**environment, "PYTHONPATH": str(REPO)}, check=False)
    step, checkpoint, _ = _preempted(result, signal.SIGUSR2)
    assert step == 12
    history = read_run(next((run_dir / "wandb").glob("offline-run-*")), strict=True).history
    # (W&B gets a validation at the step it validated; before, at Lightning's count of the steps before it: 11)
    assert [row["trainer/global_step"] for row in history if "val/loss" in row] == [12], "step 12 validated"
    _check_preempted_then_resumed(run_dir, step, checkpoint, environment, uninterrupted)
    resumed = read_run(sorted((run_dir / "wandb").glob("offline-run-*"))[1], strict=False).history
    assert [row["trainer/global_step"] for row in resumed if "val/loss" in row] == [24, 30], "the rest, once"


@pytest.mark.cli
def test_a_sigterm_during_the_sanity_check_stops_training_after_its_first_step(tmp_path: Path, environment) -> None:
    """Lightning's own SIGTERM handling would let the step run and end the process with status 0
    and no checkpoint of it."""
    run_dir = tmp_path / "run"
    result = run_command(_command(run_dir, "logger=none", "trainer.num_sanity_val_steps=1", *signal_at(0, "SIGTERM")),
                         env={**environment, "PYTHONPATH": str(REPO)}, check=False)
    step, checkpoint, _ = _preempted(result, signal.SIGTERM)
    assert step == 1 and _saved_step(checkpoint) == 1


@pytest.mark.cli
def test_sigusr1_under_slurm_saves_and_requeues_the_job(tmp_path: Path, environment) -> None:
    """As SLURM does, the signal goes to every process of the job, data loader workers included:
    they leave it to their rank."""
    calls = fake_scontrol(tmp_path / "bin")
    env = {**environment, **SLURM, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{environment['PATH']}"}
    run_dir = tmp_path / "run"
    command = _command(run_dir, "logger=none", "optim.train_steps=1000", "task.datamodule.num_workers=2", "resume=auto")
    result = _signal_after(command, env, run_dir / "checkpoints" / "step0000005.ckpt", signal.SIGUSR1,
                           victims=lambda process: [-process.pid])  # the whole process group
    step, checkpoint, go_on = _preempted(result, signal.SIGUSR1)
    assert _saved_step(checkpoint) == step >= 5
    assert go_on == "SLURM job 4242 requeued: it continues from this checkpoint (resume=auto)"
    assert calls.read_text().splitlines() == ["requeue 4242"], "requeued once"
    assert not list(run_dir.glob("hpc_ckpt_*.ckpt")), "no checkpoint from Lightning's SLURM auto-requeue"


def test_lightning_leaves_sigusr1_and_requeueing_to_it_under_slurm(tmp_path: Path, monkeypatch) -> None:
    """Lightning's SLURM auto-requeue would save hpc_ckpt_<n>.ckpt from inside its SIGUSR1 handler
    (where resume=auto never looks) and requeue the job a second time."""
    for key, value in SLURM.items():
        monkeypatch.setenv(key, value)
    callback = PreemptionCallback(str(tmp_path), [signal.SIGTERM, signal.SIGUSR1])
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, callbacks=[callback], enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path)
    environment = trainer._accelerator_connector.cluster_environment
    assert isinstance(environment, SLURMEnvironment) and environment.auto_requeue
    before = signal.getsignal(signal.SIGUSR1)
    callback.on_fit_start(trainer, None)  # fit calls it before Lightning installs its handlers
    assert not environment.auto_requeue
    trainer._signal_connector.register_signal_handlers()  # what fit does next
    try:
        assert signal.getsignal(signal.SIGUSR1) is before, "Lightning installed no SIGUSR1 handler"
    finally:
        trainer._signal_connector.teardown()


def test_lightning_registers_no_sigterm_handler_of_its_own_beside_the_callback(tmp_path: Path) -> None:
    """Lightning's SIGTERM handler broadcasts from inside the handler, a collective that waits for
    ever for a rank that is elsewhere (a ddp_spawn test hung on it): with the callback set up, as
    every stage does before Lightning registers its handlers, it registers none."""
    callback = PreemptionCallback(str(tmp_path), [signal.SIGTERM])
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, callbacks=[callback], enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path)
    before = signal.getsignal(signal.SIGTERM)
    for stage in ("fit", "test"):
        callback.setup(trainer, None, stage)
        trainer._signal_connector.register_signal_handlers()  # what each stage does next
        try:
            assert signal.getsignal(signal.SIGTERM) is before, stage
        finally:
            trainer._signal_connector.teardown()


def test_requeue_needs_a_command_that_continues_the_run_and_reports_a_failure(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "4240")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "2")
    calls = fake_scontrol(tmp_path / "bin")
    callback = PreemptionCallback(str(tmp_path), [signal.SIGTERM], requeue=True, resume=None)
    assert callback._go_on() == ("SLURM job 4240_2 not requeued: its command has resume=None, so it would start "
                                 "afresh; continue with the same command and resume=auto")
    assert not calls.exists()
    callback.resume = str(tmp_path)  # a run directory: the same command continues it
    assert callback._go_on() == f"SLURM job 4240_2 requeued: it continues from this checkpoint (resume={tmp_path})"
    assert calls.read_text().splitlines() == ["requeue 4240_2"]

    fake_scontrol(tmp_path / "bin", status=1, said="slurm_requeue error: Access/permission denied")
    callback.resume = "auto"
    assert callback._go_on() == ("requeueing SLURM job 4240_2 failed (scontrol exit status 1: slurm_requeue error: "
                                 "Access/permission denied); continue with the same command and resume=auto")
    callback.requeue = False
    assert callback._go_on() == "continue with the same command and resume=auto"


def test_a_bad_signal_name_is_refused(tmp_path: Path) -> None:
    """(Turned off: tests/training/test_preemption_off.py.)"""
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        bad = compose("train", overrides=["callbacks.preemption.signals=[SIGTERM,SIGFOO]", f"paths.output_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"callbacks.preemption.signals: 'SIGFOO' is not a signal"):
        signal_numbers(bad.callbacks.preemption.signals)
    assert signal_numbers(["SIGTERM", "usr1", "SIGUSR2"]) == [signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2]


def test_the_slurm_launcher_sends_a_signal_that_training_handles_and_allows_requeues(tmp_path: Path) -> None:
    """conf/hydra/launcher/slurm.yaml: submitit asks SLURM for SIGUSR2 five minutes before the time
    limit, which callbacks.preemption handles, and requeues after a time limit are allowed."""
    from submitit.slurm.slurm import _make_sbatch_string

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("train", overrides=["hydra/launcher=slurm", f"paths.output_dir={tmp_path}"],
                      return_hydra_config=True)
    launcher = instantiate(cfg.hydra.launcher)
    assert type(launcher).__name__ == "SlurmLauncher" and launcher.params["max_num_timeout"] > 0
    sbatch = _make_sbatch_string(command="python src/train.py", folder=tmp_path,
                                 signal_delay_s=launcher.params["signal_delay_s"])
    assert "#SBATCH --signal=USR2@300\n" in sbatch, sbatch
    assert "SIGUSR2" in cfg.callbacks.preemption.signals


@pytest.mark.cli
@pytest.mark.parametrize("strategy, victim, signum", [("ddp", "rank 1", signal.SIGTERM),
                                                      ("ddp_spawn", "launcher", signal.SIGUSR2)])
@pytest.mark.slow
@TWO_CORES
def test_ddp_ranks_stop_after_the_same_step_whichever_process_got_the_signal(
        tmp_path: Path, environment, strategy: str, victim: str, signum: int) -> None:
    """``ddp`` (as under SLURM, every rank a process of its own), rank 1 alone signalled (a kill of
    one process): rank 0 learns of it at the step boundary and saves. ``ddp_spawn``, its launching
    process alone signalled (as a container runtime signals the first process): it passes the
    signal on to the ranks instead of dying."""
    run_dir = tmp_path / "run"
    command = _command(run_dir, "logger=none", "hardware=cpu2_ddp", f"trainer.strategy={strategy}",
                       "optim.train_steps=1000")

    def victims(process: subprocess.Popen) -> list[int]:
        if victim == "launcher":
            return [process.pid]
        rank_1 = children(process.pid, b"src/train.py")  # ddp: rank 0 is the process started, rank 1 its child
        assert len(rank_1) == 1, rank_1
        return rank_1

    result = _signal_after(command, environment, run_dir / "checkpoints" / "step0000005.ckpt", signum, victims)
    step, checkpoint, go_on = _preempted(result, signum)
    assert _saved_step(checkpoint) == step >= 5
    assert go_on == "continue with the same command and resume=auto"
