"""Attention maps of one translated sentence (the paper's Figures 3–5) and the sinusoidal
positional encoding (§3.5), as PNG files.

    maps = attention_maps(model, vocab, "A man is riding a bike.", decoding)
    paths = draw_attention(maps, "attention/")   # encoder_self_layer1.png, …, cross_layerN.png

The source is encoded (its subword ids + EOS) and translated with beam search; then one
teacher-forced pass over BOS + the hypothesis gives every layer's and head's encoder
self-attention, decoder (masked) self-attention and encoder-decoder attention. Decoder rows are
the decoder's input positions: row i sits on token i of BOS + hypothesis and predicts token i+1
(the last row predicts EOS).

Drawing uses matplotlib's Agg canvas on plain ``Figure`` objects, never pyplot: no global figure
state, nothing to close, usable from threads and from a training process alike.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch import Tensor

from aiayn.data.subwords import Subwords
from aiayn.decoding.search import Search
from aiayn.decoding.settings import Decoding
from aiayn.errors import ConfigError
from aiayn.model.positional import sinusoidal_table
from aiayn.model.transformer import Transformer

if TYPE_CHECKING:
    from aiayn.decoding.translator import RawTextForm

log = logging.getLogger(__name__)

DPI = 100
PANEL_INCHES = 4.0  # one head's panel; at most MAX_COLUMNS of them side by side
MAX_COLUMNS = 4  # so a figure is at most 1600 px wide
TITLE_INCHES = 0.6  # the figure title above the panels
KINDS = {  # file stem: (title, AttentionMaps field, whether its keys are source positions)
    "encoder_self": ("encoder self-attention", "encoder_self", True),
    "decoder_self": ("decoder self-attention", "decoder_self", False),
    "cross": ("encoder-decoder attention", "cross", True),
}


@dataclass
class AttentionMaps:
    """Every attention weight of one sentence pair; weight tensors are float32 on the CPU.

    ``encoder_self``: (layers, heads, S, S); ``decoder_self``: (layers, heads, T, T), zero above
    the diagonal; ``cross``: (layers, heads, T, S). Rows are queries, columns keys, each row
    sums to 1. S counts the source pieces and EOS, T counts BOS and the hypothesis pieces.
    """

    source: str
    translation: str
    src_pieces: list[str]  # the source's subword pieces, then "</s>"
    tgt_pieces: list[str]  # "<s>", then the hypothesis' pieces (the decoder's inputs)
    encoder_self: Tensor
    decoder_self: Tensor
    cross: Tensor

    @property
    def n_layers(self) -> int:
        return self.encoder_self.size(0)

    @property
    def n_heads(self) -> int:
        return self.encoder_self.size(1)


@torch.no_grad()
def attention_maps(model: Transformer, vocab: Subwords, text: str, decoding: Decoding | dict[str, Any],
                   constraint: Any = None, raw_text: RawTextForm | None = None) -> AttentionMaps:
    """Translate ``text`` with beam search (``decoding``: the decoding settings, as a checkpoint
    holds them; ``constraint``: the task's output constraint, a parser's trees) and collect the attention weights of the teacher-forced pass over BOS + the
    translation. ``raw_text`` (a parser's: the task's own reading of a line and writing of its
    output) encodes ``text`` and writes the translation, as translate.py does (a tree over the
    line's words; a repair said in a warning); None: encoded and decoded as text. The model runs
    in eval mode (dropout off) and is left in the mode it was in."""
    device = next(model.parameters()).device
    src_ids = (raw_text or vocab).encode([text])[0] + [vocab.eos_id]
    if len(src_ids) > model.max_positions:
        raise ConfigError(
            f"text: the sentence has {len(src_ids)} subword tokens with EOS, more than the model's "
            f"max_positions={model.max_positions} cover; give a shorter text (at most {model.max_positions - 1} subwords)"
        )
    src = torch.tensor([src_ids], dtype=torch.long, device=device)
    was_training = model.training
    model.eval()
    try:
        hypothesis = Search(decoding, vocab, constraint).fitting(model).best(model, src)[0]
        hypothesis = hypothesis[: model.max_positions - 1]  # BOS + hypothesis must fit the positions
        tgt_in = torch.tensor([[vocab.bos_id] + hypothesis], dtype=torch.long, device=device)
        memory, src_mask, encoder_weights = model.encode(src, return_weights=True)
        _, _, decoder_weights = model.decode(tgt_in, model.start_decoding(memory, src_mask), return_weights=True)
    finally:
        model.train(was_training)

    def stack(weights: list[Tensor | None]) -> Tensor:  # per layer (1, h, q, k) → (layers, h, q, k)
        return torch.stack([w[0] for w in weights]).float().cpu()

    translation, repaired = raw_text.output(text, hypothesis) if raw_text is not None else (
        vocab.decode([hypothesis])[0], None)
    if repaired is not None:
        log.warning("text: %s", repaired)
    return AttentionMaps(
        source=text,
        translation=translation,
        src_pieces=vocab.pieces(src_ids),
        tgt_pieces=vocab.pieces([vocab.bos_id] + hypothesis),
        encoder_self=stack([w.self_attention for w in encoder_weights]),
        decoder_self=stack([w.self_attention for w in decoder_weights]),
        cross=stack([w.cross_attention for w in decoder_weights]),
    )


def attention_figure_size(n_heads: int) -> tuple[int, int]:
    """(width, height) in pixels of one :func:`draw_attention` picture of ``n_heads`` panels."""
    columns = min(n_heads, MAX_COLUMNS)
    rows = math.ceil(n_heads / columns)
    return round(columns * PANEL_INCHES * DPI), round((rows * PANEL_INCHES + TITLE_INCHES) * DPI)


def paper_layer(n_layers: int) -> int:
    """The layer the paper's Figures 3–5 show, counted from 1: "layer 5 of 6", the next to last
    (the only one of a one-layer model)."""
    return max(1, n_layers - 1)


def draw_attention(maps: AttentionMaps, out_dir: str | os.PathLike, layers: Sequence[int] | None = None) -> list[Path]:
    """One PNG per layer and kind, a panel per head, into ``out_dir`` (created if missing):
    ``encoder_self_layer{L}.png``, ``decoder_self_layer{L}.png``, ``cross_layer{L}.png`` with L
    counted from 1; ``layers`` (counted from 1) picks some, None draws every one. Returns their
    paths, encoder self-attention first, each kind by layer."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    caption = _shorten(f"{maps.source}  →  {maps.translation or '(empty translation)'}", 140)
    paths = []
    for stem, (title, field, keys_are_source) in KINDS.items():
        weights = getattr(maps, field)
        row_labels = maps.src_pieces if field == "encoder_self" else maps.tgt_pieces
        column_labels = maps.src_pieces if keys_are_source else maps.tgt_pieces
        for layer in range(weights.size(0)):
            if layers is not None and layer + 1 not in layers:
                continue
            path = out_dir / f"{stem}_layer{layer + 1}.png"
            _draw_heads(weights[layer], row_labels, column_labels, f"{title}, layer {layer + 1}\n{caption}", path)
            paths.append(path)
    return paths


def _draw_heads(weights: Tensor, row_labels: list[str], column_labels: list[str], title: str, path: Path) -> None:
    n_heads = weights.size(0)
    width, height = attention_figure_size(n_heads)
    figure = Figure(figsize=(width / DPI, height / DPI), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    columns = min(n_heads, MAX_COLUMNS)
    axes = figure.subplots(math.ceil(n_heads / columns), columns, squeeze=False)
    font = max(3.0, min(9.0, 190.0 / max(len(row_labels), len(column_labels))))
    rows_text, columns_text = _labels(row_labels), _labels(column_labels)
    image = None
    last_row = math.ceil(n_heads / columns) - 1
    for head, ax in enumerate(axes.flat):
        if head >= n_heads:
            ax.set_axis_off()
            continue
        image = ax.imshow(weights[head].numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto",
                          interpolation="nearest")
        # The heads of a layer share their pieces: labelled once, along the left and the bottom
        # (each panel's own labels made a big model's 18 pictures take minutes to lay out).
        row, column = divmod(head, columns)
        below = row == last_row or head + columns >= n_heads
        if below:
            ax.set_xticks(range(len(columns_text)), labels=columns_text, rotation=90, fontsize=font)
        else:
            ax.set_xticks([])
        if column == 0:
            ax.set_yticks(range(len(rows_text)), labels=rows_text, fontsize=font)
        else:
            ax.set_yticks([])
        ax.tick_params(length=0)
        ax.set_title(f"head {head + 1}", fontsize=10)
    figure.suptitle(_escape(title), fontsize=11)
    figure.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    figure.savefig(path, dpi=DPI, pil_kwargs={"compress_level": 1})  # a fast PNG: 18 of them for a run


def draw_positional_encoding(d_model: int, max_positions: int, path: str | os.PathLike) -> Path:
    """The sinusoidal table of §3.5 (``max_positions`` × ``d_model``) as a heatmap PNG at ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = sinusoidal_table(max_positions, d_model).numpy()
    figure = Figure(figsize=(10, 5.5), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    ax = figure.subplots()
    image = ax.imshow(table, cmap="RdBu_r", vmin=-1.0, vmax=1.0, aspect="auto", interpolation="nearest")
    ax.set_xlabel("dimension (even: sin, odd: cos)")
    ax.set_ylabel("position")
    ax.set_title(f"sinusoidal positional encoding, d_model={d_model}, positions 0–{max_positions - 1}")
    figure.colorbar(image, ax=ax, label="PE(pos, i)")
    figure.savefig(path, dpi=DPI)
    return path


def _labels(pieces: list[str]) -> list[str]:
    return [_escape(piece) for piece in pieces]


def _escape(text: str) -> str:
    """Keep matplotlib from reading ``$…$`` in a sentence as mathtext."""
    return text.replace("$", r"\$")


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
