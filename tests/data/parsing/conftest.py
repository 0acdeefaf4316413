"""The 10% treebank sample's data module as the parsing tests read it, with each linearisation
(leaves as XX, the paper's, or as the words)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiayn.data.parsing.datamodule import ParsingDataModule
from tests.helpers.treebank import SAMPLE_SPLIT


@pytest.fixture(scope="module", params=["xx", "words"])
def datamodule(request: pytest.FixtureRequest, data_root: Path,
               tmp_path_factory: pytest.TempPathFactory) -> ParsingDataModule:
    """The sample with each linearisation, its splits set up for training and the test."""
    dm = ParsingDataModule(data_root=str(data_root), treebank="ptb_sample", vocab_size=600, max_tokens=4096,
                           max_length=600, cache_dir=str(tmp_path_factory.mktemp("cache")),
                           linearization=request.param, **SAMPLE_SPLIT)
    dm.setup("fit")
    dm.setup("test")
    return dm
