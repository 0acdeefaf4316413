"""``callbacks.preemption.enabled=false``: no handling of ours, and Lightning's SIGTERM handler kept
off too, which ended a killed run with status 0 (as if it had finished) after the step under way,
unsaved: a SIGTERM ends the run as it ends any program, at once, with the signal's status, in one
process and under DDP. Lightning's SLURM requeue on SIGUSR1 stays."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import lightning as L
import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from lightning.fabric.plugins.environments import SLURMEnvironment

from aiayn.cli.naming import CONFIG_DIR
from aiayn.training.lightning_signals import PlainSigterm
from aiayn.training.preemption import PreemptionCallback
from tests.helpers.runs import REPO, TINY, TWO_CORES, children, popen

RUN = [*TINY, "logger=csv", "callbacks.preemption.enabled=false", "optim.train_steps=100000",
       "trainer.val_check_interval=100000", "trainer.limit_val_batches=1", "checkpoint.every_n_train_steps=5",
       "trainer.enable_progress_bar=false", "visualize_at_end=false"]


def test_the_setting_builds_the_callback_that_keeps_lightnings_sigterm_handler_off(tmp_path: Path,
                                                                                    monkeypatch) -> None:
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        off = compose("train", overrides=["callbacks.preemption.enabled=false", f"paths.output_dir={tmp_path}"])
    callback = instantiate(off.callbacks.preemption, dirpath=str(tmp_path))
    assert isinstance(callback, PlainSigterm) and not isinstance(callback, PreemptionCallback)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")  # Lightning's SLURM requeue registers its SIGUSR1 handler
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_JOB_NAME", "aiayn")
    trainer = L.Trainer(accelerator="cpu", devices=1, logger=False, callbacks=[callback], enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path,
                        plugins=[SLURMEnvironment(auto_requeue=True)])
    sigterm, sigusr1 = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR1)
    for stage in ("fit", "test", "fit"):  # set up again: one wrapping, not one a stage
        callback.setup(trainer, None, stage)
        trainer._signal_connector.register_signal_handlers()  # what each stage does next
        try:
            assert signal.getsignal(signal.SIGTERM) is sigterm, stage
            assert signal.getsignal(signal.SIGUSR1) is not sigusr1, "Lightning's SLURM requeue stays"
        finally:
            trainer._signal_connector.teardown()
    assert signal.getsignal(signal.SIGUSR1) is sigusr1


@pytest.mark.cli
@pytest.mark.parametrize("processes", [1, pytest.param(2, marks=[pytest.mark.slow, TWO_CORES])])
def test_a_sigterm_ends_the_run_with_the_signals_status(tmp_path: Path, data_root: Path, subword_cache: Path,
                                                         processes: int) -> None:
    """Before: status 0 and no word, the run seen as finished by a script or a scheduler."""
    run = tmp_path / "run"
    command = [sys.executable, "src/train.py", *RUN, f"hydra.run.dir={run}",
               *(["hardware=cpu2_ddp", "trainer.strategy=ddp"] if processes == 2 else [])]
    env = {**os.environ, "AIAYN_DATA_ROOT": str(data_root), "AIAYN_CACHE_DIR": str(subword_cache),
           "OMP_NUM_THREADS": "1"}
    process = popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                    start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not (run / "checkpoints" / "step0000005.ckpt").exists():  # training
            assert process.poll() is None, process.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "no step-5 checkpoint within 5 minutes"
            time.sleep(0.05)
        ranks = children(process.pid, b"src/train.py")
        assert len(ranks) == processes - 1
        os.kill(process.pid, signal.SIGTERM)
        stdout, _ = process.communicate(timeout=120)  # every process of the job ended (they share its pipes)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == -signal.SIGTERM
    assert "test test_2016_flickr:" not in stdout  # no test after a killed training
