"""src/prepare.py's own bad input: a task that does not exist and a raw folder that does not,
each one line on stderr and exit status 2 (the WMT raw trees with something wrong are tested in
tests/data/wmt/test_prepare_errors.py), in this process (tests.helpers.inprocess). And a real
prepare.py process stopped midway — Ctrl-C, SIGKILL, a file system that fills up — leaves nothing
half-written in the cache, or what the next run removes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.inprocess import run_tool
from tests.helpers.runs import IN_THE_FOREGROUND, REPO, in_small_filesystem, limit_file_size, offline_environment, popen
from tests.helpers.wmt import build_raw_tree


def _one_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, (result.returncode, result.stderr[-3000:])
    return lines[0]


def test_an_unknown_task_lists_the_tasks(tmp_path):
    line = _one_line(run_tool("src/prepare.py", "task=wmt_en_cs", f"hydra.run.dir={tmp_path}", check=False))
    assert line.startswith("prepare.py: ") and "Could not find 'task/wmt_en_cs'" in line
    assert "Available options in 'task': multi30k_de_en, multi30k_en_de, parallel_text, wmt_en_de, wmt_en_fr, wsj, wsj_semi" in line


def test_without_a_task_it_names_the_tasks_and_prepares_nothing(tmp_path):
    """No default task: one that downloaded WMT14 (gigabytes) when task= was left out."""
    (tmp_path / "data").mkdir()
    (tmp_path / "cwd").mkdir()
    line = _one_line(run_tool("src/prepare.py", cwd=tmp_path / "cwd", data_root=tmp_path / "data",
                              cache_dir=tmp_path / "cache", check=False))
    assert line.startswith("prepare.py: task is missing: give task=<name>, one of multi30k_de_en, multi30k_en_de, "
                           "parallel_text, wmt_en_de, wmt_en_fr, wsj, wsj_semi (see python "), line
    assert line.endswith("src/prepare.py --help)"), line
    assert not list((tmp_path / "data").iterdir()) and not list((tmp_path / "cwd").iterdir())
    assert not (tmp_path / "cache").exists()


def test_a_raw_dir_that_does_not_exist_is_named(tmp_path):
    line = _one_line(run_tool("src/prepare.py", "task=wmt_en_de", f"task.raw_dir={tmp_path / 'nowhere'}",
                              "task.datamodule.download=false", f"hydra.run.dir={tmp_path / 'run'}",
                              cache_dir=tmp_path / "cache", check=False))
    assert line == (f"prepare.py: task.raw_dir={tmp_path / 'nowhere'} does not exist: point task.raw_dir at the folder "
                    "where WMT's archives are unpacked (docs/wmt.md lists them), or set task.datamodule.download=true "
                    "to fetch them into it")



@pytest.mark.parametrize(("override", "message"), [
    ("task.vocab_size=0", "task.vocab_size must be a whole number of at least 8, got 0"),
    ("task.datamodule.subword_sample_pairs=-1", "task.datamodule.subword_sample_pairs must be a positive whole number"),
])
def test_the_tasks_settings_are_checked_as_train_checks_them(override: str, message: str, tmp_path: Path,
                                                            data_root: Path) -> None:
    """Before: sentencepiece's own error (``INTERNAL: ... vocab_size() > 0``), or for a sample of no
    pairs "no lines to train the sentencepiece model on" for a corpus of thousands."""
    line = _one_line(run_tool("src/prepare.py", "task=parallel_text", f"task.data_dir={data_root / 'multi30k'}",
                              "task.src_lang=en", "task.tgt_lang=de", override, f"hydra.run.dir={tmp_path / 'run'}",
                              cache_dir=tmp_path / "cache", check=False))
    assert line.startswith(f"prepare.py: {message}"), line
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("override", ["decoding.beam_size=1", "decoding=translation"])
def test_a_decoding_setting_is_refused_as_one_prepare_would_ignore(override: str, tmp_path: Path, data_root) -> None:
    """The task's decoding is composed with it, so Hydra takes decoding.*; nothing here decodes (before:
    accepted and ignored, exit 0)."""
    line = _one_line(run_tool("src/prepare.py", "task=multi30k_en_de", override, f"hydra.run.dir={tmp_path / 'run'}",
                              data_root=data_root, cache_dir=tmp_path / "cache", check=False))
    assert line == (f"prepare.py: {override}: prepare.py decodes nothing, so it would be ignored; decoding settings "
                    "are given to train.py, evaluate.py, translate.py and export.py")
    assert not (tmp_path / "cache").exists()

# --- a real prepare.py process interrupted, killed, or out of disk space -------------------------

VOCAB = 500


@pytest.fixture(scope="module")
def long_raw(data_root, tmp_path_factory) -> Path:
    """The miniature raw tree with europarl repeated 12 times (65,000 pairs): a preparation that
    lasts long enough to be interrupted in the middle."""
    raw = build_raw_tree(data_root, tmp_path_factory.mktemp("long_raw"))
    for lang in ("en", "de"):
        path = raw / "training" / f"europarl-v7.de-en.{lang}"
        path.write_bytes(path.read_bytes() * 12)
    return raw


def _command(raw: Path, *overrides: str) -> list[str]:
    return [sys.executable, "src/prepare.py", "task=wmt_en_de", f"task.raw_dir={raw}", f"task.vocab_size={VOCAB}",
            "task.datamodule.download=false", "task.datamodule.prepare_workers=2", *overrides]


def _environment(cache: Path) -> dict[str, str]:
    return {**offline_environment(), "AIAYN_CACHE_DIR": str(cache)}


def _start_and_stop_midway(raw: Path, cache: Path, run_dir: Path, how: signal.Signals) -> subprocess.CompletedProcess:
    """Start prepare.py as a process of its own (a session, as a shell's job), wait until its
    temporary folder is there, then send ``how`` to the whole job, as Ctrl-C or a kill does."""
    process = popen([*IN_THE_FOREGROUND, *_command(raw, f"hydra.run.dir={run_dir}")[1:]], cwd=REPO, env=_environment(cache),
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not list((cache / "wmt14").glob(".*.tmp")) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert process.poll() is None, "prepare.py ended before it could be interrupted"
    time.sleep(0.3)  # well into the cleaning of the training pairs
    os.killpg(process.pid, how)
    stdout, stderr = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _left_in(cache: Path) -> list[str]:
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*"))


@pytest.mark.cli
def test_ctrl_c_is_one_line_and_leaves_nothing_half_written(long_raw, tmp_path):
    cache = tmp_path / "cache"
    result = _start_and_stop_midway(long_raw, cache, tmp_path / "run", signal.SIGINT)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 130 and lines == [  # before: a traceback per process, exit 1
        ("prepare.py: interrupted before wmt_en_de was prepared; nothing half-written was kept. Run the same command "
         "again to prepare it")], result.stderr[-3000:]
    assert _left_in(cache) in (["sentencepiece", "wmt14"], ["wmt14"])  # no temporary folder, no lock file


@pytest.mark.cli
def test_what_a_killed_preparation_left_is_removed_by_the_next_run(long_raw, tmp_path):
    cache = tmp_path / "cache"
    result = _start_and_stop_midway(long_raw, cache, tmp_path / "run", signal.SIGKILL)
    assert result.returncode == -signal.SIGKILL
    left = [p for p in (cache / "wmt14").iterdir() if p.name.startswith(".")]
    assert left and any(p.name.endswith(".tmp") for p in left)  # a half-built folder, its lock file
    again = run_tool(*_command(long_raw, f"hydra.run.dir={tmp_path / 'again'}")[1:], cache_dir=cache)
    log = (tmp_path / "again" / "prepare.log").read_text()
    assert f"removed what an interrupted job left in {cache / 'wmt14'}: " in log
    assert again.stdout.splitlines()[-1].startswith("prepared wmt_en_de in ")
    assert not [p for p in cache.rglob(".*")]  # nothing hidden left anywhere in the cache


@pytest.mark.cli
def test_a_full_disk_is_one_line_and_leaves_nothing_half_written(long_raw, tmp_path):
    """The preparation needs about 15 MB; its cache gets 2 MiB (a tmpfs, or a 1 MiB file-size limit
    where no file system can be mounted)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    command = _command(long_raw, f"hydra.run.dir={tmp_path / 'run'}")
    wrapped = in_small_filesystem(command, cache)
    result = subprocess.run(wrapped or command, check=False, cwd=REPO, env=_environment(cache), capture_output=True, text=True,
                            timeout=300, preexec_fn=None if wrapped else limit_file_size(1 << 20))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr[-3000:]  # before: OSError 28's traceback
    reason = "No space left on device" if wrapped else "File too large"
    assert lines[0].startswith(f"prepare.py: {cache / 'wmt14'}: {reason} while writing the prepared WMT14 en-de data; "
                               "nothing of it was kept. Free space there, or set AIAYN_CACHE_DIR to a folder on a disk "
                               "with room, and run again"), lines[0]
    # the tmpfs (and all on it) went with its namespace: what the command left there is listed beside it
    left = (tmp_path / "cache.left").read_text().split() if wrapped else \
        [f"wmt14/{path.name}" for path in cache.joinpath("wmt14").iterdir()]
    assert not [path for path in left if path.startswith("wmt14/")], left
