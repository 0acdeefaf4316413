"""Multi30kDataModule on the real data: files, vocabulary, filtering, batches, references."""

from __future__ import annotations

import gzip
import logging
from types import SimpleNamespace

import lightning as L
import pytest
import torch

from aiayn.data.corpus import ParallelCorpus, TranslationCollator, filter_pairs
from aiayn.data.multi30k import Multi30kDataModule
from aiayn.data.readers import read_lines
from aiayn.errors import DataError
from tests.helpers.datafiles import multi30k_copy

VOCAB = 1000


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def dm(data_root, cache) -> Multi30kDataModule:
    module = Multi30kDataModule(str(data_root), vocab_size=VOCAB, max_tokens=2048, cache_dir=str(cache), download=False)
    module.prepare_data()
    module.setup("fit")
    module.setup("test")
    return module


def _check_layout(batch, dataset, vocab, max_tokens):
    src, tgt_in, tgt_out, index = batch["src"], batch["tgt_in"], batch["tgt_out"], batch["index"]
    assert src.dtype == tgt_in.dtype == tgt_out.dtype == index.dtype == torch.long
    assert src.dim() == 2 and tgt_in.shape == tgt_out.shape and src.size(0) == tgt_in.size(0) == index.size(0)
    assert src.numel() <= max_tokens and tgt_in.numel() <= max_tokens
    longest_src = longest_tgt = 0
    for row, i in enumerate(index.tolist()):
        _, s, t = dataset[i]
        longest_src, longest_tgt = max(longest_src, len(s)), max(longest_tgt, len(t))
        assert src[row].tolist() == s + [vocab.eos_id] + [vocab.pad_id] * (src.size(1) - len(s) - 1)
        tail = [vocab.pad_id] * (tgt_in.size(1) - len(t) - 1)
        assert tgt_in[row].tolist() == [vocab.bos_id] + t + tail
        assert tgt_out[row].tolist() == t + [vocab.eos_id] + tail
    assert (src.size(1), tgt_in.size(1)) == (longest_src + 1, longest_tgt + 1)  # no all-pad column


def test_sizes_vocab_and_nothing_filtered(dm):
    assert dm.split_sizes == {"train": 29_000, "val": 1_014, "test": 1_000}
    assert dm.filtered == {"empty": 0, "too_long": 0}
    assert dm.vocab.vocab_size == VOCAB
    assert dm.vocab.path.parent.parent == dm.cache_dir
    assert dm.hparams.vocab_size == VOCAB and dm.hparams.test_split == "test_2016_flickr"


def test_train_batches_layout(dm):
    loader = dm.train_dataloader()
    assert loader.batch_sampler.shuffle and loader.batch_sampler.pad_to_equal
    seen = []
    for number, batch in enumerate(loader):
        if number < 5:
            _check_layout(batch, dm.dataset("train"), dm.vocab, 2048)
        seen.extend(batch["index"].tolist())
    assert sorted(seen) == list(range(29_000))


def test_a_checkpoint_of_the_batch_by_batch_order_goes_on_in_it_and_a_new_one_by_steps(dm):
    """A checkpoint written before the epoch's order shuffled whole steps (its position has no
    ``order``) resumes the rest of its epoch in the order it began; one written now, by steps."""
    def resumed(state):
        dm.trainer = SimpleNamespace(world_size=1, global_rank=0, accumulate_grad_batches=4,
                                     _checkpoint_connector=SimpleNamespace(_loaded_checkpoint={}))
        try:
            dm.load_state_dict(state)
            sampler = dm.train_dataloader().batch_sampler
            return list(sampler), sampler
        finally:
            dm.trainer = None

    def written_at(epoch: int, batches: int) -> dict:  # what a checkpoint of this run keeps there
        counted = SimpleNamespace(current=SimpleNamespace(processed=batches), total=SimpleNamespace(processed=batches))
        dm.trainer = SimpleNamespace(world_size=1, accumulate_grad_batches=4, fit_loop=SimpleNamespace(
            epoch_loop=SimpleNamespace(batch_progress=counted), epoch_progress=SimpleNamespace(
                current=SimpleNamespace(processed=epoch))))
        try:
            return dm.state_dict()
        finally:
            dm.trainer = None

    written = {"epoch": 0, "epoch_batches": 8, "trained": 8, "processes": 1, "accumulate": 4}
    rest, sampler = resumed(written)
    drawn = torch.randperm(len(sampler.batches), generator=torch.Generator().manual_seed(sampler.seed)).tolist()
    old_order = [sampler.batches[b] for b in drawn]
    assert rest == old_order[8:]
    # A checkpoint written in that epoch says its order, so that a second resume goes on in it too
    # (before: "steps", and the rest of the epoch came from the other order); the next epoch's, by steps.
    assert written_at(0, 16)["order"] == "batches" and written_at(1, 4)["order"] == "steps"
    assert resumed(written_at(0, 16))[0] == old_order[16:]
    rest, sampler = resumed({**written, "order": "steps"})
    sampler.set_epoch(0)
    assert rest == list(sampler)[8:] != old_order[8:]
    assert written_at(0, 16)["order"] == "steps"


def test_val_batches_decode_to_the_references(dm, data_root):
    references = dm.references("val")
    assert references == read_lines(data_root / "multi30k" / "val.de.gz")
    assert dm.sources("val") == read_lines(data_root / "multi30k" / "val.en.gz")
    assert dm.references("test_2016_flickr") == dm.references("test") == read_lines(data_root / "multi30k" / "test_2016_flickr.de.gz")
    loader = dm.val_dataloader()
    assert not loader.batch_sampler.shuffle and not loader.batch_sampler.pad_to_equal
    decoded = {}
    for batch in loader:
        _check_layout(batch, dm.dataset("val"), dm.vocab, 2048)
        decoded.update(zip(batch["index"].tolist(), dm.vocab.decode(batch["tgt_out"].tolist())))
    assert sorted(decoded) == list(range(1_014))
    assert [decoded[i] for i in range(1_014)] == [" ".join(r.split()) for r in references]


def test_eval_loaders_shard_across_ranks(dm):
    seen = []
    try:
        for rank in (0, 1):
            dm.trainer = SimpleNamespace(world_size=2, global_rank=rank)
            loader = dm.test_dataloader()
            assert (loader.batch_sampler.num_replicas, loader.batch_sampler.rank) == (2, rank)
            seen.extend(i for batch in loader for i in batch["index"].tolist())
    finally:
        dm.trainer = None
    assert sorted(seen) == list(range(1_000))


def test_setup_is_idempotent(dm):
    before = {role: dm.dataset(role) for role in ("train", "val", "test")}
    vocab = dm.vocab
    dm.setup("fit")
    dm.setup("test")
    dm.setup(None)
    assert dm.vocab is vocab
    assert all(dm.dataset(role) is dataset for role, dataset in before.items())


@pytest.mark.slow
def test_filtering_matches_a_hand_count(data_root, cache, dm, caplog):
    src = read_lines(data_root / "multi30k" / "train.en.gz")
    tgt = read_lines(data_root / "multi30k" / "train.de.gz")
    src_ids, tgt_ids = dm.vocab.encode(src), dm.vocab.encode(tgt)
    too_long = sum(1 for s, t in zip(src_ids, tgt_ids) if max(len(s), len(t)) > 12)
    assert 1_000 < too_long < 28_000
    small = Multi30kDataModule(str(data_root), vocab_size=VOCAB, max_length=12, max_tokens=512, cache_dir=str(cache), download=False)
    with caplog.at_level(logging.INFO, logger="aiayn.data"):
        small.setup("fit")
    assert small.vocab.path == dm.vocab.path  # same training lines and settings: reused
    assert small.filtered == {"empty": 0, "too_long": too_long}
    assert small.split_sizes == {"train": 29_000 - too_long, "val": 1_014, "test": 1_000}
    message = " ".join(r.getMessage() for r in caplog.records)
    assert f"{too_long} with a side over max_length=12" in message and "train.en.gz" in message and "train.de.gz" in message
    train = small.dataset("train")
    assert all(len(s) <= 12 and len(t) <= 12 for _, s, t in (train[i] for i in range(len(train))))
    kept = train.line_numbers.tolist()
    assert train[0][1] == src_ids[kept[0]] and train[len(train) - 1][2] == tgt_ids[kept[-1]]
    # validation is never filtered, even with the small max_length
    assert len(small.dataset("val")) == 1_014 and len(small.references("val")) == 1_014


def test_filter_pairs_drops_empty_and_over_long_pairs_and_counts_each():
    keep, dropped = filter_pairs([[5], [], [5, 6, 7], [5, 6], [5]], [[5], [5], [5], [], [5, 6, 7]], max_length=2)
    assert keep == [0] and dropped == {"empty": 2, "too_long": 2}


def test_corpus_lengths_count_eos_and_the_collator_pads_and_shifts_by_hand():
    corpus = ParallelCorpus([[10, 11], [12]], [[20], [21, 22, 23]])
    assert len(corpus) == 2 and corpus[1] == (1, [12], [21, 22, 23])
    assert corpus.src_lengths.tolist() == [3, 2] and corpus.tgt_lengths.tolist() == [2, 4]
    batch = TranslationCollator(pad_id=0, bos_id=2, eos_id=3)([corpus[1], corpus[0]])
    assert batch["src"].tolist() == [[12, 3, 0], [10, 11, 3]]
    assert batch["tgt_in"].tolist() == [[2, 21, 22, 23], [2, 20, 0, 0]]
    assert batch["tgt_out"].tolist() == [[21, 22, 23, 3], [20, 3, 0, 0]]
    assert batch["index"].tolist() == [1, 0]


def test_validation_with_a_worker_process_sees_every_sentence_once(data_root, cache, dm):
    module = Multi30kDataModule(str(data_root), vocab_size=VOCAB, cache_dir=str(cache), download=False, num_workers=1)
    module.setup("validate")
    loader = module.val_dataloader()
    assert loader.persistent_workers
    indices = [i for batch in loader for i in batch["index"].tolist()]
    assert sorted(indices) == list(range(1_014))


class _Probe(L.LightningModule):
    """Records the indices of each training epoch; no model involved."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.epochs: list[list[int]] = []

    def on_train_epoch_start(self):
        self.epochs.append([])

    def training_step(self, batch, batch_idx):
        self.epochs[-1].extend(batch["index"].tolist())
        return (self.weight * batch["src"].float().mean()).sum()

    def validation_step(self, batch, batch_idx):
        assert batch["tgt_in"][:, 0].eq(2).all()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_lightning_trainer_drives_the_sampler_epochs(data_root, cache):
    module = Multi30kDataModule(str(data_root), vocab_size=VOCAB, max_tokens=4096, cache_dir=str(cache), download=False)
    probe = _Probe()
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=2, limit_train_batches=4, limit_val_batches=2, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        use_distributed_sampler=False, num_sanity_val_steps=0,
    )
    trainer.fit(probe, datamodule=module)
    assert len(probe.epochs) == 2 and all(probe.epochs)
    assert probe.epochs[0] != probe.epochs[1]  # Lightning called set_epoch on the batch sampler
    assert trainer.train_dataloader.batch_sampler.epoch == 1


def test_missing_data_and_unknown_splits_languages_and_stages_are_refused(tmp_path):
    module = Multi30kDataModule(str(tmp_path), cache_dir=str(tmp_path / "cache"), download=False)
    with pytest.raises(DataError, match="AIAYN_DATA_ROOT"):
        module.prepare_data()
    with pytest.raises(ValueError, match="unknown Multi30k split"):
        Multi30kDataModule(str(tmp_path), test_split="test_2019")
    with pytest.raises(ValueError, match="language"):
        Multi30kDataModule(str(tmp_path), tgt_lang="fr")
    with pytest.raises(KeyError, match="unknown split"):
        module.dataset("dev")
    with pytest.raises(RuntimeError, match="setup"):
        module.dataset("val")
    with pytest.raises(ValueError, match="unknown stage"):
        module.setup("train")


def test_setup_fit_names_a_missing_test_file_before_anything_is_loaded(data_root, tmp_path):
    root = multi30k_copy(tmp_path / "data", data_root, leave_out={"test_2016_flickr.de.gz"})
    module = Multi30kDataModule(str(root), vocab_size=VOCAB, cache_dir=str(tmp_path / "cache"), download=False)
    missing = root / "multi30k" / "test_2016_flickr.de.gz"
    with pytest.raises(DataError) as info:
        module.setup("fit")
    assert str(info.value) == (
        f"Multi30k files missing or unreadable (download=False): {missing} (test split 'test_2016_flickr': missing; "
        "from https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/test_2016_flickr.de.gz). "
        "Fetch them there, or point AIAYN_DATA_ROOT / paths.data_root at a folder whose multi30k/ holds them")
    assert module.split_sizes == {} and module.vocab is None  # before any training work
    module.setup("validate")  # a stage that does not read the test split is not held up by it
    assert module.split_sizes == {"val": 1_014}


def test_trainer_fit_stops_on_a_missing_test_file_before_the_first_step(data_root, tmp_path):
    root = multi30k_copy(tmp_path / "data", data_root, leave_out={"test_2016_flickr.en.gz"})
    module = Multi30kDataModule(str(root), vocab_size=VOCAB, cache_dir=str(tmp_path / "cache"), download=False)
    probe = _Probe()
    trainer = L.Trainer(accelerator="cpu", max_steps=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    with pytest.raises(DataError, match=rf"{root / 'multi30k' / 'test_2016_flickr.en.gz'} \(test split"):
        trainer.fit(probe, datamodule=module)
    assert probe.epochs == [] and trainer.global_step == 0


def test_every_missing_file_of_every_split_is_named_in_one_error(data_root, tmp_path):
    root = multi30k_copy(tmp_path / "data", data_root, leave_out={"train.de.gz", "val.en.gz", "test_2016_flickr.de.gz"})
    module = Multi30kDataModule(str(root), cache_dir=str(tmp_path / "cache"), download=False)
    with pytest.raises(DataError) as info:
        module.prepare_data()
    message = str(info.value)
    for split, name in (("train", "train.de.gz"), ("val", "val.en.gz"), ("test_2016_flickr", "test_2016_flickr.de.gz")):
        assert f"{root / 'multi30k' / name} (" in message and f"split '{split}': missing; from https://" in message
    assert "train.en.gz" not in message


def test_raw_lines_only_for_evaluation_splits(dm):
    with pytest.raises(KeyError, match="evaluation splits only"):
        dm.references("train")


def test_a_test_file_shorter_than_its_pair_stops_the_run_before_the_first_step(data_root, tmp_path):
    root = multi30k_copy(tmp_path / "data", data_root, leave_out={"test_2016_flickr.de.gz"})
    short = root / "multi30k" / "test_2016_flickr.de.gz"
    lines = read_lines(data_root / "multi30k" / "test_2016_flickr.de.gz")[:990]
    short.write_bytes(gzip.compress("".join(f"{line}\n" for line in lines).encode()))
    module = Multi30kDataModule(str(root), vocab_size=VOCAB, cache_dir=str(tmp_path / "cache"), download=False)
    probe = _Probe()
    trainer = L.Trainer(accelerator="cpu", max_steps=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    with pytest.raises(DataError) as info:
        trainer.fit(probe, datamodule=module)
    assert str(info.value) == (
        f"test split 'test_2016_flickr': parallel files differ in length: {short} ends after line 990 but "
        f"{root / 'multi30k' / 'test_2016_flickr.en.gz'} goes on at line 991; they must be aligned line by line")
    assert probe.epochs == [] and trainer.global_step == 0  # before: every step trained, then the test failed


def test_an_empty_validation_file_pair_is_named_before_the_first_step(data_root, tmp_path):
    root = multi30k_copy(tmp_path / "data", data_root, leave_out={"val.en.gz", "val.de.gz"})
    for lang in ("en", "de"):
        (root / "multi30k" / f"val.{lang}.gz").write_bytes(gzip.compress(b""))
    module = Multi30kDataModule(str(root), vocab_size=VOCAB, cache_dir=str(tmp_path / "cache"), download=False)
    with pytest.raises(DataError, match=r"^val split 'val': \S+/val.en.gz / \S+/val.de.gz: no lines; a split needs"):
        module.setup("fit")
    assert module.split_sizes == {}


def test_a_runs_checks_read_each_split_through_once_and_again_when_a_file_changes(data_root, tmp_path, monkeypatch):
    import aiayn.data.checks

    reads = []
    monkeypatch.setattr(aiayn.data.checks, "count_pairs", lambda *paths: reads.append(paths) or len(read_lines(paths[0])))
    root = multi30k_copy(tmp_path / "data", data_root, leave_out={"test_2016_flickr.de.gz"})
    test_de = root / "multi30k" / "test_2016_flickr.de.gz"
    test_de.write_bytes((data_root / "multi30k" / "test_2016_flickr.de.gz").read_bytes())
    module = Multi30kDataModule(str(root), vocab_size=VOCAB, cache_dir=str(tmp_path / "cache"), download=False)
    module.check_files()  # as train.py checks, then Lightning's hooks
    module.prepare_data()
    module.setup("fit")
    module.setup("test")
    assert sorted(path.name for path, _ in reads) == ["test_2016_flickr.en.gz", "train.en.gz", "val.en.gz"]
    lines = read_lines(test_de)[:990]  # the test file cut short after the checks: read through again, and named
    test_de.write_bytes(gzip.compress("".join(f"{line}\n" for line in lines).encode()))
    monkeypatch.undo()
    with pytest.raises(DataError, match=rf"^test split 'test_2016_flickr': parallel files differ in length: {test_de}"):
        module.setup("test")
