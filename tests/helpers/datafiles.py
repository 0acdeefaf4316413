"""Small data files for tests: lines written plain or gzipped, a Multi30k folder made of the real
shared files with some of them left out or replaced, and a corpus of one's own (task=parallel_text)
made of the shared WMT14 files."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

from aiayn.data.readers import read_lines


def write_lines(path: Path, lines: list[str] | bytes) -> Path:
    """``lines`` (one per line, or raw bytes as they are) into ``path``, gzipped for a ``.gz`` name."""
    data = lines if isinstance(lines, bytes) else "".join(line + "\n" for line in lines).encode()
    with (gzip.open if path.suffix == ".gz" else open)(path, "wb") as f:
        f.write(data)
    return path


def multi30k_copy(root: Path, data_root: Path, train_en: list[str] | None = None, train_de: list[str] | None = None,
                  leave_out: tuple[str, ...] | set[str] = ()) -> Path:
    """``root`` whose ``multi30k/`` links every real Multi30k file of ``data_root`` but those named
    in ``leave_out``; with ``train_en`` and ``train_de``, the training files hold those lines instead."""
    folder = root / "multi30k"
    folder.mkdir(parents=True)
    replaced = {"train.en.gz", "train.de.gz"} if train_en is not None else set()
    for file in (data_root / "multi30k").glob("*.gz"):
        if file.name not in leave_out and file.name not in replaced:
            (folder / file.name).symlink_to(file)
    if replaced:
        write_lines(folder / "train.en.gz", train_en)
        write_lines(folder / "train.de.gz", train_de)
    return root


def own_corpus(folder: Path, data_root: Path, dev_lines: int = 40, test_lines: int = 30) -> Path:
    """``folder`` as a user's corpus: ``train.{en,de}.gz`` (the WMT14 slice, as it comes),
    ``valid.{en,de}`` (newstest2013) and ``test.{en,de}`` (newstest2014), plain."""
    wmt = data_root / "wmt14"
    folder.mkdir(parents=True)
    shutil.copyfile(wmt / "train_sample" / "src-train.txt.gz", folder / "train.en.gz")
    shutil.copyfile(wmt / "train_sample" / "tgt-train.txt.gz", folder / "train.de.gz")
    for lang in ("en", "de"):
        write_lines(folder / f"valid.{lang}", read_lines(wmt / f"newstest2013.{lang}")[:dev_lines])
        write_lines(folder / f"test.{lang}", read_lines(wmt / f"newstest2014-en-de.{lang}")[:test_lines])
    return folder
