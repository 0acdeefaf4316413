"""Which files each split of a corpus is read from, and the check, before a run reads any, that
they are all there, readable and whole (:class:`SplitFiles`, a part of
:class:`aiayn.data.datamodule.TranslationDataModule`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import ClassVar

from aiayn.data.cache import check_folder
from aiayn.data.readers import count_pairs
from aiayn.errors import DataError

ROLES = ("train", "val", "test")


class SplitFiles:
    """The file checks of a data module with ``splits`` (role → split name) and ``download``."""

    splits: dict[str, str]
    download: bool
    data_root: Path
    cache_dir: Path
    # The setting that names the folder the corpus is read from (``data_root``), for errors; a data
    # module whose folder another setting names says its own (WMT's ``task.raw_dir``), and evaluate.py,
    # which moves every task's folder under its data root, sets that one's on the instance.
    DATA_ROOT_SETTING: ClassVar[str] = "paths.data_root"

    def check_folders(self) -> None:
        """A :class:`ConfigError` naming the setting (and the environment variable it came from)
        when the data root or the cache folder is a file."""
        check_folder(self.data_root, self.DATA_ROOT_SETTING, "AIAYN_DATA_ROOT")
        check_folder(self.cache_dir, "paths.cache_dir", "AIAYN_CACHE_DIR")

    def split_files(self, split: str, download: bool) -> tuple[Path, Path]:
        """The (source, target) files of ``split``, fetched first if allowed and missing."""
        raise NotImplementedError

    def required_files(self, split: str) -> dict[Path, str]:
        """Every file ``split`` is read from, each with where it comes from (an address, or what
        to do to get it), found without fetching or building anything. The default: the two
        files :meth:`split_files` names."""
        return {path: "" for path in self.split_files(split, False)}

    def fetch_files(self, split: str) -> None:
        """Fetch or build what ``split`` needs, where the module can (``download``); what is
        still missing afterwards :meth:`check_files` reports with every other missing file."""
        if self.download:
            try:
                self.split_files(split, True)
            except DataError:
                pass  # listed by check_files, with the files of the other splits

    def check_files(self, roles: tuple[str, ...] = ROLES) -> None:
        """Check that every file the splits of ``roles`` (``"train"``, ``"val"``, ``"test"``)
        are read from is there and readable, fetching missing ones first where allowed
        (:meth:`fetch_files`). One :class:`DataError` names every file still missing or
        unreadable, each with where to get it.

        ``setup("fit")`` runs it for all three splits before anything is loaded, so a training
        run whose test split is missing fails before its first step; ``prepare_data`` runs it
        too, and ``setup`` of another stage for the splits that stage reads."""
        self.check_folders()
        problems: dict[Path, str] = {}
        for role in dict.fromkeys(roles):
            split = self.splits[role]
            self.fetch_files(split)
            for path, source in self.required_files(split).items():
                if path.is_symlink() and not path.exists():  # ls lists it: say why it is not there
                    problems.setdefault(path, f"{role} split {split!r}: a link to {os.readlink(path)}, which is not "
                                              "there; link it to the file, or put the file in its place")
                elif not path.is_file():
                    problems.setdefault(path, f"{role} split {split!r}: missing" + (f"; {source}" if source else ""))
                elif not os.access(path, os.R_OK):
                    problems.setdefault(path, f"{role} split {split!r}: not readable; check its permissions")
        if problems:
            listing = "; ".join(f"{path} ({problem})" for path, problem in problems.items())
            raise DataError(self.missing_files_message(listing))
        # A run checks its files up to four times (train.py before the run folder is made,
        # prepare_data, setup("fit"), setup("test")): a split's files are read through once while
        # they stay as they were (the same size, modification and change time).
        checked = self.__dict__.setdefault("_contents_checked", {})
        for role in dict.fromkeys(roles):
            split = self.splits[role]
            state = tuple((str(path), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
                          for path in self.required_files(split) for stat in (path.stat(),))
            if checked.get(split) != state:
                self.check_contents(split, role)
                checked[split] = state

    def check_contents(self, split: str, role: str) -> None:
        """Read the two files of ``split`` through: a :class:`DataError` naming the file that ends
        first, or both when empty (a test file shorter than its pair stops a run before its first
        step, not after its last). A corpus whose files are checked otherwise overrides it."""
        src_path, tgt_path = self.split_files(split, False)
        try:
            if count_pairs(src_path, tgt_path) == 0:
                raise DataError(f"{src_path} / {tgt_path}: no lines; a split needs one sentence pair per line")
        except DataError as error:
            raise DataError(f"{role} split {split!r}: {error}") from None

    def missing_files_message(self, listing: str) -> str:
        """The error :meth:`check_files` raises, around ``listing`` (each file and its problem)."""
        return f"files this run reads are missing or unreadable: {listing}"
