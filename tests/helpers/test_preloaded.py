"""A process forked from the preloaded interpreter (tests/helpers/preloaded.py) is the process a
fresh ``python script args`` is: what the script sees of its process, and what the test sees of
its end, are the same either way."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import preloaded

# Prints what a script can see of the process it runs in, then ends as its first argument says.
SCRIPT = r'''
import atexit, json, os, random, signal, sys, time
atexit.register(lambda: print("atexit ran", flush=True))
handlers = {name: repr(signal.getsignal(getattr(signal, name)))
            for name in ("SIGINT", "SIGTERM", "SIGPIPE", "SIGXFSZ", "SIGCHLD", "SIGUSR1", "SIGHUP")}
streams = {name: [getattr(sys, name).encoding, getattr(sys, name).errors, getattr(sys, name).line_buffering,
                  getattr(sys, name).write_through] for name in ("stdin", "stdout", "stderr")}
seen = {"argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(), "handlers": handlers, "streams": streams,
        "own_session": os.getsid(0) == os.getpid(), "variable": os.environ.get("PRELOADED_TEST"),
        "stdin": sys.stdin.read(), "main": __name__, "file": __file__, "threads": None, "path": sys.path,
        "executable": sys.executable}
if "torch" in sys.argv:
    import torch
    seen["threads"] = torch.get_num_threads()
if "ranks" in sys.argv:  # the rank Lightning and torchmetrics take from the environment as they are imported
    from lightning.fabric.utilities.rank_zero import rank_zero_only
    from torchmetrics.utilities import prints
    seen["ranks"] = {"lightning": rank_zero_only.rank, "torchmetrics": prints.rank_zero_only.rank}
print(json.dumps({"seen": seen, "random": random.random()}))
how = sys.argv[1]
if how == "exit":
    sys.exit(3)
if how == "raise":
    raise RuntimeError("uncaught")
if how == "interrupt":
    raise KeyboardInterrupt
if how == "wait":
    sys.stdout.flush()
    time.sleep(300)
'''


# Starts a Python process two ways — multiprocessing's spawn (as DDP's ranks start) and
# ``python <script>`` by subprocess — with SIGUSR1 ignored and SIGUSR2 blocked; each prints what
# it sees of its process and ends with its own status.
STARTS = r'''
import json, multiprocessing, os, signal, subprocess, sys

def report(how):
    with open(f"/proc/{os.getpid()}/cmdline", "rb") as command:
        words = command.read().replace(b"\0", b" ").decode().split()
    handlers = {name: repr(signal.getsignal(getattr(signal, name))) for name in ("SIGINT", "SIGTERM", "SIGUSR1")}
    print(json.dumps({"how": how, "parent": os.getppid(), "argv": sys.argv, "path0": sys.path[0], "handlers": handlers,
                      "blocked": sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])), "command": words[1:],
                      "group": os.getpgrp(), "preloaded": "torch" in sys.modules}), flush=True)
    sys.exit(3)

if __name__ == "__main__":
    if sys.argv[1:] == ["child"]:
        report("subprocess")
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR2])
    spawned = multiprocessing.get_context("spawn").Process(target=report, args=("spawn",))
    spawned.start()
    spawned.join()
    started = subprocess.run([sys.executable, __file__, "child"])
    print(json.dumps({"me": os.getpid(), "group": os.getpgrp(), "statuses": [spawned.exitcode, started.returncode]}))
'''


@pytest.fixture()
def script(tmp_path: Path) -> Path:
    path = tmp_path / "tool" / "script.py"
    path.parent.mkdir()
    path.write_text(SCRIPT)
    return path


def _run(script: Path, *args: str, fresh: bool, cwd: Path, env: dict | None = None,
         **options) -> tuple[subprocess.Popen, str, str]:
    command = [sys.executable, str(script.relative_to(cwd)), *args]
    env = {**preloaded._SERVER_ENVIRONMENT, "PRELOADED_TEST": "yes", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(["extra", str(cwd / "more"), "extra"]), **(env or {})}
    # The choice is made from this process's environment; the child's is the command's.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(preloaded.FRESH, "1" if fresh else "0")
        process = preloaded.popen(command, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, **options)
    assert isinstance(process, preloaded.Process) != fresh
    out, err = process.communicate("the input\n", timeout=120)
    return process, out, err


@pytest.mark.cli  # starts processes, fresh and preloaded
@pytest.mark.parametrize("how, status", [("return", 0), ("exit", 3), ("raise", 1), ("interrupt", -signal.SIGINT)])
def test_a_preloaded_process_sees_and_ends_as_a_fresh_one(script: Path, how: str, status: int) -> None:
    cwd = script.parent.parent
    ends = {}
    for fresh in (True, False):
        process, out, err = _run(script, how, "torch", fresh=fresh, cwd=cwd)
        first, *rest = out.splitlines()
        ends[fresh] = (json.loads(first)["seen"], rest, process.returncode, err.strip().splitlines()[-1:])
    assert ends[True] == ends[False]
    seen, rest, returncode, last_error = ends[False]
    assert returncode == status
    assert rest == ["atexit ran"]
    assert seen["argv"] == ["tool/script.py", how, "torch"] and seen["path0"] == str(script.parent)
    assert seen["stdin"] == "the input\n" and seen["variable"] == "yes" and seen["threads"] == 1
    assert seen["main"] == "__main__" and not seen["own_session"]
    assert seen["path"][1:3] == [str(cwd / "extra"), str(cwd / "more")]
    if how == "raise":
        assert last_error == ["RuntimeError: uncaught"]


@pytest.mark.cli  # starts processes, fresh and preloaded
@pytest.mark.parametrize("unbuffered", ["1", ""])
def test_a_preloaded_process_makes_its_streams_as_its_pythonunbuffered_says(script: Path, unbuffered: str) -> None:
    cwd = script.parent.parent
    seen = {}
    for fresh in (True, False):
        _, out, _ = _run(script, "return", fresh=fresh, cwd=cwd, env={"PYTHONUNBUFFERED": unbuffered})
        seen[fresh] = json.loads(out.splitlines()[0])["seen"]["streams"]
    assert seen[True] == seen[False]
    assert seen[False]["stdout"][3] == bool(unbuffered)  # write_through


@pytest.mark.cli  # starts processes, fresh and preloaded
def test_a_console_script_is_preloaded_as_its_first_line_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``aiayn-train`` as installed: a script whose ``#!`` line names this environment's python
    (``python3`` where there is one), run as ``python <script>`` with that interpreter's name."""
    named = Path(sys.executable).with_name("python3")
    interpreter = named if named.is_file() else Path(sys.executable)
    program = tmp_path / "bin" / "aiayn-like"
    program.parent.mkdir()
    program.write_text(f"#!{interpreter}\n{SCRIPT}")
    program.chmod(0o755)
    seen = {}
    for fresh in (True, False):
        monkeypatch.setenv(preloaded.FRESH, "1" if fresh else "0")
        process = preloaded.popen([str(program), "return"], cwd=tmp_path, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, text=True)
        assert isinstance(process, preloaded.Process) != fresh
        seen[fresh] = (json.loads(process.communicate(timeout=120)[0].splitlines()[0])["seen"], process.returncode)
    assert seen[True] == seen[False]
    assert seen[False][0]["executable"] == str(interpreter) and seen[False][0]["argv"] == [str(program), "return"]
    other = tmp_path / "other"
    other.write_text(f"#!/usr/bin/env python3\n{SCRIPT}")  # not this environment's python by name: a fresh one
    assert preloaded._interpreter_of(other) is None


@pytest.mark.cli  # starts processes, fresh and preloaded
def test_the_python_processes_a_preloaded_process_starts_are_its_own_as_fresh_ones_are(tmp_path: Path) -> None:
    """DDP's spawned ranks and a ``python <script>`` that a preloaded tool starts are forked from a
    copy of the preloaded interpreter (torch already imported), and are otherwise what fresh ones
    are: the tool's children, in its process group, with its ignored signals and mask, their own
    arguments and exit status, and their command in /proc."""
    program = tmp_path / "starts.py"
    program.write_text(STARTS)
    seen = {}
    for fresh in (True, False):  # the tool's own choice is made from its environment
        process, out, err = _run(program, fresh=fresh, cwd=tmp_path, env={preloaded.FRESH: "1" if fresh else "0"})
        assert process.returncode == 0, err
        spawned, started, parent = (json.loads(line) for line in out.splitlines())
        assert spawned["parent"] == started["parent"] == parent["me"] == process.pid
        assert spawned["group"] == started["group"] == parent["group"] and parent["statuses"] == [3, 3]
        assert spawned["preloaded"] == started["preloaded"] == (not fresh)
        # The descriptors' numbers in spawn's command are the starting process's (which has one
        # more open where it is preloaded: its copy's socket).
        seen[fresh] = [{k: re.sub(r"=\d+", "=N", json.dumps(v)) for k, v in record.items()
                        if k not in ("parent", "group", "preloaded")} for record in (spawned, started)]
    assert seen[True] == seen[False]
    spawned, started = ({k: json.loads(v) for k, v in record.items()} for record in seen[False])
    assert spawned["command"][-8:] == ["-c", "from", "multiprocessing.spawn", "import", "spawn_main;",
                                       "spawn_main(tracker_fd=N,", "pipe_handle=N)", "--multiprocessing-fork"]
    assert spawned["argv"] == ["starts.py"] and spawned["path0"] == str(tmp_path)  # spawn's: the starting process's
    assert started["command"] == [str(program), "child"] and started["argv"] == [str(program), "child"]
    for record in (spawned, started):
        assert record["handlers"]["SIGUSR1"] == "<Handlers.SIG_IGN: 1>" and record["blocked"] == [signal.SIGUSR2]


@pytest.mark.cli  # starts processes
def test_within_python_starts_preloaded_a_python_start_of_this_process_is_preloaded(
        script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As the table runner and gpu-check start their jobs in a test's process; other commands, and
    every start afterwards, are plain ``subprocess.Popen`` ones."""
    monkeypatch.delenv(preloaded.FRESH, raising=False)
    with preloaded.python_starts_preloaded():
        process = subprocess.Popen([sys.executable, str(script), "exit"], env=preloaded._SERVER_ENVIRONMENT,
                                   stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
        assert isinstance(process, preloaded.Process)
        assert json.loads(process.communicate(timeout=120)[0].splitlines()[0])["seen"]["argv"] == [str(script), "exit"]
        assert process.returncode == 3
        plain = subprocess.Popen(["true"])
        assert type(plain) is preloaded._POPEN and plain.wait(timeout=60) == 0
    assert subprocess.Popen is preloaded._POPEN
    after = subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True, text=True, check=True)
    assert after.stdout == "1\n"


@pytest.mark.cli  # starts processes, fresh and preloaded
def test_a_preloaded_process_takes_signals_and_sessions_as_a_fresh_one(script: Path) -> None:
    cwd = script.parent.parent
    for fresh in (True, False):
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(preloaded.FRESH, "1" if fresh else "0")
            process = preloaded.popen([sys.executable, str(script), "wait"], cwd=cwd, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE, text=True, start_new_session=True)
        try:
            seen = json.loads(process.stdout.readline())["seen"]
            assert seen["own_session"]
            assert process.poll() is None
            with pytest.raises(subprocess.TimeoutExpired):
                process.wait(timeout=0.1)
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=60) == -signal.SIGTERM
        finally:
            process.kill()
            process.stdout.close()


@pytest.mark.cli  # starts processes, fresh and preloaded
def test_two_preloaded_processes_draw_their_own_random_numbers(script: Path) -> None:
    draws = [json.loads(_run(script, "return", fresh=False, cwd=script.parent)[1].splitlines()[0])["random"]
             for _ in range(2)]
    assert draws[0] != draws[1]


WANDB_FOLDERS = r'''
import json, os
import wandb
from wandb.sdk.artifacts.artifact import Artifact
from wandb.sdk.data_types._private import MEDIA_TMP

folders = [MEDIA_TMP.name, Artifact._TMP_DIR.name]
print(json.dumps({"folders": folders, "there": [os.path.isdir(folder) for folder in folders]}))
'''


@pytest.mark.cli  # starts processes
def test_each_preloaded_process_stages_wandbs_files_in_folders_of_its_own(tmp_path: Path) -> None:
    """wandb makes its staging folders as it is imported (in the preloaded interpreter) and removes
    them at exit: each process has its own, so that one ending leaves the next its folders (before:
    the first child's exit removed the folders every later child would write a Table's file to)."""
    script = tmp_path / "tool" / "wandb_folders.py"
    script.parent.mkdir()
    script.write_text(WANDB_FOLDERS)
    seen = [json.loads(_run(script, fresh=False, cwd=tmp_path)[1]) for _ in range(2)]
    assert [report["there"] for report in seen] == [[True, True], [True, True]]
    assert not set(seen[0]["folders"]) & set(seen[1]["folders"])
    assert not any(os.path.exists(folder) for report in seen for folder in report["folders"])  # removed at their exit
    assert seen[1]["folders"][0].endswith("wandb-media") and seen[1]["folders"][1].endswith("wandb-artifacts")


@pytest.mark.cli  # starts processes, fresh and preloaded
def test_a_preloaded_process_takes_its_rank_from_its_environment(script: Path) -> None:
    """ddp starts its later ranks as ``python <script>`` with LOCAL_RANK set; Lightning's and
    torchmetrics' rank_zero_only read the rank as they are imported (in the preloaded interpreter,
    before any child's environment existed): a preloaded child has the rank a fresh start has."""
    cwd = script.parent.parent
    seen = [json.loads(_run(script, "return", "ranks", fresh=fresh, cwd=cwd, env={"LOCAL_RANK": "1"})[1]
                       .splitlines()[0])["seen"]["ranks"] for fresh in (True, False)]
    assert seen[0] == seen[1] == {"lightning": 1, "torchmetrics": 1}
    # Lightning reads SLURM_PROCID too (torchmetrics only LOCAL_RANK); no rank at all is rank 0
    for env, ranks in (({"SLURM_PROCID": "3"}, {"lightning": 3, "torchmetrics": 0}),
                       ({}, {"lightning": 0, "torchmetrics": 0})):
        out = _run(script, "return", "ranks", fresh=False, cwd=cwd, env=env)[1]
        assert json.loads(out.splitlines()[0])["seen"]["ranks"] == ranks, env


def test_a_tools_command_in_the_tests_environment_is_preloaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite's tool runs take the preloaded interpreter (a variable that a library sets in this
    process while it runs, and that differs from the preloaded interpreter's, once made every run
    a fresh interpreter without a word)."""
    monkeypatch.delenv(preloaded.FRESH, raising=False)  # AIAYN_TESTS_FRESH_PROCESSES=1 make test: still true
    command = [sys.executable, "src/train.py", "--help"]
    assert preloaded._preloadable(command, {"cwd": preloaded.REPO, "env": {**preloaded._SERVER_ENVIRONMENT,
                                  "PYTORCH_NVML_BASED_CUDA_CHECK": "1", "TORCHINDUCTOR_CACHE_DIR": "/tmp/x",
                                  "KMP_INIT_AT_FORK": "FALSE"}})
    assert not preloaded._preloadable(command, {"cwd": preloaded.REPO,
                                                "env": {**preloaded._SERVER_ENVIRONMENT, "PYTHONHOME": "/elsewhere"}})
    # a rank's variables are read as Lightning is imported, and taken again by a preloaded child
    # (test_a_preloaded_process_takes_its_rank_from_its_environment): ddp's later ranks are preloaded
    assert preloaded._preloadable(command, {"cwd": preloaded.REPO,
                                            "env": {**preloaded._SERVER_ENVIRONMENT, "LOCAL_RANK": "1"}})


def test_a_home_of_its_own_is_preloaded_where_nothing_under_home_is_read_at_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests that give a run a HOME of its own (no ~/.netrc: W&B offline) take the preloaded
    interpreter in a virtual environment; not once the new HOME has a matplotlibrc, which
    matplotlib reads as it is imported."""
    monkeypatch.delenv(preloaded.FRESH, raising=False)
    command = [sys.executable, "src/train.py", "--help"]
    env = {**preloaded._SERVER_ENVIRONMENT, "HOME": str(tmp_path)}
    env.pop("MPLCONFIGDIR", None)
    env.pop("XDG_CONFIG_HOME", None)
    assert preloaded._preloadable(command, {"cwd": preloaded.REPO, "env": env}) == (sys.prefix != sys.base_prefix)
    (tmp_path / ".config" / "matplotlib").mkdir(parents=True)
    (tmp_path / ".config" / "matplotlib" / "matplotlibrc").write_text("figure.dpi: 72\n")
    assert not preloaded._preloadable(command, {"cwd": preloaded.REPO, "env": env})
