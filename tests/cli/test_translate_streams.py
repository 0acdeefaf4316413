"""translate.py's input and output streams as a shell gives them: a pipe or a device named as the
input (``input=<(zcat f.gz)``, ``input=/dev/null``) is read like stdin; a closed stdin or stdout
is one line before the model loads; a disk that fills up as translations are written is one line
saying how many were written, an ``out=`` file cut back to whole lines. On the session's tiny
trained run; what needs a process (a closed descriptor, a file-size limit) in one."""

from __future__ import annotations

import gzip
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.helpers.inprocess import run_tool
from tests.helpers.runs import REPO, TrainedRun, limit_file_size, offline_environment
from tests.helpers.translating import ARGUMENTS, SENTENCES

LINES = "".join(sentence + "\n" for sentence in SENTENCES)


def _translate(tiny_run: TrainedRun, *arguments: str, **options) -> subprocess.CompletedProcess:
    return run_tool("src/translate.py", f"ckpt={tiny_run.last}", *ARGUMENTS, *arguments,
                    cache_dir=tiny_run.cache_dir, **options)


def _process(tiny_run: TrainedRun, *arguments: str, **options) -> subprocess.CompletedProcess:
    """translate.py in a process of its own, started as ``options`` say (``preexec_fn``, ``stdout``)."""
    environment = {**offline_environment(), "AIAYN_CACHE_DIR": str(tiny_run.cache_dir)}
    command = [sys.executable, "src/translate.py", f"ckpt={tiny_run.last}", *ARGUMENTS, *arguments]
    return subprocess.run(command, cwd=REPO, env=environment, stderr=subprocess.PIPE, text=True, timeout=300,
                          check=False, **options)


def test_a_pipe_named_as_the_input_is_read_once_as_stdin_is(tiny_run: TrainedRun, tmp_path: Path) -> None:
    """Before: ``input=/dev/fd/63: no such file`` for a pipe or a device (only regular
    files were taken); a file read twice (iter_lines reads again to name a line it refuses) would
    find a pipe empty the second time."""
    expected = _translate(tiny_run, stdin=LINES).stdout
    assert len(expected.splitlines()) == len(SENTENCES)
    fifo = tmp_path / "sentences"
    os.mkfifo(fifo)
    with_mark = "\ufeff" + LINES.replace("\n", "\r\n")  # a BOM and CRLF: what iter_lines reads twice for

    def feed() -> None:
        with open(fifo, "w", encoding="utf-8", newline="") as pipe:
            pipe.write(with_mark)

    writer = threading.Thread(target=feed, daemon=True)
    writer.start()
    assert _translate(tiny_run, f"input={fifo}").stdout == expected
    writer.join(timeout=60)
    writer = threading.Thread(target=fifo.write_bytes, args=(gzip.compress(LINES.encode()),), daemon=True)
    writer.start()  # gzip through a pipe (input=<(cat f.gz)): it cannot be renamed f.gz, so zcat is the remedy
    compressed = _translate(tiny_run, f"input={fifo}", check=False)
    writer.join(timeout=60)
    assert compressed.returncode == 2 and compressed.stderr.strip().splitlines()[-1] == (
        f"translate.py: {fifo}: gzip-compressed data, but not read as gzip (a name ending in .gz); decompress it "
        "first (zcat)"), compressed.stderr[-2000:]
    assert _translate(tiny_run, f"input={os.devnull}").stdout == ""  # a device: no lines, none written
    with socket.socket(socket.AF_UNIX) as listening:  # what is neither: one line (not ENXIO's traceback)
        listening.bind(str(tmp_path / "socket"))
        refused = _translate(tiny_run, f"input={tmp_path / 'socket'}", check=False)
    assert refused.returncode == 2 and refused.stderr.strip().splitlines()[-1] == (
        f"translate.py: input={tmp_path / 'socket'} is neither a file nor a pipe; give the file of sentences to "
        "translate"), refused.stderr[-2000:]


@pytest.mark.cli
@pytest.mark.parametrize("closed", [0, 1])
def test_a_closed_stdin_or_stdout_is_one_line_before_the_model_loads(tiny_run: TrainedRun, closed: int) -> None:
    """``translate.py ckpt=… <&-`` and ``… >&-``. Before: an AttributeError traceback, exit 1,
    the closed stdout's after every sentence was translated."""
    result = _process(tiny_run, preexec_fn=lambda: os.close(closed), stdin=subprocess.DEVNULL,
                      stdout=subprocess.DEVNULL if closed == 0 else None)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    expected = {0: "translate.py: stdin is closed, so there is nothing to translate; give the sentences on stdin, or "
                   "as input=<file>",
                1: "translate.py: stdout is closed, so the translations could not be written; give out=<file>, or "
                   "leave stdout open"}[closed]
    assert result.stderr.strip() == expected


@pytest.mark.cli
def test_a_file_that_fills_its_disk_is_cut_back_to_the_whole_lines_it_holds(tiny_run: TrainedRun,
                                                                             tmp_path: Path) -> None:
    """A 1 KiB file-size limit (``ulimit -f``) on ``out=``, a line per group (``buffer_size=1``).
    Before: "[Errno 27] File too large while writing; nothing of that file was kept", naming no
    file, and the file kept a cut last line."""
    source = tmp_path / "many.en"
    source.write_text(LINES * 60, encoding="utf-8")
    whole = _translate(tiny_run, f"input={source}").stdout.splitlines(keepends=True)
    out = tmp_path / "out.de"
    result = _process(tiny_run, f"input={source}", f"out={out}", "buffer_size=1", preexec_fn=limit_file_size(1024),
                      stdout=subprocess.DEVNULL)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    written = out.read_text(encoding="utf-8").splitlines(keepends=True)
    assert 0 < len(written) < len(whole) and written == whole[:len(written)]  # whole lines, the first ones
    assert result.stderr.strip().splitlines()[-1] == (
        f"translate.py: out={out}: File too large after {len(written)} lines, which the file holds, each whole; "
        "raise the file-size limit (ulimit -f), or give out= a file on a disk with room, and run again")


@pytest.mark.cli
@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full, a device that is always full, here")
def test_a_full_device_or_stdout_says_how_many_lines_were_written(tiny_run: TrainedRun) -> None:
    """Before: "[Errno 28] No space left on device while writing; nothing of that file was kept",
    naming neither the setting nor stdout."""
    with open("/dev/full", "w") as full:
        for arguments, stdout, name in ((["out=/dev/full"], subprocess.DEVNULL, "out=/dev/full"), ([], full, "stdout")):
            result = _process(tiny_run, *arguments, input=LINES, stdout=stdout)
            assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
            assert result.stderr.strip().splitlines()[-1] == (
                f"translate.py: {name}: No space left on device after 0 lines were written (the last may be cut); "
                "free space there, or give out= a file on a disk with room, and run again")
