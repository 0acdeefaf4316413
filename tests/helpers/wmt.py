"""A miniature WMT14 EN-DE raw tree built from the real shared files (no network): the training
sample split over the three corpora as WMT ships them, the plain newstest2013 dev set and the
newstest2014 sgm test set, in the upstream archives' layout. Used by the WMT tests and by the GPU
test of the user's command."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

from aiayn.data.readers import read_lines

# the training sample's 10,000 lines, split over the three EN-DE corpora as WMT ships them
CORPORA = (("training/europarl-v7.de-en", 0, 5000, False), ("commoncrawl.de-en", 5000, 8000, True),
           ("training/news-commentary-v9.de-en", 8000, 10_000, False))


def build_raw_tree(data_root: Path, root: Path) -> Path:
    """A miniature WMT14 EN-DE raw tree in the layout of the upstream archives."""
    wmt = data_root / "wmt14"
    en = read_lines(wmt / "train_sample" / "src-train.txt.gz")
    de = read_lines(wmt / "train_sample" / "tgt-train.txt.gz")
    for stem, start, end, gz in CORPORA:
        for lang, lines in (("en", en), ("de", de)):
            path = root / f"{stem}.{lang}{'.gz' if gz else ''}"
            path.parent.mkdir(parents=True, exist_ok=True)
            data = "".join(f"{line}\n" for line in lines[start:end]).encode("utf-8")
            path.write_bytes(gzip.compress(data) if gz else data)
    (root / "dev").mkdir()
    for lang in ("en", "de"):
        shutil.copyfile(wmt / f"newstest2013.{lang}", root / "dev" / f"newstest2013.{lang}")
    (root / "test-full").mkdir()
    for name in ("newstest2014-deen-src.en.sgm", "newstest2014-deen-ref.de.sgm"):
        shutil.copyfile(wmt / "sgm" / name, root / "test-full" / name)
    return root
