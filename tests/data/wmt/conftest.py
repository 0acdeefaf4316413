"""The miniature WMT14 EN-DE raw tree the WMT tests prepare (tests/helpers/wmt.py builds it)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers.wmt import build_raw_tree


@pytest.fixture(scope="session")
def raw_tree(data_root, tmp_path_factory) -> Path:
    """The miniature raw tree, shared read-only: a test that changes files changes a copy."""
    return build_raw_tree(data_root, tmp_path_factory.mktemp("wmt14_raw"))


@pytest.fixture
def raw_copy(raw_tree, tmp_path) -> Path:
    """A copy of the raw tree of the test's own, to change (file times preserved)."""
    return Path(shutil.copytree(raw_tree, tmp_path / "raw"))
