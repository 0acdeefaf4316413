"""Lazy re-exports for ``aiayn`` itself and the data packages: a name is imported from its
submodule on first use, so that importing a light module (e.g. ``aiayn.data.readers``) does not
import Lightning, nor ``import aiayn`` torch."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package`` that serve each name of
    ``exports`` from its submodule (``{name: submodule}``, relative to ``package``)."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{exports[name]}"), name)

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
