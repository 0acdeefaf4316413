"""The nearest settings to an override Hydra could not apply (``model.d_modle=64``): Hydra names the
key and the node it is not in, not what the node holds. :func:`refused_key` composes the
tool's config again without that override (a sweep's ``a,b`` as its first value) and says the
node's settings nearest the key (``did you mean model.d_model?``), else all of them; a section
given a value as if it were a config group (translate's ``decoding=parsing``), its settings. For
``--cfg job``, :func:`left_out_as_the_run_meets_it` resolves the config afresh to find a setting left out."""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from omegaconf import OmegaConf

from aiayn.cli.hydra_options import hydra_options_and_overrides
from aiayn.cli.naming import CONFIG_DIR, tool_command, tool_name
from aiayn.config.identity import override_key


def refused_key(key: str, because: str) -> str:
    """The line for an override of ``key`` Hydra could not apply (``because``, its reason): the
    settings nearest it (:func:`nearest_settings`), or, where ``key`` is a section given a value as
    a config group would be (translate's ``decoding=parsing``), how to give its settings."""
    parent, _, leaf = key.rpartition(".")
    node = _composed_without(key, parent)
    if isinstance(node, Mapping) and isinstance(node.get(leaf), Mapping) and node[leaf]:
        return _section(key, node[leaf])
    hint = nearest_settings(key, node) or f"`{tool_command()} --cfg job` prints every setting, `--help` the groups"
    return f"{key} is not a setting here ({because}); {hint}"


def nearest_settings(key: str, node: object) -> str | None:
    """``did you mean model.d_model?``, or ``the settings of model are …``, for the unknown ``key``
    of this command line's overrides, from ``node``, the node it is not in as composed without it;
    None where that could not be composed."""
    parent, _, leaf = key.rpartition(".")
    if not isinstance(node, Mapping) or not node:
        return None
    settings = sorted(str(name) for name in node)
    close = difflib.get_close_matches(leaf, settings, n=3, cutoff=0.75)
    prefix = f"{parent}." if parent else ""
    if close:
        return f"did you mean {' or '.join(prefix + name for name in close)}?"
    return f"the settings of {parent or 'the config'} are {', '.join(settings)}"


def _composed_without(key: str, parent: str) -> object:
    """The node ``parent`` of the tool's config composed from this command line's overrides but those
    of ``key``; None if that cannot be composed."""
    try:
        config = _composed(key)
        node = OmegaConf.select(config, parent) if parent else config
        return OmegaConf.to_container(node, resolve=False) if OmegaConf.is_config(node) else node
    except Exception:  # noqa: BLE001  a suggestion is extra: without it the line stays as it was
        return None


def left_out_as_the_run_meets_it() -> BaseException | None:
    """The error of a mandatory setting left out as resolving the tool's config afresh meets it
    (omegaconf's ``InterpolationToMissingValueError``, naming the setting and its node), for ``--cfg
    job``: Hydra resolves the config it shows in place, turning a setting that reads one left out
    (``task.name: parallel_text_${task.src_lang}_…``) into ``???`` itself; None if there is none."""
    from omegaconf.errors import InterpolationToMissingValueError

    return unresolved_as_the_run_meets_it(InterpolationToMissingValueError)


def unresolved_as_the_run_meets_it(kind: type[BaseException]) -> BaseException | None:
    """The error of ``kind`` that resolving the tool's config afresh meets, with the node it was met at
    (``--cfg job`` resolves a copy, whose errors name none); None if it meets none of that kind."""
    try:
        OmegaConf.to_container(_composed(None), resolve=True)
    except kind as error:
        return error
    except Exception:  # noqa: BLE001  another error: the line stays as it was
        return None
    return None


def _composed(key: str | None) -> object:
    """The tool's config composed on its own from this command line's overrides but those of ``key``
    (a sweep's ``a,b`` as its first value), unresolved."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    _, overrides = hydra_options_and_overrides(sys.argv[1:])
    rest = first_of_each_sweep([override for override in overrides if override_key(override) != key])
    name = tool_name().removesuffix(".py").removeprefix("aiayn-")
    GlobalHydra.instance().clear()  # the tool's own composition failed; this one is on its own
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name=name, overrides=rest)


def named_after_the_model(missing: str) -> str:
    """What to add to Hydra's ``missing`` group option (``In 'train': Could not find 'optim/gated'.``)
    where train.yaml named it after the model (``optim: ${model}``, ``checkpoint: ${model}``) and the
    command line did not: a model file of one's own (docs/extending.md) has no recipe or checkpoints
    of its name; "" for any other."""
    found = re.match(r"In 'train': Could not find '(optim|checkpoint)/([^']+)'", missing)
    if found is None or any(override_key(override) == found[1] for override in hydra_options_and_overrides(sys.argv[1:])[1]):
        return ""
    group, model = found.groups()
    return (f"; train.yaml picks {group}=${{model}}, and model={model} has none of its name: give {group}=<one of "
            f"those> (optim=small checkpoint=small, say), or add {group}/{model}.yaml beside model/{model}.yaml")


def first_of_each_sweep(overrides: list[str]) -> list[str]:
    """``overrides`` with each sweep (``a,b``, ``range(1,3)``, ``glob(table3_*)``) given its first
    value, as the sweep's first job has it: one config to compose. Unparsable: as they are."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Glob

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:  # noqa: BLE001  Hydra's own composition says what is wrong with them
        return overrides
    first = []
    for text, override in zip(overrides, parsed):
        if not override.is_sweep_override():
            first.append(text)
            continue
        if isinstance(override.value(), Glob):
            options = sorted(path.stem for path in Path(CONFIG_DIR, override.key_or_group).glob("*.yaml"))
            values = override.value().filter(options)
        else:
            values = list(override.sweep_string_iterator()) if override.is_discrete_sweep() else []
        if values:  # a sweep of no value (an interval): left out
            first.append(f"{override.get_key_element()}={values[0]}")
    return first


def _section(key: str, section: Mapping) -> str:
    """What to give instead of ``key=<name>`` where ``key`` is a section of settings: each of them,
    and those conf/<key>/<name>.yaml sets, where there is one."""
    given = next((override.split("=", 1)[1] for override in hydra_options_and_overrides(sys.argv[1:])[1]
                  if override_key(override) == key and "=" in override), None)
    names = ", ".join(f"{key}.{name}" for name in sorted(map(str, section)))
    if all(value is None for value in section.values()):  # evaluate's, translate's, export's decoding.*
        names += "; each left unset: the checkpoint's own"
    line = (f"{key}={given}: {key} is a section of settings here, not a choice of conf/{key}/; give its settings "
            f"one by one, {key}.<setting>=<value> ({names})")
    path = Path(CONFIG_DIR, key, f"{given}.yaml") if given else None
    if path is not None and path.is_file():
        values = {name: value for name, value in OmegaConf.to_container(OmegaConf.load(path)).items()
                  if name != "defaults" and name in section}
        if values:
            settings = " ".join(f"{key}.{name}={_yaml(value)}" for name, value in values.items())
            line += f"; conf/{key}/{given}.yaml's are {settings}"
    return line


def _yaml(value: object) -> str:
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
