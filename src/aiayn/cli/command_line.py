"""What every tool does to its command line before Hydra reads it (:func:`read_by_hydra`, around
each tool's ``main``):

* old setting names become the new ones, each with a one-line notice, and a setting that is no more
  is refused in one line (:mod:`aiayn.cli.renamed`);
* a path's value is given to Hydra quoted, as the one string it is (a leading ``~`` expanded): a
  ``--multirun`` job's folder is named after its overrides (``0_debug=tiny,seed=7``), whose ``=``
  Hydra's grammar refuses and whose commas it takes for a sweep. A value written in Hydra's own syntax (quoted, a list, an
  interpolation, a sweep function) is left as it is;
* Hydra's own options (``--multirun``, ``--cfg job``, ...) go before the overrides wherever they
  were given: its parser takes none after them.

A call with arguments (a composed config, in tests) is passed on as it is.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from aiayn.cli import tool_name
from aiayn.cli.errors import USER_ERROR
from aiayn.cli.hydra_options import hydra_options_and_overrides
from aiayn.cli.renamed import REMOVED, RENAMED, new_arguments, removed_setting

Result = TypeVar("Result")

# The settings whose value is a path (any tool's; hydra.*: train's output folders).
PATHS = ("ckpt", "resume", "out", "input", "model_dir", "data_root", "task.raw_dir", "task.data_dir", "hydra.run.dir",
         "hydra.sweep.dir")

_OVERRIDE = re.compile(r"^(?P<key>[+~]{0,2}[A-Za-z_][\w.]*)=(?P<value>.*)$", re.DOTALL)
# Written in Hydra's syntax: quoted, a list or dict, an interpolation, a sweep function (glob(...)).
_HYDRA_SYNTAX = re.compile(r"""^\s*(['"\[{]|\w+\(.*\)\s*$)|\$\{""", re.DOTALL)
# What Hydra's grammar does not take as it is in a plain value.
_GRAMMAR = re.compile(r"""[=()\[\]{}'"\s~]""")


def read_by_hydra(tool: str) -> Callable[[Callable[..., Result]], Callable[..., Result]]:
    """Wrap ``tool``'s ``main`` so that its command line is rewritten as above first."""

    def wrap(main: Callable[..., Result]) -> Callable[..., Result]:
        @functools.wraps(main)
        def run(*args: Any, **kwargs: Any) -> Result:
            if not args and not kwargs:
                refused = removed_setting(sys.argv[1:], REMOVED.get(tool, {}))
                if refused:
                    sys.stderr.write(f"{tool_name()}: {refused}\n")
                    raise SystemExit(USER_ERROR)
                arguments, notices = new_arguments(sys.argv[1:], RENAMED.get(tool, {}))
                sys.argv[1:] = hydra_options_first([quoted_path(argument, tool) for argument in arguments])
                for notice in notices:
                    sys.stderr.write(f"{tool_name()}: {notice}\n")
            return main(*args, **kwargs)

        return run

    return wrap


def quoted_path(argument: str, tool: str) -> str:
    """``ckpt=runs/0_a=1,b=2/last.ckpt`` as ``ckpt='runs/0_a=1,b=2/last.ckpt'``: a path setting's
    value quoted where Hydra would read it otherwise. Commas alone are quoted where they cannot be
    a sweep (any tool but train, or a path that exists): evaluate's and translate's ``ckpt=a,b``
    reaches aiayn.checkpoints.given as one string. A leading ``~`` is the user's home, as the shell
    makes it where the key is a plain name. Any other argument as it is."""
    match = _OVERRIDE.match(argument)
    if not match or match["key"].lstrip("+~") not in PATHS:
        return argument
    value = match["value"]
    if not value or _HYDRA_SYNTAX.search(value) or value.endswith("\\"):
        return argument
    # ~ as the shell expands it in ckpt=~/x, but not in task.data_dir=~/x (a dotted key is no assignment).
    value = os.path.expanduser(value)
    commas = "," in value and (tool != "train" or os.path.lexists(value))
    if not (_GRAMMAR.search(value) or commas):
        return f"{match['key']}={value}"
    quote = "'" if "'" not in value else '"'
    if quote in value:  # both kinds of quote in it: Hydra's escapes, in single quotes
        quote, value = "'", value.replace("'", "\\'")
    return f"{match['key']}={quote}{value}{quote}"


def hydra_options_first(arguments: list[str]) -> list[str]:
    """``arguments`` with Hydra's options (and their values) moved before the overrides, in their
    order: ``seed=1,2 --multirun`` as ``--multirun seed=1,2``."""
    options, overrides = hydra_options_and_overrides(arguments)
    return [*options, *overrides]
