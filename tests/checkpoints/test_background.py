"""Checkpoints saved by a background thread (aiayn.checkpoints.background): what is written is the
state when the save was asked for, with tensors that were one still one; one save at a time;
saves, removals and links happen in the order asked; after a failed save nothing more is done and
the error reaches the training thread. Real files, real torch.save; the thread is held at a gate so
that the order is the test's, not the scheduler's. (tests/gpu/test_checkpoint_snapshot.py: a GPU's
state is copied into host memory.)
Whole runs save this way by default (checkpoint.in_background=true): tests/checkpoints,
tests/training (resume, preemption, DDP) and tests/cli/test_refused_in_one_line.py (a full disk)."""

from __future__ import annotations

import collections
import logging
import pickle
import threading
from pathlib import Path

import pytest
import torch

from aiayn.checkpoints.background import AtomicCheckpointIO, BackgroundCheckpointIO, snapshot
from aiayn.checkpoints.digest import damaged, digest_path
from aiayn.model import Transformer
from aiayn.training.saving import link_last


@pytest.fixture
def writer():
    io = BackgroundCheckpointIO()
    yield io
    io.teardown()


def _hold(writer: BackgroundCheckpointIO) -> threading.Event:
    """Hold the writer's thread until the event returned is set."""
    gate = threading.Event()
    writer.after_saves(gate.wait)
    return gate


def test_the_state_written_is_the_state_when_the_save_was_asked_for(writer, tmp_path: Path) -> None:
    weights = torch.zeros(1000)
    gate = _hold(writer)
    writer.save_checkpoint({"state_dict": {"w": weights}, "global_step": 1}, tmp_path / "step0000001.ckpt")
    weights.add_(1.0)  # the next optimizer step, while the file is not yet written
    gate.set()
    writer.wait()
    saved = torch.load(tmp_path / "step0000001.ckpt", weights_only=False)
    assert torch.equal(saved["state_dict"]["w"], torch.zeros(1000))
    assert digest_path(tmp_path / "step0000001.ckpt").exists() and not damaged(tmp_path / "step0000001.ckpt")


def test_the_snapshot_copies_tensors_and_keeps_everything_else_as_it_is() -> None:
    Step = collections.namedtuple("Step", "weights count")
    counts = collections.defaultdict(int, {"a": 1})
    checkpoint = {"state_dict": collections.OrderedDict(w=torch.ones(3)), "subwords": b"\x00model", "counts": counts,
                  "loops": [Step(torch.zeros(2), 7), (1, 2)]}
    copied = snapshot(checkpoint)
    checkpoint["state_dict"]["w"].add_(1.0)
    checkpoint["loops"][0].weights.add_(1.0)
    assert torch.equal(copied["state_dict"]["w"], torch.ones(3)) and type(copied["state_dict"]) is collections.OrderedDict
    assert torch.equal(copied["loops"][0].weights, torch.zeros(2)) and copied["loops"][0].count == 7
    assert type(copied["loops"][0]) is Step and copied["loops"][1] == (1, 2)
    assert copied["subwords"] is checkpoint["subwords"]  # bytes as they are, not walked byte by byte
    assert type(copied["counts"]) is collections.defaultdict and copied["counts"]["b"] == 0 and "b" not in counts


def test_tensors_that_are_one_are_copied_once_and_written_once(writer, tmp_path: Path) -> None:
    """The tied embeddings are one storage under two names of the state_dict: the file written in
    the background holds it once, as the file written in the training thread does, not twice."""
    torch.manual_seed(0)
    state = {"state_dict": Transformer(2000, 2000, n_layers=1, d_model=64, d_ff=128, n_heads=2).state_dict()}
    copied = snapshot(state)["state_dict"]
    assert copied["src_embedding.weight"] is copied["tgt_embedding.weight"]
    weights = torch.ones(6)
    halves = snapshot({"whole": weights, "half": weights[:3]})
    assert halves["half"].untyped_storage().data_ptr() != halves["whole"].untyped_storage().data_ptr()
    here, background = tmp_path / "here" / "step0000001.ckpt", tmp_path / "background" / "step0000001.ckpt"
    AtomicCheckpointIO().save_checkpoint(state, here)
    writer.save_checkpoint(state, background)
    writer.wait()
    assert background.stat().st_size <= here.stat().st_size  # (the same storages; a pickle a little shorter)
    loaded = torch.load(background, weights_only=False)["state_dict"]
    assert loaded["src_embedding.weight"].untyped_storage().data_ptr() == \
        loaded["tgt_embedding.weight"].untyped_storage().data_ptr()
    assert all(torch.equal(loaded[name], tensor) for name, tensor in state["state_dict"].items())


def test_a_save_asked_for_while_the_one_before_is_being_written_waits_for_it(writer, tmp_path: Path,
                                                                            caplog: pytest.LogCaptureFixture) -> None:
    """At most one copy of the state is held: a save waits for the one before it, and says so once.
    (The gate opens a moment later from another thread: a disk slower than the steps between two
    saves. The second save returns only after the first is on disk, however late the gate opens.)"""
    first, second, third, fourth = (tmp_path / f"step000000{step}.ckpt" for step in (1, 2, 3, 4))
    gate = _hold(writer)
    writer.save_checkpoint({"global_step": 1}, first)
    threading.Timer(0.2, gate.set).start()
    with caplog.at_level(logging.WARNING, logger="aiayn.checkpoints.background"):
        writer.save_checkpoint({"global_step": 2}, second)
        assert first.exists(), "the second save was copied while the first was still being written"
        writer.wait()
        gate = _hold(writer)
        writer.save_checkpoint({"global_step": 3}, third)
        threading.Timer(0.2, gate.set).start()
        writer.save_checkpoint({"global_step": 4}, fourth)  # waits again, says nothing more
        assert third.exists()
        writer.wait()
    assert second.exists() and fourth.exists()
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 1 and lines[0].startswith("the checkpoint before step0000002.ckpt was still being written "
                                                   "when it was asked for: training waited"), lines
    assert "checkpoint.every_n_train_steps" in lines[0]


def test_removals_and_links_wait_for_the_saves_asked_for_before_them(writer, tmp_path: Path) -> None:
    old, new, last = tmp_path / "step0000001.ckpt", tmp_path / "step0000002.ckpt", tmp_path / "last.ckpt"
    writer.save_checkpoint({"global_step": 1}, old)
    writer.wait()
    gate = _hold(writer)
    writer.save_checkpoint({"global_step": 2}, new)
    writer.remove_checkpoint(old)
    writer.after_saves(link_last, new, last)
    assert old.exists() and not new.exists() and not last.exists()  # nothing yet: the thread is held
    gate.set()
    writer.wait()
    assert not old.exists() and not digest_path(old).exists()
    assert torch.load(last, weights_only=False)["global_step"] == 2 and last.readlink() == Path(new.name)


def test_after_a_failed_save_nothing_more_is_done_and_the_error_reaches_the_caller(writer, tmp_path: Path) -> None:
    kept = tmp_path / "step0000001.ckpt"
    writer.save_checkpoint({"global_step": 1}, kept)
    (tmp_path / "a-file").write_text("not a folder")
    gate = _hold(writer)
    writer.save_checkpoint({"global_step": 2}, tmp_path / "a-file" / "step0000002.ckpt")  # cannot be written
    writer.remove_checkpoint(kept)  # would leave the run with no checkpoint
    writer.after_saves(link_last, tmp_path / "a-file" / "step0000002.ckpt", tmp_path / "last.ckpt")
    gate.set()
    with pytest.raises(OSError):
        writer.wait()
    assert kept.exists() and not (tmp_path / "last.ckpt").is_symlink()
    writer.save_checkpoint({"global_step": 3}, tmp_path / "step0000003.ckpt")  # once raised, saving goes on
    writer.wait()
    assert (tmp_path / "step0000003.ckpt").exists()


def test_the_writer_goes_to_ddp_spawns_ranks_without_its_thread(writer, tmp_path: Path) -> None:
    writer.save_checkpoint({"global_step": 1}, tmp_path / "step0000001.ckpt")
    copy = pickle.loads(pickle.dumps(writer))
    copy.save_checkpoint({"global_step": 2}, tmp_path / "step0000002.ckpt")
    copy.teardown()
    assert (tmp_path / "step0000002.ckpt").exists()
