"""Translate text with a checkpoint: `python src/translate.py ckpt=<file> [input=...] [out=...]`
(or an exported model: `engine=ctranslate2 model_dir=<folder>`).

One sentence a line in, one translation a line out, in the same order; an empty line gives an
empty line; a line longer than the model can read is truncated with a warning. With
``decoding.nbest=k`` (k > 1) each input gets its k best hypotheses (k samples with
``decoding.sampling=true``), one a line, best first, as ``<input index>\t<score>\t<log-prob>\t<text>``
(aiayn.decoding.translator.nbest_lines; the index counts input lines from 0; an empty line has its k
lines too, each ``""`` scored 0). ``ckpt=a.ckpt,b.ckpt`` translates with the ensemble of the
checkpoints (aiayn.model.Ensemble); ``average_last=k`` with the
average of the checkpoint and the k - 1 before it by step (§6.1), as evaluate.py and export.py.

A parser (task=wsj, §6.3) writes each line's tree over exactly its words, one line each, in the
bracketed form of evaluate.py's EVALB files (``(TOP (S (NP (XX The) (XX dog)) ...))``, each word
tagged ``XX``, brackets in words written ``-LRB-``/``-RRB-``), whatever characters the words hold;
an output that had to be repaired to be such a tree is named in a warning with its input line
(aiayn.data.parsing.raw_text). So does a parser's CTranslate2 export, whose search cannot keep to
the tree constraint (its warnings say so).

Input is read in chunks of at most ``buffer_size`` lines, each sorted by length and translated in
batches of ``batch_size``. Translations are written as they finish, in input order (after each
batch, the longest run from the start that is complete), straight into ``out`` (created, with
its folder, before anything is translated; stdout without it) and flushed after every write: a
run killed midway leaves a file that holds the translations of the first lines, each whole, and
a line that is not UTF-8 stops the run after every line before it is translated and written.

``interactive`` says how stdin is read (fairseq-interactive's way of answering as you type):
``true`` translates each line alone as soon as it is read; ``false`` fills whole chunks (the
fastest for a file piped in); ``auto`` (the default) is ``true`` for a terminal and, for a pipe,
translates together the lines that have arrived and answers them before waiting for more, so a
long file piped in is still batched while a line fed alone into an open pipe is answered at once.

``engine=ctranslate2 model_dir=<folder>`` translates with a CTranslate2 export of a checkpoint
(src/export.py format=ctranslate2) instead, through the same reading and writing, with the
decoding settings CTranslate2 serves (aiayn.decoding.declarations; others are refused in one
line): its beam search normalises by |Y|^α rather than GNMT's length penalty and stops as
``decoding.stop=first_k`` (its ``decoding.beam_size=1`` is greedy search, which aiayn's
``decoding.beam_size=1 decoding.alpha=0`` is too).
"""

from __future__ import annotations

import errno
import io
import logging
import os
import stat
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, NoReturn, TextIO

import hydra
from omegaconf import DictConfig, OmegaConf

from aiayn.checkpoints.given import averaged_count, checkpoint_list
from aiayn.cli.command_line import read_by_hydra
from aiayn.cli.errors import reader_gone, reports_composition_errors, reports_errors
from aiayn.cli.line_input import AvailableLines, chunked
from aiayn.cli.naming import CONFIG_DIR
from aiayn.cli.outputs import output_file
from aiayn.data.readers import decode_lines, iter_lines
from aiayn.decoding.settings import Asked, asked
from aiayn.decoding.switches import check_device, switches_of
from aiayn.errors import ConfigError, UserError
from aiayn.files import no_room

if TYPE_CHECKING:  # torch's, imported once the settings are checked: --help and a refusal start in a second
    from aiayn.decoding.translator import Translator

# What translates: aiayn's own beam search over a checkpoint, or a CTranslate2 export (src/export.py).
ENGINES = ("aiayn", "ctranslate2")


@read_by_hydra("translate")  # paths as one value, old names, Hydra's options anywhere (aiayn.cli.command_line)
@reports_composition_errors  # an override Hydra cannot apply: one line, exit 2
@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="translate")
@reports_errors  # one line on stderr, exit status 2, for what the user can fix
def main(cfg: DictConfig) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    wanted = asked(cfg.decoding)  # checked before anything is loaded
    switches = _check_settings(cfg)
    source = _input_file(cfg.input)
    output = _output_file(cfg.out, source)
    _check_streams(source, output)
    from aiayn.decoding.translator import nbest_lines  # torch: once every setting is checked

    translator = _translator(cfg, wanted, switches)
    chunks = _chunks(cfg, source)
    writer = None
    nbest = translator.nbest > 1
    try:
        with _opened(output, cfg.out) as out:
            writer = LineWriter(out, f"out={cfg.out}" if output is not None else "stdout")
            if nbest:  # k lines an input, each with its index and scores
                for ready in translator.stream_nbest(chunks):
                    writer.write(nbest_lines(ready, writer.inputs), inputs=len(ready))
            else:
                for ready in translator.stream(chunks):
                    writer.write(ready)
    except KeyboardInterrupt:  # Ctrl-C, the way out of an interactive session: what is written stays
        _summary(writer.inputs if writer else 0, translator)
        sys.exit(130)
    except BrokenPipeError:  # the reader of the output has gone (`| head -3`)
        reader_gone()
    _summary(writer.inputs, translator)


def _translator(cfg: DictConfig, wanted: Asked, switches: dict) -> Translator:
    """aiayn's own :class:`Translator` of ``ckpt`` (its decoding settings with those ``wanted``,
    its task's output constraint), or (``engine=ctranslate2``) the CTranslate2 translator of the
    exported folder ``model_dir``, which has the same ``stream``, ``stream_nbest`` and counters."""
    if cfg.engine == "ctranslate2":
        from aiayn.decoding.ctranslate2 import CTranslate2Translator

        return CTranslate2Translator(cfg.model_dir, wanted, batch_size=cfg.batch_size, device=cfg.device)
    from aiayn.pretrained import load  # torch: once every setting is checked

    # One checkpoint when k > 1 (_check_settings); DataError for too few, before anything is loaded.
    trained = load(cfg.ckpt, average_last=cfg.average_last, device=cfg.device)  # several: their ensemble
    return trained.translator(wanted, switches=switches, batch_size=cfg.batch_size)  # a parser's: trees


def _summary(lines: int, translator: Translator) -> None:
    print(f"translated {lines} lines in {translator.seconds:.1f} s ({translator.sentences_per_second:.1f} sentences/s)"
          + (f"; {translator.truncated} truncated" if translator.truncated else ""), file=sys.stderr)


class LineWriter:
    """Writes translations one a line, each group flushed at once (to the operating system: a kill
    of the process loses none of it), so that what is written is always a whole prefix of the
    output; ``lines`` counts the lines written, ``inputs`` the inputs they answer. ``out`` is a
    text stream (stdout) or a file opened unbuffered in binary (``out=``, see :func:`_opened`).

    A write that finds no room (a full disk, a quota, ``ulimit -f``) is a UserError that says how
    many lines were written; an ``out=`` file is first cut back to them, so that it ends in a whole
    line (stdout's last line may be cut: it cannot be cut back)."""

    def __init__(self, out: TextIO | BinaryIO, name: str = "stdout"):
        self.out, self.name, self.lines, self.inputs, self.bytes = out, name, 0, 0, 0

    def write(self, texts: list[str], inputs: int | None = None) -> None:
        """Write ``texts``, the answers of ``inputs`` inputs (None: one each)."""
        text = "".join(text + "\n" for text in texts)
        try:
            if not isinstance(self.out, io.RawIOBase):  # a text stream (stdout)
                self.out.write(text)
                self.out.flush()
            else:
                data = text.encode("utf-8")
                left = memoryview(data)
                while left:  # an unbuffered file may take part of it at a time
                    left = left[self.out.write(left):]
                self.bytes += len(data)
        except OSError as error:
            if no_room(error) is None:
                raise
            self._no_room(error)
        self.lines += len(texts)
        self.inputs += len(texts) if inputs is None else inputs

    def _no_room(self, error: OSError) -> NoReturn:
        fd, text = self.out.fileno(), not isinstance(self.out, io.RawIOBase)
        if text:  # what the stream still holds would fail again at exit: dropped
            os.dup2(os.open(os.devnull, os.O_WRONLY), fd)
        if text or not stat.S_ISREG(os.fstat(fd).st_mode):
            kept = f"after {self.lines} lines were written (the last may be cut)"
        else:
            os.ftruncate(fd, self.bytes)
            kept = f"after {self.lines} lines, which the file holds, each whole"
        fix = ("raise the file-size limit (ulimit -f)" if error.errno == errno.EFBIG else  # a limit, not a full disk
               "free space there")
        raise UserError(f"{self.name}: {error.strerror or error} {kept}; {fix}, or give out= a file on a disk with "
                        "room, and run again")


def _check_settings(cfg: DictConfig) -> dict:
    """The engine's settings checked (what the engine serves of the decoding settings, it says
    itself); the speed switches (aiayn.decoding.switches.switches_of) returned."""
    if cfg.batch_size < 1:
        raise ConfigError(f"batch_size must be a whole number of at least 1, got {cfg.batch_size!r}")
    if cfg.engine not in ENGINES:
        raise ConfigError(f"engine={cfg.engine} is not one of {', '.join(ENGINES)}")
    if cfg.engine == "ctranslate2":
        if not cfg.model_dir:
            raise ConfigError("engine=ctranslate2 needs model_dir=<folder>, a CTranslate2 export of src/export.py "
                              "format=ctranslate2")
        if not OmegaConf.is_missing(cfg, "ckpt"):
            raise ConfigError(f"ckpt={cfg.ckpt} is for engine=aiayn; with engine=ctranslate2 give the exported "
                              "folder as model_dir=<folder>")
        if cfg.int8 or cfg.compile or cfg.onednn or cfg.onnxruntime or cfg.precision != "fp32":
            raise ConfigError("precision, int8, compile, onednn and onnxruntime are aiayn's own switches; a CTranslate2 "
                              "model has its type from the export (src/export.py format=ctranslate2 quantization=int8)")
        if not Path(cfg.model_dir).is_dir():
            raise ConfigError(f"model_dir={cfg.model_dir}: no such folder; give a CTranslate2 export of src/export.py "
                              "format=ctranslate2")
    elif cfg.model_dir is not None:
        raise ConfigError(f"model_dir={cfg.model_dir} is for engine=ctranslate2; add engine=ctranslate2, or give a "
                          "checkpoint as ckpt=<file.ckpt>")
    members = len(checkpoint_list(cfg.ckpt)) if cfg.engine == "aiayn" else 1  # (an ensemble: refused averaged)
    if averaged_count(cfg.average_last, members) > 1 and cfg.engine != "aiayn":
        raise ConfigError(f"average_last={cfg.average_last} averages checkpoints, which engine={cfg.engine} cannot: "
                          "export an average instead (src/average.py, then src/export.py with average_last), or "
                          "give engine=aiayn the checkpoint")
    if cfg.interactive not in ("auto", True, False):
        raise ConfigError(f"interactive must be auto, true or false, got {cfg.interactive!r}")
    if cfg.buffer_size < 1:
        raise ConfigError(f"buffer_size must be a whole number of at least 1, got {cfg.buffer_size!r}")
    check_device(cfg.device)
    return switches_of(cfg)  # precision, int8, compile, onednn and onnxruntime


def _input_file(given: str | None) -> Path | None:
    """The input file (None: stdin, also for ``input=-`` as Unix tools read it, as ``out=-`` is
    stdout), refused when it is not there or is a folder. A pipe or a device is a file too
    (``input=<(zcat news.en.gz)``, ``input=/dev/stdin``): read once, as stdin is."""
    if not given or given == "-":
        return None
    path = Path(given)
    if path.is_dir():
        raise ConfigError(f"input={given} is a directory; give the file of sentences to translate")
    if not path.exists():
        link = f" (a link to {os.readlink(path)}, which is not there)" if path.is_symlink() else ""
        raise ConfigError(f"input={given}: no such file{link}; give the file of sentences to translate "
                          "(without input=, or with input=-, stdin is read)")
    mode = path.stat().st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):  # a socket, a disk
        raise ConfigError(f"input={given} is neither a file nor a pipe; give the file of sentences to translate")
    return path


def _check_streams(source: Path | None, output: Path | None) -> None:
    """Refuse, before the model loads, a closed stdin read (``<&-``) or a closed stdout written
    (``>&-``): there Python has no stream at all, and the run would end in a traceback, having
    translated for nothing."""
    if source is None and sys.stdin is None:
        raise ConfigError("stdin is closed, so there is nothing to translate; give the sentences on stdin, or as "
                          "input=<file>")
    if output is None and sys.stdout is None:
        raise ConfigError("stdout is closed, so the translations could not be written; give out=<file>, or leave "
                          "stdout open")


def _output_file(given: str | None, source: Path | None) -> Path | None:
    """The output file (None: stdout, also for ``out=-`` as Unix tools read it); refused, before
    any translating, when it is a folder, the input itself (a file given or the one stdin reads),
    a file of binary data (a checkpoint), or in a folder that cannot be made or written to."""
    if not given or given == "-":
        return None
    path = Path(given)
    if path.is_dir():
        raise ConfigError(f"out={given} is a directory; give the file to write the translations to, "
                          f"e.g. out={path / 'translations.txt'}")
    if source is not None and path.exists() and os.path.samefile(path, source):
        raise ConfigError(f"out={given} is the input file; give another file to write the translations to")
    if source is None and _stdin_is(path):  # `translate.py out=F < F`: emptied before its first line is read
        raise ConfigError(f"out={given} is the file stdin reads (< {given}); give another file to write the "
                          "translations to")
    if _binary(path):  # a checkpoint, say (the one translating, or last.ckpt's step): never written over
        raise ConfigError(f"out={given} holds binary data, not text (a checkpoint?), which the translations would "
                          "write over; give another file to write them to")
    return output_file(given)  # its folder can be made and written in (aiayn.cli.outputs)


def _stdin_is(path: Path) -> bool:
    """Whether stdin reads the file ``path`` (``< path``)."""
    try:
        return path.exists() and os.path.samestat(os.fstat(sys.stdin.fileno()), os.stat(path))
    except (AttributeError, OSError, ValueError):  # no stdin, or none with a descriptor
        return False


def _binary(path: Path) -> bool:
    """Whether ``path`` is a regular file whose first 8 KiB hold a NUL byte, as no text does (a
    device such as /dev/full reads as zeros and is no checkpoint)."""
    if not path.is_file():
        return False
    try:
        with open(path, "rb") as file:
            return b"\0" in file.read(8192)
    except OSError:  # no such file, or not readable: nothing there to lose by reading
        return False


@contextmanager
def _opened(path: Path | None, given: str | None) -> Iterator[TextIO | BinaryIO]:
    """``out`` opened for writing (emptied first; in binary, unbuffered: LineWriter knows what
    reached the file), or stdout; an error opening it is the user's."""
    if path is None:
        yield sys.stdout
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "wb", buffering=0)  # noqa: SIM115 - closed by the with below; LineWriter encodes
    except OSError as error:
        raise ConfigError(f"out={given}: cannot be written ({error.strerror or error}); "
                          "give a path in a folder you can write to") from None
    with handle:
        yield handle


def _chunks(cfg: DictConfig, source: Path | None) -> Iterator[list[str]]:
    """The input in the chunks ``interactive`` asks for (see the module docstring)."""
    if source is not None and source.is_file():
        lines, arrived = iter_lines(source), None
    elif source is not None:  # a pipe or a device: read once, as it arrives (iter_lines may read a file twice)
        stream = AvailableLines(os.open(source, os.O_RDONLY))
        lines, arrived = _closing(decode_lines(stream, source), stream.fd), stream.ready
    else:
        stdin = AvailableLines(sys.stdin.fileno())
        lines, arrived = decode_lines(stdin, "<stdin>"), stdin.ready
    mode = cfg.interactive
    if mode == "auto" and source is None and sys.stdin.isatty():
        mode = True
    if mode is True:
        return chunked(lines, 1)
    return chunked(lines, cfg.buffer_size, arrived if mode == "auto" else None)


def _closing(lines: Iterator[str], fd: int) -> Iterator[str]:
    """``lines``, the file descriptor they are read from closed once they end or are dropped."""
    try:
        yield from lines
    finally:
        os.close(fd)


if __name__ == "__main__":
    main()
