"""The packages an engine needs beyond torch, each asked for in one line that says how to
install it: transformers and CTranslate2 (the exports and engine=ctranslate2), ONNX Runtime
(onnxruntime=true)."""

from __future__ import annotations

import importlib

from aiayn.errors import ConfigError

SERVE_EXTRA = "pip install 'aiayn[serve]'"


def require(module: str):
    """Import ``module`` (``transformers``, ``ctranslate2``), or say in one line how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"exporting and serving need the {module} package, which is not installed; "
                          f"{SERVE_EXTRA}") from None


NEEDS = "onnxruntime=true needs ONNX Runtime and torch's ONNX exporter: pip install 'aiayn[onnx]' (onnx, onnxscript, onnxruntime)"


def require_onnxruntime() -> None:
    """A ConfigError in one line when ONNX Runtime or the exporter's packages are missing."""
    try:
        import onnxruntime  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        raise ConfigError(NEEDS) from None
