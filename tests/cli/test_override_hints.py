"""An override Hydra cannot apply says what to give instead (aiayn.cli.typos): a section given a
value as if it were a config group (translate's ``decoding=parsing``) its settings, and a typo in
a command line that holds a sweep the nearest setting, as it does without one. The tools run in
this process (tests.helpers.inprocess)."""

from __future__ import annotations

import pytest

from tests.helpers.inprocess import run_tool
from tests.helpers.runs import TINY
from tests.helpers.tables import tables_command


@pytest.mark.parametrize("tool", ["translate", "evaluate"])
def test_a_section_given_a_group_choice_says_how_to_give_its_settings(tool, tmp_path, data_root):
    """decoding is a config group in train and a section of settings in translate and evaluate
    (the checkpoint's, each overridable). Before: "decoding is not a setting here (…); did you
    mean decoding?"."""
    result = run_tool(f"src/{tool}.py", "ckpt=model.ckpt", "decoding=parsing", cwd=tmp_path, data_root=data_root,
                      check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith(
        f"{tool}.py: decoding=parsing: decoding is a section of settings here, not a choice of conf/decoding/; give "
        "its settings one by one, decoding.<setting>=<value> (decoding.alpha, decoding.beam_size, "), lines
    assert "each left unset: the checkpoint's own" in lines[0]
    assert lines[0].endswith("; conf/decoding/parsing.yaml's are decoding.beam_size=21 decoding.alpha=0.3 "
                             "decoding.max_len_offset=300 decoding.constrained=true"), lines
    assert "did you mean" not in lines[0]


HINT = "model.d_modle is not a setting here (Key 'd_modle' not in 'ModelConfig'); did you mean model.d_model?"


@pytest.mark.parametrize("sweeps", [["model.n_heads=2,4"], ["seed=range(1,3)", "experiment=glob(table3_A_h1*)"]],
                         ids=["choice", "range and glob"])
def test_a_typo_beside_a_sweep_gets_the_nearest_setting(sweeps, tmp_path, data_root):
    """The settings nearest a typo are found in the config of the sweep's first job. Before: none,
    as the config could not be composed from a command line that holds a sweep."""
    result = run_tool("src/train.py", "--multirun", *TINY, "model.d_modle=32", *sweeps,
                      f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path, data_root=data_root, check=False)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [f"train.py: {HINT}"]


def test_the_sweep_dry_run_gives_the_hint_beside_a_sweep_too(capsys: pytest.CaptureFixture):
    assert tables_command("sweep", *TINY, "model.d_modle=32", "model.n_heads=2,4") == 2
    assert capsys.readouterr().err == f"tables.py: {HINT}\n"
