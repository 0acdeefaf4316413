"""The folder an export is written to: made beside its destination and renamed into place, so that
an export that stops midway leaves no half-written folder; exporting again replaces an earlier
export there, and nothing else.

An export records what it wrote in :data:`RECORD` (its format and its files). A folder is an
earlier export, to be replaced, when that record is there and the folder holds the files it lists
and no other: a file added since (notes, another model's weights), a Hugging Face model folder
written by another tool, a project that happens to hold a ``config.json`` — none is ever removed;
the export is refused in one line naming what the folder holds. So is the working folder, or one
above it, which renaming into place would remove from under the shell that runs the command.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from aiayn.errors import ConfigError

RECORD = ".aiayn-export.json"  # what an export wrote: {"format": ..., "files": [...]}


@contextmanager
def replacing_folder(out: Path, format: str) -> Iterator[Path]:
    """Yield a fresh folder beside ``out`` to write the export of ``format`` in; when the block ends
    without an error it becomes ``out`` (replacing an earlier export there: see the module's
    docstring), otherwise it is removed. ConfigError, before anything is written, for an ``out``
    that is a file, the working folder (or above it), or a folder holding anything but an earlier
    export."""
    out = Path(os.path.abspath(out))
    _check_destination(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    except OSError as error:
        raise ConfigError(f"out={out}: cannot write there ({error.strerror or error}); "
                          "give a folder you can write to") from None
    try:
        yield scratch
        written = sorted(str(path.relative_to(scratch)) for path in scratch.rglob("*") if not path.is_dir())
        (scratch / RECORD).write_text(json.dumps({"format": format, "files": written}, indent=2) + "\n",
                                      encoding="utf-8")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(scratch, 0o777 & ~umask)  # a folder as any other the user makes (mkdtemp's is private)
        for path in scratch.rglob("*"):  # and files: transformers writes model.safetensors private (0600),
            if path.is_file():  # which a server running as another user could not read
                os.chmod(path, 0o666 & ~umask)
        if out.is_dir():
            _check_destination(out)  # unchanged while the export was written
            shutil.rmtree(out)
        os.replace(scratch, out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _check_destination(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out={out} is a file; give a folder to export into")
    here = Path.cwd().resolve()
    if out.is_dir() and (out.resolve() == here or out.resolve() in here.parents):
        raise ConfigError(f"out={out} is the working folder{'' if out.resolve() == here else ' or above it'}, which "
                          "an export would replace; give a folder of its own (out=exported/hf, say)")
    if not out.is_dir() or not any(out.iterdir()):
        return
    foreign = _not_exported(out)
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise ConfigError(f"out={out} is a folder holding files an export of aiayn did not write ({shown}); "
                          "give a new or empty folder to export into, or remove them")


def _not_exported(out: Path) -> list[str]:
    """What ``out`` holds besides the files its export record lists (all of it without a record)."""
    held = sorted(str(path.relative_to(out)) for path in out.rglob("*") if not path.is_dir())
    try:
        listed = set(json.loads((out / RECORD).read_text(encoding="utf-8"))["files"]) | {RECORD}
    except (OSError, ValueError, KeyError, TypeError):
        return held
    return [name for name in held if name not in listed]
