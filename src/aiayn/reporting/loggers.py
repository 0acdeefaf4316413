"""Experiment loggers. W&B is the default: online with an API key, otherwise offline (no prompt,
no network wait), written under the run directory and uploadable later with ``wandb sync``."""

from __future__ import annotations

import netrc
import os
from typing import Any

from lightning.pytorch.loggers import WandbLogger


def wandb_has_credentials() -> bool:
    """An API key in the environment or in ~/.netrc (where ``wandb login`` puts it)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def wandb_logger(project: str, save_dir: str, mode: str = "auto", **kwargs: Any) -> WandbLogger:
    """``mode``: "online", "offline", or "auto" (online only with credentials). WANDB_MODE in the
    environment, when set, wins as it does for wandb itself."""
    mode = os.environ.get("WANDB_MODE", mode)
    if mode == "auto":
        mode = "online" if wandb_has_credentials() else "offline"
    os.makedirs(save_dir, exist_ok=True)
    return WandbLogger(project=project, save_dir=save_dir, offline=(mode == "offline"), **kwargs)
