"""aiayn.checkpoints.given and io's lines for a ckpt= that names nothing: every tool's ckpt= goes
through them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aiayn.checkpoints.given import checkpoint_list, one_checkpoint
from aiayn.checkpoints.io import read_checkpoint
from aiayn.errors import ConfigError, DataError


@pytest.mark.parametrize("given, said", [(None, "ckpt=null"), ("", "ckpt="), ("  ", "ckpt=")])
def test_a_ckpt_that_names_nothing_is_refused_naming_what_to_give(given, said: str) -> None:
    """Before: "None: checkpoint not found" for ckpt=null, and ckpt= took the working folder for a run's."""
    for read in (checkpoint_list, one_checkpoint):
        with pytest.raises(ConfigError) as refused:
            read(given)
        assert str(refused.value) == (f"{said} names no checkpoint; give one file, e.g. "
                                      "ckpt=<run folder>/checkpoints/last.ckpt")


def test_a_link_to_a_step_that_is_not_there_names_its_target(tmp_path: Path) -> None:
    """A run folder copied without the step its last.ckpt points to (before: only "checkpoint not found")."""
    link = tmp_path / "last.ckpt"
    os.symlink("step0000004.ckpt", link)
    with pytest.raises(DataError) as missing:
        read_checkpoint(link)
    assert str(missing.value) == f"{link}: checkpoint not found (a link to step0000004.ckpt, which is not there)"
    with pytest.raises(DataError, match=r"^\S+/step0000004\.ckpt: checkpoint not found$"):
        read_checkpoint(tmp_path / "step0000004.ckpt")
