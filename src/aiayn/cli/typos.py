"""The nearest settings to an override Hydra could not apply (``model.d_modle=64``): Hydra names the
key and the node it is not in, not what the node holds. :func:`nearest_settings` composes the
tool's config again without that override and says the node's settings nearest the key (``did you
mean model.d_model?``), else all of them."""

from __future__ import annotations

import difflib
import sys
from collections.abc import Mapping

from omegaconf import OmegaConf

from aiayn.cli import CONFIG_DIR, tool_name
from aiayn.cli.hydra_options import hydra_options_and_overrides


def nearest_settings(key: str) -> str | None:
    """``did you mean model.d_model?``, or ``the settings of model are …``, for the unknown ``key``
    of this command line's overrides; None where the node cannot be composed without it."""
    parent, _, leaf = key.rpartition(".")
    node = _composed_without(key, parent)
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
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    _, overrides = hydra_options_and_overrides(sys.argv[1:])
    rest = [override for override in overrides if override.split("=", 1)[0].lstrip("+~") != key]
    name = tool_name().removesuffix(".py").removeprefix("aiayn-")
    try:
        GlobalHydra.instance().clear()  # the tool's own composition failed; this one is on its own
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            config = compose(config_name=name, overrides=rest)
        node = OmegaConf.select(config, parent) if parent else config
        return OmegaConf.to_container(node, resolve=False) if OmegaConf.is_config(node) else node
    except Exception:  # noqa: BLE001  a suggestion is extra: without it the line stays as it was
        return None
