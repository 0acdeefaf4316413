"""Loading a trained model back from a Lightning checkpoint written by src/train.py.

A checkpoint holds the model weights, the module's hyper-parameters (model config, vocabulary
size, decoding settings and the run's whole resolved config) and the serialized subword model,
so nothing else is needed to translate with it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from aiayn.data.readers import DataError
from aiayn.data.subwords import Subwords
from aiayn.model import Transformer
from aiayn.training.module import TranslationModule


@dataclass
class TrainedModel:
    model: Transformer  # in eval mode
    vocab: Subwords
    decoding: dict[str, Any]  # beam_size, alpha, max_len_offset
    config: dict[str, Any]  # the training run's resolved config ({} for old checkpoints)
    module: TranslationModule
    step: int


def read_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """The raw checkpoint dict, with a clear error for a missing or foreign file."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: checkpoint not found")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:  # torch raises several kinds for a file that is not a checkpoint
        raise DataError(f"{path}: not a readable checkpoint ({type(error).__name__}: {error})") from None
    missing = [key for key in ("state_dict", "hyper_parameters", "subwords") if key not in checkpoint]
    if missing:
        raise DataError(f"{path}: not an aiayn training checkpoint (no {', '.join(missing)})")
    return checkpoint


def load_trained(path: str | os.PathLike, map_location: str | torch.device = "cpu",
                 state_dict: dict[str, torch.Tensor] | None = None) -> TrainedModel:
    """Rebuild the module from ``path`` (with ``state_dict``'s weights instead, if given: an
    average of several checkpoints, say) on ``map_location`` ("auto": a GPU if there is one)."""
    if map_location == "auto":
        map_location = "cuda" if torch.cuda.is_available() else "cpu"
    checkpoint = read_checkpoint(path)
    module = TranslationModule(**checkpoint["hyper_parameters"])
    module.load_state_dict(state_dict if state_dict is not None else checkpoint["state_dict"])
    module.to(map_location).eval()
    return TrainedModel(
        model=module.model,
        vocab=Subwords(proto=checkpoint["subwords"]),
        decoding=dict(module.decoding),
        config=dict(checkpoint["hyper_parameters"].get("run_config") or {}),
        module=module,
        step=int(checkpoint.get("global_step", 0)),
    )
