"""The user's error behind a config that cannot be resolved (omegaconf's ``InterpolationResolutionError``):
what a resolver raised (the plan's ConfigError), a mandatory setting left out that another setting reads,
or a choice that a table beside it has no entry for (``task.split=foo``). The tools report it in one line
(aiayn.cli.errors), and train.py raises it as the ConfigError it is, so that the run that never started
leaves no folder behind."""

from __future__ import annotations

import re
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError, InterpolationToMissingValueError, MissingMandatoryValue

from aiayn.cli.naming import config_options, tool_command
from aiayn.cli.typos import left_out_as_the_run_meets_it, unresolved_as_the_run_meets_it
from aiayn.errors import ConfigError, UserError, user_error_behind


def raised_by_resolver(error: BaseException) -> UserError | None:
    """The UserError a resolver raised (the plan's ConfigError), which omegaconf reports as an
    InterpolationResolutionError; None for any other error."""
    return user_error_behind(error) if isinstance(error, InterpolationResolutionError) else None


def user_error_within(error: BaseException) -> UserError | None:
    """The UserError an error of resolving the config stands for: one a resolver raised (:func:`raised_by_resolver`),
    a mandatory setting left out that another setting reads (:func:`left_out`), or a choice a table beside it
    has no entry for (:func:`_no_such_choice`); None for any other error."""
    if raised := raised_by_resolver(error) or left_out(error):
        return raised
    choice = _no_such_choice(error) if isinstance(error, InterpolationResolutionError) else None
    return ConfigError(choice) if choice else None


def left_out(error: BaseException) -> ConfigError | None:
    """The ConfigError of a mandatory setting (``???``) left out that another setting reads
    (``task.datamodule.data_dir: ${task.data_dir}``), which omegaconf reports under the setting it
    was resolving (a resolver's reading, ``--cfg job``'s: as a run meets it); None for any other error."""
    if isinstance(error, InterpolationResolutionError) and isinstance(error.__context__, MissingMandatoryValue):
        error = left_out_as_the_run_meets_it() or error
    if not isinstance(error, InterpolationToMissingValueError):
        return None
    found = re.search(r"Missing mandatory value: ([\w.\[\]-]+)", str(error))
    return ConfigError(missing_line(found.group(1), getattr(error, "parent_node", None))) if found else None


def _no_such_choice(error: InterpolationResolutionError) -> str | None:
    """``task.split=foo: not one of task.splits (standard, sample)`` where a setting picks an entry
    of a table beside it (``${task.splits.${task.split}.treebank}``) that has no such entry; None
    for any other interpolation. (``--cfg job``'s error names no node: the config resolved afresh gives one.)"""
    found = re.search(r"Interpolation key '([\w.]+)\.(\w+)s\.([^.']+)\.[\w.]+' not found", str(error))
    if found is not None and getattr(error, "parent_node", None) is None:
        error = unresolved_as_the_run_meets_it(InterpolationResolutionError) or error
    parent = getattr(error, "parent_node", None)
    if found is None or parent is None:
        return None
    base, name, value = found.groups()
    root = parent._get_root()
    choices = OmegaConf.select(root, f"{base}.{name}s", throw_on_resolution_failure=False)
    if str(OmegaConf.select(root, f"{base}.{name}", throw_on_resolution_failure=False)) != value \
            or not isinstance(choices, DictConfig):
        return None
    return f"{base}.{name}={value}: not one of {base}.{name}s ({', '.join(map(str, choices))})"


def missing_line(key: str, node: Any = None) -> str:
    """``key`` left out, with the other mandatory settings of its section also left out (``node``: any
    node of the config), so that one try names them all (before: ``task=parallel_text``, one a try)."""
    options = config_options(key) if "." not in key else ""  # a config group left out (prepare.py's task)
    value = f"<name>, one of {options}" if options else "<value>"
    section = node._get_root().get(key.split(".")[0]) if isinstance(node, DictConfig) and "." in key else None
    keys = [key, *(other for other in _left_out_in(section, key.split(".")[0]) if other != key)]
    named = f"{', '.join(keys[:-1])} and {keys[-1]} are" if len(keys) > 1 else f"{key} is"
    return f"{named} missing: give {' '.join(f'{k}={value}' for k in keys)} (see {tool_command()} --help)"


def _left_out_in(node: Any, prefix: str) -> list[str]:
    """The settings under ``node`` (at ``prefix``) left at ``???``, read without resolving anything."""
    found = []
    for name in node if isinstance(node, DictConfig) else ():
        child = node._get_node(name)
        if isinstance(child, DictConfig):
            found += _left_out_in(child, f"{prefix}.{name}")
        elif child is not None and child._is_missing() and not child._is_interpolation():
            found.append(f"{prefix}.{name}")
    return found
