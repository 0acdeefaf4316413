"""Hydra's own options on a command line (``--multirun``, ``--cfg job``, ``-c all``, ...), told
apart from the overrides (``key=value``) as Hydra's argument parser takes them."""

from __future__ import annotations


def hydra_options_and_overrides(arguments: list[str]) -> tuple[list[str], list[str]]:
    """``arguments`` as Hydra's options (with their values) and the overrides, each in their order."""
    from hydra._internal.utils import get_args_parser

    takes = {}  # option → how many values it takes: 0, 1 or "?" (one of its choices, if given)
    for action in get_args_parser()._actions:
        for option in action.option_strings:
            takes[option] = 0 if action.nargs == 0 else ("?", action.choices) if action.nargs == "?" else 1
    options, overrides = [], []
    index = 0
    while index < len(arguments):
        argument = arguments[index]
        name = argument.split("=", 1)[0]
        count = takes.get(name) if argument.startswith("-") else None
        if count is None:
            overrides.append(argument)
        elif "=" in argument or count == 0:
            options.append(argument)
        elif count == 1:
            options.extend(arguments[index:index + 2])
            index += 1
        else:  # nargs "?": the next argument only when it is one of the choices
            choices = count[1] or ()
            following = arguments[index + 1:index + 2]
            options.extend([argument, *[value for value in following if value in choices]])
            index += len([value for value in following if value in choices])
        index += 1
    return options, overrides


def shown_part(arguments: list[str]) -> str | None:
    """What ``--cfg``/``-c`` asks to show (``job``, ``hydra``, ``all``; ``""`` when it names none), or None."""
    for index, argument in enumerate(arguments):
        if argument.startswith("--cfg="):
            return argument.split("=", 1)[1]
        if argument in ("--cfg", "-c"):
            return arguments[index + 1] if index + 1 < len(arguments) else ""
    return None
