"""The data root and the cache: the folders a data module reads and writes under, as the settings
(``paths.data_root``, ``paths.cache_dir``) and their variables (``AIAYN_DATA_ROOT``,
``AIAYN_CACHE_DIR``) name them."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiayn.data.multi30k import Multi30kDataModule


def test_a_data_module_built_without_a_cache_uses_paths_cache_dirs_default(data_root, tmp_path, monkeypatch):
    """As conf/paths/default.yaml's ``paths.cache_dir``: ``$AIAYN_CACHE_DIR``, else ``~/.cache/aiayn``
    (before: ``$XDG_CACHE_HOME/aiayn``, another folder than the tools' where that variable is set)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("AIAYN_CACHE_DIR", str(tmp_path / "cache"))
    assert Multi30kDataModule(data_root=str(data_root)).cache_dir == tmp_path / "cache"
    monkeypatch.delenv("AIAYN_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert Multi30kDataModule(data_root=str(data_root)).cache_dir == tmp_path / "home" / ".cache" / "aiayn"


@pytest.mark.parametrize("variable", ["AIAYN_DATA_ROOT", "AIAYN_CACHE_DIR"])
def test_a_data_root_or_cache_dir_that_is_a_file_is_named_by_its_variable(data_root, tmp_path, variable):
    from tests.helpers.inprocess import run_tool
    from tests.helpers.runs import TINY

    file = tmp_path / "a-file"
    file.write_text("not a folder\n")
    roots = {"data_root": file if variable == "AIAYN_DATA_ROOT" else data_root,
             "cache_dir": file if variable == "AIAYN_CACHE_DIR" else tmp_path / "cache"}
    for tool, args in (("src/train.py", TINY), ("src/prepare.py", ["task=wmt_en_de"])):
        run_dir = tmp_path / Path(tool).stem
        result = run_tool(tool, *args, f"hydra.run.dir={run_dir}", check=False, **roots)
        lines = [line for line in result.stderr.strip().splitlines() if "Seed set to" not in line]  # Lightning's INFO
        assert result.returncode == 2 and len(lines) == 1, result.stderr[-2000:]
        assert lines[0].startswith(f"{Path(tool).name}: {variable}={file} (") and "is a file, not a folder: set " \
            f"{variable} to a folder (or unset it for the default)" in lines[0]  # before: 12 "missing" files, or a traceback
        assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*"))
    assert not (tmp_path / "train").exists()  # a training run refused before it starts leaves no folder
