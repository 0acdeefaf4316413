"""Settings renamed so that each has one name in every tool: the old names keep working for one
release, each use answered with a one-line notice on stderr naming the new one.

:func:`accepts_old_names` wraps a tool's ``main`` and rewrites its command line before Hydra reads
it: ``task.decoding.beam_size=5`` (train) becomes ``decoding.beam_size=5``, ``beam_size=5``
(translate) too. A name that ends in ``.`` renames a whole section. It also passes a list of
checkpoints, ``ckpt=a.ckpt,b.ckpt`` (an ensemble, evaluate and translate), to Hydra quoted, as the
one string it is (Hydra would take it for a sweep).
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from aiayn.cli import tool_name

Result = TypeVar("Result")

# The release in which the old names stop working.
UNTIL = "0.3"

# Every tool's: the decoding settings' old spellings (issue of one address per setting).
DECODING = ("beam_size", "alpha", "max_len_offset", "kv_cache", "constrained")
RENAMED = {
    "train": {"task.decoding.": "decoding."},
    "translate": {**{key: f"decoding.{key}" for key in DECODING}, "output": "out"},
    "evaluate": {"out_dir": "out", "seed": "decoding.seed"},  # its own seed= seeded nothing
    "average": {"dir": "ckpt", "last": "average_last"},
}

# The tools whose ckpt= may list several checkpoints (an ensemble).
CHECKPOINT_LISTS = ("evaluate", "translate")

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


def quoted_checkpoint_list(argument: str) -> str:
    """``ckpt=a.ckpt,b.ckpt`` as ``ckpt='a.ckpt,b.ckpt'``; any other argument as it is."""
    key, _, value = argument.partition("=")
    if key.lstrip("+") != "ckpt" or "," not in value or value[:1] in ("'", '"', "["):
        return argument
    return f"{key}='{value.replace(chr(92), chr(92) * 2).replace(chr(39), chr(92) + chr(39))}'"


def accepts_old_names(tool: str) -> Callable[[Callable[..., Result]], Callable[..., Result]]:
    """Wrap ``tool``'s ``main`` so that its command line's old setting names (:data:`RENAMED`) are
    rewritten, each with a notice. A call with arguments (a composed config, in tests) is passed
    on as it is."""

    def wrap(main: Callable[..., Result]) -> Callable[..., Result]:
        @functools.wraps(main)
        def run(*args: Any, **kwargs: Any) -> Result:
            if not args and not kwargs:
                sys.argv[1:], notices = new_arguments(sys.argv[1:], RENAMED.get(tool, {}))
                if tool in CHECKPOINT_LISTS:
                    sys.argv[1:] = [quoted_checkpoint_list(argument) for argument in sys.argv[1:]]
                for notice in notices:
                    sys.stderr.write(f"{tool_name()}: {notice}\n")
            return main(*args, **kwargs)

        return run

    return wrap
