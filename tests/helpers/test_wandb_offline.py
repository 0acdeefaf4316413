"""Reading W&B offline runs back: real ``.wandb`` files written by wandb (plain and through
Lightning's WandbLogger), multi-block records, checksum corruption and truncation."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers.wandb_offline import (
    BLOCK_SIZE,
    OfflineRun,
    TruncatedWandbFile,
    WandbFileError,
    find_run_file,
    iter_records,
    read_run,
)

BIG = "x" * 100_000  # a config value whose record spans four 32 KiB blocks
WIDE = "y" * 40_000  # a logged value whose history record spans two blocks
STEPS = [
    {"loss": 4.5, "acc": 0.1, "train/ppl": 90.0, "lr": 1e-4},
    {"loss": 3.25, "acc": 0.2, "train/ppl": 25.8, "lr": 2e-4, "text": WIDE},
    {"loss": 2.0, "acc": 0.3, "train/ppl": 7.4, "lr": 3e-4, "val": {"bleu": 12.5, "n": {"k": 1}}},
]
CONFIG = {
    "model": {"d_model": 512, "heads": 8, "dropout": 0.1, "sizes": [1, 2, 3]},
    "optim": {"name": "adam", "betas": [0.9, 0.98]},
    "seed": 7,
    "big": BIG,
}


def _offline_env(mp: pytest.MonkeyPatch, root: Path) -> None:
    mp.setenv("WANDB_MODE", "offline")
    mp.setenv("WANDB_SILENT", "true")
    mp.setenv("WANDB_DIR", str(root))
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        mp.setenv(var, str(root / "_wandb_home"))
    mp.delenv("WANDB_RUN_ID", raising=False)


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory) -> Path:
    """A finished offline run written by ``wandb.init``; returns its save dir (WANDB_DIR)."""
    import wandb

    root = tmp_path_factory.mktemp("plain")
    with pytest.MonkeyPatch.context() as mp:
        _offline_env(mp, root)
        run = wandb.init(mode="offline", project="aiayn-test", name="base-run", group="ablation",
                         tags=["base", "en-de"], config=CONFIG)
        run.config.update({"late": {"warmup": 4000}})
        for metrics in STEPS:
            run.log(metrics)
        run.summary["best"] = {"bleu": 27.3, "step": 2}
        run.summary["scratch"] = 1
        del run.summary["scratch"]
        run.finish()
        wandb.teardown()  # finish() can return before wandb-core has written the last block
    return root


def _copy(src: Path, dst_dir: Path) -> Path:
    dst = dst_dir / src.name
    shutil.copyfile(src, dst)
    return dst


def _strip_times(row: dict) -> dict:
    return {k: v for k, v in row.items() if k not in ("_timestamp", "_runtime")}


def test_plain_run_round_trips(plain_run):
    run = read_run(plain_run)  # the save dir holding wandb/offline-run-*
    assert isinstance(run, OfflineRun)
    run_dir = next((plain_run / "wandb").glob("offline-run-*"))
    assert run.path == run_dir / f"run-{run.run_id}.wandb"
    assert run_dir.name.endswith(run.run_id)
    assert run.path.stat().st_size > 3 * BLOCK_SIZE  # the big record really crossed blocks
    assert (run.project, run.name, run.group, run.tags) == ("aiayn-test", "base-run", "ablation",
                                                            ["base", "en-de"])
    assert run.config == {**CONFIG, "late": {"warmup": 4000}}
    assert run.exit_code == 0

    assert [_strip_times(row) for row in run.history] == [
        {"_step": i, **metrics} for i, metrics in enumerate(STEPS)
    ]
    assert all(isinstance(row["_timestamp"], float) for row in run.history)

    assert run.summary["best"] == {"bleu": 27.3, "step": 2}
    assert "scratch" not in run.summary
    assert run.summary["_step"] == len(STEPS) - 1
    for key, value in {**STEPS[0], **STEPS[1], **STEPS[2]}.items():  # last value of each key
        assert run.summary[key] == value

    # The same run through the run directory and through the file itself.
    assert read_run(run_dir) == run
    assert read_run(run.path) == run
    assert read_run(plain_run / "wandb") == run


def test_iter_records_gives_protobufs_in_order(plain_run):
    records = list(iter_records(find_run_file(plain_run)))
    kinds = [r.WhichOneof("record_type") for r in records]
    assert kinds[0] == "header" and kinds[1] == "run" and kinds[-1] == "exit"
    assert kinds.count("history") == len(STEPS)
    assert [r.num for r in records] == sorted(r.num for r in records)
    assert records[1].run.config.update  # the run record carries the initial config


def test_lightning_wandb_logger_round_trips(tmp_path, monkeypatch):
    import wandb
    from lightning.pytorch.loggers import WandbLogger

    _offline_env(monkeypatch, tmp_path)
    logger = WandbLogger(offline=True, save_dir=str(tmp_path), project="aiayn-pl",
                         name="pl-run", group="pl-group", tags=["lightning"])
    hparams = {"model": {"d_model": 64, "n_layers": 2}, "optimizer": "adam", "warmup": 400}
    logger.log_hyperparams(hparams)
    logged = [({"train/loss": 2.5, "lr": 1e-3}, 10), ({"train/loss": 1.5, "val/bleu": 3.0}, 20),
              ({"train/loss": 1.0, "lr": 5e-4}, 30)]
    for metrics, step in logged:
        logger.log_metrics(metrics, step=step)
    logger.finalize("success")
    wandb.finish()
    wandb.teardown()  # finish() can return before wandb-core has written the file's last block

    run = read_run(tmp_path)
    assert (run.project, run.name, run.group, run.tags) == ("aiayn-pl", "pl-run", "pl-group",
                                                            ["lightning"])
    assert run.config == hparams
    assert [_strip_times(row) for row in run.history] == [
        {"_step": i, "trainer/global_step": step, **metrics}
        for i, (metrics, step) in enumerate(logged)
    ]
    assert run.summary["trainer/global_step"] == 30
    assert run.summary["val/bleu"] == 3.0 and run.summary["lr"] == 5e-4
    assert run.exit_code == 0


@pytest.mark.parametrize("flip_at, chunk_at", [
    (7 + 7 + 3, 7),  # inside the first record (a FULL chunk right after the file header)
    (BLOCK_SIZE + 1000, BLOCK_SIZE),  # inside a MIDDLE chunk of the big multi-block record
])
def test_flipped_byte_is_reported_with_file_and_offset(plain_run, tmp_path, flip_at, chunk_at):
    path = _copy(find_run_file(plain_run), tmp_path)
    data = bytearray(path.read_bytes())
    data[flip_at] ^= 0x40
    path.write_bytes(bytes(data))
    for strict in (True, False):
        with pytest.raises(WandbFileError, match="checksum mismatch") as info:
            read_run(path, strict=strict)
        assert not isinstance(info.value, TruncatedWandbFile)
        assert str(path) in str(info.value) and f"byte offset {chunk_at}" in str(info.value)
        assert info.value.offset == chunk_at and info.value.path == path


def test_a_cut_final_record_is_an_error_when_strict_and_skipped_otherwise(plain_run, tmp_path):
    full = find_run_file(plain_run)
    complete = read_run(full)
    path = _copy(full, tmp_path)
    size = path.stat().st_size

    path.write_bytes(full.read_bytes()[: size - 3])  # a killed run: the exit record is cut
    with pytest.raises(TruncatedWandbFile, match="truncated") as info:
        read_run(path)
    assert str(path) in str(info.value)
    last_chunk = info.value.offset
    assert size - 200 < last_chunk < size - 3

    partial = read_run(path, strict=False)
    assert partial.exit_code is None
    assert partial.history == complete.history and partial.config == complete.config
    assert partial.summary == complete.summary

    # Cut inside the last chunk's 7-byte header, and a zero-filled tail in its place.
    for tail in (full.read_bytes()[last_chunk: last_chunk + 3], b"\0" * 100):
        path.write_bytes(full.read_bytes()[:last_chunk] + tail)
        with pytest.raises(TruncatedWandbFile, match="truncated"):
            list(iter_records(path))
        assert read_run(path, strict=False).history == complete.history


def test_truncated_inside_multi_block_record(plain_run, tmp_path):
    full = find_run_file(plain_run)
    path = tmp_path / full.name
    path.write_bytes(full.read_bytes()[: 2 * BLOCK_SIZE + 500])  # the run record spans blocks 0-3
    with pytest.raises(TruncatedWandbFile, match="truncated") as info:
        list(iter_records(path))
    assert info.value.offset < BLOCK_SIZE  # reported at the start of the record it cut
    before = list(iter_records(path, strict=False))
    assert [r.WhichOneof("record_type") for r in before] == ["header"]

    path.write_bytes(full.read_bytes()[:2 * BLOCK_SIZE])  # cut exactly at a block boundary
    with pytest.raises(TruncatedWandbFile, match="multi-chunk record"):
        list(iter_records(path))


def test_a_file_that_is_not_a_wandb_log_is_refused_and_a_cut_header_is_truncated(tmp_path):
    path = tmp_path / "run-x.wandb"
    path.write_bytes(b"PK\x03\x04 definitely not a transaction log")
    with pytest.raises(WandbFileError, match="not a W&B transaction log"):
        list(iter_records(path))
    path.write_bytes(b":W&B")  # header cut short: nothing to read, or "truncated" when strict
    assert list(iter_records(path, strict=False)) == []
    with pytest.raises(TruncatedWandbFile):
        list(iter_records(path))


def test_finding_the_run_file_fails_on_none_and_names_each_of_several(tmp_path):
    with pytest.raises(FileNotFoundError, match="offline-run"):
        find_run_file(tmp_path)
    for name in ("offline-run-20250101_000000-aaaa", "offline-run-20250101_000001-bbbb"):
        (tmp_path / "wandb" / name).mkdir(parents=True)
    with pytest.raises(ValueError, match="several offline runs") as info:
        find_run_file(tmp_path)
    assert "aaaa" in str(info.value) and "bbbb" in str(info.value)
