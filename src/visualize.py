"""Draw a trained model's attention maps (the paper's Figures 3–5) for one sentence:
`python src/visualize.py ckpt=<checkpoint> [text="A man is riding a bike."] [out=<dir>]`.

Translates the sentence with the checkpoint's beam-search settings, writes one PNG per layer
and kind (encoder self-attention, decoder self-attention, encoder-decoder attention) into
``out`` (default ``<ckpt dir>/../attention``) and prints their paths, one a line.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import hydra
from omegaconf import DictConfig


def fail(message: str) -> NoReturn:
    print(f"visualize.py: {message}", file=sys.stderr)
    sys.exit(2)


@hydra.main(version_base="1.3", config_path="../conf", config_name="visualize")
def main(cfg: DictConfig) -> None:
    if not cfg.ckpt:
        fail("no checkpoint given; run it as `python src/visualize.py ckpt=<checkpoint file>`")
    ckpt = Path(cfg.ckpt).absolute()
    if not ckpt.is_file():  # before the slow imports (torch, Lightning, matplotlib)
        fail(f"{ckpt}: checkpoint not found")
    from aiayn.analysis import attention_maps, draw_attention, draw_positional_encoding
    from aiayn.data.readers import DataError
    from aiayn.training.checkpoint import load_trained

    try:
        trained = load_trained(ckpt, map_location=cfg.device)
    except DataError as error:
        fail(str(error))
    out = Path(cfg.out) if cfg.out else ckpt.parent.parent / "attention"
    maps = attention_maps(trained.model, trained.vocab, str(cfg.text), trained.decoding)
    paths = draw_attention(maps, out)
    if cfg.positional_encoding:
        paths.append(draw_positional_encoding(trained.model.d_model, cfg.positional_encoding_positions,
                                              out / "positional_encoding.png"))
    print(f"{maps.source} → {maps.translation or '(empty translation)'}", file=sys.stderr)
    for path in paths:
        print(path)


if __name__ == "__main__":
    main()
