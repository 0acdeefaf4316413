"""aiayn: the Transformer of "Attention Is All You Need".

From Python (docs/python.md)::

    import aiayn

    model = aiayn.load("run/checkpoints/last.ckpt")   # aiayn.pretrained: translate.py's loading
    model.translate(["A man is riding a bike."])       # the checkpoint's beam search (§6.1)
    net = aiayn.Transformer(1000, 1000, n_layers=2)    # the bare network, plain torch.nn (aiayn.model)

The names are imported on first use: ``import aiayn`` alone imports nothing of torch, so that the
tools start without it.
"""

from __future__ import annotations

from aiayn._lazy import lazy_exports

_EXPORTS = {"load": "pretrained", "Pretrained": "pretrained", "Transformer": "model"}
__all__ = sorted(_EXPORTS)  # noqa: PLE0605  the lazily imported names above, one list of them
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
