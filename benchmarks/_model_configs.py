"""The model configs the benchmarks build: conf/model/<name>.yaml as train.py composes it (its
defaults, the schema's among them), with ``--set model.KEY=VALUE`` overrides, without Hydra."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from _common import REPO
from omegaconf import OmegaConf

from aiayn.config.schemas import ModelConfig

MODEL_DIR = REPO / "conf" / "model"


def load_model_config(name: str, overrides: list[str]) -> dict[str, Any]:
    """conf/model/<name>.yaml (or a yaml file path) with its `defaults` merged in as Hydra does
    (the schema entry, ``/schema/model``, its defaults: d_k and d_v are d_model / n_heads unless
    given), then ``model.KEY=VALUE`` overrides; resolved once all are merged."""
    merged = _model_node(name)
    for override in overrides:
        key, _, value = override.partition("=")
        if not key.startswith("model.") or not _:
            raise SystemExit(f"--set {override}: expected model.KEY=VALUE")
        merged = OmegaConf.merge(merged, OmegaConf.from_dotlist([f"{key.removeprefix('model.')}={value}"]))
    return OmegaConf.to_container(merged, resolve=True)


def _model_node(name: str) -> Any:
    """conf/model/<name>.yaml (or a yaml file) merged with its defaults, unresolved."""
    path = Path(name) if name.endswith((".yaml", ".yml")) else MODEL_DIR / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in MODEL_DIR.glob("*.yaml")))
        raise SystemExit(f"--model {name}: no such model config ({path}); name one of {known} or a yaml file")
    config = OmegaConf.load(path)
    merged = OmegaConf.create()
    defaults = list(config.pop("defaults", None) or ["_self_"])
    for entry in defaults if "_self_" in defaults else [*defaults, "_self_"]:
        if entry.startswith("/schema/model"):  # /schema/model@_here_
            part = OmegaConf.structured(ModelConfig)
        elif entry == "_self_":
            part = config
        else:
            part = _model_node(str(path.parent / f"{entry}.yaml"))
        merged = OmegaConf.merge(merged, part)
    return merged
