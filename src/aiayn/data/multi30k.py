"""Multi30k task 1: locating (and, when allowed, downloading) its files, and its
:class:`Multi30kDataModule`."""

from __future__ import annotations

import logging
import os
import zlib
from pathlib import Path

from aiayn.data.datamodule import TranslationDataModule
from aiayn.data.download import NotTheFile, download_file, open_compressed, read_through, refuse_unless
from aiayn.data.readers import plain_or_gzipped, read_lines
from aiayn.errors import DataError

log = logging.getLogger(__name__)

URL_TEMPLATE = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/{split}.{lang}.gz"
"""Where each raw, gzipped file lives upstream (github.com/multi30k/dataset, task 1)."""

MIRROR_ENV = "AIAYN_MULTI30K_MIRROR"
"""A base URL to download ``{split}.{lang}.gz`` from instead (a local mirror, say)."""

SPLITS = ("train", "val", "test_2016_flickr", "test_2017_flickr", "test_2017_mscoco", "test_2018_flickr")
LANGUAGES = ("en", "de")
SUBDIR = "multi30k"
"""The files live in ``<data_root>/multi30k/{split}.{lang}.gz`` as upstream has them, or unpacked
(``{split}.{lang}``: read where it is there, :func:`aiayn.data.readers.plain_or_gzipped`)."""

DOWNLOAD_TIMEOUT_S = 30.0

LINES = {"train": 29_000, "val": 1_014, "test_2016_flickr": 1_000, "test_2017_flickr": 1_000, "test_2017_mscoco": 461,
         "test_2018_flickr": 1_071}
"""The lines of each split's official files (either language): a download with other counts is
another file served under the name, refused. A user's own files in the data root are not held to it."""


def multi30k_path(data_root: str | os.PathLike, split: str, lang: str) -> Path:
    """Where the file of ``split`` in ``lang`` is expected under ``data_root``, as upstream has it."""
    _check(split, lang)
    return Path(data_root) / SUBDIR / f"{split}.{lang}.gz"


def _present(data_root: str | os.PathLike, split: str, lang: str) -> Path:
    """The file of ``split`` in ``lang`` to read: the unpacked one where a user gunzipped it (before:
    reported missing, or downloaded again beside it), else the gzipped one, missing or not."""
    gzipped = multi30k_path(data_root, split, lang)
    found = plain_or_gzipped(gzipped.with_suffix(""))
    return found if found.is_file() else gzipped


def multi30k_url(split: str, lang: str) -> str:
    """The upstream address of the file of ``split`` in ``lang``."""
    _check(split, lang)
    mirror = os.environ.get(MIRROR_ENV)
    if mirror:
        return f"{mirror.rstrip('/')}/{split}.{lang}.gz"
    return URL_TEMPLATE.format(split=split, lang=lang)


def multi30k_files(
    data_root: str | os.PathLike, split: str, src_lang: str, tgt_lang: str, download: bool = True,
    data_root_setting: str = "paths.data_root",
) -> tuple[Path, Path]:
    """The source and target files of ``split``; missing ones are downloaded when ``download``
    is true, and a :class:`DataError` lists whatever is still missing (naming ``data_root_setting``,
    the setting that gave ``data_root``)."""
    if src_lang == tgt_lang:
        raise ValueError(f"source and target language are both {src_lang!r}; choose two of {LANGUAGES}")
    paths = (_present(data_root, split, src_lang), _present(data_root, split, tgt_lang))
    missing = [(path, multi30k_url(split, lang)) for path, lang in zip(paths, (src_lang, tgt_lang)) if not path.is_file()]
    if missing and download:
        for path, url in missing:
            _download(url, path, split)
        missing = [(path, url) for path, url in missing if not path.is_file()]
    if missing:
        listing = "; ".join(f"{path} (from {url})" for path, url in missing)
        how = "download failed (see the warnings above)" if download else "download=False"
        raise DataError(
            f"Multi30k files missing ({how}): {listing}. Fetch them there, or point "
            f"AIAYN_DATA_ROOT / {data_root_setting} at a folder whose {SUBDIR}/ holds them"
        )
    return paths


def _check(split: str, lang: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown Multi30k split {split!r}; choose one of {SPLITS}")
    if lang not in LANGUAGES:
        raise ValueError(f"unsupported Multi30k language {lang!r}; choose one of {LANGUAGES}")


def _download(url: str, path: Path, split: str) -> None:
    """Fetch ``url`` into ``path``, renamed into place only once it is what :func:`_check_download`
    asks; failures are logged, not raised (the caller lists what is still missing)."""
    try:
        download_file(url, path, DOWNLOAD_TIMEOUT_S, check=lambda temporary: _check_download(temporary, url, split))
    except (OSError, DataError) as error:  # URLError, timeouts, cut transfers and read-only folders are OSErrors
        log.warning("could not download %s to %s: %s", url, path, error)


def _check_download(temporary: Path, url: str, split: str) -> None:
    """A :class:`NotTheFile` naming ``url`` where what it sent is not gzip data (an HTML page, say),
    does not decompress to its end (a cut or damaged copy: gzip's CRC and length are checked
    there) or has other than the split's official line count (:data:`LINES`: another file)."""
    refuse_unless(temporary, url, ("gzip data",), "gzip data (a .gz file)")
    try:
        with open_compressed(temporary) as stream:
            read_through(stream)
    except (EOFError, zlib.error, OSError) as error:
        raise NotTheFile(f"{url} sent damaged gzip data ({error})") from None
    lines = len(read_lines(temporary))
    if lines != LINES[split]:
        raise NotTheFile(f"{url} sent {lines:,} lines, where Multi30k's {split} files have {LINES[split]:,}: another "
                         "file under its name")


class Multi30kDataModule(TranslationDataModule):
    """Multi30k task 1 (``<data_root>/multi30k/{split}.{lang}.gz``, or unpacked) as a :class:`TranslationDataModule`."""

    EVALUATION_SPLITS = SPLITS

    def __init__(
        self,
        data_root: str,
        src_lang: str = "en",
        tgt_lang: str = "de",
        vocab_size: int = 8000,
        max_tokens: int = 4096,
        max_length: int = 256,
        cache_dir: str | None = None,
        seed: int = 0,
        num_workers: int = 0,
        download: bool = True,
        val_split: str = "val",
        test_split: str = "test_2016_flickr",
        eval_max_tokens: int | None = None,
        length_buckets: list[int] | None = None,
        subword_model: str | None = None,
    ):
        super().__init__(
            data_root, src_lang, tgt_lang, vocab_size, max_tokens, max_length, cache_dir, seed,
            num_workers, download, "train", val_split, test_split, eval_max_tokens, length_buckets, subword_model,
        )
        if src_lang == tgt_lang:
            raise ValueError(f"source and target language are both {src_lang!r}")
        for split in self.splits.values():  # unknown splits or languages fail here, not later
            for lang in (src_lang, tgt_lang):
                multi30k_path(data_root, split, lang)
        self.save_hyperparameters(logger=False)  # in checkpoints; the logged config has them as task.datamodule.*

    def split_files(self, split: str, download: bool) -> tuple[Path, Path]:
        return multi30k_files(self.data_root, split, self.src_lang, self.tgt_lang, download=download,
                              data_root_setting=self.DATA_ROOT_SETTING)

    def required_files(self, split: str) -> dict[Path, str]:
        """The split's two files, each with its upstream address."""
        return {_present(self.data_root, split, lang): f"from {multi30k_url(split, lang)}"
                for lang in (self.src_lang, self.tgt_lang)}

    def missing_files_message(self, listing: str) -> str:
        how = "download failed (see the warnings above)" if self.download else "download=False"
        return (f"Multi30k files missing or unreadable ({how}): {listing}. Fetch them there, or point "
                f"AIAYN_DATA_ROOT / {self.DATA_ROOT_SETTING} at a folder whose {SUBDIR}/ holds them")
