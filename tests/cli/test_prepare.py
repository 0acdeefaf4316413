"""src/prepare.py's own bad input: a task that does not exist and a raw folder that does not,
each one line on stderr and exit status 2 (the WMT raw trees with something wrong are tested in
tests/data/wmt/test_prepare_errors.py). The tool runs in this process (tests.helpers.inprocess)."""

from __future__ import annotations

from tests.helpers.inprocess import run_tool


def _one_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, (result.returncode, result.stderr[-3000:])
    return lines[0]


def test_an_unknown_task_lists_the_tasks(tmp_path):
    line = _one_line(run_tool("src/prepare.py", "task=wmt_en_cs", f"hydra.run.dir={tmp_path}", check=False))
    assert line.startswith("prepare.py: ") and "Could not find 'task/wmt_en_cs'" in line
    assert "Available options in 'task': multi30k_de_en, multi30k_en_de, wmt_en_de, wmt_en_fr, wsj, wsj_semi" in line


def test_a_raw_dir_that_does_not_exist_is_named(tmp_path):
    line = _one_line(run_tool("src/prepare.py", "task=wmt_en_de", f"task.raw_dir={tmp_path / 'nowhere'}",
                              "task.datamodule.download=false", f"hydra.run.dir={tmp_path / 'run'}",
                              cache_dir=tmp_path / "cache", check=False))
    assert line == (f"prepare.py: task.raw_dir={tmp_path / 'nowhere'} does not exist: point task.raw_dir at the folder "
                    "where WMT's archives are unpacked (docs/wmt.md lists them), or set task.datamodule.download=true "
                    "to fetch them into it")
