"""What every tool does to its command line before Hydra reads it (:func:`read_by_hydra`, around
each tool's ``main``):

* old setting names become the new ones, each with a one-line notice, and a setting that is no more
  is refused in one line (:mod:`aiayn.cli.renamed`);
* a path's value (and visualize's ``text``) is given to Hydra quoted, as the one string it is (a
  path's leading ``~`` expanded): a
  ``--multirun`` job's folder is named after its overrides (``0_debug=tiny,seed=7``), whose ``=``
  Hydra's grammar refuses and whose commas it takes for a sweep. A value written in Hydra's own syntax (quoted, a list, an
  interpolation, a sweep function) is left as it is;
* Hydra's own options (``--multirun``, ``--cfg job``, ...) go before the overrides wherever they
  were given: its parser takes none after them;
* a setting deleted (``~seed``, ``~logger``) is refused in one line: every setting of a tool is one
  it reads (Hydra would let the config lose it, and the tool fail on it later or run without it,
  as ``~decoding`` once dropped a parser's constrained decoding); so is a setting a tool other than
  train does not have, added with ``+`` (``+bach_size=8``, which Hydra adds and the tool never
  reads; train checks its whole config itself, aiayn.training.config_check).

A call with arguments (a composed config, in tests) is passed on as it is.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from aiayn.cli.errors import USER_ERROR
from aiayn.cli.hydra_options import hydra_options_and_overrides
from aiayn.cli.naming import config_options, tool_command, tool_name
from aiayn.cli.renamed import REMOVED, RENAMED, new_arguments, removed_setting

Result = TypeVar("Result")

# The settings whose value is a path (any tool's; hydra.*: train's output folders).
PATHS = ("ckpt", "resume", "out", "input", "model_dir", "data_root", "paths.data_root", "paths.cache_dir", "task.raw_dir",
         "task.data_dir", "hydra.run.dir", "hydra.sweep.dir")
# The settings whose value is any text, one string whatever it holds (visualize's sentence).
TEXTS = ("text",)

_OVERRIDE = re.compile(r"^(?P<key>[+~]{0,2}[A-Za-z_][\w.]*)=(?P<value>.*)$", re.DOTALL)
# Written in Hydra's syntax: quoted, a list or dict, an interpolation, a sweep function (glob(...)).
_HYDRA_SYNTAX = re.compile(r"""^\s*(['"\[{]|\w+\(.*\)\s*$)|\$\{""", re.DOTALL)
# An override that deletes (``~key``, ``~key=value``) or adds (``+key=value``, ``++key=value``) a setting.
_CHANGE = re.compile(r"^(?P<how>~|\+\+?)(?P<key>[A-Za-z_][\w.]*)(=|$)")
# What Hydra's grammar does not take as it is in a plain value.
_GRAMMAR = re.compile(r"""[=()\[\]{}'"\s~]""")


def read_by_hydra(tool: str) -> Callable[[Callable[..., Result]], Callable[..., Result]]:
    """Wrap ``tool``'s ``main`` so that its command line is rewritten as above first."""

    def wrap(main: Callable[..., Result]) -> Callable[..., Result]:
        @functools.wraps(main)
        def run(*args: Any, **kwargs: Any) -> Result:
            if not args and not kwargs:
                arguments, notices = new_arguments(sys.argv[1:], RENAMED.get(tool, {}))
                refused = removed_setting(sys.argv[1:], REMOVED.get(tool, {})) or refused_override(arguments, tool)
                if refused:
                    sys.stderr.write(f"{tool_name()}: {refused}\n")
                    raise SystemExit(USER_ERROR)
                arguments, twice = the_last_of_each(sys.argv[1:], arguments)
                notices += twice
                sys.argv[1:] = hydra_options_first([quoted_path(argument, tool) for argument in arguments])
                for notice in notices:
                    sys.stderr.write(f"{tool_name()}: {notice}\n")
            return main(*args, **kwargs)

        return run

    return wrap


def refused_override(arguments: list[str], tool: str) -> str | None:
    """The line refusing the first override of ``arguments`` that deletes a setting (``~key``) or,
    in a tool but train, adds one the tool does not have (``+key=…``, ``++key=…``); None if none
    does. Hydra's own settings (``hydra.*``, ``hydra/…``) are Hydra's."""
    from dataclasses import fields

    from aiayn.config.tools import TOOLS

    _, overrides = hydra_options_and_overrides(arguments)
    for argument in overrides:
        match = _CHANGE.match(argument)
        if match is None or match["key"].split(".", 1)[0] == "hydra":
            continue
        key = match["key"]
        if match["how"].startswith("~"):
            options = config_options(key) if key in _groups(tool) else ""
            if options:
                return (f"~{key}: a config group cannot be deleted; choose one of its options instead, "
                        f"{key}=<name>, one of {options}")
            return (f"~{key}: a setting cannot be deleted, {tool_name()} reads each of its settings; give "
                    f"{key}=<value> instead (null where the setting may be none; `{tool_command()} --cfg job` "
                    "shows every setting and its value)")
        if tool in TOOLS:
            settings = sorted(f.name for f in fields(TOOLS[tool]))
            name = key.split(".", 1)[0]
            if name not in settings:
                close = difflib.get_close_matches(name, settings, n=3, cutoff=0.6)
                hint = f"did you mean {' or '.join(close)}?" if close else f"the settings are {', '.join(settings)}"
                return f"{key} is not a setting of {tool_name()}, so {match['how']}{key} would be ignored; {hint}"
    return None


def the_last_of_each(given: list[str], arguments: list[str]) -> tuple[list[str], list[str]]:
    """``arguments`` (``given`` renamed, one for one) with a setting set more than once set by its
    last (``seed=1 … seed=3``, a script's command with one changed at its end; an old name and its
    new one, ``task.decoding.beam_size=5 decoding.beam_size=3``), as Hydra would apply them, and a
    notice for each one set aside: Hydra took the last without a word, and a run's name and tags
    said every value. Hydra's own settings and options are left as they are."""
    _, typed = hydra_options_and_overrides(given)
    options, overrides = hydra_options_and_overrides(arguments)
    keys = [_setting_of(override) for override in overrides]
    last = {key: index for index, key in enumerate(keys) if key is not None}
    kept, notices = [], []
    for index, (override, key) in enumerate(zip(overrides, keys)):
        if key is not None and last[key] != index:
            notices.append(f"{key} is given more than once; the last, {typed[last[key]]}, is used and {typed[index]} "
                           "set aside")
            continue
        kept.append(override)
    return ([*options, *kept], notices) if notices else (arguments, [])  # Hydra's options go first anyway


def _setting_of(override: str) -> str | None:
    """The setting ``override`` sets (``+seed=1`` → ``seed``); None for Hydra's own and for what sets none."""
    match = _OVERRIDE.match(override)
    key = match["key"].lstrip("+~") if match is not None else None
    return None if key is None or key.split(".", 1)[0] == "hydra" else key


def _groups(tool: str) -> set[str]:
    """The config groups ``tool``'s defaults list chooses an option of (conf/<tool>.yaml: ``task``,
    ``model``, ``logger`` ...), which ``<group>=<name>`` changes."""
    from omegaconf import OmegaConf

    from aiayn.cli.naming import CONFIG_DIR

    try:
        defaults = OmegaConf.to_container(OmegaConf.load(os.path.join(CONFIG_DIR, f"{tool}.yaml"))).get("defaults")
    except (OSError, AttributeError):
        return set()
    return {name.removeprefix("optional ").strip() for entry in defaults or () if isinstance(entry, dict)
            for name in entry if not name.startswith(("override ", "/"))}


def quoted_path(argument: str, tool: str) -> str:
    """``ckpt=runs/0_a=1,b=2/last.ckpt`` as ``ckpt='runs/0_a=1,b=2/last.ckpt'``: a path setting's
    value quoted where Hydra would read it otherwise, and so a text's (``text=A man, a dog (left).``). Commas alone are quoted where they cannot be
    a sweep (any tool but train, or a path that exists): evaluate's and translate's ``ckpt=a,b``
    reaches aiayn.checkpoints.given as one string. A leading ``~`` is the user's home, as the shell
    makes it where the key is a plain name. Any other argument as it is."""
    match = _OVERRIDE.match(argument)
    text = match is not None and match["key"].lstrip("+~") in TEXTS  # a sentence: its commas are no sweep
    if not match or (match["key"].lstrip("+~") not in PATHS and not text):
        return argument
    value = match["value"]
    if not value or _HYDRA_SYNTAX.search(value) or value.endswith("\\"):
        return argument
    # ~ as the shell expands it in ckpt=~/x, but not in task.data_dir=~/x (a dotted key is no assignment).
    value = value if text else os.path.expanduser(value)
    commas = "," in value and (text or tool != "train" or os.path.lexists(value))
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
