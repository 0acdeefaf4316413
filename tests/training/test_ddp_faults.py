"""DDP faults: a 2-process CPU DDP run whose rank dies mid-training (any rank, under ddp_spawn and
ddp, the process the user started included) ends, every process of it, with a one-line message
saying how to continue — no hang; ddp_spawn's ranks whose launching process is killed save the
step reached and say so, naming no signal nobody sent; a rank that hangs
is bounded by the process group's timeout (``distributed.timeout_minutes``, not Lightning's 30
minutes); more training processes than the machine has CPU cores or GPUs are refused up front."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

from aiayn.checkpoints.io import read_checkpoint
from aiayn.config.hardware import Machine, cpu_cores, place, this_machine
from aiayn.errors import ConfigError
from aiayn.training.distributed import strategy_with_timeout
from tests.helpers.runs import REPO, TINY, TINY_MODEL, TWO_CORES, children, popen, run_command

RUN = [
    *TINY_MODEL, "task.datamodule.max_tokens=512", "optim.train_steps=100000",
    "trainer.val_check_interval=100000", "trainer.num_sanity_val_steps=0", "trainer.enable_progress_bar=false",
    "checkpoint.every_n_train_steps=5", "hardware=cpu2_ddp", "logger=none",
]


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (gone, or a zombie awaiting its parent)."""
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def _ranks(process: subprocess.Popen, strategy: str) -> list[int]:
    """PIDs of the training processes, rank 0 first."""
    if strategy == "ddp_spawn":  # both ranks are spawned children, in rank order
        return children(process.pid, b"spawn_main")
    return [process.pid, *children(process.pid, b"src/train.py")]  # ddp


@pytest.mark.cli  # an end-to-end run of the tool; -m 'not cli' skips it
@pytest.mark.parametrize("strategy, victim", [("ddp_spawn", 1), ("ddp_spawn", 0), ("ddp", 1), ("ddp", 0)])
@pytest.mark.slow
@TWO_CORES
def test_a_dead_rank_ends_the_job_cleanly(tmp_path: Path, data_root: Path, strategy: str, victim: int) -> None:
    env = {**os.environ, "AIAYN_DATA_ROOT": str(data_root), "AIAYN_CACHE_DIR": str(tmp_path / "cache"),
           "OMP_NUM_THREADS": "1"}
    run_dir = tmp_path / "run"
    command = [sys.executable, "src/train.py", *RUN, f"trainer.strategy={strategy}", f"hydra.run.dir={run_dir}"]
    process = popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (run_dir / "checkpoints" / "step0000005.ckpt").exists():  # both ranks are training
            assert process.poll() is None, process.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "training did not start within 5 minutes"
            time.sleep(0.1)
        ranks = _ranks(process, strategy)
        assert len(ranks) == 2, ranks
        os.kill(ranks[victim], signal.SIGKILL)
        stderr = process.communicate(timeout=600)[1]  # a hang fails here (the end takes about 5 s on an idle CPU)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode != 0
    # Every rank ends: the job's pipe closed as the last one let go of it, which may be a moment
    # before that process is gone (its exit under way); one still there a minute later outlived it.
    deadline = time.monotonic() + 60
    while (alive := [pid for pid in ranks if _running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive, "a rank outlived the job"
    # The launching process says it, or, where it was the one killed (ddp's rank 0, the process the
    # user started), rank 1, which sees its peer gone.
    lines = [line for line in stderr.splitlines() if line.startswith("train.py: ")]
    assert lines and "a training process failed, so the job stopped" in lines[-1], stderr[-3000:]
    assert "resume=auto" in lines[-1]
    if strategy == "ddp" and victim == 0:
        assert "(seen by rank 1)" in lines[-1], lines[-1]


@pytest.mark.cli
@pytest.mark.slow
@TWO_CORES
def test_ranks_whose_launching_process_is_killed_save_and_say_it_ended(tmp_path: Path, data_root: Path) -> None:
    """ddp_spawn's launching process killed with SIGKILL: torch sends each rank a SIGINT, on which
    they save the step reached as on any preemption signal; their lines say the launching process
    ended (before: 'preemption: SIGINT', a Ctrl-C nobody gave), and rank 0 logs the line no
    process is left to print."""
    env = {**os.environ, "AIAYN_DATA_ROOT": str(data_root), "AIAYN_CACHE_DIR": str(tmp_path / "cache"),
           "OMP_NUM_THREADS": "1"}
    run_dir = tmp_path / "run"
    command = [sys.executable, "src/train.py", *RUN, "trainer.strategy=ddp_spawn", f"hydra.run.dir={run_dir}"]
    process = popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while not (run_dir / "checkpoints" / "step0000005.ckpt").exists():  # both ranks are training
            assert process.poll() is None, process.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "training did not start within 5 minutes"
            time.sleep(0.1)
        ranks = _ranks(process, "ddp_spawn")
        assert len(ranks) == 2, ranks
        process.kill()
        output = process.communicate(timeout=600)[0]  # the ranks' too: the pipe ends as the last one lets go
    finally:
        if process.poll() is None:
            process.kill()
    deadline = time.monotonic() + 60
    while (alive := [pid for pid in ranks if _running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive, "a rank outlived its launching process by a minute"
    log = (run_dir / "train.log").read_text()
    ended = f"the launching process (pid {process.pid}) ended"
    saving = re.findall(rf"preemption: {re.escape(ended)}; saving step (\d+) to (\S+)\n", log)
    assert saving and "SIGINT" not in log + output, log[-3000:]
    step, path = int(saving[0][0]), Path(saving[0][1])
    assert step >= 5 and path == run_dir / "checkpoints" / f"step{step:07d}.ckpt"
    assert read_checkpoint(path)["global_step"] == step and (run_dir / "checkpoints" / "last.ckpt").resolve() == path
    line = f"stopped at step {step}: {ended}; saved {path}; continue with the same command and resume=auto"
    assert line in log and line in output, output[-3000:]


# -- the process group's timeout ------------------------------------------------------------

@pytest.mark.parametrize("name, start_method, find_unused", [
    ("ddp", "popen", None), ("ddp_spawn", "spawn", None), ("ddp_fork", "fork", None),
    ("ddp_find_unused_parameters_true", "popen", True), ("ddp_spawn_find_unused_parameters_false", "spawn", False),
])
def test_a_ddp_strategy_name_becomes_a_ddp_strategy_with_the_timeout(name, start_method, find_unused) -> None:
    strategy = strategy_with_timeout(name, 10)
    assert type(strategy) is DDPStrategy
    assert strategy._timeout == timedelta(minutes=10)  # Lightning's own default: 30 minutes
    assert strategy._start_method == start_method, "the name's start method is kept"
    assert strategy._ddp_kwargs.get("find_unused_parameters") == find_unused
    assert strategy_with_timeout(name, 0.5)._timeout == timedelta(seconds=30)


def test_a_built_ddp_strategy_gets_the_timeout_and_others_are_left_alone() -> None:
    built = DDPStrategy(start_method="spawn", find_unused_parameters=True)
    assert strategy_with_timeout(built, 3) is built
    assert built._timeout == timedelta(minutes=3) and built._start_method == "spawn"
    single = SingleDeviceStrategy(device=torch.device("cpu"))
    for strategy in ("auto", "fsdp", "single_device", single):
        assert strategy_with_timeout(strategy, 10) is strategy
    assert strategy_with_timeout("ddp", None) == "ddp", "null: Lightning's default"


def test_auto_with_several_processes_is_the_ddp_lightning_would_pick() -> None:
    """A strategy left at ``auto`` for two processes: Lightning picks ddp, with the timeout here."""
    strategy = strategy_with_timeout("auto", 10, processes=2)
    assert type(strategy) is DDPStrategy and strategy._start_method == "popen"
    assert strategy._timeout == timedelta(minutes=10)
    assert strategy_with_timeout("auto", 10, processes=1) == "auto"


@pytest.mark.parametrize("minutes", [0, -5, "ten", True])
def test_a_timeout_that_is_not_a_positive_number_is_refused(minutes) -> None:
    with pytest.raises(ConfigError, match="^distributed.timeout_minutes must be a positive number of minutes"):
        strategy_with_timeout("ddp", minutes)


# -- how many processes this machine can run (the decision itself: tests/training/test_hardware.py) --

def test_more_cpu_processes_than_this_machine_has_cores_are_refused() -> None:
    cores = cpu_cores()
    for devices in (cores + 1, str(cores + 1)):
        with pytest.raises(ConfigError) as refused:
            place(this_machine(), "cpu", devices, "ddp_spawn", "32-true")
        assert str(refused.value) == (
            f"trainer.devices={devices} asks for {cores + 1} CPU training processes but this machine has {cores} CPU "
            f"core{'s' if cores > 1 else ''}; use trainer.devices={cores} or fewer")
    for devices in (1, cores, str(cores), "auto"):
        assert place(this_machine(), "cpu", devices, "auto", "32-true").accelerator == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a machine without a usable CUDA GPU")
@pytest.mark.parametrize("accelerator", ["gpu", "cuda"])
@pytest.mark.parametrize("devices", [1, 8, "auto", -1, "0,1", [0]])
def test_gpu_processes_without_a_gpu_are_refused(accelerator, devices) -> None:
    with pytest.raises(ConfigError, match=f"^trainer.accelerator={accelerator} asks for a GPU but no usable CUDA GPU "
                                          "was found on this machine; use hardware=auto"):
        place(this_machine(), accelerator, devices, "auto", "bf16-mixed")
    assert place(this_machine(), "auto", None, "auto", "auto").accelerator == "cpu"  # auto: the CPU here


@pytest.mark.parametrize("count", [1, 8])
def test_more_gpu_processes_than_gpus_are_refused(count: int) -> None:
    """On a simulated machine of one GPU and of eight (before: on the machine's own GPUs only, so
    never in CI; on one GPU it wrote its indices as "0", which Lightning, and so trainer.devices,
    reads as no GPU: Lightning's list of one index is "0,")."""
    machine = Machine(gpus=count, bf16=True, cpu_cores=16, gpu_name="NVIDIA H200")
    for devices in (count + 1, str(count + 1)):
        with pytest.raises(ConfigError, match=f"^trainer.devices={devices} asks for {count + 1} GPU training processes "
                                              f"but this machine has {count} usable CUDA GPU"):
            place(machine, "gpu", devices, "auto", "auto")
    for devices in ([count], f"0,{count}"):
        with pytest.raises(ConfigError, match=f"names CUDA GPU {count} but this machine has {count}"):
            place(machine, "cuda", devices, "auto", "auto")
    for devices in (count, -1, "auto", "-1", list(range(count)), ",".join(map(str, range(count))) + ","):
        assert place(machine, "gpu", devices, "auto", "auto").processes == count
    assert place(machine, "gpu", -1, "auto", "auto", 2).processes == 2 * count


@pytest.mark.cli
def test_a_node_that_never_joins_is_named_with_how_nodes_are_started(tmp_path: Path, data_root: Path,
                                                                     subword_cache: Path) -> None:
    """``trainer.num_nodes=2`` with the second node never started: node 0 waits
    ``distributed.timeout_minutes`` (here 3 s), then says so (before: "a training process failed …
    resume=auto", after Lightning's 10-minute wait)."""
    env = {key: value for key, value in os.environ.items() if key not in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK")}
    env.update(WANDB_MODE="offline", AIAYN_DATA_ROOT=str(data_root), AIAYN_CACHE_DIR=str(subword_cache))
    result = run_command([sys.executable, "src/train.py", *RUN, "hardware=cpu", "trainer.num_nodes=2",
                          "distributed.timeout_minutes=0.05", f"hydra.run.dir={tmp_path / 'run'}"], env=env, check=False)
    assert result.returncode == 2, result.stderr[-3000:]
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("train.py: the job's other nodes never joined (1 of its 2 processes started within "
                           "distributed.timeout_minutes=0.05): "), line
    assert "srun" in line and "NODE_RANK" in line and "MASTER_ADDR" in line and "Traceback" not in result.stderr


@pytest.mark.cli
@pytest.mark.slow
@TWO_CORES
def test_a_user_error_in_a_spawned_rank_is_its_own_line_and_leaves_no_run_folder(tmp_path: Path, data_root: Path,
                                                                                subword_cache: Path) -> None:
    """ddp_spawn: a setting the ranks refuse as they load the data (an evaluation example longer than
    a batch may be) is the line and exit status 2 of one process (tests/cli/test_refused_in_one_line.py),
    and the run that never started leaves no folder (before: "a training process failed, so the job
    stopped: aiayn.errors.ConfigError: … resume=auto", exit 1, the folder kept)."""
    run_dir = tmp_path / "run"
    result = run_command([sys.executable, "src/train.py", *TINY, "hardware=cpu2_ddp", "logger=none",
                          "task.datamodule.eval_max_tokens=30", f"hydra.run.dir={run_dir}"],
                         data_root=data_root, cache_dir=subword_cache, check=False)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("train.py: ")]
    refused = ("train.py: task.datamodule.eval_max_tokens=30 (it defaults to max_tokens) is below the longest example "
               "of the split val: 79 subword tokens with BOS/EOS (pair 916), which evaluation keeps whole; set it to "
               "at least 79")
    assert lines == [refused], result.stderr[-3000:]
    assert "resume=auto" not in result.stderr and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert not run_dir.exists(), sorted(run_dir.rglob("*"))
