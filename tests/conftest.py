"""Shared test fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def data_root() -> Path:
    """The real data folder: $AIAYN_DATA_ROOT, else ``<repo>/../shared/data``; fails if absent."""
    root = Path(os.environ.get("AIAYN_DATA_ROOT") or REPO.parent / "shared" / "data")
    if not (root / "multi30k" / "train.en.gz").is_file():
        pytest.fail(
            f"real data not found: {root / 'multi30k' / 'train.en.gz'} is missing; "
            "set AIAYN_DATA_ROOT to the folder holding multi30k/",
            pytrace=False,
        )
    return root
