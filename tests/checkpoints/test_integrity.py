"""Checkpoints are used only whole and only with their own run: a checkpoint whose bytes changed
after it was written is refused by the tools and skipped by resume; averaging refuses checkpoints
of another run and never writes over a file; a copied run folder resumes with ``last.ckpt`` the
newest and no Lightning ``-v1`` copies."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from aiayn import files
from aiayn.checkpoints import io as io_module
from aiayn.checkpoints.digest import damaged, digest_path, file_digest, identity
from aiayn.checkpoints.io import save_checkpoint_atomically
from aiayn.checkpoints.resume import newest_checkpoint
from tests.helpers.inprocess import run_tool, train
from tests.helpers.runs import TrainedRun


@pytest.fixture
def run_copy(tiny_run: TrainedRun, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(tiny_run.run_dir, copy, symlinks=True)
    return copy


def _flip(path: Path, count: int = 64) -> None:
    """xor ``count`` bytes in the middle of ``path`` (the size stays)."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + count] = bytes(b ^ 0xFF for b in data[middle:middle + count])
    path.write_bytes(bytes(data))


def _one_line(result) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_every_checkpoint_has_a_digest_of_its_bytes(tiny_run: TrainedRun) -> None:
    checkpoints = sorted(tiny_run.checkpoints.glob("*.ckpt"))
    assert checkpoints
    for path in checkpoints:
        assert digest_path(path, follow=True).is_file(), path
        assert damaged(path) is None, path


def test_flipped_bytes_are_refused_by_the_tools_and_skipped_by_resume(run_copy: Path, tmp_path: Path,
                                                                     tiny_run: TrainedRun, data_root: Path) -> None:
    newest = run_copy / "checkpoints" / "step0000004.ckpt"
    _flip(newest)
    assert "damaged" in damaged(newest)
    assert newest_checkpoint(run_copy).name == "step0000003.ckpt"  # resume=auto: the newest whole one
    # the tools refuse it in one line
    line = _one_line(run_tool("src/evaluate.py", f"ckpt={newest}", f"out={tmp_path / 'eval'}", "split=val",
                              "wandb=disabled", data_root=data_root, cache_dir=tiny_run.cache_dir, check=False))
    assert line.startswith(f"evaluate.py: {newest}: damaged: its bytes are not those written"), line
    line = _one_line(run_tool("src/average.py", f"ckpt={run_copy}", "average_last=2", f"out={tmp_path / 'a.ckpt'}",
                              check=False))
    assert f"{newest}: damaged" in line
    assert not (tmp_path / "a.ckpt").exists()


@pytest.mark.parametrize("text", ["", "0f3a\n", "not a digest at all\n"])
def test_a_digest_file_holding_no_digest_leaves_its_checkpoint_read_unchecked(run_copy: Path, text: str,
                                                                             caplog: pytest.LogCaptureFixture) -> None:
    """An emptied or cut-short digest file is the digest file's fault: its checkpoint is read as one
    without a digest, with a warning (before: "damaged", and resume skipped it for an older one)."""
    newest = run_copy / "checkpoints" / "step0000004.ckpt"
    digest_path(newest).write_text(text)
    with caplog.at_level("WARNING", logger="aiayn.checkpoints.digest"):
        assert damaged(newest) is None
    assert f"{digest_path(newest)} holds no BLAKE2b digest" in caplog.text and "read unchecked" in caplog.text
    assert newest_checkpoint(run_copy).name == "step0000004.ckpt"
    assert identity(newest) == file_digest(newest)
    _flip(newest)  # then nothing can tell damage: it is read as it is, as a checkpoint without a digest
    assert damaged(newest) is None


@pytest.mark.parametrize("stopped_at", ["the rename", "the digest"])
def test_a_save_stopped_midway_never_leaves_a_file_under_another_files_digest(tmp_path: Path, stopped_at: str,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A step saved again (a copied run, an older step resumed) and the process killed between its
    steps: the file there is under its own digest or none, never called damaged (before: the new
    digest was written before the rename, so a kill there left the old, whole file "damaged")."""
    out = tmp_path / "step0000004.ckpt"
    save_checkpoint_atomically({"weights": torch.zeros(64)}, out)
    old = out.read_bytes()

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # the moment a SIGKILL could come: nothing after it runs

    target = files.os if stopped_at == "the rename" else io_module
    monkeypatch.setattr(target, "replace" if stopped_at == "the rename" else "write_digest", killed)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint_atomically({"weights": torch.ones(64)}, out)
    monkeypatch.undo()
    assert damaged(out) is None, "a whole file is not called damaged"
    assert (out.read_bytes() == old) == (stopped_at == "the rename")  # renamed or not, each is whole
    assert torch.load(out)["weights"].sum() == (0 if stopped_at == "the rename" else 64)
    assert not digest_path(out).exists()  # read unchecked until the next save of it writes its digest
    save_checkpoint_atomically({"weights": torch.ones(64)}, out)
    assert digest_path(out).read_text().strip() == file_digest(out) and damaged(out) is None


def test_averaging_refuses_checkpoints_of_another_run(run_copy: Path, tmp_path: Path) -> None:
    folder = run_copy / "checkpoints"
    other = torch.load(folder / "step0000003.ckpt", map_location="cpu", weights_only=False)
    seed = other["hyper_parameters"]["run_config"]["seed"]
    other["hyper_parameters"]["run_config"]["seed"] = 7  # as a run of seed 7 wrote it
    torch.save(other, folder / "step0000003.ckpt")
    (digest_path(folder / "step0000003.ckpt")).unlink()
    line = _one_line(run_tool("src/average.py", f"ckpt={run_copy}", "average_last=2", f"out={tmp_path / 'a.ckpt'}",
                              check=False))
    assert line == (f"average.py: {folder / 'step0000004.ckpt'} is not of the run of {folder / 'step0000003.ckpt'} "
                    f"(seed: 7 → {seed}); average the checkpoints of one run"), line

    other = torch.load(folder / "step0000003.ckpt", map_location="cpu", weights_only=False)
    other["hyper_parameters"]["run_config"]["seed"] = seed
    other["subwords"] = other["subwords"][:-1] + b"x"  # another subword model
    torch.save(other, folder / "step0000003.ckpt")
    line = _one_line(run_tool("src/average.py", f"ckpt={run_copy}", "average_last=2", f"out={tmp_path / 'a.ckpt'}",
                              check=False))
    assert "(its subword model)" in line

    other = torch.load(folder / "step0000003.ckpt", map_location="cpu", weights_only=False)
    other["subwords"] = torch.load(folder / "step0000004.ckpt", map_location="cpu", weights_only=False)["subwords"]
    plan = other["hyper_parameters"]["run_config"]["plan"]
    batch = plan["tokens_per_batch"]
    plan.update(tokens_per_batch=batch * 2, tokens_per_step=batch * 2)  # a run of other batches
    torch.save(other, folder / "step0000003.ckpt")
    line = _one_line(run_tool("src/average.py", f"ckpt={run_copy}", "average_last=2", f"out={tmp_path / 'a.ckpt'}",
                              check=False))
    # The differences alone: not how to resume the other run's checkpoint, which averaging does not do.
    assert f"(plan.tokens_per_batch: {batch * 2} → {batch}; plan.tokens_per_step: {batch * 2} → " in line, line
    assert line.endswith("); average the checkpoints of one run") and "give" not in line, line


def test_average_never_writes_over_a_file_or_a_name_a_run_gives_its_checkpoints(run_copy: Path) -> None:
    folder = run_copy / "checkpoints"
    before = {path.name: path.read_bytes() for path in folder.iterdir() if path.is_file()}
    for out, says in [(folder / "last.ckpt", "exists"), (folder / "step0000004.ckpt", "exists"),
                      (folder / "step0000009.ckpt", "a name a run gives its own checkpoints"),
                      (run_copy / "notes.txt", "exists")]:
        if out.name == "notes.txt":
            out.write_text("mine\n")
        line = _one_line(run_tool("src/average.py", f"ckpt={run_copy}", "average_last=2", f"out={out}", check=False))
        assert line.startswith(f"average.py: out={out}") and says in line, line
    assert {path.name: path.read_bytes() for path in folder.iterdir() if path.is_file()} == before
    assert (run_copy / "notes.txt").read_text() == "mine\n"


@pytest.mark.slow
def test_a_copied_run_folder_resumes_with_last_ckpt_the_newest_and_no_versioned_copies(
        run_copy: Path, tiny_run: TrainedRun, data_root: Path) -> None:
    train(run_copy, *tiny_run.overrides, "resume=auto", "optim.train_steps=6", "test_after_training=false",
          data_root=data_root, cache_dir=tiny_run.cache_dir)
    names = sorted(path.name for path in (run_copy / "checkpoints").glob("*.ckpt"))
    assert not [name for name in names if "-v" in name], names
    last = torch.load(run_copy / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert last["global_step"] == 6
