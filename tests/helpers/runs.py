"""What the tests share to run the tools: the checkout, the tiny run's settings, and running a
tool (src/*.py, benchmarks/*.py, a console script) as its own process, as a user runs it (forked
from the preloaded interpreter where it starts the same way: tests/helpers/preloaded.py).

Test modules import these from here, never from one another.
"""

from __future__ import annotations

import contextlib
import os
import pty
import resource
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.preloaded import IN_THE_FOREGROUND as IN_THE_FOREGROUND  # noqa: PLC0414  theirs to share
from tests.helpers.preloaded import popen

REPO = Path(__file__).resolve().parents[2]

# A model and run small enough for seconds on a CPU (conf/debug/tiny.yaml, as users run it);
# everything else is the default job's config.
TINY = ["debug=tiny"]
# The tiny model alone, for runs of other lengths.
TINY_MODEL = [
    "model.n_layers=1", "model.d_model=32", "model.d_ff=64", "model.n_heads=2", "model.d_k=16", "model.d_v=16",
    "task.vocab_size=500",
]

# A paper row (experiment=table3_*) cut to seconds on a CPU: it keeps what the row varies (N, ε_ls,
# …) and cuts the widths; two steps, one batch of each evaluation split.
TINY_ROW = [
    "model.d_model=32", "model.d_ff=64", "model.n_heads=2", "model.d_k=16", "model.d_v=16",
    "task.vocab_size=500", "task.datamodule.max_tokens=1024", "task.datamodule.eval_max_tokens=1024",
    "decoding.max_len_offset=5", "optim.train_steps=2", "trainer.limit_val_batches=1",
    "trainer.limit_test_batches=1", "trainer.num_sanity_val_steps=0", "checkpoint.every_n_train_steps=1",
    "optim.warmup_steps=2",
]

# The session's one tiny trained run (the `tiny_run` fixture of tests/conftest.py), read by the tests
# of evaluate, translate, average, visualize and bad input. On top of TINY it has what each of them
# needs: 2 layers (six attention pictures, drawn at the end of training) and a step checkpoint after
# every step (steps 1-4).
TINY_RUN = [
    *TINY, "model.n_layers=2", "logger=none", "visualize_at_end=true", "checkpoint.every_n_train_steps=1",
]


# A test that starts two CPU training processes (DDP over gloo) on one node: train refuses more CPU
# processes than this process may run on, so where it may run on one core (``taskset -c 0``) the
# test is skipped, saying so.
TWO_CORES = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2,
                               reason="two CPU training processes need two CPU cores; this process may run on one")


def children(pid: int, marker: bytes = b"") -> list[int]:
    """The child processes of ``pid`` whose command line holds ``marker`` (DDP ranks:
    ``spawn_main`` for ddp_spawn's, ``src/train.py`` for those ddp starts), oldest first."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if parent == pid and marker in command:
            found.append(int(entry.name))
    return sorted(found)


@dataclass(frozen=True)
class TrainedRun:
    """A finished src/train.py run: its directory, the AIAYN_CACHE_DIR it used, and its overrides."""

    run_dir: Path
    cache_dir: Path
    overrides: tuple[str, ...]

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def last(self) -> Path:
        return self.checkpoints / "last.ckpt"


def offline_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with W&B offline and quiet."""
    return {**(os.environ if base is None else base), "WANDB_MODE": "offline", "WANDB_SILENT": "true"}


# run_command(stdout=TERMINAL): the process's stdout is a terminal, as in an interactive shell.
TERMINAL = "terminal"


def run_command(command: Sequence[str], *, cwd: Path = REPO, env: Mapping[str, str] | None = None,
                data_root: Path | None = None, cache_dir: Path | None = None, stdin: str | bytes | None = None,
                check: bool = True, timeout: float = 600,
                stdout: Path | str | None = None) -> subprocess.CompletedProcess:
    """Run ``command`` and return its result (str output; bytes when ``stdin`` is bytes).

    ``env`` is the environment to start from (default: this process's, with W&B offline and
    quiet); ``data_root`` and ``cache_dir`` set AIAYN_DATA_ROOT and AIAYN_CACHE_DIR. Without
    ``stdin`` the process reads an empty stdin. ``stdout``: None captures it through a pipe; a path
    has it written to that file, as ``> file`` does; :data:`TERMINAL` gives the process a
    pseudo-terminal (TERM set where the environment has none). Either way the result's stdout is
    what was written, control sequences and all. With ``check``, a non-zero exit fails the test
    with the command and the end of its output."""
    environment = offline_environment() if env is None else dict(env)
    if data_root is not None:
        environment["AIAYN_DATA_ROOT"] = str(data_root)
    if cache_dir is not None:
        environment["AIAYN_CACHE_DIR"] = str(cache_dir)
    if stdout == TERMINAL:
        environment.setdefault("TERM", "xterm")
    with _stdout(stdout) as (target, written):
        with popen(list(command), cwd=cwd, env=environment, stdout=target, stderr=subprocess.PIPE,
                   stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
                   text=not isinstance(stdin, bytes)) as process:
            try:
                output, errors = process.communicate(stdin, timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                raise
        result = subprocess.CompletedProcess(process.args, process.returncode, output, errors)
    if written is not None:
        result.stdout = written()
    if check and result.returncode != 0:
        stdout, stderr = (output.decode(errors="replace") if isinstance(output, bytes) else output
                          for output in (result.stdout, result.stderr))
        raise AssertionError(f"exit status {result.returncode} from\n  {' '.join(map(str, command))}\n(in {cwd})\n"
                             f"--- stdout (end) ---\n{stdout[-3000:]}\n--- stderr (end) ---\n{stderr[-5000:]}")
    return result


@contextlib.contextmanager
def _stdout(where: Path | str | None) -> Iterator[tuple[object, Callable[[], str] | None]]:
    """(what subprocess is given as stdout, what reads back what was written: None for a pipe)."""
    if where is None:
        yield subprocess.PIPE, None
    elif where == TERMINAL:
        # The terminal's side is read as it is written, so that the process never waits on it.
        primary, secondary = pty.openpty()
        chunks: list[bytes] = []
        reader = threading.Thread(target=_read_all, args=(primary, chunks), daemon=True)
        reader.start()
        try:
            yield secondary, lambda: b"".join(chunks).decode("utf-8", errors="replace")
        finally:
            os.close(secondary)  # the process has ended: the reader now reads to the end
            reader.join(timeout=30)
            os.close(primary)
    else:
        with open(where, "w") as file:
            yield file, Path(where).read_text


def _read_all(descriptor: int, chunks: list[bytes]) -> None:
    while True:
        try:
            data = os.read(descriptor, 65536)
        except OSError:  # EIO: every writer has closed the terminal
            return
        if not data:
            return
        chunks.append(data)


def run_tool(script: str, *args: str, cwd: Path = REPO, **options) -> subprocess.CompletedProcess:
    """``python <script> <args>``, ``script`` relative to the checkout (``src/train.py``,
    ``benchmarks/decode_speed.py``); from another ``cwd`` it is given by its full path. The
    options are run_command's."""
    path = script if cwd == REPO else str(REPO / script)
    return run_command([sys.executable, path, *args], cwd=cwd, **options)


def train(run_dir: Path, *overrides: str, **options) -> subprocess.CompletedProcess:
    """``src/train.py`` with ``overrides`` into ``run_dir`` (hydra.run.dir); options as run_command's."""
    return run_tool("src/train.py", *overrides, f"hydra.run.dir={run_dir}", **options)


def in_small_filesystem(command: Sequence[str], folder: Path, size: str = "2m") -> list[str] | None:
    """``command`` with ``folder`` on a tmpfs of ``size`` of its own (a mount namespace), where this
    machine allows mounting one; else None. The tmpfs goes with the namespace: what the command
    left in it is listed in ``<folder>.left`` beside it: every file and folder below it, one path
    (relative to it) a line."""
    if not _mount_namespaces():
        return None
    script = ('mount -t tmpfs -o size="$1" tmpfs "$0" || exit 99; shift; "$@"; status=$?; '
              'find "$0" -mindepth 1 -printf "%P\\n" > "$0.left"; exit $status')
    return ["unshare", "--mount", "--map-root-user", "sh", "-c", script, str(folder), size, *command]


def in_read_only_folder(command: Sequence[str], folder: Path) -> list[str] | None:
    """``command`` with ``folder`` mounted read-only over itself (a mount namespace): a folder
    nobody can write to, root included (root writes into a folder whatever its mode), where this
    machine allows it; else None."""
    if not _mount_namespaces():
        return None
    script = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" || exit 99; exec "$@"'
    return ["unshare", "--mount", "--map-root-user", "sh", "-c", script, str(folder), *command]


def _mount_namespaces() -> bool:
    """Whether this machine lets a process mount in a mount namespace of its own."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--mount", "--map-root-user", "true"], check=False, capture_output=True)
    return probe.returncode == 0


def limit_file_size(size: int) -> Callable[[], None]:
    """A ``preexec_fn``: files of at most ``size`` bytes (``ulimit -f``), a write past it failing with
    EFBIG instead of killing the process; where no tmpfs can be mounted (:func:`in_small_filesystem`)."""
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    return limit


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under ``folder``: its size and modification time, to tell whether
    anything was written there. The run's lock file (aiayn.cli.run_folder.LOCK) is left out: a run
    that would resume the folder holds it before it checks the checkpoint (and may be refused),
    which changes the holder's note in it and nothing of the run."""
    return {str(path.relative_to(folder)): (path.lstat().st_size, path.lstat().st_mtime_ns)
            for path in sorted(folder.rglob("*")) if path.name != ".lock"}
