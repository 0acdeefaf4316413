"""Random models and batches for the tests of the benchmarks' peers (benchmarks/peers.py,
benchmarks/fairseq_peer.py), which copy our weights into another implementation."""

from __future__ import annotations

import torch

from aiayn.model import Transformer

PAD, UNK, BOS, EOS = 0, 1, 2, 3  # aiayn.data.subwords


def random_model(seed: int, vocab_size: int, **sizes) -> Transformer:
    """A Transformer of ``sizes`` in eval mode, its layer-norm gains and all biases random too, so
    that a peer's copy of every one of them is tested."""
    torch.manual_seed(seed)
    model = Transformer(vocab_size, vocab_size, **sizes).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0, 0.1)
            elif isinstance(module, torch.nn.Linear) and module.bias is not None:
                module.bias.normal_(0, 0.1)
    return model


def ragged_batch(lengths: list[int], seed: int, vocab_size: int, tgt: bool = False) -> torch.Tensor:
    """(len(lengths), max(lengths)) random ids, right-padded: sources end in EOS, targets
    (BOS + y[:-1]) start with BOS."""
    g = torch.Generator().manual_seed(seed)
    batch = torch.full((len(lengths), max(lengths)), PAD)
    for i, n in enumerate(lengths):
        batch[i, :n] = torch.randint(4, vocab_size, (n,), generator=g)
        batch[i, 0 if tgt else n - 1] = BOS if tgt else EOS
    return batch
