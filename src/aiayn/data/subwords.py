"""A joint sentencepiece subword vocabulary, trained once per (settings, input lines) and cached,
or given (``task.subword_model``: :func:`given_subwords`)."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import sentencepiece as spm

from aiayn.data.cache import check_folder, digest, exclusive, no_room_error, remove_leftovers
from aiayn.errors import ConfigError, DataError
from aiayn.files import atomic_write, atomic_write_text, no_room

log = logging.getLogger(__name__)

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
_CACHE_FORMAT = 1  # bump when the training options below change meaning


class Subwords:
    """A trained sentencepiece model with ids pad=0, unk=1, bos=2, eos=3."""

    def __init__(self, path: str | os.PathLike | None = None, *, proto: bytes | None = None):
        """Load the model file at ``path``, or the serialized model ``proto`` (as stored in a
        checkpoint, see :meth:`serialized`)."""
        self.path = Path(path) if path is not None else None
        where = self.path if self.path is not None else "serialized sentencepiece model"
        try:
            if proto is not None:
                self._sp = spm.SentencePieceProcessor(model_proto=proto)
            else:
                self._sp = spm.SentencePieceProcessor(model_file=str(self.path))
        except (OSError, RuntimeError, TypeError) as error:
            raise DataError(f"{where}: not a loadable sentencepiece model ({error}); delete it to retrain") from None
        self.path = self.path if self.path is not None else Path("<serialized>")
        found = (self._sp.pad_id(), self._sp.unk_id(), self._sp.bos_id(), self._sp.eos_id())
        if found != (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            raise DataError(f"{self.path}: special ids (pad, unk, bos, eos) are {found}, expected (0, 1, 2, 3); retrain it")

    vocab_size = property(lambda self: self._sp.get_piece_size(), doc="Number of ids, specials included.")
    pad_id = property(lambda self: PAD_ID)
    unk_id = property(lambda self: UNK_ID)
    bos_id = property(lambda self: BOS_ID)
    eos_id = property(lambda self: EOS_ID)

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """The ids of each text, without BOS/EOS."""
        if isinstance(texts, str):
            raise TypeError("encode takes a list of strings; wrap a single string in a list")
        return self._sp.encode(list(texts), out_type=int)

    def decode(self, ids: Sequence[Sequence[int]]) -> list[str]:
        """The text of each id sequence, cut at its first EOS, with pad/BOS/EOS removed."""
        cleaned = []
        for seq in ids:
            seq = [int(i) for i in seq]
            if EOS_ID in seq:
                seq = seq[: seq.index(EOS_ID)]
            cleaned.append([i for i in seq if i not in (PAD_ID, BOS_ID)])
        return self._sp.decode(cleaned)

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """The subword piece of each id (for labels, e.g. attention pictures)."""
        return [self._sp.id_to_piece(int(i)) for i in ids]

    def piece_ids(self) -> dict[str, int]:
        """Every piece and its id."""
        return {piece: i for i, piece in enumerate(self.pieces(range(self.vocab_size)))}

    def serialized(self) -> bytes:
        """The model as bytes: a checkpoint keeps it so that it is usable on its own."""
        return self._sp.serialized_model_proto()

    def __repr__(self) -> str:
        return f"Subwords({str(self.path)!r}, vocab_size={self.vocab_size})"


def given_subwords(path: str | os.PathLike, vocab_size: int) -> Subwords:
    """The sentencepiece model ``task.subword_model`` names, which the task's data are encoded with
    instead of one learnt from its training split (a model of another corpus, or of a checkpoint a
    run starts from): a ConfigError naming the setting where it is no file, no sentencepiece model
    with aiayn's special ids (pad 0, unk 1, bos 2, eos 3), or of another size than ``vocab_size``."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"task.subword_model={path}: no such file; give a sentencepiece model file (.model), or null "
                          "to learn one from the training split")
    try:
        vocab = Subwords(path)
    except DataError as error:
        why = str(error).removeprefix(f"{path}: ").split("; ")[0]
        raise ConfigError(f"task.subword_model={path}: {why}; give a sentencepiece model with pad 0, unk 1, bos 2 and "
                          "eos 3, as aiayn trains them") from None
    if vocab.vocab_size != vocab_size:
        raise ConfigError(f"task.subword_model={path} has {vocab.vocab_size:,} subwords and task.vocab_size is "
                          f"{vocab_size:,}; give task.vocab_size={vocab.vocab_size}")
    return vocab


def given_key(subword_model: Path | None) -> dict[str, str]:
    """What a prepared folder's key and record hold of a given subword model: its SHA-256 (the same
    bytes wherever the file lies); nothing for one learnt from the data, so that such keys stay."""
    return {"subword_model": digest(subword_model)} if subword_model is not None else {}


def learnt_or_given(lines: Sequence[str], vocab_size: int, cache_dir: str | os.PathLike, subword_model: Path | None,
                    **options: Any) -> Subwords:
    """The given ``subword_model``, else one learnt from ``lines`` (:func:`train_or_load` with
    ``options``): what a preparation encodes the training pairs with."""
    if subword_model is not None:
        log.info("encoding with the given sentencepiece model %s (task.subword_model)", subword_model)
        return Subwords(subword_model)
    return train_or_load(lines, vocab_size, cache_dir, **options)


def train_or_load(
    texts: Iterable[str],
    vocab_size: int,
    cache_dir: str | os.PathLike,
    model_type: str = "bpe",
    character_coverage: float = 1.0,
    input_sentence_size: int = 1_000_000,
    seed: int = 0,
    user_defined_symbols: Sequence[str] = (),
) -> Subwords:
    """A joint model of exactly ``vocab_size`` ids trained on ``texts`` (source and target lines
    together), cached as ``<cache_dir>/sentencepiece/<key>.model`` where the key hashes the
    settings and the lines; a cached model with the same key is reused instead of retrained.
    ``user_defined_symbols`` are pieces always kept whole (e.g. a parse tree's bracket tokens;
    a leading ``▁`` makes "space + symbol" a single piece)."""
    lines = texts if isinstance(texts, Sequence) and not isinstance(texts, str) else list(texts)
    if not lines:
        raise DataError("no lines to train the sentencepiece model on")
    settings = {
        "format": _CACHE_FORMAT,
        "vocab_size": int(vocab_size),
        "model_type": model_type,
        "character_coverage": float(character_coverage),
        "input_sentence_size": int(input_sentence_size),
        "seed": int(seed),
    }
    if user_defined_symbols:  # only when given, so that the keys of plain models stay as they were
        settings["user_defined_symbols"] = list(user_defined_symbols)
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    digest.update(_content_hash(lines))
    key = f"{model_type}{vocab_size}-{digest.hexdigest()[:20]}"
    folder = Path(cache_dir) / "sentencepiece"
    check_folder(folder.parent, "paths.cache_dir", "AIAYN_CACHE_DIR")
    model = folder / f"{key}.model"
    remove_leftovers(folder)  # what jobs killed while training a model left (no job is training it now)
    if _whole(model) is None:
        log.info("reusing sentencepiece model %s", model)
        return Subwords(model)
    # Jobs started together (a sweep's parallel rows, DDP ranks) build the same entry once: the
    # others wait for it and reuse it. Multi-threaded training is not bit-for-bit repeatable, so
    # two builds could differ, and a checkpoint must keep naming the model its run trained with.
    # The lock file goes with the lock: later jobs find the model and never lock.
    with exclusive(folder, key, f"training the sentencepiece model {model}"):
        damage = _whole(model)
        if damage is None:
            log.info("reusing sentencepiece model %s (built by another job meanwhile)", model)
        else:
            if damage != "absent":
                log.warning("%s; training it again", damage)
            remove_leftovers(folder, key, holding=True)
            try:
                _train(lines, folder, key, vocab_size, model_type, character_coverage, input_sentence_size, seed,
                       user_defined_symbols)
            except OSError as error:
                if (full := no_room(error)) is not None:
                    raise no_room_error(full, folder, f"the sentencepiece model {model.name}") from None
                raise
    return Subwords(model)


def _whole(model: Path) -> str | None:
    """None when the cached ``model`` is whole: its size and SHA-256 are those recorded beside it
    (``<key>.sha256``) when it was written; an entry of an older version without that record is
    whole when it loads. Else why not, in a sentence (``"absent"``: no model there)."""
    if not model.is_file():
        return "absent"
    record = model.with_suffix(".sha256")
    try:
        size, sha = record.read_text(encoding="utf-8").split()
    except FileNotFoundError:
        try:
            Subwords(model)
        except DataError as error:
            return str(error).split("; ")[0]
        atomic_write_text(record, f"{model.stat().st_size} {digest(model)}\n")  # checked from now on
        return None
    except ValueError:
        return f"{record} is unreadable"
    if model.stat().st_size != int(size):
        return f"sentencepiece model {model} is damaged ({model.stat().st_size} bytes, {size} when it was written)"
    if digest(model) != sha:
        return f"sentencepiece model {model} is damaged (its bytes changed since it was written)"
    return None


def _train(lines: Sequence[str], folder: Path, key: str, vocab_size: int, model_type: str,
           character_coverage: float, input_sentence_size: int, seed: int,
           user_defined_symbols: Sequence[str]) -> None:
    """Train ``<folder>/<key>.model`` (and ``.vocab``) from ``lines``; written atomically."""
    model = folder / f"{key}.model"
    log.info("training a %s sentencepiece model of %d ids on %d lines into %s", model_type, vocab_size, len(lines), model)
    spm.set_random_generator_seed(int(seed))
    try:
        with tempfile.TemporaryDirectory(dir=folder, prefix=f".{key}.") as scratch:  # removed whatever happens
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(lines),
                model_prefix=f"{scratch}/{key}",
                vocab_size=int(vocab_size),
                model_type=model_type,
                character_coverage=float(character_coverage),
                # No byte_fallback (sentencepiece's default): a character the training text lacks is <unk>, as
                # in the paper's wordpiece vocabularies, and a vocabulary holds no 256 byte pieces. (tensor2tensor's
                # own subword encoder escaped such characters instead; the paper is silent.) The tools warn where a
                # corpus leaves many subwords unknown (docs/training.md).
                input_sentence_size=int(input_sentence_size),
                shuffle_input_sentence="true",
                hard_vocab_limit="true",
                pad_id=PAD_ID,
                unk_id=UNK_ID,
                bos_id=BOS_ID,
                eos_id=EOS_ID,
                num_threads=os.cpu_count() or 1,
                minloglevel=2,
                **({"user_defined_symbols": list(user_defined_symbols)} if user_defined_symbols else {}),
            )
            for suffix in (".vocab", ".model"):  # the .model last: it marks a complete entry
                data = Path(f"{scratch}/{key}{suffix}").read_bytes()
                atomic_write(folder / f"{key}{suffix}", lambda file, data=data: file.write(data))
            model_file = folder / f"{key}.model"  # its size and hash, checked at every reuse
            atomic_write_text(folder / f"{key}.sha256", f"{model_file.stat().st_size} {digest(model_file)}\n")
    except RuntimeError as error:
        if "No space left on device" in str(error) or "Disk quota exceeded" in str(error):
            raise no_room_error(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), folder,
                                f"the sentencepiece model {key}.model") from None
        too_high = re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)", str(error))
        if too_high:
            raise DataError(
                f"the training text has too few distinct pieces for a vocabulary of {too_high[1]} subwords "
                f"(at most {too_high[2]} here); lower task.vocab_size or train on more text"
            ) from None
        # Every character of the text is a piece of its own (character_coverage 1.0): a text of many
        # characters (Chinese, Japanese) needs a vocabulary larger than them.
        too_low = re.search(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)", str(error))
        if too_low:
            raise DataError(
                f"a vocabulary of {too_low[1]} subwords cannot hold the training text's distinct characters, each a "
                f"subword of its own ({int(too_low[2]):,} with the special ids); raise task.vocab_size to at least "
                f"{int(too_low[2]):,}"
            ) from None
        if "!sentences_.empty()" in str(error):  # sentencepiece passes over lines of more than 4,192 bytes
            longest = max((len(line.encode("utf-8", "surrogatepass")) for line in lines), default=0)
            raise DataError(
                f"none of the {len(lines):,} training lines is one sentencepiece learns from: each is empty or over "
                f"its 4,192 bytes (the longest has {longest:,}); a file whose lines end in a carriage return alone "
                "(old Mac files) reads as one line: end its lines in \\n (tr '\\r' '\\n')"
            ) from None
        raise DataError(f"sentencepiece training for {model} failed: {error}") from None


def _content_hash(lines: Iterable[str]) -> bytes:
    digest = hashlib.sha256()
    for line in lines:
        digest.update(line.encode("utf-8", "surrogatepass"))
        digest.update(b"\n")
    return digest.digest()
