"""What an export tells the people who serve it: the model card of an averaged checkpoint
(average.py's file) and of a CTranslate2 export, each as the folder it is in is used. On the
session's tiny trained run; the tools run in this process (tests.helpers.inprocess)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from aiayn.checkpoints.digest import digest_path
from tests.helpers.inprocess import run_tool
from tests.helpers.runs import TrainedRun

pytest.importorskip("transformers", reason="transformers is not installed (pip install 'aiayn[serve]')")


def _tool(tiny_run: TrainedRun, data_root: Path, script: str, *arguments: str):
    return run_tool(script, *arguments, data_root=data_root, cache_dir=tiny_run.cache_dir)


def test_an_averaged_checkpoint_is_exported_as_the_average_with_no_score_of_its_newest_step(tiny_run, data_root,
                                                                                             tmp_path):
    """average.py's file, exported, is said to be the average of its steps, and the dev score the run
    measured for its newest step alone is not put on its card (before: "4 steps" and that score)."""
    checkpoints = tmp_path / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    for name in ("step0000003.ckpt", "step0000004.ckpt"):
        shutil.copy(tiny_run.checkpoints / name, checkpoints / name)
        shutil.copy(digest_path(tiny_run.checkpoints / name), digest_path(checkpoints / name))
    shutil.copy(tiny_run.run_dir / "summary.json", tmp_path / "run" / "summary.json")
    newest = _tool(tiny_run, data_root, "src/export.py", f"ckpt={checkpoints / 'step0000004.ckpt'}",
                   f"out={tmp_path / 'newest'}")
    assert "(step 4) as hf" in newest.stdout
    assert "dev set during training" in (tmp_path / "newest" / "README.md").read_text(encoding="utf-8")

    average = checkpoints / "average.ckpt"
    _tool(tiny_run, data_root, "src/average.py", f"ckpt={checkpoints / 'step0000004.ckpt'}", "average_last=2",
          f"out={average}")
    exported = _tool(tiny_run, data_root, "src/export.py", f"ckpt={average}", f"out={tmp_path / 'hf'}")
    assert "(step 4, averaged over steps 3, 4) as hf" in exported.stdout, exported.stdout
    card = (tmp_path / "hf" / "README.md").read_text(encoding="utf-8")
    assert f"the average of 2 checkpoints at steps 3, 4 ({average})" in card
    assert "4 steps" not in card and "dev set during training" not in card
