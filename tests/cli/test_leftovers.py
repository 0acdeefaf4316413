"""What a killed tool was writing (a temporary beside its target, aiayn.files.atomic_path) is
removed by the next write into that folder, evaluate's and average's included; what a live
process is writing, here or on another machine sharing the folder, is left to it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.inprocess import run_tool
from tests.helpers.runs import REPO, TrainedRun

# A writer of ``argv[1]`` that is killed (SIGKILL) halfway, or stays halfway until its stdin closes.
_WRITER = """
import os, signal, sys
from pathlib import Path
from aiayn.files import atomic_path
with atomic_path(Path(sys.argv[1])) as temporary:
    temporary.write_text("half of it")
    if sys.argv[2] == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    print("writing", flush=True)
    sys.stdin.read()
"""


def _writer(target: Path, how: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _WRITER, str(target), how], cwd=REPO, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


def _hidden(folder: Path) -> set[str]:
    return {path.name for path in folder.iterdir() if path.name.startswith(".")}


@pytest.mark.slow
def test_what_a_killed_evaluate_or_average_left_goes_with_the_next_write_there(tiny_run: TrainedRun, data_root: Path,
                                                                               tmp_path: Path) -> None:
    out = tmp_path / "eval"
    killed = _writer(out / "val.step4.hyp.de", "killed")
    assert killed.wait() == -9
    (left,) = _hidden(out)
    live = _writer(out / "other.json", "live")
    try:
        assert live.stdout.readline().strip() == "writing"
        elsewhere = out / ".val.step4.json.another_machine-1.tmp"  # another machine's writer, on a shared disk
        elsewhere.write_text("theirs")
        kept = _hidden(out) - {left}
        run_tool("src/evaluate.py", f"ckpt={tiny_run.last}", "split=val", "wandb=disabled", "decoding.max_len_offset=2",
                 f"out={out}", data_root=data_root, cache_dir=tiny_run.cache_dir)
        assert _hidden(out) == kept  # the killed writer's gone; the live one's and the other machine's kept
    finally:
        live.stdin.close()
        live.wait()

    folder = tmp_path / "averaged"
    killed = _writer(folder / "averaged.ckpt", "killed")
    assert killed.wait() == -9 and len(_hidden(folder)) == 1
    run_tool("src/average.py", f"ckpt={tiny_run.last}", "average_last=2", f"out={folder / 'again.ckpt'}",
             data_root=data_root, cache_dir=tiny_run.cache_dir)
    assert _hidden(folder) == set() and (folder / "again.ckpt").is_file()
