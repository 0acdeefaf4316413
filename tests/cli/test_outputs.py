"""Where the tools write (``out=``), checked before any work (aiayn.cli.outputs): a folder that
cannot be made or written in is one line naming ``out=``, exit status 2, and nothing is made."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiayn.cli.outputs import output_file, output_folder
from aiayn.errors import ConfigError
from tests.helpers.inprocess import run_tool
from tests.helpers.runs import TrainedRun

# A folder no process writes in, root's included (a pseudo file system): what a read-only disk is.
UNWRITABLE = Path("/proc")
# Each tool that writes a file or folder of its own, with what it needs beside out=.
TOOLS = {
    "translate": lambda run, out: [f"ckpt={run.last}", f"out={out}/translations.de"],
    "evaluate": lambda run, out: [f"ckpt={run.last}", f"out={out}", "wandb=disabled", "split=val"],
    "average": lambda run, out: [f"ckpt={run.run_dir}", "average_last=2", f"out={out}/averaged.ckpt"],
    "visualize": lambda run, out: [f"ckpt={run.last}", f"out={out}"],
}


def _contents(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*"))


def test_a_folder_that_can_be_made_and_written_in_is_taken_and_nothing_is_made(tmp_path: Path) -> None:
    assert output_folder(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert output_file(str(tmp_path / "a" / "out.txt")) == tmp_path / "a" / "out.txt"
    assert _contents(tmp_path) == []  # the probe written and removed; the folders are the tool's to make


def test_a_file_in_the_way_or_a_folder_that_cannot_be_written_in_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("notes\n")
    with pytest.raises(ConfigError, match=f"^out={tmp_path}/notes.txt/sub: cannot create its folder "
                                          f"{tmp_path}/notes.txt/sub \\({tmp_path}/notes.txt is a file\\); give a path"):
        output_folder(tmp_path / "notes.txt" / "sub")
    if UNWRITABLE.is_dir():  # (root writes in any folder of a disk, whatever its mode)
        with pytest.raises(ConfigError, match=f"^out={UNWRITABLE}/x/y.ckpt: not writable \\({UNWRITABLE}: "):
            output_file(f"{UNWRITABLE}/x/y.ckpt")
        with pytest.raises(ConfigError, match=f"^evaluate's out={UNWRITABLE}/eval: not writable"):  # the caller's name
            output_folder(UNWRITABLE / "eval", "evaluate's out")


@pytest.mark.slow  # each tool's start and checkpoint
@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize("where", ["under a file", "unwritable"])
def test_each_tool_refuses_an_output_it_could_not_write_before_any_work(tool: str, where: str, tiny_run: TrainedRun,
                                                                         data_root: Path, tmp_path: Path) -> None:
    """Before: average.py and visualize.py gave a traceback for a folder under a file; average.py
    named its own temporary file (``/sys/.x.ckpt.vm-7740.tmp: Permission denied``) after averaging,
    evaluate.py and visualize.py the OS's error after decoding."""
    if where == "unwritable" and not UNWRITABLE.is_dir():
        pytest.skip(f"no {UNWRITABLE} here")
    (tmp_path / "notes.txt").write_text("notes\n")
    out = tmp_path / "notes.txt" / "sub" if where == "under a file" else UNWRITABLE / "aiayn-out"
    before = _contents(tmp_path)
    result = run_tool(f"src/{tool}.py", *TOOLS[tool](tiny_run, out), stdin="A dog.\n", data_root=data_root,
                      cache_dir=tiny_run.cache_dir, check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert lines[0].startswith(f"{tool}.py: out={out}"), lines[0]
    why = f"({tmp_path}/notes.txt is a file)" if where == "under a file" else f"not writable ({UNWRITABLE}: "
    fix = "give a path in a folder you can write to" if tool in ("translate", "average") else \
        "give out=<a folder you can write in>"
    assert why in lines[0] and lines[0].endswith(fix), lines[0]
    assert result.stdout == "" and _contents(tmp_path) == before
