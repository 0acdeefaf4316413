"""benchmarks/fairseq_peer.py: fairseq's TransformerModel holding a copy of our weights computes our
function (teacher-forced logits and gradients agree, greedy outputs are identical), and its
SequenceGenerator returns one clean hypothesis per sentence. Skipped where fairseq is not
installed (it is a benchmark-only peer; the module docstring says how to install it)."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch

from aiayn.model import Transformer, greedy_search
from tests.helpers import peer_models
from tests.helpers.peer_models import BOS, EOS, PAD, UNK  # fairseq's own order is BOS, PAD, EOS, UNK
from tests.helpers.runs import REPO

pytest.importorskip("fairseq")
sys.path.insert(0, str(REPO / "benchmarks"))
fairseq_peer = importlib.import_module("fairseq_peer")

pytestmark = [
    pytest.mark.usefixtures("single_thread"),
    # fairseq's decoder passes a bool padding mask with a float causal mask to torch's attention
    pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask and attn_mask"),
]

IDS = {"bos_id": BOS, "eos_id": EOS, "pad_id": PAD, "unk_id": UNK}
V = 50
SMALL = {"n_layers": 2, "d_model": 64, "d_ff": 128, "n_heads": 4, "d_k": 16, "d_v": 16, "dropout": 0.0,
         "max_positions": 128}


def random_model(seed: int) -> Transformer:
    return peer_models.random_model(seed, V, **SMALL)


def ragged_batch(lengths: list[int], seed: int, tgt: bool = False) -> torch.Tensor:
    return peer_models.ragged_batch(lengths, seed, V, tgt)


def left_padded(batch: torch.Tensor) -> torch.Tensor:
    """The same sentences with their padding moved to the left (fairseq's default for sources)."""
    out = torch.full_like(batch, PAD)
    for i, row in enumerate(batch):
        real = row[row != PAD]
        out[i, batch.size(1) - real.numel():] = real
    return out


SRC_LENGTHS = [6, 11, 3, 9]
TGT_LENGTHS = [8, 5, 12, 7]


def test_dictionary_uses_our_ids():
    vocab = fairseq_peer.dictionary(V, **IDS)
    assert (vocab.pad(), vocab.unk(), vocab.bos(), vocab.eos(), len(vocab)) == (PAD, UNK, BOS, EOS, V)


def test_logits_match():
    model = random_model(0)
    peer = fairseq_peer.fairseq_peer(model, **IDS)
    assert not peer.training
    src, tgt_in = ragged_batch(SRC_LENGTHS, 1), ragged_batch(TGT_LENGTHS, 2, tgt=True)
    with torch.no_grad():
        ours = model(src, tgt_in)
        theirs = fairseq_peer.fairseq_logits(peer, src, tgt_in)
        # Left padding (fairseq's default) changes nothing: positions count real tokens.
        theirs_left = fairseq_peer.fairseq_logits(peer, left_padded(src), tgt_in)
    real = tgt_in != PAD
    assert theirs.shape == ours.shape == (len(TGT_LENGTHS), max(TGT_LENGTHS), V)
    torch.testing.assert_close(theirs[real], ours[real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(theirs_left[real], ours[real], rtol=1e-5, atol=1e-5)


def test_without_our_positions_the_function_differs():
    """fairseq's own sinusoids (another layout and frequencies, offset positions) are not ours:
    replacing them is what makes the logits equal."""
    from fairseq.modules import SinusoidalPositionalEmbedding

    model = random_model(1)
    peer = fairseq_peer.fairseq_peer(model, **IDS)
    for stack in (peer.encoder, peer.decoder):
        stack.embed_positions = SinusoidalPositionalEmbedding(SMALL["d_model"], PAD, SMALL["max_positions"] + PAD + 1)
    src, tgt_in = ragged_batch(SRC_LENGTHS, 3), ragged_batch(TGT_LENGTHS, 4, tgt=True)
    with torch.no_grad():
        ours, theirs = model(src, tgt_in), fairseq_peer.fairseq_logits(peer, src, tgt_in)
    real = tgt_in != PAD
    assert not torch.allclose(theirs[real], ours[real], atol=1e-2)


def test_gradients_match():
    """One training step's gradients agree (loss over real target tokens), so the peer's training
    step does the same work on the same function."""
    model = random_model(2)
    peer = fairseq_peer.fairseq_peer(model, **IDS)
    src, tgt = ragged_batch(SRC_LENGTHS, 5), ragged_batch(TGT_LENGTHS, 6, tgt=True)
    tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
    for module, logits in ((model, model(src, tgt_in)), (peer, fairseq_peer.fairseq_logits(peer, src, tgt_in))):
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD).backward()
    torch.testing.assert_close(peer.encoder.embed_tokens.weight.grad, model.src_embedding.weight.grad,
                               rtol=1e-4, atol=1e-5)
    ours, theirs = model.decoder_layers[0].cross_attention.w_k.weight, peer.decoder.layers[0].encoder_attn.k_proj.weight
    torch.testing.assert_close(theirs.grad, ours.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_outputs_identical(seed):
    model = random_model(seed)
    peer = fairseq_peer.fairseq_peer(model, **IDS)
    lengths = [5, 9, 2, 7, 12, 4][: 3 + seed]
    src = ragged_batch(lengths, 10 + seed)
    offset = 6
    ours = greedy_search(model, src, bos_id=BOS, eos_id=EOS, max_len_offset=offset)
    assert all(PAD not in h for h in ours)  # fairseq never picks PAD; ours would if it were the argmax
    theirs = fairseq_peer.fairseq_greedy(peer, src, max_len_offset=offset)
    # fairseq runs every sentence to the batch's longest limit; ours stops each at its own.
    assert len(theirs[lengths.index(max(lengths))]) <= max(lengths) + offset
    assert [h[: n + offset] for h, n in zip(theirs, lengths)] == ours
    assert sum(map(len, ours)) > len(lengths)  # real outputs, not all empty


def test_beam_search_one_clean_hypothesis_per_sentence():
    model = random_model(4)
    peer = fairseq_peer.fairseq_peer(model, **IDS)
    lengths = [7, 3, 10, 5]
    offset = 8
    hypotheses = fairseq_peer.fairseq_beam_search(peer, ragged_batch(lengths, 20), beam_size=4, alpha=0.6,
                                                  max_len_offset=offset)
    assert len(hypotheses) == len(lengths)
    for h in hypotheses:
        assert all(isinstance(t, int) and 0 <= t < V for t in h)
        assert not {PAD, BOS, EOS} & set(h)
        assert len(h) <= max(lengths) + offset


def test_refuses_what_it_cannot_mirror():
    torch.manual_seed(0)
    with pytest.raises(ValueError, match="d_k = d_v = d_model / h"):
        fairseq_peer.fairseq_peer(Transformer(V, V, **{**SMALL, "d_k": 8}), **IDS)
