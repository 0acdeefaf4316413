"""Stops that say what they did: Ctrl-C during training saves the step reached as a preemption
does; a SIGTERM after training (during the test) is one line (training is saved; resume=auto runs
only the test) and the resumed run does just that; Ctrl-C in the other tools is one line, exit 130."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from aiayn.training.preemption import EXIT_STATUS
from tests.helpers.preloaded import Process
from tests.helpers.runs import IN_THE_FOREGROUND, REPO, TINY, TWO_CORES, children, popen, run_command
from tests.helpers.signals import signal_while_checking_files, signal_while_setting_up
from tests.helpers.slurm import SLURM, fake_scontrol
from tests.helpers.wandb_offline import read_run

RUN = [*TINY, "logger=csv", "trainer.enable_progress_bar=false", "visualize_at_end=false", "run_name=stops"]


@pytest.fixture(scope="module")
def env(data_root: Path, subword_cache: Path) -> dict[str, str]:
    return {**os.environ, "WANDB_MODE": "offline", "AIAYN_DATA_ROOT": str(data_root),
            "AIAYN_CACHE_DIR": str(subword_cache), "OMP_NUM_THREADS": "1"}


def _cpu_seconds(process: subprocess.Popen) -> float:
    """The CPU time ``process`` has used (user + system), which a loaded machine does not
    inflate as it does the wall-clock time."""
    fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _signal_when(command: list[str], env: dict[str, str], ready, signum: int, fresh: bool = False,
                 victims=None) -> subprocess.CompletedProcess:
    """Run ``command`` (SIGINT at its default), send ``signum`` once ``ready(process)`` holds, to
    the process or to the pids ``victims(process)`` names; ``fresh``: in an interpreter that
    imports everything itself (tests.helpers.preloaded)."""
    process = popen([*IN_THE_FOREGROUND, *command[1:]], cwd=REPO, env=env, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, text=True, fresh=fresh)
    try:
        deadline = time.monotonic() + 300
        while not ready(process):
            assert process.poll() is None, f"it ended before the signal:\n{process.stderr.read()[-3000:]}"
            assert time.monotonic() < deadline, "not ready within 5 minutes"
            time.sleep(0.02)
        targets = victims(process) if victims else [process.pid]
        assert targets, "no process to signal"
        for pid in targets:
            os.kill(pid, signum)
        stdout, stderr = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


@pytest.mark.cli
@pytest.mark.slow
def test_ctrl_c_during_training_saves_the_step_reached(tmp_path: Path, env) -> None:
    run = tmp_path / "run"
    command = [sys.executable, "src/train.py", *RUN, "optim.train_steps=400", f"hydra.run.dir={run}"]
    result = _signal_when(command, env, lambda _: (run / "checkpoints" / "step0000002.ckpt").exists(), signal.SIGINT)
    assert result.returncode == EXIT_STATUS, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    match = re.match(r"^train\.py: preempted by SIGINT at step (\d+); saved (\S+); continue with the same command "
                     r"and resume=auto$", last)
    assert match, last
    assert torch.load(match.group(2), weights_only=False)["global_step"] == int(match.group(1)) >= 2
    assert "Traceback" not in result.stderr


@pytest.mark.cli
@pytest.mark.slow
def test_a_signal_while_the_run_sets_up_stops_it_in_one_line_and_nothing_is_resumed_wrongly(tmp_path: Path,
                                                                                            env) -> None:
    """Ctrl-C or SIGTERM inside ``fit`` once the data is loaded, before the sanity check (for WMT,
    minutes of loading): one line, exit 75 (before: Lightning's "Detected KeyboardInterrupt,
    attempting graceful shutdown ..." and status 1; SIGTERM: 143 and no word). A fresh run leaves
    no folder; a resumed one keeps its checkpoint, and the same command continues from it."""
    environment = {**env, "PYTHONPATH": str(REPO)}
    fresh = tmp_path / "fresh"
    result = run_command([sys.executable, "src/train.py", *RUN, f"hydra.run.dir={fresh}",
                          *signal_while_setting_up("SIGINT")], env=environment, check=False)
    assert result.returncode == EXIT_STATUS, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "train.py: stopped by SIGINT while the run set up (its data, its model), before its first step; nothing of "
        "this attempt was saved; run the same command again")
    assert "Traceback" not in result.stderr and "KeyboardInterrupt" not in result.stderr + result.stdout
    assert not fresh.exists(), "a run stopped before its first step leaves no folder"

    run = tmp_path / "run"
    command = [sys.executable, "src/train.py", *RUN, "test_after_training=false", f"hydra.run.dir={run}"]
    run_command([*command, "optim.train_steps=2"], env=environment)
    saved = sorted(p.name for p in (run / "checkpoints").iterdir())
    result = run_command([*command, "optim.train_steps=4", "resume=auto", *signal_while_setting_up("SIGTERM")],
                         env=environment, check=False)
    assert result.returncode == EXIT_STATUS, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "train.py: stopped by SIGTERM while the run set up (its data, its model), before its first step; nothing of "
        "this attempt was saved; continue with the same command (it resumes the same checkpoint)")
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == saved
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 2


@pytest.mark.cli
def test_a_signal_before_fit_stops_the_run_in_one_line_and_slurm_requeues_it(tmp_path: Path, env) -> None:
    """A signal as the run checks its data files (for WMT, maybe a download), before the model and
    the trainer exist: one line, exit 75, no folder (before: SIGTERM ended it with 143 and no word).
    Under SLURM a preemption signal requeues the job, whose command then runs again; Ctrl-C does not."""
    calls = fake_scontrol(tmp_path / "bin")
    environment = {**env, **SLURM, "PYTHONPATH": str(REPO), "PATH": f"{tmp_path / 'bin'}{os.pathsep}{env['PATH']}"}
    for name, go_on in (("SIGTERM", "SLURM job 4242 requeued: it runs the same command again"),
                        ("SIGINT", "run the same command again")):
        run = tmp_path / name
        result = run_command([sys.executable, "src/train.py", *RUN, f"hydra.run.dir={run}",
                              *signal_while_checking_files(name)], env=environment, check=False)
        assert result.returncode == EXIT_STATUS, result.stderr[-3000:]
        assert result.stderr.strip().splitlines()[-1] == (
            f"train.py: stopped by {name} while the run set up (its data, its model), before its first step; "
            f"nothing of this attempt was saved; {go_on}")
        assert "Traceback" not in result.stderr
        assert not run.exists(), "a run stopped before its first step leaves no folder"
    assert calls.read_text().splitlines() == ["requeue 4242"], "requeued for SIGTERM alone"


@pytest.mark.cli
@pytest.mark.slow
def test_a_sigterm_during_the_test_says_so_and_resume_runs_only_the_test(tmp_path: Path, env) -> None:
    run = tmp_path / "run"
    # The whole test split (1,000 sentences), so that the test lasts long enough to be signalled.
    logged = [each if each != "logger=csv" else "logger=[csv,wandb]" for each in RUN]
    command = [sys.executable, "src/train.py", *logged, "trainer.limit_test_batches=1.0", f"hydra.run.dir={run}"]
    result = _signal_when(command, env, lambda _: (run / "summary.json").exists(), signal.SIGTERM)
    assert result.returncode == EXIT_STATUS, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"train.py: stopped by SIGTERM after training, before the test had finished; training is finished and saved "
        f"({run / 'checkpoints' / 'last.ckpt'}); the same command with resume=auto runs only the test")
    assert "test test_2016_flickr:" not in result.stdout
    # Its W&B run ends preempted, as its exit status says (before: finished as the process exited, exit code 0).
    (attempt,) = (run / "wandb").glob("offline-run-*")
    assert read_run(attempt, strict=True).exit_code == EXIT_STATUS
    summary = json.loads((run / "summary.json").read_text())

    resumed = run_command([*command, "resume=auto"], env=env)
    assert "test test_2016_flickr:" in resumed.stdout
    after = json.loads((run / "summary.json").read_text())
    # The training time too, to the end of the last step's validation (before: counted to the end of fit, and the
    # resumed run's, from its checkpoint, was smaller)
    kept = ("steps", "tokens_seen", "dev/ppl", "training_time_s")
    assert {k: after[k] for k in kept} == {k: summary[k] for k in kept}
    rows = [row for row in (run / "csv").glob("version_*/metrics.csv")]
    assert len(rows) == 2, "the resumed attempt logged (its test) in a file of its own"


@pytest.mark.cli
@pytest.mark.slow
@TWO_CORES
@pytest.mark.parametrize("strategy, moment, victim", [("ddp", "testing", "first"), ("ddp", "testing", "rank 1"),
                                                      ("ddp_spawn", "testing", "first"),
                                                      ("ddp_spawn", "training ended", "first")])
def test_a_sigterm_after_training_stops_every_ddp_rank_in_one_line(tmp_path: Path, env, strategy: str, moment: str,
                                                                    victim: str) -> None:
    """Two ranks; the signal goes to the process the user started (ddp: rank 0, which passes it
    on; ddp_spawn: the launching process, which passes it on to the test's ranks), during the
    test, or (ddp_spawn) as training's ranks end, before the test's are started; or to rank 1
    alone (a kill of one process), which stops the job once rank 0 has run its share. Before:
    'a training process failed' (ddp), the test hung or ran on to exit 0 (ddp_spawn)."""
    run = tmp_path / "run"
    command = [sys.executable, "src/train.py", *RUN, "hardware=cpu2_ddp", f"trainer.strategy={strategy}",
               "trainer.limit_test_batches=1.0", f"hydra.run.dir={run}"]
    log = run / "train.log"
    if moment == "testing":
        def ready(_: subprocess.Popen) -> bool:
            return log.exists() and "testing on test_2016_flickr: 1,000 sentences" in log.read_text()
    else:
        def ready(_: subprocess.Popen) -> bool:
            return (run / "summary.json").exists()
    victims = None
    if victim == "rank 1":  # ddp: rank 0 is the process started, rank 1 its child
        def victims(process: subprocess.Popen) -> list[int]:
            return children(process.pid, b"src/train.py")
    result = _signal_when(command, env, ready, signal.SIGTERM, victims=victims)
    assert result.returncode == EXIT_STATUS, result.stderr[-3000:]
    line = (f"train.py: stopped by SIGTERM after training, before the test had finished; training is finished and "
            f"saved ({run / 'checkpoints' / 'last.ckpt'}); the same command with resume=auto runs only the test")
    assert result.stderr.strip().splitlines()[-1] == line
    assert "a training process failed" not in result.stderr and "Traceback" not in result.stderr
    assert "test test_2016_flickr:" not in result.stdout
    if victim == "first" and strategy == "ddp":
        resumed = run_command([*command, "resume=auto"], env=env)
        assert "test test_2016_flickr:" in resumed.stdout


@pytest.mark.cli
@TWO_CORES
def test_a_sigterm_as_ddp_spawn_starts_its_ranks_stops_the_job_in_one_line(tmp_path: Path, env) -> None:
    """The launching process passes the signal on to ranks still importing torch, with no handler
    yet, which die of it: the job says so in one line, status 75, as a preemption (before: 'a
    training process failed'). Fresh interpreters, so that the ranks take seconds to start."""
    command = [sys.executable, "src/train.py", *RUN, "hardware=cpu2_ddp", "trainer.strategy=ddp_spawn",
               f"hydra.run.dir={tmp_path / 'run'}"]
    result = _signal_when(command, env, lambda process: len(children(process.pid, b"spawn_main")) == 2,
                          signal.SIGTERM, fresh=True)
    assert result.returncode == EXIT_STATUS, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "train.py: stopped by SIGTERM as the training processes started, before their first step; nothing of this "
        "attempt was saved; continue with the same command and resume=auto")
    assert "a training process failed" not in result.stderr and "Traceback" not in result.stderr
    assert not list((tmp_path / "run" / "checkpoints").glob("*.ckpt"))


def _importing_torch(process: subprocess.Popen) -> bool:
    """The process has begun to import torch (its library is mapped): the tool is starting."""
    try:
        return "libtorch" in Path(f"/proc/{process.pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.cli
@pytest.mark.parametrize("moment", ["starting", "working"])
def test_ctrl_c_in_a_tool_is_one_line_and_exit_130(moment: str, tmp_path: Path, tiny_run, env) -> None:
    """Ctrl-C while the tool imports torch, Lightning and Hydra (before: a KeyboardInterrupt
    traceback), or once it works: one line, exit status 130, whatever the machine's load."""
    out = tmp_path / "eval"
    command = [sys.executable, "src/evaluate.py", f"ckpt={tiny_run.last}", f"out={out}", "wandb=disabled",
               "split=train"]  # 29,000 sentences: minutes of decoding
    # Working: 2 s of its own CPU time where it is forked from the preloaded interpreter (its imports
    # done), 8 s where it imports everything itself (about 4 s of it, on an idle machine): decoding.
    # On a loaded machine the signal may still come while it starts, which ends the same way.
    ready = _importing_torch if moment == "starting" else \
        lambda process: _cpu_seconds(process) > (2 if isinstance(process, Process) else 8)
    result = _signal_when(command, {**env, "AIAYN_CACHE_DIR": str(tiny_run.cache_dir)}, ready, signal.SIGINT,
                          fresh=moment == "starting")
    assert result.returncode == 130, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1].startswith("evaluate.py: interrupted (Ctrl-C) "), result.stderr
    assert "Traceback" not in result.stderr and not list(tmp_path.glob("eval/.*"))


def test_a_signal_while_a_line_is_logged_still_stops_the_run(tmp_path: Path) -> None:
    """The signal comes while a log line is written (as on a loaded machine, where the test's
    SIGTERM came as the summary was logged): logging's handler of write errors must not swallow
    the stop (before: it printed '--- Logging error ---' and the run went on to exit 0)."""
    import logging
    from types import SimpleNamespace

    from aiayn.training.after_training import Stopped, StopsAfterTraining

    class SignalledWhileWritten(io.StringIO):
        def write(self, text: str) -> int:
            os.kill(os.getpid(), signal.SIGTERM)  # handled at the next bytecode, inside StreamHandler.emit
            for _ in range(1000):  # the handler runs before this loop ends
                pass
            return super().write(text)

    logger = logging.getLogger("tests.stops")
    handler = logging.StreamHandler(SignalledWhileWritten())  # as the run's train.log and console handlers write
    logger.addHandler(handler)
    stops = StopsAfterTraining(["SIGTERM"], tmp_path / "last.ckpt")
    testing = SimpleNamespace(testing=True, world_size=1, strategy=SimpleNamespace(launcher=None))  # one process
    try:
        with pytest.raises(Stopped, match=r"^stopped by SIGTERM after training, before the test had finished"):
            stops.setup(testing, None, "test")
            logger.warning("run summary in …")
    finally:
        logger.removeHandler(handler)
        stops.teardown(testing, None, "test")


@pytest.mark.parametrize("newest, stopped_early, said", [
    (4, None, "after training"), (2, None, "as the training processes started"),
    (2, 2, "after training"),  # the run stopped early at 2 (callbacks.early_stopping): training had ended
])
def test_a_training_rank_killed_by_the_signal_passed_on_as_it_ends_is_a_stop_after_training(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, newest: int, stopped_early: int | None, said: str) -> None:
    """ddp_spawn's launching process passed a SIGTERM on to training's ranks as they ended; one, past
    its handlers, died of it and fit failed. With the last step (4) saved, training is finished and
    the line says so, as at any other moment after training; with an earlier step the newest, the
    ranks were killed before training ended, and the line is the one for ranks that were starting.
    (End to end, fresh interpreters hit this moment: test_a_sigterm_after_training_stops_every_ddp_rank_in_one_line
    with AIAYN_TESTS_FRESH_PROCESSES=1 said 'as the training processes started' before.)"""
    from types import SimpleNamespace

    from lightning.pytorch.strategies.launchers import _MultiProcessingLauncher
    from torch.multiprocessing import ProcessExitedException

    from aiayn.training import preemption
    from aiayn.training.after_training import StopsAfterTraining

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    torch.save({"callbacks": {"EarlyStopping": {"stopped_at": stopped_early}}}, folder / f"step{newest:07d}.ckpt")
    (folder / "last.ckpt").symlink_to(f"step{newest:07d}.ckpt")
    stops = StopsAfterTraining(["SIGTERM"], folder / "last.ckpt")
    launcher = _MultiProcessingLauncher.__new__(_MultiProcessingLauncher)
    trainer = SimpleNamespace(max_steps=4, strategy=SimpleNamespace(launcher=launcher))
    monkeypatch.setattr(preemption, "_passed_on", int(signal.SIGTERM))  # what _forward records as it passes it on
    died = ProcessExitedException("process 1 terminated with signal SIGTERM", error_index=1, error_pid=4242,
                                  exit_code=-signal.SIGTERM, signal_name="SIGTERM")
    with pytest.raises((preemption.Preempted, ProcessExitedException)) as raised, stops.around_the_training(trainer):
        raise died
    line, status = preemption.describe(raised.value)
    assert status == EXIT_STATUS and line.startswith(f"stopped by SIGTERM {said}"), line
    if said == "after training":
        assert line.endswith(f"training is finished and saved ({folder / 'last.ckpt'}); the same command with "
                             "resume=auto runs only the test")
