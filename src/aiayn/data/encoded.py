"""A training split read as text, encoded once: its subword ids kept in the cache and mapped by
later runs, as ``fairseq-preprocess`` binarises a corpus once.

Multi30k's and the parsing tasks' training splits are read as text at every run (WMT and
``task=parallel_text`` are prepared once, :mod:`aiayn.data.wmt`, :mod:`aiayn.data.prepared_text`).
Encoding them is the same work at every run, on every DDP rank. The first run that reads a split
with a subword model stores the ids as a binarised corpus (:mod:`aiayn.data.storage`) in
``<cache_dir>/encoded/<key>/``, the key hashing the model and both sides' lines; later runs, and
the ranks that waited for the first, map it. Each file's size and SHA-256 are recorded beside it,
in the ``meta.json`` a prepared folder has (:mod:`aiayn.data.manifest`), and checked at every
reuse: a damaged entry is encoded again, with a warning. A cache folder that
cannot be written (read-only, full) costs the speed, not the run: a warning, and the pairs encoded
in memory as before.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from aiayn.data.cache import exclusive, remove_leftovers
from aiayn.data.manifest import META, damage, folder_files, read_meta
from aiayn.data.storage import MappedCorpus, corpus_files, write_corpus
from aiayn.data.subwords import Subwords
from aiayn.files import write_json

log = logging.getLogger(__name__)

FORMAT = 2  # in the key: a change of the stored layout makes new entries
NAME = "train"


def encoded_training_pairs(src: Sequence[str], tgt: Sequence[str], vocab: Subwords,
                           cache_dir: str | os.PathLike) -> MappedCorpus | None:
    """The pairs ``src``/``tgt`` encoded with ``vocab``, stored once in ``cache_dir`` and mapped;
    None (said in a warning) where the cache folder cannot hold them: the caller encodes them in
    memory."""
    folder = Path(cache_dir) / "encoded"
    key = entry_key(src, tgt, vocab)
    entry = folder / key
    try:
        remove_leftovers(folder)  # what jobs killed while encoding left (no job is encoding that entry now)
        if _damage(entry) is None:
            return MappedCorpus(entry, NAME)
        with exclusive(folder, key, f"encoding the training pairs into {entry}"):
            damage = _damage(entry)
            if damage is not None:
                if damage != "absent":
                    log.warning("%s; encoding the training pairs again", damage)
                    shutil.rmtree(entry)
                _store(src, tgt, vocab, folder, key)
    except OSError as error:
        log.warning("%s: cannot keep the encoded training pairs there (%s); they are encoded in memory for this run "
                    "(a cache folder that can be written saves this at the next run)", folder, error.strerror or error)
        return None
    return MappedCorpus(entry, NAME)


def entry_key(src: Sequence[str], tgt: Sequence[str], vocab: Subwords) -> str:
    """The entry of these lines encoded with this model (its bytes, not its file's name)."""
    digest_ = hashlib.sha256(f"encoded-{FORMAT}\n".encode())
    digest_.update(hashlib.sha256(vocab.serialized()).digest())
    for side in (src, tgt):
        lines = hashlib.sha256()
        for line in side:
            lines.update(line.encode("utf-8", "surrogatepass") + b"\n")
        digest_.update(len(side).to_bytes(8, "little") + lines.digest())
    return f"{len(src)}-{digest_.hexdigest()[:24]}"


def _store(src: Sequence[str], tgt: Sequence[str], vocab: Subwords, folder: Path, key: str) -> None:
    """Encode the pairs into a hidden folder beside the entry, record its files, and rename it
    into place: a job killed on the way leaves ``.<key>.*``, which the next job removes."""
    log.info("encoding %d training pairs once into %s", len(src), folder / key)
    scratch = Path(tempfile.mkdtemp(dir=folder, prefix=f".{key}."))
    try:
        write_corpus(scratch, NAME, vocab.encode(src), vocab.encode(tgt), vocab.vocab_size)
        write_json(scratch / META, {"files": folder_files(scratch)})  # the record: written last
        os.rename(scratch, folder / key)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise


def _damage(entry: Path) -> str | None:
    """None when ``entry`` holds every file of the corpus, each of the size and SHA-256 its record
    says (:func:`aiayn.data.manifest.damage`); else why not, in a sentence (``"absent"``: no entry there)."""
    if not entry.is_dir():
        return "absent"
    meta = read_meta(entry)
    if not meta or not isinstance(meta.get("files"), dict):
        return f"the encoded training pairs in {entry} have no readable record of their files"
    if set(meta["files"]) != {path.name for pair in corpus_files(entry, NAME).values() for path in pair}:
        return f"the record of the encoded training pairs in {entry} names other files"
    return damage(entry, meta, hashes=True)
