"""The best candidates of a beam-search step, found faster on a CPU than by one ``topk``.

Each step of beam search (aiayn.model.search) ranks beam × vocabulary candidates per sentence
(32,000 for the default job's model) and keeps the best 2·beam. torch's CPU ``topk`` spends about
1.7 ns per candidate on that; most candidates are far from the best. Here the candidates are cut
into blocks of equal width, each block's maximum is taken (one vectorised pass), and only the
``count`` blocks with the largest maxima are searched: each of the best ``count`` candidates lies
in one of them (a block left out has ``count`` blocks at least as good before it, and so
``count`` candidates at least as good), so the values found are exactly ``topk``'s. Measured on
one core of an AMD EPYC (2026-11-26): 5.2 → 0.7 ms for 128 sentences of 4 × 8,000 candidates,
56 → 27 µs for one.

Among candidates of exactly equal score, which ids come first is left undefined by ``topk`` too;
there the two may pick differently. On a GPU one ``topk`` is a single kernel and stays.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

# Blocks of a multiple of 16 candidates (a whole number of vector registers, or each block's maximum
# is several times slower to take), 32 to 256 wide, nearest 128 first: wide enough that the maxima
# are few, narrow enough that the blocks searched (count × width) are few. The width divides the
# row, so that the row splits into whole blocks without a copy.
WIDTHS = sorted(range(32, 257, 16), key=lambda width: (abs(width - 128), width))


@functools.lru_cache(maxsize=64)
def block_width(size: int) -> int | None:
    """The block width (see WIDTHS) for rows of ``size`` candidates; None where none divides it."""
    return next((width for width in WIDTHS if size % width == 0), None)


def top_candidates(candidates: Tensor, count: int) -> tuple[Tensor, Tensor]:
    """``candidates.topk(count, dim=-1)`` for ``candidates`` (n, beam·vocab): the ``count`` best
    scores per row, best first, (n, count), and their positions in the row, (n, count)."""
    n, size = candidates.shape
    width = block_width(size)
    if candidates.device.type != "cpu" or width is None or size // width <= 4 * count:
        return candidates.topk(count, dim=-1)
    maxima = candidates.view(n, size // width, width).amax(-1)  # (n, blocks)
    blocks = maxima.topk(count, dim=-1).indices  # (n, count): the blocks holding the best
    # (n, count, 1) · width + (width,) → (n, count·width): the positions of those blocks' candidates
    positions = (blocks.unsqueeze(-1) * width + torch.arange(width, device=candidates.device)).view(n, -1)
    scores, picked = candidates.gather(1, positions).topk(count, dim=-1)  # (n, count) each
    return scores, positions.gather(1, picked)
