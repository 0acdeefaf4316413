"""WMT14 preparation on a miniature raw tree built from the real shared files (no network; the
tree is `raw_tree` of conftest.py): cleaning report, subwords, binarised storage, reuse of a
preparation only for the same raw files, batches, and src/prepare.py + src/train.py with
task=wmt_en_de (the raw files themselves: test_raw_files.py). The folder is prepared by running src/prepare.py
(the `prepared` fixture); the tools run in this process (tests.helpers.inprocess)."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from aiayn.data.batching import TokenBatchSampler
from aiayn.data.readers import read_lines
from aiayn.data.storage import MappedCorpus, write_corpus
from aiayn.data.wmt.cleaning import CleaningRules, normalize
from aiayn.data.wmt.datamodule import WMTDataModule
from aiayn.data.wmt.preparation import prepare_wmt
from aiayn.data.wmt.sgm import read_sgm
from aiayn.errors import DataError
from tests.helpers.inprocess import run_tool
from tests.helpers.runs import TINY

VOCAB = 500


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def prepared(raw_tree, cache) -> Path:
    """Prepared through the entry point, as a user runs it."""
    result = run_tool("src/prepare.py", "task=wmt_en_de", f"task.raw_dir={raw_tree}", f"task.vocab_size={VOCAB}",
                      "task.datamodule.download=false", "task.datamodule.prepare_workers=2",
                      f"hydra.run.dir={cache}/prepare-run", cache_dir=cache, timeout=300)
    line = next(line for line in result.stdout.splitlines() if line.startswith("prepared wmt_en_de in "))
    folder = Path(line.split(" in ", 1)[1].split(" (")[0])
    assert folder.parent == cache / "wmt14"
    log = (cache / "prepare-run" / "prepare.log").read_text()
    assert "cleaning total: read 10000" in log and "cleaning commoncrawl: read 3000" in log
    return folder


@pytest.fixture(scope="module")
def dm(raw_tree, cache, prepared) -> WMTDataModule:
    module = WMTDataModule(str(raw_tree), vocab_size=VOCAB, max_tokens=1024, cache_dir=str(cache), download=False)
    module.prepare_data()  # reuses the prepared folder
    module.setup("fit")
    module.setup("test")
    return module


# --- the prepared folder ---------------------------------------------------------------------


@pytest.mark.slow
def test_prepare_counts_each_cleaning_rule_and_stores_the_kept_pairs_unescaped(data_root, prepared):
    report = json.loads((prepared / "report.json").read_text())
    total = report["cleaning"]["total"]
    assert total["read"] == 10_000 and [report["cleaning"]["corpora"][n]["read"] for n in
                                        ("europarl-v7", "commoncrawl", "news-commentary-v9")] == [5000, 3000, 2000]
    assert total["kept"] + total["empty"] + total["too_long"] + total["ratio"] == 10_000
    # the rules, counted by hand on the raw lines
    en = read_lines(data_root / "wmt14" / "train_sample" / "src-train.txt.gz")
    de = read_lines(data_root / "wmt14" / "train_sample" / "tgt-train.txt.gz")
    outcomes = Counter(CleaningRules().check(normalize(s), normalize(t)) for s, t in zip(en, de))
    assert (total["empty"], total["too_long"], total["ratio"]) == (outcomes["empty"], outcomes["too_long"], outcomes["ratio"])
    assert total["ratio"] > 0
    assert report["train_pairs"] == total["kept"] == outcomes[None]
    assert report["eval_sizes"] == {"newstest2013": 3000, "newstest2014": 3003}

    corpus = MappedCorpus(prepared, "train")
    assert len(corpus) == total["kept"]
    assert np.load(prepared / "train.src.ids.npy", mmap_mode="r").dtype == np.uint16
    # the XML-escaped sample comes out unescaped
    assert sum("&apos;" in line or "&quot;" in line for line in en) > 100
    from aiayn.data.subwords import Subwords
    vocab = Subwords(prepared / "sentencepiece.model")
    decoded = vocab.decode([corpus[i][1] for i in range(len(corpus))])
    assert not any("&apos;" in line or "&quot;" in line or "&amp;" in line for line in decoded)
    assert sum("'" in line for line in decoded) > 100
    # the first kept pair, encoded by hand, is the first stored pair
    first = next((normalize(s), normalize(t)) for s, t in zip(en, de) if CleaningRules().check(normalize(s), normalize(t)) is None)
    assert [corpus[0][1], corpus[0][2]] == vocab.encode(list(first))
    # the record of every file, the token arrays' SHA-256 taken as they were written, is of its bytes
    recorded = json.loads((prepared / "meta.json").read_text())["files"]
    assert sorted(recorded) == sorted(path.name for path in prepared.iterdir() if path.name != "meta.json")
    assert all(recorded[name] == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
               for name in recorded for data in [(prepared / name).read_bytes()])


def test_mapped_corpus_round_trip_and_pickling(tmp_path):
    import pickle

    write_corpus(tmp_path, "toy", [[5, 6], [7], [8, 9, 10]], [[11], [12, 13], []], vocab_size=100_000)
    corpus = MappedCorpus(tmp_path, "toy", indices=np.array([2, 0]))
    assert len(corpus) == 2 and corpus[0] == (0, [8, 9, 10], []) and corpus[1] == (1, [5, 6], [11])
    assert corpus.src_lengths.tolist() == [4, 3] and corpus.tgt_lengths.tolist() == [1, 2]
    assert corpus.line_numbers.tolist() == [2, 0]
    state = pickle.dumps(corpus)
    assert len(state) < 2000  # file names, not arrays
    assert pickle.loads(state)[0] == corpus[0]
    with pytest.raises(DataError, match="prepare the data again"):
        MappedCorpus(tmp_path, "other")


# --- reuse: only of a folder prepared from the same raw files -----------------------------------


def _prepare(raw: Path, cache: Path) -> Path:
    return prepare_wmt(raw, cache, "en", "de", VOCAB, workers=1, download=False)


@pytest.mark.slow
def test_the_same_raw_tree_is_reused_and_a_copy_with_one_file_changed_is_prepared_anew(raw_tree, cache, prepared,
                                                                                        raw_copy, caplog):
    with caplog.at_level(logging.INFO, logger="aiayn.data"):
        assert _prepare(raw_tree, cache) == prepared
    assert f"reusing the prepared WMT14 en-de data in {prepared}" in caplog.text
    # another raw tree, the same but for news-commentary's last 500 pairs, with the same settings
    for lang in ("en", "de"):
        path = raw_copy / "training" / f"news-commentary-v9.de-en.{lang}"
        path.write_text("".join(f"{line}\n" for line in read_lines(path)[:1500]), encoding="utf-8")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="aiayn.data"):
        other = _prepare(raw_copy, cache)
    assert other != prepared and other.parent == prepared.parent and "reusing the prepared" not in caplog.text
    ours, theirs = (json.loads((folder / "report.json").read_text()) for folder in (prepared, other))
    assert [report["cleaning"]["corpora"]["news-commentary-v9"]["read"] for report in (ours, theirs)] == [2000, 1500]
    assert theirs["train_pairs"] < ours["train_pairs"] and MappedCorpus(other, "train").stored_size == theirs["train_pairs"]
    assert (ours["raw_dir"], theirs["raw_dir"]) == (str(raw_tree.resolve()), str(raw_copy.resolve()))
    assert MappedCorpus(prepared, "train").stored_size == ours["train_pairs"]  # the first preparation is untouched


@pytest.mark.slow
def test_a_raw_file_changed_since_the_preparation_has_it_prepared_again(raw_copy, tmp_path, caplog):
    cache = tmp_path / "cache"
    first = _prepare(raw_copy, cache)
    dev = raw_copy / "dev" / "newstest2013.de"
    lines = read_lines(dev)
    assert read_lines(first / "newstest2013.de")[0] == lines[0]
    lines[0] = "Ein anderer erster Satz."  # the raw file fixed (or changed) after the preparation
    dev.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    with caplog.at_level(logging.INFO, logger="aiayn.data"):
        again = _prepare(raw_copy, cache)
    assert again == first
    changed = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(changed) == 1 and changed[0].startswith(f"raw file {dev} changed since the preparation at {first} (")
    assert changed[0].endswith("; preparing again") and "reusing the prepared" not in caplog.text
    assert read_lines(again / "newstest2013.de")[0] == "Ein anderer erster Satz."
    assert [p.name for p in cache.joinpath("wmt14").iterdir() if p.is_dir()] == [first.name]  # no stale copy left
    # unchanged since: reused; and still reused once the raw corpora are deleted (the folder holds all a run reads)
    for remove in (None, raw_copy / "training"):
        if remove is not None:
            shutil.rmtree(remove)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="aiayn.data"):
            assert _prepare(raw_copy, cache) == first
        assert f"reusing the prepared WMT14 en-de data in {first}" in caplog.text
    assert "4 raw files of the preparation at" in caplog.text


# --- the datamodule --------------------------------------------------------------------------


def test_datamodule_splits_and_references(dm, data_root, prepared):
    assert dm.prepared == prepared and dm.vocab.vocab_size == VOCAB
    stored = MappedCorpus(prepared, "train").stored_size
    assert dm.split_sizes["train"] == stored - dm.filtered["empty"] - dm.filtered["too_long"]
    assert dm.references("newstest2014") == read_sgm(data_root / "wmt14" / "sgm" / "newstest2014-deen-ref.de.sgm")
    assert dm.sources("test") == read_sgm(data_root / "wmt14" / "sgm" / "newstest2014-deen-src.en.sgm")
    assert dm.references("val") == read_lines(data_root / "wmt14" / "newstest2013.de")
    assert len(dm.dataset("val")) == 3000 and len(dm.dataset("test")) == 3003


def test_max_length_filter_is_counted_and_logged(raw_tree, cache, prepared, caplog):
    lengths = MappedCorpus(prepared, "train")
    src, tgt = lengths.stored_lengths("src"), lengths.stored_lengths("tgt")
    too_long = int(((src > 20) | (tgt > 20)).sum())
    assert 100 < too_long < len(src) - 100
    module = WMTDataModule(str(raw_tree), vocab_size=VOCAB, max_length=20, max_tokens=512, cache_dir=str(cache), download=False)
    with caplog.at_level(logging.INFO, logger="aiayn.data"):
        module.setup("fit")
    assert module.filtered == {"empty": 0, "too_long": too_long}
    assert f"{too_long} with a side over max_length=20" in caplog.text
    train = module.dataset("train")
    assert len(train) == len(src) - too_long
    assert all(len(s) <= 20 and len(t) <= 20 for _, s, t in (train[i] for i in range(len(train))))
    assert train[0][1] == lengths[int(train.line_numbers[0])][1]


def test_batches_within_budget_and_each_example_once_across_two_ranks(dm, caplog):
    train = dm.dataset("train")
    per_rank = []
    try:
        for rank in (0, 1):
            dm.trainer = SimpleNamespace(world_size=2, global_rank=rank)
            with caplog.at_level(logging.INFO, logger="aiayn.data"):
                loader = dm.train_dataloader()
            sampler = loader.batch_sampler
            assert "% of their tokens are padding" in caplog.text and 0 < sampler.padding_fraction < 0.5
            batches = [batch["index"].tolist() for batch in loader]
            for batch in loader:
                assert batch["src"].numel() <= 1024 and batch["tgt_in"].numel() <= 1024
            per_rank.append(batches)
            # evaluation-style sharding of the same training pairs: exactly once, no padding batches
            exact = TokenBatchSampler(train.src_lengths, train.tgt_lengths, 1024, shuffle=True, seed=dm.seed,
                                      num_replicas=2, rank=rank, pad_to_equal=False)
            per_rank.append([list(b) for b in exact])
    finally:
        dm.trainer = None
    train_0, exact_0, train_1, exact_1 = per_rank
    assert len(train_0) == len(train_1)  # DDP ranks take the same number of steps
    once = Counter(i for batch in exact_0 + exact_1 for i in batch)
    assert sorted(once) == list(range(len(train))) and set(once.values()) == {1}
    # training: every kept example exactly once too (batches are split, not repeated, to even out the ranks)
    seen = Counter(i for batch in train_0 + train_1 for i in batch)
    assert sorted(seen) == list(range(len(train))) and set(seen.values()) == {1}
    # deterministic for a seed and an epoch
    dm.trainer = SimpleNamespace(world_size=2, global_rank=0)
    try:
        again = [b["index"].tolist() for b in dm.train_dataloader()]
    finally:
        dm.trainer = None
    assert again == train_0


def test_worker_processes_map_the_same_files(dm):
    from torch.utils.data import DataLoader

    from aiayn.data.corpus import TranslationCollator

    train = dm.dataset("train")
    sampler = TokenBatchSampler(train.src_lengths, train.tgt_lengths, 4096, shuffle=False)
    collate = TranslationCollator(0, 2, 3)
    inline = [b["src"].tolist() for b in DataLoader(train, batch_sampler=sampler, collate_fn=collate)]
    workers = [b["src"].tolist() for b in DataLoader(train, batch_sampler=sampler, collate_fn=collate, num_workers=1)]
    assert inline == workers


@pytest.mark.slow
def test_setup_fit_prepares_a_folder_missing_its_test_file_again_before_anything_is_loaded(raw_copy, tmp_path, caplog):
    cache = tmp_path / "cache"
    folder = _prepare(raw_copy, cache)
    wanted = (folder / "newstest2014.de").read_bytes()
    (folder / "newstest2014.de").unlink()
    module = WMTDataModule(str(raw_copy), vocab_size=VOCAB, cache_dir=str(cache), download=False)
    assert module.prepared == folder
    with caplog.at_level(logging.INFO, logger="aiayn.data"):
        module.setup("fit")  # the raw files are there: prepared again
    assert f"prepared file {folder / 'newstest2014.de'} is missing; preparing again" in caplog.text
    assert (folder / "newstest2014.de").read_bytes() == wanted
    # without the raw test set it cannot be: one error naming both, before the training pairs are mapped
    (folder / "newstest2014.de").unlink()
    shutil.rmtree(raw_copy / "test-full")
    module = WMTDataModule(str(raw_copy), vocab_size=VOCAB, cache_dir=str(cache), download=False)
    with pytest.raises(DataError) as info:
        module.setup("fit")
    message = str(info.value)
    assert message.startswith(f"prepared file {folder / 'newstest2014.de'} is missing, and it cannot be prepared "
                              f"again: WMT14 en-de files missing under {raw_copy} (task.datamodule.download=false): "
                              "test-full/newstest2014-deen-src.en.sgm, test-full/newstest2014-deen-ref.de.sgm (from "
                              "https://www.statmt.org/wmt14/test-full.tgz); unpack those archives")
    assert module.split_sizes == {}  # found before the training pairs were even mapped


def test_unsupported_pair_and_splits(tmp_path):
    with pytest.raises(ValueError, match="no WMT14 data for en-cs"):
        WMTDataModule(str(tmp_path), tgt_lang="cs")
    with pytest.raises(ValueError, match="newstest2013"):
        WMTDataModule(str(tmp_path), val_split="newstest2012")


# --- end to end ------------------------------------------------------------------------------


@pytest.mark.slow
def test_train_cli_on_the_miniature_tree(raw_tree, cache, prepared, tmp_path):
    run_dir = tmp_path / "run"
    result = run_tool("src/train.py", "task=wmt_en_de", f"task.raw_dir={raw_tree}", *TINY,
                      f"task.vocab_size={VOCAB}", "task.datamodule.num_workers=0", "task.datamodule.download=false",
                      "optim.train_steps=2", "trainer.val_check_interval=2", "validation.bleu_sentences=8",
                      "visualize_at_end=false", "logger=csv", f"hydra.run.dir={run_dir}", cache_dir=cache)
    summary = [line for line in result.stdout.splitlines() if line.startswith("test newstest2014:")]
    assert len(summary) == 1 and "test/bleu=" in summary[0]
    log = (run_dir / "train.log").read_text()
    assert f"reusing the prepared WMT14 en-de data in {prepared}" in log
    assert "% of their tokens are padding" in log
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
