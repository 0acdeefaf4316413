"""A preemption signal as train starts (its imports, Hydra's composition), before its set-up window
opens: held, then the run has it as its set-up begins: one line and exit 75 as a little later
(before: SIGTERM's default action, status 143 and no word); what the composed config says of it is
done (preemption off: the default action; under SLURM: requeued); a start that ends before any
window opens (``--cfg job``) has the signal's default action as it ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aiayn.training.preemption import EXIT_STATUS
from tests.helpers.runs import REPO, TINY, popen
from tests.helpers.slurm import SLURM, fake_scontrol

# Loaded by the interpreter as it starts (on PYTHONPATH): at the moment named, before that import or
# as Hydra opens conf/train.yaml to compose it, the process writes SIGN and waits for GO, which the
# test writes once it has sent the signal: the signal comes exactly then.
SITECUSTOMIZE = """
import os, sys, time

_moment, _sign, _go = os.environ["AT_MOMENT"], os.environ["SIGN_FILE"], os.environ["GO_FILE"]
_done = []


def _hook(event, args):
    if _done:
        return
    if (event == "import" and args[0] == _moment) or (event == "open" and str(args[0]).endswith(_moment)):
        _done.append(True)
        open(_sign, "w").close()
        while not os.path.exists(_go):
            time.sleep(0.01)


sys.addaudithook(_hook)
"""

RUN = [*TINY, "logger=none", "trainer.enable_progress_bar=false", "visualize_at_end=false"]
LINE = ("train.py: stopped by {name} while the run set up (its data, its model), before its first step; nothing of "
        "this attempt was saved; {go_on}")


def _signalled_at(moment: str, tmp_path: Path, env: dict[str, str], overrides: list[str],
                  signum: int = signal.SIGTERM) -> subprocess.CompletedProcess:
    """``python src/train.py`` with ``overrides``, sent ``signum`` at ``moment`` (a module's import,
    or the end of the path of a file it opens), in a fresh interpreter (nothing imported before)."""
    hooks = tmp_path / "hooks"
    hooks.mkdir(parents=True)
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    sign, go = tmp_path / "sign", tmp_path / "go"
    environment = {**env, "PYTHONPATH": os.pathsep.join([str(hooks), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
                   "AT_MOMENT": moment, "SIGN_FILE": str(sign), "GO_FILE": str(go)}
    command = [sys.executable, "src/train.py", *RUN, *overrides]
    process = popen(command, cwd=REPO, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                    fresh=True)
    try:
        deadline = time.monotonic() + 300
        while not sign.exists():
            assert process.poll() is None, f"it ended before {moment}:\n{process.stderr.read()[-3000:]}"
            assert time.monotonic() < deadline, f"no {moment} within 5 minutes"
            time.sleep(0.01)
        process.send_signal(signum)
        go.touch()
        stdout, stderr = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def env(data_root: Path, subword_cache: Path) -> dict[str, str]:
    return {**os.environ, "AIAYN_DATA_ROOT": str(data_root), "AIAYN_CACHE_DIR": str(subword_cache),
            "OMP_NUM_THREADS": "1"}


@pytest.mark.cli
@pytest.mark.parametrize("moment", ["torch", f"{os.sep}conf{os.sep}train.yaml"], ids=["importing torch", "composing"])
def test_a_sigterm_as_train_starts_stops_it_in_one_line_once_its_window_opens(moment: str, tmp_path: Path,
                                                                             env) -> None:
    run = tmp_path / "run"
    result = _signalled_at(moment, tmp_path, env, [f"hydra.run.dir={run}"])
    assert result.returncode == EXIT_STATUS, (result.returncode, result.stderr[-3000:])
    assert result.stderr.strip().splitlines()[-1] == LINE.format(name="SIGTERM", go_on="run the same command again")
    assert "Traceback" not in result.stderr
    assert not run.exists(), "a run stopped before its first step leaves no folder"


@pytest.mark.cli
def test_a_signal_as_train_starts_does_what_the_composed_config_says(tmp_path: Path, env) -> None:
    """Preemption off: SIGTERM's default action, as it has later in the set-up. Under SLURM: the
    job requeued. SIGUSR1 where the preemption's signals leave it out: its default action."""
    off = _signalled_at("torch", tmp_path / "off", env, [f"hydra.run.dir={tmp_path / 'off' / 'run'}",
                                                         "callbacks.preemption.enabled=false"])
    assert off.returncode == -signal.SIGTERM, (off.returncode, off.stderr[-3000:])

    other = _signalled_at("torch", tmp_path / "other", env, [f"hydra.run.dir={tmp_path / 'other' / 'run'}",
                                                             "callbacks.preemption.signals=[SIGTERM]"], signal.SIGUSR1)
    assert other.returncode == -signal.SIGUSR1, (other.returncode, other.stderr[-3000:])

    calls = fake_scontrol(tmp_path / "bin")
    slurm = {**env, **SLURM, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{env['PATH']}"}
    requeued = _signalled_at("torch", tmp_path / "slurm", slurm, [f"hydra.run.dir={tmp_path / 'slurm' / 'run'}"])
    assert requeued.returncode == EXIT_STATUS, requeued.stderr[-3000:]
    assert requeued.stderr.strip().splitlines()[-1] == LINE.format(
        name="SIGTERM", go_on="SLURM job 4242 requeued: it runs the same command again")
    assert calls.read_text().splitlines() == ["requeue 4242"]


@pytest.mark.cli
def test_a_sigterm_as_a_start_that_opens_no_window_ends_it_as_before(tmp_path: Path, env) -> None:
    """``--cfg job`` (or a help page, a config refused) sets no run up: the signal held since the
    start has its default action as the start ends (never swallowed: before the hold, at once)."""
    result = _signalled_at("torch", tmp_path, env, ["--cfg", "job"])
    assert result.returncode == -signal.SIGTERM, (result.returncode, result.stderr[-3000:])


def test_a_process_forked_while_the_start_holds_its_signals_is_not_held():
    """The hold is train's own process's: a process forked meanwhile (it inherits the handler) has
    the signal's action at once, as it would have had, and the holder's signal is still held."""
    from aiayn.training import starting

    starting.hold()
    try:
        child = os.fork()
        if child == 0:  # pragma: no cover (the child)
            os.kill(os.getpid(), signal.SIGTERM)
            os._exit(0)  # reached only if the signal was held
        _, status = os.waitpid(child, 0)
        os.kill(os.getpid(), signal.SIGUSR1)
    finally:
        held = starting.take()
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
    assert held == signal.SIGUSR1
