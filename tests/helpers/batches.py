"""Random padded batches shaped as the data pipeline makes them, and the measures of closeness that
the comparisons of a fast path with the plain one use."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor


def padded_batch(vocab_size: int, src_lengths: Sequence[int], tgt_lengths: Sequence[int], *, seed: int,
                 pad_id: int = 0, bos_id: int = 2, eos_id: int = 3,
                 device: torch.device | str = "cpu") -> dict[str, Tensor]:
    """A batch as TranslationCollator makes it (source + EOS, BOS + target, target + EOS, padded with
    ``pad_id``) of random tokens above the special ids; drawn on the CPU from ``seed``, so the same
    on every device, then moved to ``device``."""
    generator = torch.Generator().manual_seed(seed)
    size, src_len, tgt_len = len(src_lengths), max(src_lengths) + 1, max(tgt_lengths) + 1
    first = max(pad_id, bos_id, eos_id) + 1
    src = torch.full((size, src_len), pad_id)
    tgt_in, tgt_out = torch.full((size, tgt_len), pad_id), torch.full((size, tgt_len), pad_id)
    for row, (s, t) in enumerate(zip(src_lengths, tgt_lengths)):
        src[row, :s] = torch.randint(first, vocab_size, (s,), generator=generator)
        src[row, s] = eos_id
        target = torch.randint(first, vocab_size, (t,), generator=generator)
        tgt_in[row, 0], tgt_in[row, 1 : t + 1] = bos_id, target
        tgt_out[row, :t], tgt_out[row, t] = target, eos_id
    return {"src": src.to(device), "tgt_in": tgt_in.to(device), "tgt_out": tgt_out.to(device)}


def relative_error(value: Tensor, reference: Tensor) -> float:
    """‖value − reference‖ / ‖reference‖, both taken in float64."""
    value, reference = value.detach().double(), reference.detach().double()
    return float((value - reference).norm() / reference.norm())


def cosine(value: Tensor, reference: Tensor) -> float:
    """The cosine similarity of the two tensors as flat vectors, in float64."""
    value, reference = value.detach().double().flatten(), reference.detach().double().flatten()
    return float(value @ reference / (value.norm() * reference.norm()))


def flat(tensors: Iterable[Tensor]) -> Tensor:
    """The tensors, each flattened, in one vector (a model's whole gradient, say)."""
    return torch.cat([tensor.detach().flatten() for tensor in tensors])
