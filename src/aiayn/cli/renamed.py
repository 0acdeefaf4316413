"""Settings renamed so that each has one name in every tool: the old names keep working for one
release, each use answered with a one-line notice on stderr naming the new one.

aiayn.cli.command_line rewrites each tool's command line with :func:`new_arguments` before Hydra
reads it: ``task.decoding.beam_size=5`` (train) becomes ``decoding.beam_size=5``, ``beam_size=5``
(translate) too. A name that ends in ``.`` renames a whole section. A setting that is no more
(:data:`REMOVED`) is refused there in one line that says what took its place (:func:`removed_setting`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# The release in which the old names stop working.
UNTIL = "0.3"

# Every tool's: the decoding settings' old spellings (issue of one address per setting).
DECODING = ("beam_size", "alpha", "max_len_offset", "kv_cache", "constrained")
RENAMED = {
    "train": {"task.decoding.": "decoding."},
    "translate": {**{key: f"decoding.{key}" for key in DECODING}, "output": "out"},
    # its own seed= seeded nothing; data_root is train's and prepare's paths.data_root
    "evaluate": {"out_dir": "out", "seed": "decoding.seed", "data_root": "paths.data_root"},
    "average": {"dir": "ckpt", "last": "average_last"},
}

# Settings that are no more, each with what takes its place: one line (exit 2) when given.
_STEPS_NOT_MINUTES = ("§6.1's checkpoints to average are counted in steps now, the same on any hardware: "
                      "checkpoint.average_last of them, checkpoint.average_every_n_steps apart (base 5 × 1,500, big "
                      "20 × 600: the paper's 10 minutes at its step times, conf/checkpoint/)")
REMOVED = {
    "train": {"checkpoint.every_n_minutes": _STEPS_NOT_MINUTES, "checkpoint.keep_timed": _STEPS_NOT_MINUTES},
}

_OVERRIDE = re.compile(r"^(?P<prefix>[+~]{0,2})(?P<key>[A-Za-z_][\w.]*)(?P<rest>(=.*)?)$", re.DOTALL)


def new_arguments(arguments: list[str], renamed: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """``arguments`` (a command line's overrides) with old setting names replaced, and a notice for
    each replacement."""
    result, notices = [], []
    for argument in arguments:
        match = _OVERRIDE.match(argument)
        key = match["key"] if match else None
        new = None
        for old, replacement in renamed.items():
            if key == old or (old.endswith(".") and key and key.startswith(old)):
                new = replacement + key[len(old):] if old.endswith(".") else replacement
                break
        if new is None:
            result.append(argument)
            continue
        result.append(f"{match['prefix']}{new}{match['rest']}")
        notices.append(f"{key} is now {new}; the old name works until release {UNTIL}")
    return result, notices


def removed_setting(arguments: list[str], removed: Mapping[str, str]) -> str | None:
    """The line for the first of ``arguments`` that sets a setting of ``removed``; None if none does."""
    for argument in arguments:
        match = _OVERRIDE.match(argument)
        if match and match["key"] in removed:
            return f"{match['key']} is no longer a setting: {removed[match['key']]}; leave it out"
    return None
