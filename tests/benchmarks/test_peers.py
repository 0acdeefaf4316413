"""The peers of benchmarks/side_by_side.py compute our function once our weights are copied in:
teacher-forced logits agree and greedy outputs are identical (torch.nn.Transformer, MarianMT)."""

from __future__ import annotations

import sys

import pytest
import torch

from aiayn.model import Transformer, greedy_search
from tests.helpers import peer_models
from tests.helpers.peer_models import BOS, EOS, PAD
from tests.helpers.runs import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import peers

pytestmark = pytest.mark.usefixtures("single_thread")

V = 40
TINY = {"n_layers": 2, "d_model": 32, "d_ff": 64, "n_heads": 4, "d_k": 8, "d_v": 8, "dropout": 0.1, "max_positions": 64}


def random_model(seed: int) -> Transformer:
    return peer_models.random_model(seed, V, **TINY)


def ragged_batch(lengths: list[int], seed: int, tgt: bool = False) -> torch.Tensor:
    return peer_models.ragged_batch(lengths, seed, V, tgt)


SRC_LENGTHS = [6, 11, 3, 9]
TGT_LENGTHS = [8, 5, 12, 7]


# nn.Transformer's inference fast path packs the padded source as a nested tensor, and says that API
# is a prototype; the benchmark runs the peer as it is, and silences the notice as well (side_by_side.py).
@pytest.mark.filterwarnings("ignore:.*nested tensors.*:UserWarning")
def test_torch_transformer_logits_match():
    model = random_model(0)
    peer = peers.copy_to_torch(model, peers.torch_peer(model)).eval()
    src, tgt_in = ragged_batch(SRC_LENGTHS, 1), ragged_batch(TGT_LENGTHS, 2, tgt=True)
    with torch.no_grad():
        ours, theirs = model(src, tgt_in), peer(src, tgt_in)
    real = tgt_in != PAD
    torch.testing.assert_close(theirs[real], ours[real], rtol=1e-4, atol=1e-4)
    # A peer with its own random weights computes something else: the copy is what makes them equal.
    with torch.no_grad():
        assert not torch.allclose(peers.torch_peer(model).eval()(src, tgt_in)[real], ours[real], atol=1e-2)


def test_marian_logits_match():
    model = random_model(3)
    peer = peers.copy_to_marian(model, peers.marian_peer(model, bos_id=BOS, eos_id=EOS)).eval()
    src, tgt_in = ragged_batch(SRC_LENGTHS, 4), ragged_batch(TGT_LENGTHS, 5, tgt=True)
    with torch.no_grad():
        ours = model(src, tgt_in)
        theirs = peer(**peers.marian_inputs(src, PAD), decoder_input_ids=tgt_in).logits
    real = tgt_in != PAD
    torch.testing.assert_close(theirs[real], ours[real], rtol=1e-4, atol=1e-4)


def test_positions_differ_in_layout_and_are_replaced():
    """Marian's own table puts sines then cosines; ours interleaves them (§3.5)."""
    model = random_model(0)
    fresh = peers.marian_peer(model, bos_id=BOS, eos_id=EOS)
    table = model.src_positions.table[:TINY["max_positions"]]
    own = fresh.model.encoder.embed_positions.weight
    assert not torch.allclose(own, table, atol=1e-3)
    torch.testing.assert_close(own[:, : TINY["d_model"] // 2], table[:, 0::2], rtol=1e-4, atol=1e-4)
    copied = peers.copy_to_marian(model, fresh)  # Marian's table stays; the copy reorders d_model to its layout
    order = peers.marian.marian_order(TINY["d_model"])
    torch.testing.assert_close(copied.model.decoder.embed_positions.weight, table[:, order], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_outputs_identical(seed):
    model = random_model(seed)
    lengths = [5, 9, 2, 7, 12][: 3 + seed]
    src = ragged_batch(lengths, 10 + seed)
    offset = 6
    ours = greedy_search(model, src, bos_id=BOS, eos_id=EOS, max_len_offset=offset)

    torch_peer = peers.copy_to_torch(model, peers.torch_peer(model)).eval()
    assert peers.torch_greedy(torch_peer, src, bos_id=BOS, eos_id=EOS, max_len_offset=offset) == ours

    marian = peers.copy_to_marian(model, peers.marian_peer(model, bos_id=BOS, eos_id=EOS)).eval()
    theirs = peers.marian_generate(marian, src, pad_id=PAD, max_len_offset=offset, num_beams=1)
    # Marian runs every sentence to the batch's longest limit; ours stops each at its own.
    assert [h[: n + offset] for h, n in zip(theirs, lengths)] == ours
    assert sum(map(len, ours)) > len(lengths)  # real outputs, not all empty


def test_peers_refuse_what_they_cannot_mirror():
    torch.manual_seed(0)
    with pytest.raises(ValueError, match="d_k = d_v = d_model / h"):
        peers.torch_peer(Transformer(V, V, **{**TINY, "d_k": 4}))
    # separate embeddings are Marian's untied ones (aiayn.export.marian), each vocabulary its size
    separate = peers.marian_peer(Transformer(V, V + 1, **TINY, share_embeddings=False), bos_id=BOS, eos_id=EOS)
    assert separate.lm_head.out_features == V + 1 and not separate.config.tie_word_embeddings
