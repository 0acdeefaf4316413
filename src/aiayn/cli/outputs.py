"""Where a tool writes what it makes (``out=``), checked before it does any of the work: a folder
that cannot be made there (a file in the way, no permission) or written in (no permission, a
read-only disk, a pseudo file system such as /proc) is one line naming the setting and what to
do, not an error of the operating system's about a file the user never named, after minutes of
decoding (translate.py, evaluate.py, average.py, visualize.py; export.py's folder is checked as it
is made, aiayn.export.folder).

Whether a folder can be written in is tried, not guessed from its permission bits: root may write
in any folder but one on a read-only disk, which only a write shows.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from aiayn.errors import ConfigError

FIX = "give a path in a folder you can write to"


def output_file(given: str, setting: str = "out") -> Path:
    """The file ``given`` (``setting``'s value) is to be written as; a ConfigError where it cannot
    be (see the module), or where it is a file that cannot be written."""
    path = Path(given)
    writable_folder(path.parent, given, setting)
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(f"{setting}={given}: not writable (the file's permissions); {FIX}")
    return path


def output_folder(given: str | os.PathLike, setting: str = "out", fix: str = FIX) -> Path:
    """The folder ``given`` (``setting``'s value) is to be written in; a ConfigError where it
    cannot be made or written in (see the module), ending in ``fix``."""
    folder = Path(given)
    writable_folder(folder, str(given), setting, fix)
    return folder


def writable_folder(folder: Path, given: str, setting: str, fix: str = FIX) -> None:
    """ConfigError naming ``setting``=``given`` and what to do (``fix``) unless ``folder`` is, or
    can be made, a folder this process can write in: the nearest of it and those above it that
    is there must be a folder, where a file is written once and removed. Nothing is made: the
    tool makes the folder as it writes."""
    existing = next(above for above in (folder, *folder.parents) if os.path.lexists(above))
    if not existing.is_dir():
        raise ConfigError(f"{setting}={given}: cannot create its folder {folder} ({existing} is a file); {fix}")
    try:
        descriptor, probe = tempfile.mkstemp(prefix=".write-test.", dir=existing)
    except OSError as error:
        raise ConfigError(f"{setting}={given}: not writable ({existing}: {error.strerror or error}); {fix}") from None
    os.close(descriptor)
    os.unlink(probe)
