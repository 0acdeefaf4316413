"""Whether W&B runs online or offline here, and the check of a W&B mode setting, without W&B or
Lightning: a tool checks its settings with them before it imports either (evaluate.py refuses
``wandb=online`` without an API key in a second, not after Lightning's import)."""

from __future__ import annotations

import netrc
import os
from urllib.parse import urlparse

from aiayn.errors import ConfigError


def wandb_has_credentials() -> bool:
    """An API key in the environment or in ~/.netrc (where ``wandb login`` puts it) for the W&B
    server used (``WANDB_BASE_URL``, else api.wandb.ai)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    try:
        return netrc.netrc().authenticators(host) is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def wandb_mode(mode: str = "auto") -> str:
    """"online" or "offline": ``mode``, WANDB_MODE in the environment when set (it wins, as it does
    for wandb itself), "auto" online only with credentials. WANDB_MODE=dryrun is wandb's older
    name for offline, and the one Lightning's WandbLogger sets in the process as it starts an
    offline run: every later job of a --multirun sweep run here finds it set."""
    mode = os.environ.get("WANDB_MODE", mode)
    if mode == "auto":
        mode = "online" if wandb_has_credentials() else "offline"
    return "offline" if mode == "dryrun" else mode


def check_wandb_mode(mode: str, setting: str, modes: tuple[str, ...] = ("online", "offline", "auto")) -> None:
    """A ConfigError for a W&B ``mode`` (the value of ``setting``) that is none of ``modes``, or
    online without an API key (wandb would stop at its start with a traceback, or wait for a login
    prompt)."""
    if mode not in modes:
        raise ConfigError(f"{setting} must be {', '.join(modes[:-1])} or {modes[-1]} (online with an API key), "
                          f"got {mode!r}")
    if wandb_mode(mode) == "online" and not wandb_has_credentials():
        given = "WANDB_MODE=online" if os.environ.get("WANDB_MODE") == "online" else f"{setting}=online"
        raise ConfigError(f"{given} needs a W&B API key and none is configured here (WANDB_API_KEY, or "
                          f"`wandb login`); log in, or use {setting}=auto: offline without a key, "
                          f"uploaded later with `wandb sync`")
