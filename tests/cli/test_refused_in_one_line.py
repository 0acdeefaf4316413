"""What used to end in a traceback (or wait hours to) and is now one line, exit status 2, with
nothing left behind: the settings, paths, environment and files of docs/guarantees/bad-input.md's rows
84-91. The tools run in this process (tests.helpers.inprocess) unless a process is needed (a
file-size limit)."""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aiayn.checkpoints.trained import load_trained
from tests.helpers.inprocess import run_tool
from tests.helpers.runs import (
    REPO,
    TINY,
    TrainedRun,
    in_small_filesystem,
    limit_file_size,
    offline_environment,
    run_command,
)


def _last_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and lines, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return lines[-1]


@pytest.mark.cli  # the modules a process imports
def test_an_override_hydra_cannot_apply_is_refused_before_torch_is_imported(tmp_path: Path, data_root: Path) -> None:
    """train.py composes its config before importing the run (torch, Lightning, W&B: five seconds
    and more), so that a mistyped or ill-typed override is one line in about a second, as --help is."""
    for override, message in (("model.d_model=abc", "Value 'abc' of type 'str' could not be converted to Integer"),
                              ("decoding.beam=5", "decoding.beam is not a setting here")):
        result = run_command([sys.executable, "-X", "importtime", str(REPO / "src" / "train.py"), override],
                             cwd=tmp_path, data_root=data_root, check=False)
        imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in result.stderr.splitlines()
                    if line.startswith("import time:")}
        said = [line for line in result.stderr.splitlines() if not line.startswith("import time:")]
        assert result.returncode == 2 and len(said) == 1 and message in said[0], result.stderr[-3000:]
        assert "hydra" in imported and not imported & {"torch", "lightning", "wandb"}, imported & {"torch", "lightning"}
    assert not (tmp_path / "outputs").exists()


def _train(tmp_path: Path, data_root: Path, cache: Path, *overrides: str, env: dict | None = None):
    return run_tool("src/train.py", *TINY, "logger=none", *overrides, cwd=tmp_path, data_root=data_root,
                    cache_dir=cache, env=env, check=False)


def test_an_evaluation_example_longer_than_a_batch_stops_the_run_before_its_first_step(tmp_path, data_root,
                                                                                       subword_cache):
    """Before: Lightning's traceback at the first validation (and for the test split, after training)."""
    line = _last_line(_train(tmp_path, data_root, subword_cache, "task.datamodule.eval_max_tokens=30"))
    assert line == ("train.py: task.datamodule.eval_max_tokens=30 (it defaults to max_tokens) is below the longest "
                    "example of the split val: 79 subword tokens with BOS/EOS (pair 916), which evaluation keeps "
                    "whole; set it to at least 79"), line
    assert not (tmp_path / "outputs").exists(), list((tmp_path / "outputs").rglob("*"))


def test_positions_that_do_not_cover_max_length_are_refused_up_front(tmp_path, data_root, subword_cache):
    line = _last_line(_train(tmp_path, data_root, subword_cache, "model.max_positions=100"))
    assert line == ("train.py: model.max_positions=100 is below the longest training sequence, "
                    "task.datamodule.max_length=128 subwords plus EOS; raise model.max_positions to at least 129 or "
                    "lower task.datamodule.max_length to at most 99"), line
    assert not (tmp_path / "outputs").exists()


@pytest.mark.slow
def test_an_evaluation_example_beyond_the_positions_stops_the_run_before_its_first_step(tmp_path, data_root,
                                                                                       subword_cache):
    """Training pairs are held to max_length, evaluation examples are kept whole. Before: the
    positional encoding's ValueError traceback at the first validation."""
    line = _last_line(_train(tmp_path, data_root, subword_cache, "model.max_positions=60",
                             "task.datamodule.max_length=59"))
    assert line == ("train.py: model.max_positions=60 is below the longest example of the split val: 79 subword "
                    "tokens with BOS/EOS (pair 916), which evaluation keeps whole; raise model.max_positions to at "
                    "least 79"), line
    assert not (tmp_path / "outputs").exists(), list((tmp_path / "outputs").rglob("*"))


def test_a_file_as_the_run_folder_is_named(tmp_path, data_root, subword_cache):
    (tmp_path / "taken").write_text("a file\n")
    for folder, reason in ((tmp_path / "taken", "a file of that name is there"),
                           (tmp_path / "taken" / "run", "Not a directory")):
        result = _train(tmp_path, data_root, subword_cache, f"hydra.run.dir={folder}")
        line = _last_line(result)
        assert line == (f"train.py: hydra.run.dir: cannot make the output folder {folder} ({reason}); give "
                        "hydra.run.dir= a folder that can be made there"), line
        assert result.stderr.count("\n") == 1, result.stderr  # the line alone
    assert (tmp_path / "taken").read_text() == "a file\n"


def test_a_read_only_disk_is_one_line_naming_the_file() -> None:
    """The line a write refused by a read-only disk gives (a run folder's lock or log, a cache to
    build), wherever it comes from (before: a traceback, exit 1)."""
    from aiayn.cli.errors import describe

    error = OSError(30, "Read-only file system", "/mnt/ro/run/.lock")
    assert describe(error) == (("/mnt/ro/run/.lock: Read-only file system; the tool writes there: give it a folder on a "
                               "disk it may write to"), 2)


_IN_THE_NAMESPACE = """import json, sys
from tests.helpers.inprocess import run_tool
results = [run_tool("src/train.py", *overrides, env=env, check=False) for overrides, env in json.loads(sys.argv[1])]
print(json.dumps([[result.returncode, result.stderr] for result in results]))
"""

_READ_ONLY = """set -e
mount --bind "$1" "$1" && mount -o remount,bind,ro "$1"
shift
exec "$@"
"""


@pytest.mark.slow
@pytest.mark.cli
def test_a_run_on_a_read_only_disk_is_one_line(tmp_path, data_root, subword_cache, tiny_run: TrainedRun):
    """A run folder or cache on a read-only disk (a bind mount made read-only, in a mount namespace
    of the test's own): resume=auto there, resume= of it from elsewhere, a cache entry to build."""
    probe = subprocess.run(["unshare", "-m", "true"], check=False, capture_output=True)
    if probe.returncode != 0:
        pytest.skip("no mount namespace here (unshare -m needs privileges)")
    disk = tmp_path / "disk"
    disk.mkdir()
    (disk / "run").mkdir()
    shutil.copytree(tiny_run.checkpoints, disk / "run" / "checkpoints", symlinks=True)
    shutil.copytree(tiny_run.cache_dir, disk / "cache", symlinks=True)
    script = tmp_path / "read_only.sh"
    script.write_text(_READ_ONLY)
    environment = {**offline_environment(), "AIAYN_DATA_ROOT": str(data_root), "AIAYN_CACHE_DIR": str(tiny_run.cache_dir)}
    cases = [
        ([f"hydra.run.dir={disk / 'run'}", "resume=auto"], {}, f"train.py: hydra.run.dir: cannot write {disk / 'run'}/"),
        ([f"hydra.run.dir={tmp_path / 'attempt'}", f"resume={disk / 'run'}"], {},
         f"train.py: {disk / 'run' / '.lock'}: Read-only file system; the tool writes there"),
        ([f"hydra.run.dir={tmp_path / 'other'}", "task.vocab_size=450"], {"AIAYN_CACHE_DIR": str(disk / "cache")},
         f"train.py: {disk / 'cache'}"),
    ]
    # One interpreter in the namespace runs the three in its own process, each as a process would
    # (tests/helpers/inprocess.py): torch is imported once, not three times.
    runs = [([*tiny_run.overrides, *overrides], {**environment, **env}) for overrides, env, _ in cases]
    command = ["unshare", "-m", "sh", str(script), str(disk), sys.executable, "-c", _IN_THE_NAMESPACE, json.dumps(runs)]
    done = subprocess.run(command, check=False, cwd=REPO, env=environment, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for (_, _, start), (status, stderr) in zip(cases, json.loads(done.stdout.splitlines()[-1]), strict=True):
        assert status == 2 and "Traceback" not in stderr, stderr[-3000:]
        line = stderr.strip().splitlines()[-1]
        assert line.startswith(start) and "Read-only file system" in line, line


@pytest.mark.slow
def test_wandb_online_without_an_api_key_is_refused_before_the_run_starts(tmp_path, data_root, subword_cache):
    """Before: wandb's UsageError traceback as the logger started."""
    bare = {key: value for key, value in os.environ.items() if not key.startswith("WANDB_")}
    bare["HOME"] = str(tmp_path)  # no ~/.netrc with a key
    for overrides, env, setting in (
        (["logger.wandb.mode=online"], bare, "logger.wandb.mode=online"),
        ([], {**bare, "WANDB_MODE": "online"}, "WANDB_MODE=online"),
    ):
        line = _last_line(_train(tmp_path, data_root, subword_cache, "logger=wandb", *overrides, env=env))
        assert line == (f"train.py: {setting} needs a W&B API key and none is configured here (WANDB_API_KEY, or "
                        "`wandb login`); log in, or use logger.wandb.mode=auto: offline without a key, uploaded "
                        "later with `wandb sync`"), line
    line = _last_line(_train(tmp_path, data_root, subword_cache, "logger=wandb", "logger.wandb.mode=sometimes",
                             env=offline_environment()))
    assert line == "train.py: logger.wandb.mode must be online, offline or auto (online with an API key), got 'sometimes'"
    assert not (tmp_path / "outputs").exists()


def test_a_sentence_longer_than_the_positions_to_visualize_is_named(tiny_run: TrainedRun, tmp_path):
    """Before: a ValueError's traceback."""
    positions = load_trained(tiny_run.last).model.max_positions
    result = run_tool("src/visualize.py", f"ckpt={tiny_run.last}", f"text={' '.join(['a'] * positions)}",
                      f"out={tmp_path / 'pictures'}", check=False)
    line = _last_line(result)
    assert line.startswith("visualize.py: text: the sentence has ") and (
        f"more than the model's max_positions={positions} cover; give a shorter text (at most {positions - 1} "
        "subwords)") in line, line
    assert not (tmp_path / "pictures").exists()


def _other_layout(tiny_run: TrainedRun, tmp_path: Path) -> Path:
    """The tiny run's checkpoint with its encoder's weights under other names, as another version
    of the network would have them."""
    checkpoint = torch.load(tiny_run.last, map_location="cpu", weights_only=False)
    checkpoint["state_dict"] = {key.replace("model.encoder_layers", "model.encoder_blocks"): value
                                for key, value in checkpoint["state_dict"].items()}
    path = tmp_path / "other" / "checkpoints" / "step0000004.ckpt"
    path.parent.mkdir(parents=True)
    torch.save(checkpoint, path)
    return path


@pytest.mark.slow
def test_a_checkpoint_of_another_layout_is_one_line_in_evaluate_and_resume(tiny_run: TrainedRun, data_root, tmp_path):
    """Before: torch's 'Error(s) in loading state_dict' with every key, as a traceback."""
    path = _other_layout(tiny_run, tmp_path)
    expected = ("its weights are laid out otherwise than the network its settings describe is built by this version "
                "of aiayn (missing 24 (")  # the 12 weights of each of the 2 encoder layers
    line = _last_line(run_tool("src/evaluate.py", f"ckpt={path}", "wandb=disabled", data_root=data_root,
                               cache_dir=tiny_run.cache_dir, check=False))
    assert line.startswith(f"evaluate.py: {path}: {expected}encoder_layers.0.self_attention.w_q.weight"), line
    assert "not this network's 24 (encoder_blocks.0." in line and line.endswith("another version wrote it; use that "
                                                                               "version with it")
    line = _last_line(run_tool("src/train.py", *tiny_run.overrides, f"resume={path}", "optim.train_steps=6",
                               f"hydra.run.dir={tmp_path / 'resumed'}", cwd=tmp_path, data_root=data_root,
                               cache_dir=tiny_run.cache_dir, check=False))
    assert line.startswith(f"train.py: {path}: {expected}model.encoder_layers.0."), line


@pytest.mark.slow
def test_a_full_disk_while_saving_a_checkpoint_is_one_line_and_leaves_no_part_of_it(tmp_path, data_root,
                                                                                    subword_cache):
    """A 256 KiB file-size limit (``ulimit -f``): the logs fit, the tiny model's checkpoint does
    not. Before: torch's 'enforce fail at inline_container.cc' traceback."""
    def limit_file_size() -> None:  # a write past the limit fails with EFBIG instead of killing the process
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 18, 1 << 18))

    run = tmp_path / "run"
    environment = {**offline_environment(), "AIAYN_DATA_ROOT": str(data_root), "AIAYN_CACHE_DIR": str(subword_cache)}
    result = subprocess.run([sys.executable, "src/train.py", *TINY, "logger=csv", f"hydra.run.dir={run}"], cwd=REPO,
                            env=environment, capture_output=True, text=True, timeout=300, preexec_fn=limit_file_size,
                            check=False)
    line = _last_line(result)
    assert line == (f"train.py: {run / 'checkpoints'}: File too large while saving checkpoint step0000002.ckpt; it was "
                    "not written (the checkpoints before it are whole). Free space there and continue with the same "
                    "command and resume=auto"), line
    assert list((run / "checkpoints").iterdir()) == []  # no temporary, no digest without its file


def test_evaluating_on_a_task_whose_data_is_not_prepared_refuses_instead_of_preparing_it(tiny_run: TrainedRun,
                                                                                        data_root, tmp_path):
    """Before: a Multi30k model with task=wmt_en_de started preparing all of WMT14 (hours)."""
    cache = tmp_path / "cache"
    line = _last_line(run_tool("src/evaluate.py", f"ckpt={tiny_run.last}", "task=wmt_en_de", "wandb=disabled",
                               data_root=data_root, cache_dir=cache, check=False))
    assert line.startswith(f"evaluate.py: task=wmt_en_de: {tiny_run.last} was trained on task multi30k_en_de, and its "
                           "test sets are read from the prepared WMT14 en-de data, which is not prepared under "
                           f"{cache} "), line
    assert line.endswith("preparing it takes hours at full scale: run src/prepare.py with this task first"), line
    assert not (cache / "wmt14").exists()


@pytest.mark.cli
def test_a_full_disk_while_evaluate_writes_is_one_line_and_leaves_no_part_of_a_file(tiny_run: TrainedRun, data_root,
                                                                                    tmp_path):
    """``out=`` on a file system of 4 KiB (a tmpfs of its own, or a 4 KiB file-size limit): what
    evaluate writes of the validation split does not all fit. Before: OSError 28's traceback, exit 1."""
    out = tmp_path / "eval"
    out.mkdir()
    command = [sys.executable, "src/evaluate.py", f"ckpt={tiny_run.last}", "split=val", "wandb=disabled",
               "decoding.max_len_offset=5", f"out={out}"]
    wrapped = in_small_filesystem(command, out, size="4k")
    environment = {**offline_environment(), "AIAYN_DATA_ROOT": str(data_root),
                   "AIAYN_CACHE_DIR": str(tiny_run.cache_dir)}
    result = subprocess.run(wrapped or command, cwd=REPO, env=environment, capture_output=True, text=True, timeout=600,
                            preexec_fn=None if wrapped else limit_file_size(4096), check=False)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr[-3000:]
    reason = "No space left on device" if wrapped else "File too large"
    assert re.fullmatch(rf"evaluate\.py: {re.escape(str(out))}/val\.step4\S*: {reason} while writing; "
                        r"nothing of that file was kept \(what was written before it is whole\)\. Free space there, "
                        r"or give out= a folder on a disk with room, and run again\n", result.stderr), result.stderr
    left = (tmp_path / "eval.left").read_text().split() if wrapped else [path.name for path in out.iterdir()]
    # no temporary; the files before it whole
    assert not [name for name in left if name.startswith(".") or "/." in name]


@pytest.mark.parametrize(("tool", "arguments", "said"), [
    ("experiments/tables.py", ["bogus"], "tables.py: argument command: invalid choice: 'bogus'"),
    ("experiments/tables.py", ["run", "experiment=table3_base"],
     "tables.py run: the following arguments are required: --root (see tables.py run --help)"),
    ("experiments/tables.py", ["params", "--vocab", "x"], "tables.py params: argument --vocab: invalid int value: 'x'"),
    ("experiments/table4/baseline.py", ["--split", "dev"], "baseline.py: argument --split: invalid choice: 'dev'"),
])
def test_the_tools_that_take_options_refuse_a_command_line_in_one_line(tool, arguments, said):
    """experiments/tables.py and Table 4's baseline, as every tool: one line, exit status 2 (before:
    argparse's usage block above its error line)."""
    result = run_tool(tool, *arguments, check=False)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(said) and result.stderr.rstrip().endswith("--help)"), result.stderr
