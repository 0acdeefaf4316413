"""Settings renamed so that each has one name in every tool (aiayn.cli.renamed): an old name on
the command line still works for one release and says, in one line, what it is called now."""

from __future__ import annotations

import sys

import pytest
from omegaconf import OmegaConf

from aiayn.cli.renamed import RENAMED, UNTIL, new_arguments


def test_old_names_become_the_new_ones_with_a_notice_each() -> None:
    arguments, notices = new_arguments(["task.decoding.beam_size=5", "+task.decoding.alpha=1", "model=big",
                                        "task.name=x", "decoding.kv_cache=false"], RENAMED["train"])
    assert arguments == ["decoding.beam_size=5", "+decoding.alpha=1", "model=big", "task.name=x",
                         "decoding.kv_cache=false"]
    assert notices == [f"task.decoding.beam_size is now decoding.beam_size; the old name works until release {UNTIL}",
                       f"task.decoding.alpha is now decoding.alpha; the old name works until release {UNTIL}"]
    arguments, notices = new_arguments(["beam_size=2", "alpha=0", "output=x.de", "batch_size=4", "beam_sizes=1"],
                                       RENAMED["translate"])
    assert arguments == ["decoding.beam_size=2", "decoding.alpha=0", "out=x.de", "batch_size=4", "beam_sizes=1"]
    assert len(notices) == 3
    assert new_arguments(["dir=run", "last=5", "out=a.ckpt"], RENAMED["average"])[0] == [
        "ckpt=run", "average_last=5", "out=a.ckpt"]
    assert new_arguments(["out_dir=eval"], RENAMED["evaluate"])[0] == ["out=eval"]


def test_the_train_command_takes_the_old_decoding_name(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture) -> None:
    from aiayn.cli.train import main

    monkeypatch.setattr(sys, "argv", ["train.py", "task.decoding.beam_size=7", "--cfg", "job"])
    main()
    captured = capsys.readouterr()
    assert OmegaConf.create(captured.out).decoding.beam_size == 7
    notice, plan = captured.err.strip().splitlines()[0], captured.err.strip().splitlines()[1:]
    assert notice == (f"train.py: task.decoding.beam_size is now decoding.beam_size; the old name works until "
                      f"release {UNTIL}")
    assert plan[0].startswith("plan: "), plan  # the plan, as --cfg job prints it after the notice
