"""What the export tests share: the tiny run's last checkpoint loaded, its MarianMT export, and
real Multi30k sentences (test2016, both sides)."""

from __future__ import annotations

from pathlib import Path

import pytest

from aiayn.checkpoints.trained import TrainedModel, load_trained
from aiayn.data.readers import read_lines

N_SENTENCES = 12


@pytest.fixture(scope="session")
def tiny_trained(tiny_run) -> TrainedModel:
    return load_trained(tiny_run.last, "cpu")


@pytest.fixture(scope="session")
def hf_export(tiny_run, tiny_trained: TrainedModel, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny run's last checkpoint exported as a MarianMT folder (read-only for the tests)."""
    pytest.importorskip("transformers", reason="transformers is not installed (pip install 'aiayn[serve]')")
    from aiayn.export.huggingface import export_huggingface

    out = tmp_path_factory.mktemp("export") / "hf"
    return export_huggingface(load_trained(tiny_run.last, "cpu"), out, ckpt=tiny_run.last, steps=[tiny_trained.step])


@pytest.fixture(scope="session")
def multi30k_pairs(data_root: Path) -> tuple[list[str], list[str]]:
    """The first test2016 sentences, English and German, with a line of unusual characters added."""
    folder = data_root / "multi30k"
    english = read_lines(folder / "test_2016_flickr.en.gz")[:N_SENTENCES]
    german = read_lines(folder / "test_2016_flickr.de.gz")[:N_SENTENCES]
    return english + ["Ein «Zürcher» café — naïve 😀 résumé"], german + ["A “quoted” ½ déjà-vu"]
