"""The 10% treebank sample's data module as the parsing tests read it, with each linearisation
(leaves as XX, the paper's, or as the words)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiayn.data.parsing.datamodule import ParsingDataModule
from tests.helpers.treebank import SAMPLE_SPLIT


@pytest.fixture(scope="session")
def parsing_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for the modules' data modules: the subword model of each linearisation is learnt
    once (2 s) and its training pairs encoded once, then read from it (0.06 s)."""
    return tmp_path_factory.mktemp("parsing-cache")


@pytest.fixture(scope="module", params=["xx", "words"])
def datamodule(request: pytest.FixtureRequest, data_root: Path, parsing_cache: Path) -> ParsingDataModule:
    """The sample with each linearisation, its splits set up for training and the test."""
    dm = ParsingDataModule(data_root=str(data_root), treebank="ptb_sample", vocab_size=600, max_tokens=4096,
                           max_length=600, cache_dir=str(parsing_cache),
                           linearization=request.param, **SAMPLE_SPLIT)
    dm.setup("fit")
    dm.setup("test")
    return dm
