"""How ``compile=true`` compiles the network for training (``compile_mode``): torch.compile's
arguments, and which modes replay CUDA graphs."""

from __future__ import annotations

from typing import Any

# compile_mode's values; those that replay CUDA graphs.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs", "cudagraphs")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune", "cudagraphs")


def compile_options(mode: str) -> dict[str, Any]:
    """torch.compile's arguments for a ``compile_mode``: inductor in that mode, or for
    ``cudagraphs`` torch's CUDA-graph backend (no code generation: the eager kernels, replayed)."""
    if mode == "cudagraphs":
        return {"backend": "cudagraphs"}
    return {} if mode == "default" else {"mode": mode}
