"""The tools' one error wrapper (aiayn.cli.errors) and their own --help pages.

End to end (real processes, marked ``cli``): for each of the six tools a user error is exactly one
line on stderr, ``<tool as invoked>: ...``, exit status 2, no traceback; nothing here trains, so
each takes seconds (the time to import torch). In process: the --help pages (tests.helpers.inprocess,
invoked as the console script), and which exceptions the wrapper reports and how, raised for real.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import traceback
from pathlib import Path

import hydra
import pytest
import torch
from omegaconf import OmegaConf
from omegaconf.errors import MissingMandatoryValue
from torch.multiprocessing import ProcessRaisedException

from aiayn.cli.errors import USER_ERROR, describe, reports_errors
from aiayn.cli.naming import config_options
from aiayn.cli.rank_errors import os_error_of_a_rank, user_error_of_a_rank
from aiayn.decoding.settings import Decoding, asked
from aiayn.errors import ConfigError, DataError
from aiayn.training.nonfinite import NonFiniteLossError
from tests.helpers import inprocess
from tests.helpers.runs import REPO, offline_environment, popen, run_command

TOOLS = ("train", "prepare", "evaluate", "translate", "average", "visualize")
BIN = Path(sys.executable).parent


def run(command: list[str], cwd: Path, data_root: Path | None = None) -> subprocess.CompletedProcess:
    """``command`` from ``cwd`` (outside the checkout), its cache there; its exit status is the test's to check."""
    return run_command(command, cwd=cwd, data_root=data_root, cache_dir=cwd / "cache", check=False, timeout=300)


def console_script(tool: str) -> str:
    path = BIN / f"aiayn-{tool}"
    if not path.is_file():
        pytest.fail(f"{path} is not installed; run `pip install -e .` (pyproject.toml [project.scripts])", pytrace=False)
    return str(path)


def user_error(tool: str, tmp: Path) -> tuple[list[str], str]:
    """A quick mistake for ``tool``: its arguments and the start of the line it must give."""
    bogus = tmp / "notes.ckpt"
    bogus.write_text("notes, not a checkpoint\n")
    return {
        "train": ([f"resume={tmp / 'no' / 'run'}", "logger=none", f"hydra.run.dir={tmp / 'run'}"],
                  f"resume={tmp / 'no' / 'run'}: no such checkpoint file or run directory"),
        "prepare": (["task=multi30k_en_de", f"paths.data_root={tmp / 'empty'}", "task.datamodule.download=false",
                     f"hydra.run.dir={tmp / 'prepare'}"], "Multi30k files missing"),
        "evaluate": ([], "ckpt is missing: give ckpt=<value>"),
        "translate": ([f"ckpt={bogus}"], f"{bogus}: not a readable checkpoint"),
        "average": ([f"ckpt={tmp / 'missing'}", f"out={tmp / 'out.ckpt'}"], f"{tmp / 'missing'}: no such directory"),
        "visualize": ([f"ckpt={tmp / 'nope.ckpt'}"], f"{tmp / 'nope.ckpt'}: checkpoint not found"),
    }[tool]


def assert_one_line(result: subprocess.CompletedProcess, prefix: str, message: str) -> None:
    assert result.returncode == USER_ERROR, result.stdout[-2000:] + result.stderr[-5000:]
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{prefix}: {message}"), lines[0]


@pytest.mark.cli  # the modules a process imports
@pytest.mark.parametrize("tool", [*TOOLS, "export"])
def test_help_is_the_tools_page_without_torch(tool: str) -> None:
    """A tool's --help takes a second, not the five that torch, Lightning and W&B took to import
    (aiayn.cli.help serves it without the tool's command), and is the page the command prints."""
    result = run_command([sys.executable, "-X", "importtime", f"src/{tool}.py", "--help"], cwd=REPO, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in result.stderr.splitlines()
                if line.startswith("import time:")}
    assert "omegaconf" in imported and not imported & {"torch", "lightning", "wandb"}
    assert result.stdout == inprocess.run_tool(f"src/{tool}.py", "--help").stdout  # the command's own page


@pytest.mark.cli
@pytest.mark.parametrize("tool", TOOLS)
def test_a_user_error_is_one_line_named_after_the_script(tool: str, tmp_path: Path) -> None:
    arguments, message = user_error(tool, tmp_path)
    result = run([sys.executable, str(REPO / "src" / f"{tool}.py"), *arguments], cwd=tmp_path)
    assert_one_line(result, f"{tool}.py", message)


@pytest.mark.cli
@pytest.mark.parametrize("tool", ["average", "visualize", "evaluate"])
def test_a_console_script_names_itself(tool: str, tmp_path: Path) -> None:
    arguments, message = user_error(tool, tmp_path)
    result = run([console_script(tool), *arguments], cwd=tmp_path)
    assert_one_line(result, f"aiayn-{tool}", message)
    if tool == "evaluate":  # what to run for help is the command as invoked
        assert result.stderr.strip().endswith("(see aiayn-evaluate --help)")


@pytest.mark.cli
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_asking_for_a_gpu_without_one_says_to_use_the_cpu(tmp_path: Path, data_root: Path) -> None:
    result = run([console_script("train"), "hardware=gpu", "logger=none", f"hydra.run.dir={tmp_path / 'run'}"],
                 cwd=tmp_path, data_root=data_root)
    assert result.returncode == USER_ERROR and "Traceback" not in result.stderr, result.stderr[-5000:]
    # Refused with the rest of the config, before anything is built or written.
    assert result.stderr.strip().splitlines() == [
        ("aiayn-train: trainer.accelerator=gpu asks for a GPU but no usable CUDA GPU was found on this machine; use "
         "hardware=auto (the default) or hardware=cpu to train on its CPU")]
    assert not (tmp_path / "run").exists()


TRAIN_ONLY_GROUPS = ("hardware:", "experiment:", "logger:", "model:")
OWN_SETTINGS = {
    "train": ["== Config groups", "hardware: auto, cpu", "experiment: table", "trainer:", "resume: null"],
    "prepare": ["task: multi30k_de_en, multi30k_en_de, parallel_text, wmt_en_de", "seed: 1234"],
    "evaluate": ["task: multi30k_de_en, multi30k_en_de, parallel_text, wmt_en_de", "ckpt: ???", "average_last: null", "beam_size:"],
    "translate": ["ckpt: ???", "input: null", "beam_size: null", "kv_cache: null"],
    "average": ["ckpt: ???", "average_last: null", "out: ???"],
    "visualize": ["ckpt: null", "text: A man is riding a bike.", "positional_encoding: true"],
}


@pytest.mark.slow
@pytest.mark.parametrize("tool", TOOLS)
def test_help_shows_the_tools_own_settings(tool: str, tmp_path: Path) -> None:
    # In this process, invoked as the console script from outside the checkout.
    result = inprocess.run_tool(f"src/{tool}.py", "--help", cwd=tmp_path, argv0=console_script(tool),
                                cache_dir=tmp_path / "cache", check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    page = result.stdout
    assert page.startswith(f"aiayn-{tool}: ") and f"usage: aiayn-{tool} " in page and "example: " in page, page[:500]
    for text in OWN_SETTINGS[tool]:
        assert text in page, f"{text!r} not in aiayn-{tool} --help:\n{page}"
    if tool != "train":
        lines = page.splitlines()
        assert not [line for line in lines if line.startswith(TRAIN_ONLY_GROUPS)], page
    if tool not in ("train", "prepare", "evaluate"):
        assert "== Config group" not in page, page
    assert not list(tmp_path.iterdir()), "--help writes nothing"


@pytest.mark.cli
def test_help_of_a_script_names_the_script(tmp_path: Path) -> None:
    result = run([sys.executable, str(REPO / "src" / "translate.py"), "--help"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("translate.py: ") and f"usage: python {REPO / 'src' / 'translate.py'} ckpt=" in result.stdout


@pytest.mark.cli
@pytest.mark.parametrize("arguments", [("visualize", "--help"), ("prepare", "--help"), ("train", "--cfg", "job")])
def test_a_page_whose_reader_has_gone_ends_quietly(arguments: tuple[str, ...], tmp_path: Path, data_root: Path) -> None:
    """`train.py --help | head -3`: the reader has what it wanted; no traceback follows, and the exit
    status is a SIGPIPE's, as cat's and translate's (the read end closed before the page is written)."""
    tool, *options = arguments
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        environment = {**offline_environment(), "AIAYN_DATA_ROOT": str(data_root), "AIAYN_CACHE_DIR": str(tmp_path)}
        with popen([sys.executable, str(REPO / "src" / f"{tool}.py"), *options], cwd=tmp_path, stdout=write_end,
                   stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=environment) as process:
            _, errors = process.communicate(timeout=300)
    finally:
        os.close(write_end)
    assert process.returncode == 128 + signal.SIGPIPE, errors[-3000:]
    assert "Traceback" not in errors and "BrokenPipeError" not in errors, errors[-3000:]
    if tool != "train":  # train's --cfg job writes its plan on stderr
        assert errors == ""


# -- in process: the wrapper itself -------------------------------------------------------------
def _raise(error: BaseException):
    def task(cfg):
        raise error
    return reports_errors(task)


def test_wrapper_reports_a_user_error_as_one_line(capsys, monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", ["/somewhere/aiayn-average", "ckpt=x"])
    with pytest.raises(SystemExit) as exit_:
        _raise(DataError("/x: no such directory\n(second line)"))(OmegaConf.create({}))
    assert exit_.value.code == 2
    assert capsys.readouterr().err == "aiayn-average: /x: no such directory (second line)\n"


def test_wrapper_passes_other_errors_and_results_through() -> None:
    with pytest.raises(KeyError):
        _raise(KeyError("a bug"))(OmegaConf.create({}))
    assert describe(ValueError("plain")) is None and describe(RuntimeError("plain")) is None
    assert reports_errors(lambda cfg: cfg.x + 1)(OmegaConf.create({"x": 1})) == 2


def test_what_the_wrapper_reports(tmp_path: Path) -> None:
    with pytest.raises(MissingMandatoryValue) as missing:
        _ = OmegaConf.create({"ckpt": "???"}).ckpt
    message, status = describe(missing.value)
    assert status == 2 and message.startswith("ckpt is missing: give ckpt=<value>")

    for path, kind in [(tmp_path / "absent.txt", FileNotFoundError), (tmp_path, IsADirectoryError)]:
        with pytest.raises(kind) as error:
            path.read_text()
        message, status = describe(error.value)
        assert status == 2 and message.startswith(f"{path}: ") and "\n" not in message

    assert describe(NonFiniteLossError("stopped after 8 non-finite steps in a row")) == (
        "stopped after 8 non-finite steps in a row", 1)
    message, status = describe(RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer"))
    assert status == 1 and message.startswith("a training process failed, so the job stopped")
    assert message.endswith("stopped: Connection closed by peer. Continue from the newest checkpoint with resume=auto")
    # what a rank saw of its peer's death (ddp's rank 0 killed, tests/training/test_ddp_faults.py), without gloo's
    # source location and closing advice
    message, _ = describe(RuntimeError(
        "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:652: Connection "
        "reset by peer. This is typically caused by a remote worker hanging or bugs in the application. Check the logs "
        "of the remote worker before reporting an error. GLHF! 🏖️"))
    assert message == ("a training process failed, so the job stopped: Read error [127.0.0.1]:652: Connection reset by "
                       "peer. Continue from the newest checkpoint with resume=auto")

    # A user error raised by a class that hydra.utils.instantiate builds (a data module) is still one.
    with pytest.raises(Exception) as wrapped:
        hydra.utils.instantiate({"_target_": f"{__name__}.RefusesToBeBuilt"})
    assert type(wrapped.value).__name__ == "InstantiationException"
    assert describe(wrapped.value) == ("/data/x.en: file not found; check the path or the data root", 2)


class RefusesToBeBuilt:
    def __init__(self) -> None:
        raise DataError("/data/x.en: file not found; check the path or the data root")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_without_a_gpu_names_the_setting_to_change() -> None:
    with pytest.raises((AssertionError, RuntimeError)) as error:
        torch.zeros(1, device="cuda")
    message, status = describe(error.value, OmegaConf.create({"device": "cuda"}))
    assert status == 2 and message.startswith("this machine has no usable CUDA GPU (") and message.endswith("device=cpu")
    assert describe(error.value, OmegaConf.create({"trainer": {}}))[0].endswith("use hardware=cpu")


def test_decoding_settings_are_checked_before_loading() -> None:
    wanted = asked({"max_len_offset": 0, "kv_cache": None})
    assert dict(wanted.values) == {"max_len_offset": 0}  # None: the checkpoint's own
    assert Decoding.of(None, wanted).settings() == {
        "beam_size": 4, "alpha": 0.6, "max_len_offset": 0, "min_len": 0, "kv_cache": True, "constrained": False, "stop": "paper",
        "nbest": 1, "sampling": False, "temperature": None, "top_k": None, "top_p": None, "seed": None}
    for settings, message in [({"beam_size": 0}, "decoding.beam_size must be a whole number of at least 1, got 0"),
                              ({"max_len_offset": -1}, "decoding.max_len_offset must be a whole number of at least 0"),
                              ({"alpha": -1}, "decoding.alpha (the length penalty's exponent) must be a finite number"),
                              ({"alpha": "high"}, "decoding.alpha: Value 'high' of type 'str' could not be converted"),
                              ({"kv_cache": "maybe"}, "decoding.kv_cache: Value 'maybe' is not a valid bool"),
                              ({"beam": 4}, "decoding.beam is not a decoding setting; the settings are alpha, ")]:
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            asked(settings)


def test_help_lists_a_groups_options() -> None:
    assert config_options("task").split(", ") == sorted(p.stem for p in (REPO / "conf" / "task").glob("*.yaml"))


def test_a_dead_rank_is_reported_before_lightnings_launcher_kills_the_job(capsys, monkeypatch) -> None:
    """Lightning's `ddp` launcher SIGKILLs the whole job (its own process too) once it sees a dead
    rank; the one line comes first. A real dead child, and a stand-in process for the launcher."""
    from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver

    from aiayn.cli.rank_errors import report_dead_ranks_before_lightning_kills

    monkeypatch.setattr(sys, "argv", ["src/train.py"])
    report_dead_ranks_before_lightning_kills()
    report_dead_ranks_before_lightning_kills()  # once is enough: the line is not said twice
    rank_1 = subprocess.Popen(["sleep", "60"])
    launcher = subprocess.Popen(["sleep", "60"])
    rank_1.kill()
    rank_1.wait()
    assert _ChildProcessObserver(main_pid=launcher.pid, child_processes=[rank_1])._run() is True
    assert launcher.wait(timeout=10) == -9  # Lightning's SIGKILL still ends the job
    # Lightning's own INFO line about the dead child may be there too (where logging was not set up
    # by an earlier test); the tool says its line once.
    assert [line for line in capsys.readouterr().err.splitlines() if not line.startswith("INFO: ")] == [
        ("train.py: a training process failed, so the job stopped (rank 1 was killed by signal 9). "
         "Continue from the newest checkpoint with resume=auto")]


def _raised_in_a_spawned_rank(error: Exception, cause: Exception | None = None) -> ProcessRaisedException:
    """What ``ddp_spawn``'s launching process gets for ``error`` raised in a rank (from ``cause``):
    the rank's traceback as text, under torch's own header (torch.multiprocessing.spawn)."""
    try:
        try:
            raise cause or OSError("what went before it")
        except OSError as before:
            raise error from before
    except Exception:  # noqa: BLE001  the rank's torch.multiprocessing._wrap catches any
        trace = traceback.format_exc()
    return ProcessRaisedException(f"\n\n-- Process 1 terminated with the following error:\n{trace}", 1, 4321)


def test_a_user_error_of_a_spawned_rank_is_made_again_as_itself() -> None:
    """Its class and whole message (over lines too); any other error of a rank, or an error not of
    a rank, is no user error. A run end to end: tests/training/test_ddp_faults.py."""
    again = user_error_of_a_rank(_raised_in_a_spawned_rank(DataError("test.en: line 3: bad\n  and more")))
    assert type(again) is DataError and str(again) == "test.en: line 3: bad\n  and more"
    assert describe(again) == ("test.en: line 3: bad\n  and more", USER_ERROR)
    assert type(user_error_of_a_rank(_raised_in_a_spawned_rank(ConfigError("optim.lr: no")))) is ConfigError
    assert user_error_of_a_rank(_raised_in_a_spawned_rank(RuntimeError("aiayn.errors.DataError: a bug's"))) is None
    assert user_error_of_a_rank(DataError("not of a rank")) is None


@pytest.mark.parametrize("error", [
    OSError(errno.ENOSPC, "No space left on device", "/runs/x/checkpoints/last.ckpt"),
    OSError(errno.EDQUOT, "Disk quota exceeded"),
    PermissionError(errno.EACCES, "Permission denied", "/data/it's.en"),
    FileNotFoundError(errno.ENOENT, "No such file or directory", "/data/a.en", None, "/data/b.en"),
    IsADirectoryError(errno.EISDIR, "Is a directory", "/data"),
    OSError(errno.EROFS, "Read-only file system", "/ro/out"),
    PermissionError("not permitted"),
])
def test_an_os_error_of_a_spawned_rank_reads_as_in_one_process(error: OSError) -> None:
    """A full disk, a path not there, not permitted, a read-only disk, raised in a ``ddp_spawn``
    rank: made again from the rank's text, it is the one line and exit status 2 of one process."""
    again = os_error_of_a_rank(_raised_in_a_spawned_rank(error))
    assert type(again) is type(error) and str(again) == str(error)
    assert describe(again, OmegaConf.create({"out": "o"})) == describe(error, OmegaConf.create({"out": "o"}))
    assert describe(again)[1] == USER_ERROR


def test_a_full_disk_behind_a_spawned_ranks_error_reads_as_in_one_process() -> None:
    """torch's writer raises a RuntimeError from the failed write: the full disk it was raised
    from is what one process says, and what the launching process says too."""
    full = OSError(errno.ENOSPC, "No space left on device", "/runs/x/last.ckpt")
    error = RuntimeError("[enforce fail at inline_container.cc:778] . unexpected pos 64 vs 0")
    again = os_error_of_a_rank(_raised_in_a_spawned_rank(error, full))  # (error.__cause__ is full now)
    assert describe(again) == describe(error) and describe(again)[1] == USER_ERROR


def test_other_errors_of_a_spawned_rank_are_no_os_error_said_in_one_line() -> None:
    """An OSError of another errno (a refused connection), one not raised in a rank, a path not
    there behind another error (one process says that with its traceback): None."""
    refused = OSError(errno.ECONNREFUSED, "Connection refused", "/tmp/socket")
    assert os_error_of_a_rank(_raised_in_a_spawned_rank(refused)) is None
    assert describe(refused) is None
    assert os_error_of_a_rank(_raised_in_a_spawned_rank(RuntimeError("OSError: [Errno 28] no"))) is None
    missing = FileNotFoundError(errno.ENOENT, "No such file or directory", "a")
    assert os_error_of_a_rank(missing) is None
    assert os_error_of_a_rank(_raised_in_a_spawned_rank(RuntimeError("a bug"), missing)) is None
    assert os_error_of_a_rank(_raised_in_a_spawned_rank(DataError("FileNotFoundError: [Errno 2] x: 'a'"))) is None
