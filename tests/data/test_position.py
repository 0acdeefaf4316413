"""A run resumed on another number of processes whose step takes the same batches (the recipe's
``optim.tokens_per_step``) trains what the uninterrupted run trains: the checkpoint keeps the
position in the epoch's order over every rank (aiayn.data.position), not a rank's own count; a
resume whose step would take other batches mid-epoch is refused in one line."""

from __future__ import annotations

import csv
import gzip
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from aiayn.data.position import Position, rank_batches, read_position
from aiayn.errors import ConfigError
from tests.helpers.runs import TINY_MODEL, TWO_CORES, offline_environment, train

# 600 pairs in batches of ≤1,024 tokens: 24 batches an epoch, 12 steps of 2 batches (1 process × 2
# accumulated or 2 processes × 1); 16 steps cross the epoch's end, validation every 7 steps.
RUN = [
    *TINY_MODEL, "task=parallel_text", "task.src_lang=en", "task.tgt_lang=de", "task.datamodule.max_tokens=1024",
    "task.datamodule.eval_max_tokens=1024", "optim.tokens_per_step=2048", "model.dropout=0.1", "logger=csv",
    "visualize_at_end=false", "test_after_training=false", "trainer.limit_val_batches=1",
    "trainer.num_sanity_val_steps=0", "trainer.enable_progress_bar=false", "validation.bleu_sentences=8",
    "decoding.max_len_offset=5", "checkpoint.every_n_train_steps=1", "checkpoint.save_top_k=-1",
    "optim.warmup_steps=4", "trainer.val_check_interval=7", "optim.train_steps=16",
]
STATE = "ParallelTextDataModule"  # the data module's entry in a checkpoint


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> Path:
    """The first 600 Multi30k training pairs, and 20 validation pairs as valid and test."""
    folder = tmp_path_factory.mktemp("corpus")
    for lang in ("en", "de"):
        for split, source, count in (("train", "train", 600), ("valid", "val", 20), ("test", "val", 20)):
            with gzip.open(data_root / "multi30k" / f"{source}.{lang}.gz", "rt", encoding="utf-8") as lines:
                kept = [next(lines) for _ in range(count)]
            (folder / f"{split}.{lang}").write_text("".join(kept), encoding="utf-8")
    return folder


def _positions(run: Path) -> dict[int, dict]:
    """The data module's state in each step checkpoint, by step, without the layout that wrote it."""
    found = {}
    for path in (run / "checkpoints").glob("step*.ckpt"):
        saved = torch.load(path, map_location="cpu", weights_only=False)
        assert saved[STATE]["order"] == "steps"  # the epoch's order shuffles whole steps (aiayn.data.batching)
        found[saved["global_step"]] = {k: v for k, v in saved[STATE].items()
                                       if k not in ("processes", "accumulate", "order")}
    return found


def _logged(run: Path) -> tuple[list[float], list[int]]:
    """The gradient norm of every step, in the order trained (each attempt's metrics.csv in turn),
    and the steps validated at."""
    norms, validated = [], []
    for table in sorted((run / "csv").glob("version_*/metrics.csv")):
        for row in csv.DictReader(table.open()):
            if row["train/grad_norm"]:
                norms.append(float(row["train/grad_norm"]))
            if row["val/loss"]:
                validated.append(int(row["step"]))
    return norms, validated


@pytest.mark.cli
@pytest.mark.slow
@TWO_CORES
def test_a_run_resumed_on_two_processes_trains_what_it_would_have_trained(tmp_path: Path, corpus: Path,
                                                                        data_root: Path, subword_cache: Path) -> None:
    """Stopped at step 10 of 12 of epoch 0 on 1 process, resumed on 2: the last 4 batches of epoch
    0 are trained (before: the 2 processes skipped 20 batches each of their 12, so epoch 1 began at
    once), the epoch ends after step 12 and validation comes at step 14, as without the stop."""
    env = {**offline_environment(), "AIAYN_DATA_ROOT": str(data_root), "AIAYN_CACHE_DIR": str(subword_cache),
           "OMP_NUM_THREADS": "1"}
    run = [*RUN, f"task.data_dir={corpus}"]
    train(tmp_path / "whole", *run, "hardware=cpu2_ddp", env=env, timeout=300)
    train(tmp_path / "cut", *run, "optim.train_steps=10", env=env, timeout=300)
    train(tmp_path / "cut", *run, "hardware=cpu2_ddp", "resume=auto", env=env, timeout=300)
    whole, cut = _positions(tmp_path / "whole"), _positions(tmp_path / "cut")
    assert whole[10] == cut[10] == {"epoch": 0, "epoch_batches": 20, "trained": 20}
    assert whole[16] == {"epoch": 1, "epoch_batches": 8, "trained": 32}
    for step in range(11, 17):
        assert cut[step] == whole[step], step
    (norms, validated), (cut_norms, cut_validated) = _logged(tmp_path / "whole"), _logged(tmp_path / "cut")
    assert len(norms) == len(cut_norms) == 16
    # 1 process × 2 batches and 2 processes × 1 sum the same gradients in another order (~3e-5 relative), of
    # the same dropout masks (before: seeded by each rank's own count and rank, other masks on 2 processes)
    torch.testing.assert_close(torch.tensor(cut_norms), torch.tensor(norms), rtol=1e-3, atol=0)
    assert validated == [7, 14, 16] and cut_validated == [7, 10, 14, 16]  # 10: the end of the first attempt


def _trainer(processes: int, accumulate: int, checkpoint: dict | None = None) -> SimpleNamespace:
    """A trainer of this layout restoring ``checkpoint`` (as Lightning holds the one it loaded)."""
    return SimpleNamespace(world_size=processes, accumulate_grad_batches=accumulate,
                           _checkpoint_connector=SimpleNamespace(_loaded_checkpoint=checkpoint or {}))


def test_a_position_is_each_new_ranks_share_of_the_batches_trained() -> None:
    """Rank r of P trains batches r, r + P, ... of the epoch's order: 20 batches trained are 10 of
    each of 2 ranks' shares, 20 of one process's."""
    saved = read_position({"epoch": 0, "epoch_batches": 20, "trained": 20, "processes": 1, "accumulate": 2,
                           "order": "steps"}, _trainer(2, 1))
    assert saved == Position(0, 20, 1, 2, 20)
    assert rank_batches(saved, _trainer(2, 1)) == 10
    assert rank_batches(Position(0, 20, 2, 1), _trainer(1, 2)) == 20
    assert rank_batches(Position(3, 24, 4, 1), _trainer(2, 2)) == 12


def test_a_checkpoint_of_a_ranks_own_count_is_read_with_the_layout_that_wrote_it(tmp_path: Path) -> None:
    """Checkpoints written before hold ``batches_done``, a rank's own count: the processes of the
    plan in their config multiply it; without a config, this run's (as they were read before)."""
    old = {"hyper_parameters": {"run_config": {"plan": {"processes": 2, "trainer": {"accumulate_grad_batches": 1}}}}}
    state = {"epoch": 0, "batches_done": 10}
    assert read_position(state, _trainer(1, 2, old)) == Position(0, 20, 2, 1, by_steps=False)
    assert rank_batches(read_position(state, _trainer(1, 2, old)), _trainer(1, 2)) == 20
    assert read_position(state, _trainer(1, 2, {"state_dict": {}})) == Position(0, 10, 1, 2, by_steps=False)
    assert read_position(state, _trainer(1, 2, {"hyper_parameters": {"run_config": None}})) == Position(
        0, 10, 1, 2, by_steps=False)
    assert read_position({}, _trainer(1, 1)) is None
    # Written before the epoch's order shuffled whole steps: that epoch goes on in its batch-by-batch order.
    assert not read_position({"epoch": 0, "epoch_batches": 20, "processes": 1, "accumulate": 2}, _trainer(1, 2)).by_steps


def test_the_layout_is_read_from_the_checkpoint_lightning_loaded_not_from_its_file_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real Trainer loads the checkpoint it resumes once; the old layout is read from what it
    holds (before: the whole file was loaded a second time, for its plan)."""
    import lightning

    path = tmp_path / "old.ckpt"
    torch.save({"pytorch-lightning_version": lightning.__version__, "hyper_parameters": {
        "run_config": {"plan": {"processes": 2, "trainer": {"accumulate_grad_batches": 1}}}}}, path)
    trainer = lightning.Trainer(accelerator="cpu", devices=1, accumulate_grad_batches=2, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer._checkpoint_connector.resume_start(path, weights_only=False)  # what Trainer.fit(ckpt_path=…) does first

    def read_again(*args, **kwargs):
        raise AssertionError(f"the checkpoint read a second time: torch.load{args}")

    monkeypatch.setattr(torch, "load", read_again)
    assert read_position({"epoch": 0, "batches_done": 10}, trainer) == Position(0, 20, 2, 1, by_steps=False)


def test_a_step_of_other_batches_mid_epoch_is_refused_and_at_its_end_allowed() -> None:
    """In the same layout a rank's count is its own, whatever it is (as before)."""
    with pytest.raises(ConfigError, match=r"stopped 6 batches into epoch 2, trained by 1 process\(es\) × 2 batch\(es\) a "
                                          r"step; this run's step is 1 × 4, which cuts the epoch into other batches: "
                                          r"resume on 1 process\(es\) × 2 \(hardware, trainer.devices"):
        rank_batches(Position(2, 6, 1, 2), _trainer(1, 4))
    with pytest.raises(ConfigError, match="this run's step is 2 × 1, and it stopped within a step"):
        rank_batches(Position(2, 7, 1, 2), _trainer(2, 1))
    with pytest.raises(ConfigError, match="this run's step is 2 × 2"):
        rank_batches(Position(2, 8, 1, 2), _trainer(2, 2))  # a multiple of the new step, but other batches
    assert rank_batches(Position(2, 0, 1, 2), _trainer(2, 2)) == 0
    assert rank_batches(Position(2, 7, 1, 2), _trainer(1, 2)) == 7
