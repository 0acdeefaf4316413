"""Checkpoints saved by a background thread (aiayn.checkpoints.background): what is written is the
state when the save was asked for; saves, removals and links happen in the order asked; after a
failed save nothing more is done and the error reaches the training thread. Real files, real
torch.save; the thread is held at a gate so that the order is the test's, not the scheduler's.
Whole runs save this way by default (checkpoint.in_background=true): tests/checkpoints,
tests/training (resume, preemption, DDP) and tests/cli/test_refused_in_one_line.py (a full disk)."""

from __future__ import annotations

import collections
import pickle
import threading
from pathlib import Path

import pytest
import torch

from aiayn.checkpoints.background import BackgroundCheckpointIO, snapshot
from aiayn.checkpoints.digest import damaged, digest_path
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
