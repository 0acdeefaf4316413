"""A subword model given (``task.subword_model``, aiayn.data.subwords.given_subwords): a task's data
are encoded with it instead of one learnt from its training split. Multi30k's are read and encoded
in the process; a corpus of one's own and WMT14 are each prepared into a folder of their own, which
holds the given model's bytes; a file that is no such model, or of another size, is refused in one
line naming the setting. Real sentencepiece models, real files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from aiayn.data.multi30k import Multi30kDataModule
from aiayn.data.parallel_text import ParallelTextDataModule
from aiayn.data.readers import read_lines, read_parallel
from aiayn.data.subwords import Subwords, given_subwords, train_or_load
from aiayn.data.wmt.preparation import prepare_wmt
from aiayn.errors import ConfigError
from tests.helpers.datafiles import own_corpus
from tests.helpers.inprocess import train
from tests.helpers.wmt import build_raw_tree

VOCAB = 500  # debug=tiny's


@pytest.fixture(scope="module")
def multi30k_model(data_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model learnt from another corpus than those it encodes below: Multi30k's training split."""
    src, tgt = read_parallel(data_root / "multi30k" / "train.en.gz", data_root / "multi30k" / "train.de.gz")
    return train_or_load(src + tgt, VOCAB, tmp_path_factory.mktemp("other")).path


def learnt_models(cache: Path) -> list[Path]:
    return sorted((cache / "sentencepiece").glob("*.model"))


def test_a_corpus_of_ones_own_is_prepared_with_the_given_model(multi30k_model: Path, data_root: Path,
                                                                tmp_path: Path) -> None:
    corpus, cache = own_corpus(tmp_path / "corpus", data_root), tmp_path / "cache"
    settings = {"data_dir": str(corpus), "src_lang": "en", "tgt_lang": "de", "vocab_size": VOCAB, "max_tokens": 2048,
                "max_length": 60, "cache_dir": str(cache), "prepare_workers": 2}
    data = ParallelTextDataModule(**settings, subword_model=str(multi30k_model))
    data.prepare_data()
    data.setup("fit")
    given = Subwords(multi30k_model)
    assert data.vocab.serialized() == given.serialized() and learnt_models(cache) == []  # none learnt
    assert (data.prepared / "sentencepiece.model").read_bytes() == multi30k_model.read_bytes()
    src, tgt = read_parallel(corpus / "train.en.gz", corpus / "train.de.gz")
    train_pairs = data.dataset("train")
    first = int(train_pairs.line_numbers[0])
    assert train_pairs[0][1:] == (given.encode([src[first]])[0], given.encode([tgt[first]])[0])
    assert data.dataset("val")[0][1] == given.encode(read_lines(corpus / "valid.en")[:1])[0]
    # A folder of its own: the same corpus with a model learnt from it is another preparation.
    assert ParallelTextDataModule(**settings).prepared != data.prepared


def test_wmt14_is_prepared_with_the_given_model(multi30k_model: Path, data_root: Path, tmp_path: Path) -> None:
    raw = build_raw_tree(data_root, tmp_path / "raw")
    folder = prepare_wmt(raw, tmp_path / "cache", "en", "de", VOCAB, workers=1, download=False,
                         subword_model=multi30k_model)
    assert (folder / "sentencepiece.model").read_bytes() == multi30k_model.read_bytes()
    assert learnt_models(tmp_path / "cache") == []
    report = json.loads((folder / "report.json").read_text())
    assert report["subwords"] == {"vocab_size": VOCAB, "given": str(multi30k_model)}
    assert "subword_model" in json.loads((folder / "meta.json").read_text())  # its SHA-256: what the key holds


@pytest.mark.slow  # learns a subword model, then trains a tiny run: about 2.5 s
def test_multi30k_and_a_training_run_encode_with_the_given_model(data_root: Path, tmp_path: Path,
                                                                 subword_cache: Path) -> None:
    """A model learnt from the WMT14 slice encodes Multi30k; a tiny run keeps it in its checkpoints."""
    corpus = own_corpus(tmp_path / "corpus", data_root)
    src, tgt = read_parallel(corpus / "train.en.gz", corpus / "train.de.gz")
    given = train_or_load(src + tgt, VOCAB, tmp_path / "other")
    data = Multi30kDataModule(str(data_root), vocab_size=VOCAB, cache_dir=str(tmp_path / "cache"),
                              subword_model=str(given.path))
    data.setup("fit")
    assert data.vocab.serialized() == given.serialized() and learnt_models(tmp_path / "cache") == []
    val = read_lines(data_root / "multi30k" / "val.en.gz")
    assert data.dataset("val")[3][1] == given.encode(val[3:4])[0]

    run_dir = tmp_path / "run"
    train(run_dir, "debug=tiny", "logger=csv", "optim.train_steps=1", "test_after_training=false",
          "visualize_at_end=false", f"task.subword_model={given.path}", data_root=data_root, cache_dir=subword_cache)
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert checkpoint["subwords"] == given.serialized()
    assert checkpoint["hyper_parameters"]["run_config"]["task"]["subword_model"] == str(given.path)


def test_a_file_that_is_no_such_model_is_refused_naming_the_setting(multi30k_model: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=rf"^task.subword_model={tmp_path}/none.model: no such file; give a "):
        given_subwords(tmp_path / "none.model", VOCAB)
    (tmp_path / "notes.model").write_text("notes\n")
    with pytest.raises(ConfigError, match=r"^task.subword_model=.*notes.model: not a loadable sentencepiece model .*; "
                                          r"give a sentencepiece model with pad 0, unk 1, bos 2 and eos 3"):
        given_subwords(tmp_path / "notes.model", VOCAB)
    with pytest.raises(ConfigError, match=r"has 500 subwords and task.vocab_size is 8,000; give task.vocab_size=500$"):
        given_subwords(multi30k_model, 8000)
    assert given_subwords(multi30k_model, VOCAB).vocab_size == VOCAB
