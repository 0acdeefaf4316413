"""src/translate.py's refusals: one line, exit status 2, before anything is translated or written."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.datafiles import write_lines
from tests.helpers.inprocess import run_tool
from tests.helpers.runs import TrainedRun, in_read_only_folder, run_command
from tests.helpers.translating import ARGUMENTS, SENTENCES


def _not_writable(tmp: Path) -> str:
    folder = tmp / "locked"
    folder.mkdir()
    folder.chmod(0o500)
    return f"out={folder}/out.de"


def _a_checkpoint(path: Path) -> Path:
    torch.save({"state_dict": {"weight": torch.ones(3)}, "global_step": 4}, path)  # as torch writes every checkpoint
    return path


def _contents(folder: Path) -> dict[Path, bytes | None]:
    """Every path under ``folder`` with its bytes (None for a folder)."""
    return {path: None if path.is_dir() else path.read_bytes() for path in folder.rglob("*")}


BAD = {  # (the bad setting, given tmp_path; the start of the one line)
    "output is a directory": (lambda tmp: f"out={tmp}",
                              "out={tmp} is a directory; give the file to write the translations to"),
    "input missing": (lambda tmp: f"input={tmp}/missing.en", "input={tmp}/missing.en: no such file"),
    "input is a directory": (lambda tmp: f"input={tmp}", "input={tmp} is a directory"),
    "ckpt missing": (lambda tmp: f"ckpt={tmp}/missing.ckpt", "{tmp}/missing.ckpt: checkpoint not found"),
    "ckpt a folder of none": (lambda tmp: f"ckpt={tmp}", ("ckpt={tmp} is a directory and holds no checkpoint files; give "
                                                     "one checkpoint file")),
    "batch_size=0": (lambda tmp: "batch_size=0", "batch_size must be a whole number of at least 1, got 0"),
    "buffer_size=0": (lambda tmp: "buffer_size=0", "buffer_size must be a whole number of at least 1, got 0"),
    "interactive=maybe": (lambda tmp: "interactive=maybe", "interactive must be auto, true or false, got 'maybe'"),
    "decoding.constrained=maybe": (lambda tmp: "decoding.constrained=maybe",
                                   "Error merging override decoding.constrained=maybe"),
    "constrained, a translation model": (lambda tmp: "decoding.constrained=true",
                                         ("decoding.constrained=true decodes within the task's output constraint, "
                                          "and this model's task has none (constrained decoding is for parsing tasks)")),
    "output folder under a file": (lambda tmp: f"out={tmp}/in.en/out.de",
                                   "out={tmp}/in.en/out.de: cannot create its folder {tmp}/in.en ({tmp}/in.en is a file)"),
    "output is the input": (lambda tmp: f"out={tmp}/in.en", "out={tmp}/in.en is the input file"),
    "output is a checkpoint": (lambda tmp: f"out={_a_checkpoint(tmp / 'step.ckpt')}",
                               "out={tmp}/step.ckpt holds binary data, not text (a checkpoint?)"),
    "output folder not writable": (lambda tmp: _not_writable(tmp), "out={tmp}/locked/out.de: not writable"),
    "precision=fp8": (lambda tmp: "precision=fp8", "precision must be one of fp32, bf16, fp16, got 'fp8'"),
    "int8=maybe": (lambda tmp: "int8=maybe", "Error merging override int8=maybe. Value 'maybe' is not a valid bool"),
    # Before: "this machine has no usable CUDA GPU (Expected one of cpu, cuda, ...)" without a GPU, a traceback with one.
    "device=gpu0": (lambda tmp: "device=gpu0", ("device must be auto (a GPU where there is one), cpu, cuda or "
                                               "cuda:<index>, got 'gpu0'")),
}


@pytest.mark.parametrize("tool", ["translate", "visualize", "export"])
def test_a_run_folder_given_as_ckpt_names_the_file_to_give(tool: str, tiny_run: TrainedRun, data_root: Path,
                                                           tmp_path: Path) -> None:
    """A run's folder where one checkpoint file is asked for: one line naming its last.ckpt (as
    evaluate.py says; before, translate.py and visualize.py said the checkpoint was not found)."""
    result = run_tool(f"src/{tool}.py", f"ckpt={tiny_run.run_dir}", f"out={tmp_path / 'out'}", stdin="A dog.\n",
                      data_root=data_root, cache_dir=tiny_run.cache_dir, check=False)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        f"{tool}.py: ckpt={tiny_run.run_dir} is a directory; give one checkpoint file, e.g. ckpt={tiny_run.last}"]


@pytest.mark.parametrize("kind", BAD)
def test_bad_input_is_one_line_before_anything_is_translated(kind: str, tiny_run: TrainedRun, data_root: Path,
                                                             tmp_path: Path) -> None:
    bad, message = BAD[kind]
    source = write_lines(tmp_path / "in.en", SENTENCES)
    key, value = bad(tmp_path).split("=", 1)
    settings = {"ckpt": str(tiny_run.last), "input": str(source), **dict(arg.split("=") for arg in ARGUMENTS), key: value}
    arguments = [f"{key}={value}" for key, value in settings.items()]
    before = _contents(tmp_path)
    if kind == "output folder not writable" and os.geteuid() == 0:  # root writes into any folder but a read-only one
        command = in_read_only_folder([sys.executable, "src/translate.py", *arguments], tmp_path / "locked")
        if command is None:
            pytest.skip("root writes into any folder, and no folder can be mounted read-only here")
        result = run_command(command, data_root=data_root, cache_dir=tiny_run.cache_dir, check=False)
    else:
        result = run_tool("src/translate.py", *arguments, data_root=data_root, cache_dir=tiny_run.cache_dir, check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]  # one line: no summary, nothing translated
    assert result.stderr.startswith(f"translate.py: {message.format(tmp=tmp_path)}"), result.stderr
    assert result.stdout == "" and _contents(tmp_path) == before and source.read_text().count("\n") == 5


def test_an_output_file_that_stdin_reads_is_refused_and_kept(tiny_run: TrainedRun, data_root: Path,
                                                             tmp_path: Path) -> None:
    """``translate.py out=F < F`` is refused as ``input=F out=F`` is (before: F emptied before its
    first line was read, "translated 0 lines", exit status 0)."""
    source = write_lines(tmp_path / "in.en", SENTENCES)
    before = source.read_bytes()
    result = run_tool("src/translate.py", f"ckpt={tiny_run.last}", f"out={source}", *ARGUMENTS, stdin=source,
                      data_root=data_root, cache_dir=tiny_run.cache_dir, check=False)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        (f"translate.py: out={source} is the file stdin reads (< {source}); give another file to write the "
         "translations to")], result.stderr[-3000:]
    assert source.read_bytes() == before


def test_a_device_as_output_is_written_to_not_taken_for_a_checkpoint(tiny_run: TrainedRun, data_root: Path) -> None:
    """``out=/dev/zero`` (a device that reads as zeros and takes what is written) is translated
    into: zeros read from a device are no checkpoint's binary data (before: it, and /dev/full, were
    refused as "holds binary data, not text (a checkpoint?)")."""
    assert Path("/dev/zero").exists()
    result = run_tool("src/translate.py", f"ckpt={tiny_run.last}", "out=/dev/zero", *ARGUMENTS, stdin="A dog.\n",
                      data_root=data_root, cache_dir=tiny_run.cache_dir, check=False)
    assert result.returncode == 0 and "binary" not in result.stderr, result.stderr[-3000:]


def test_translate_stdin_that_is_not_utf8_names_the_line_and_byte(tiny_run: TrainedRun):
    result = run_tool("src/translate.py", f"ckpt={tiny_run.last}", stdin="A dog.\nA \xe9t\xe9 cat.\n".encode("latin-1"),
                      check=False)
    assert result.returncode == 2
    assert result.stderr.decode().strip().splitlines()[-1] == (
        "translate.py: <stdin>: line 2 is not valid UTF-8 (byte 3 of the line); re-encode the file as UTF-8")


def test_translate_with_beam_size_0_names_the_setting_and_exits_2(tiny_run: TrainedRun, data_root, tmp_path):
    source = write_lines(tmp_path / "in.en", ["A dog runs."])
    result = run_tool("src/translate.py", f"ckpt={tiny_run.last}", f"input={source}", "decoding.beam_size=0",
                      data_root=data_root, cache_dir=tiny_run.cache_dir, check=False)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == "translate.py: decoding.beam_size must be a whole number of at least 1, got 0"
