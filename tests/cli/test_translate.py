"""src/translate.py: translations written as they finish, in input order (a run stopped midway
leaves the first lines' translations), the output's folder made, answers line by line from an
open pipe, and bad input refused in one line before anything is translated. On the session's
tiny trained run (real checkpoint, real sentencepiece, real Multi30k sentences). What a process
shows — a kill, a pipe, Ctrl-C, a reader that goes away — in real processes (marked ``cli``); the
rest in this process (tests.helpers.inprocess)."""

from __future__ import annotations

import gzip
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from aiayn.checkpoints.trained import TrainedModel, load_trained
from aiayn.cli.line_input import AvailableLines, chunked
from aiayn.cli.translate import LineWriter
from aiayn.data.readers import decode_lines, iter_lines
from aiayn.decoding.translator import Translator, translate
from aiayn.errors import DataError
from tests.helpers.datafiles import write_lines
from tests.helpers.inprocess import run_tool
from tests.helpers.runs import (
    IN_THE_FOREGROUND,
    REPO,
    TrainedRun,
    offline_environment,
    popen,
    run_command,
)
from tests.helpers.translating import ARGUMENTS, SENTENCES, SETTINGS


@pytest.fixture(scope="module")
def trained(tiny_run: TrainedRun, single_thread) -> TrainedModel:
    return load_trained(tiny_run.last)


def reference(trained: TrainedModel, lines: list[str]) -> str:
    """The output file translate.py must write for ``lines``."""
    return "".join(text + "\n" for text in translate(trained.model, trained.vocab, lines, SETTINGS).texts)


def start(tiny_run: TrainedRun, data_root: Path, *arguments: str, foreground: bool = False,
          **options) -> subprocess.Popen:
    """src/translate.py on the tiny run as its own process, in run_tool's environment;
    ``foreground``: SIGINT at its default, as from a terminal (tests.helpers.runs.IN_THE_FOREGROUND)."""
    environment = {**offline_environment(), "AIAYN_DATA_ROOT": str(data_root), "AIAYN_CACHE_DIR": str(tiny_run.cache_dir)}
    python = IN_THE_FOREGROUND if foreground else [sys.executable]
    return popen([*python, "src/translate.py", f"ckpt={tiny_run.last}", *ARGUMENTS, *arguments],
                 cwd=REPO, env=environment, **options)


def stop(process: subprocess.Popen) -> None:
    """Kill ``process`` if a failed test left it running."""
    if process.poll() is None:
        process.kill()
        process.wait()


def multi30k_test_sentences(data_root: Path) -> list[str]:
    with gzip.open(data_root / "multi30k" / "test_2016_flickr.en.gz", "rt", encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle]


def test_every_write_leaves_a_whole_prefix_and_a_bad_line_keeps_what_came_before(trained: TrainedModel,
                                                                                tmp_path: Path) -> None:
    """In process: the file read back after each write holds exactly the translations given so far;
    a line that is not UTF-8 (here the 5th) stops the run after the 4 before it are written."""
    source = tmp_path / "in.en"
    source.write_bytes("".join(line + "\n" for line in SENTENCES[:4]).encode() + b"caf\xe9\n" + b"A dog.\n")
    out_path = tmp_path / "out.de"
    translator = Translator(trained.model, trained.vocab, SETTINGS, batch_size=1)
    given: list[str] = []
    seen: list[str] = []

    def watched(stream):
        for group in stream:
            given.extend(group)
            yield group
            seen.append(out_path.read_text(encoding="utf-8"))  # the writer has written and flushed the group
            assert seen[-1] == "".join(text + "\n" for text in given)

    with open(out_path, "w", encoding="utf-8") as out, pytest.raises(DataError, match="line 5 is not valid UTF-8"):
        writer = LineWriter(out)
        for group in watched(translator.stream(chunked(iter_lines(source), 3))):  # as translate.py's main
            writer.write(group)

    assert out_path.read_text(encoding="utf-8") == reference(trained, SENTENCES[:4])
    assert len(seen) >= 2  # the first chunk's lines were on disk before the second chunk was read


def test_available_lines_tells_whether_the_next_line_is_here_without_waiting() -> None:
    read_end, write_end = os.pipe()
    try:
        lines = AvailableLines(read_end)
        os.write(write_end, b"one\ntw")
        assert next(lines) == b"one\n"
        assert not lines.ready()  # half a line, and the pipe is open
        os.write(write_end, "o\nthr\xe9e\n".encode())
        assert lines.ready() and next(lines) == b"two\n"
        os.write(write_end, b"four")
        os.close(write_end)
        write_end = -1
        assert list(decode_lines(lines, "<stdin>")) == ["thrée", "four"]  # the end of the input ends the line
        assert lines.ready()  # at the end: next() does not wait either
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)


def test_chunks_end_where_the_input_stops_arriving() -> None:
    arrived = iter([True, False, True, True, True])
    assert list(chunked(iter("abcdef"), 3, lambda: next(arrived))) == [["a", "b"], ["c", "d", "e"], ["f"]]
    assert list(chunked(iter("abcde"), 1)) == [["a"], ["b"], ["c"], ["d"], ["e"]]


def test_output_in_a_folder_that_is_not_there_is_written_there(tiny_run: TrainedRun, trained: TrainedModel,
                                                               data_root: Path, tmp_path: Path) -> None:
    source = write_lines(tmp_path / "in.en", SENTENCES)
    output = tmp_path / "new" / "deeper" / "out.de"
    result = run_tool("src/translate.py", f"ckpt={tiny_run.last}", f"input={source}", f"out={output}",
                      *ARGUMENTS, "batch_size=2", data_root=data_root, cache_dir=tiny_run.cache_dir)
    assert output.read_text(encoding="utf-8") == reference(trained, SENTENCES)
    assert result.stdout == ""
    assert result.stderr.strip().splitlines()[-1].startswith("translated 5 lines in ")


def test_input_dash_reads_stdin(tiny_run: TrainedRun, trained: TrainedModel, data_root: Path, tmp_path: Path) -> None:
    """``input=-`` is stdin, as Unix tools read ``-`` and as ``out=-`` is stdout (before: refused,
    ``input=-: no such file``, or a file named ``-`` in the working folder translated instead)."""
    (tmp_path / "-").write_text("Not this file.\n", encoding="utf-8")
    result = run_tool("src/translate.py", f"ckpt={tiny_run.last}", "input=-", "out=-", *ARGUMENTS,
                      stdin="".join(line + "\n" for line in SENTENCES), cwd=tmp_path, data_root=data_root,
                      cache_dir=tiny_run.cache_dir)
    assert result.stdout == reference(trained, SENTENCES)


@pytest.mark.cli
def test_a_run_killed_midway_leaves_the_first_lines_translations(tiny_run: TrainedRun, trained: TrainedModel,
                                                                 data_root: Path, tmp_path: Path) -> None:
    lines = multi30k_test_sentences(data_root)
    source = write_lines(tmp_path / "in.en", lines)
    output = tmp_path / "out.de"
    process = start(tiny_run, data_root, f"input={source}", f"out={output}", "batch_size=1", "buffer_size=4",
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300  # only so that a broken build cannot hang the test
        while not (output.is_file() and output.stat().st_size) and process.poll() is None:
            assert time.monotonic() < deadline, "no translation written"
            time.sleep(0.05)
        assert process.poll() is None, process.stderr.read().decode()[-3000:]
        process.send_signal(signal.SIGKILL)
        assert process.wait(timeout=60) == -signal.SIGKILL
    finally:
        stop(process)
        process.stderr.close()
    written = output.read_text(encoding="utf-8")
    done = written.count("\n")
    assert 1 <= done < len(lines) and written.endswith("\n")  # whole lines only
    assert written == reference(trained, lines[:done])


def read_lines_in_background(stream) -> queue.Queue:
    """The lines of ``stream`` as they come, to wait for with a timeout."""
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in iter(stream.readline, ""):
            lines.put(line)
        lines.put(None)  # the end

    threading.Thread(target=pump, daemon=True).start()
    return lines


@pytest.mark.cli
@pytest.mark.parametrize("interactive", ["auto", "true"])
@pytest.mark.slow
def test_an_open_pipe_is_answered_line_by_line(interactive: str, tiny_run: TrainedRun, trained: TrainedModel,
                                               data_root: Path, tmp_path: Path) -> None:
    with open(tmp_path / "stderr", "w+", encoding="utf-8") as stderr:
        process = start(tiny_run, data_root, f"interactive={interactive}", stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE, stderr=stderr, text=True, encoding="utf-8")
        try:
            answers = read_lines_in_background(process.stdout)
            for line in ("A man is riding a bike.", "Two dogs play in the snow."):
                process.stdin.write(line + "\n")
                process.stdin.flush()
                # Answered while stdin is still open (the timeout only keeps a broken build from hanging).
                assert answers.get(timeout=300) == reference(trained, [line])
            process.stdin.close()
            assert answers.get(timeout=60) is None
            assert process.wait(timeout=60) == 0
        finally:
            stop(process)
        stderr.seek(0)
        assert stderr.read().strip().splitlines()[-1].startswith("translated 2 lines in ")


@pytest.mark.cli  # the modules a tool imports: a process of its own
@pytest.mark.parametrize("tool", ["translate", "average"])
def test_the_tools_that_read_a_translation_checkpoint_do_not_import_lightning(tool: str, tiny_run: TrainedRun,
                                                                             data_root: Path, tmp_path: Path) -> None:
    """Lightning's import (torchmetrics, torch._dynamo and what they import) was 2 to 3 s of a few
    seconds' start: translate.py and average.py read checkpoints without it. Python's -X importtime
    lists every module the process imported."""
    out = tmp_path / "out"
    arguments = ([f"ckpt={tiny_run.last}", *ARGUMENTS, f"input={write_lines(tmp_path / 'in.en', SENTENCES)}",
                  f"out={out}"] if tool == "translate" else [f"ckpt={tiny_run.run_dir}", "average_last=2", f"out={out}"])
    result = run_command([sys.executable, "-X", "importtime", f"src/{tool}.py", *arguments],
                         data_root=data_root, cache_dir=tiny_run.cache_dir)
    imported = re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s+(\S+)$", result.stderr, re.MULTILINE)
    assert "torch" in imported and out.is_file()  # what importtime lists, and the tool did its work
    assert not [name for name in imported if name.split(".")[0] in ("lightning", "pytorch_lightning")]


def test_lines_before_one_that_is_not_utf8_are_written_first(tiny_run: TrainedRun, trained: TrainedModel,
                                                            data_root: Path, tmp_path: Path) -> None:
    output = tmp_path / "out.de"
    stdin = "".join(line + "\n" for line in SENTENCES[:3]).encode() + b"caf\xe9\nA dog.\n"
    result = run_tool("src/translate.py", f"ckpt={tiny_run.last}", f"out={output}", *ARGUMENTS, stdin=stdin,
                      data_root=data_root, cache_dir=tiny_run.cache_dir, check=False)
    assert result.returncode == 2
    assert result.stderr.decode().strip().splitlines() == [
        "translate.py: <stdin>: line 4 is not valid UTF-8 (byte 4 of the line); re-encode the file as UTF-8"]
    assert output.read_text(encoding="utf-8") == reference(trained, SENTENCES[:3])


@pytest.mark.cli
@pytest.mark.slow
def test_ctrl_c_ends_an_interactive_session_without_a_traceback(tiny_run: TrainedRun, trained: TrainedModel,
                                                                data_root: Path, tmp_path: Path) -> None:
    with open(tmp_path / "stderr", "w+", encoding="utf-8") as stderr:
        # As from a terminal, SIGINT at its default: a test run started in the background (nohup, `&`)
        # passes SIGINT on ignored, and then Python never turns it into KeyboardInterrupt.
        process = start(tiny_run, data_root, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True,
                        encoding="utf-8", foreground=True)
        try:
            answers = read_lines_in_background(process.stdout)
            process.stdin.write("A dog runs.\n")
            process.stdin.flush()
            assert answers.get(timeout=300) == reference(trained, ["A dog runs."])
            process.send_signal(signal.SIGINT)  # waiting for the next line
            assert process.wait(timeout=60) == 130
        finally:
            stop(process)
        stderr.seek(0)
        lines = stderr.read().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("translated 1 lines in "), lines


@pytest.mark.cli
@pytest.mark.slow
def test_a_reader_that_goes_away_stops_the_run_quietly(tiny_run: TrainedRun, data_root: Path, tmp_path: Path) -> None:
    """`translate.py input=... | head -1`: the reader has what it wanted; no traceback follows."""
    source = write_lines(tmp_path / "in.en", multi30k_test_sentences(data_root))
    process = start(tiny_run, data_root, f"input={source}", "batch_size=1", "buffer_size=4", stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert process.stdout.readline()  # the first translation, long before the last
        process.stdout.close()
        assert process.wait(timeout=300) == 128 + signal.SIGPIPE
        assert process.stderr.read() == b""
    finally:
        stop(process)
        process.stderr.close()
