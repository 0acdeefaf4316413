"""fairseq 0.12's ``TransformerModel`` as a benchmark peer: built with our sizes and holding a copy of
our weights, so that it computes the very function ours does (§3 of the paper); its
``SequenceGenerator`` is the peer of our beam search.

fairseq is for the benchmarks only, never a dependency of the project, and is not in
pyproject.toml. The maintained sdist ``fairseq-fixed`` builds against the venv's torch without
changing it (``--no-deps``: fairseq's own pins would pull in other torch, hydra-core and omegaconf
versions). Into the project's venv (Python 3.11, torch 2.13.0+cpu, hydra-core 1.3.8, omegaconf
2.3.1), from the checkout:

    .venv/bin/pip freeze | grep -iE '^(torch|hydra-core|omegaconf|numpy)==' > /tmp/keep.txt
    .venv/bin/pip install -c /tmp/keep.txt cython cffi bitarray regex scikit-learn
    .venv/bin/pip install --no-deps --no-build-isolation fairseq-fixed==0.12.3.1

The last step compiles fairseq's extensions (about 3 minutes on 2 cores). fairseq imports without
torchaudio and works with the venv's hydra-core and omegaconf; ``/tmp/keep.txt`` only makes sure
that nothing else replaces them or torch.

Where fairseq's Transformer differs from ours and how each is bridged:

* Vocabulary: a fairseq ``Dictionary`` puts its special symbols first, in the order BOS 0, PAD 1,
  EOS 2, UNK 3; ours are PAD 0, UNK 1, BOS 2, EOS 3 (aiayn.data.subwords). :func:`dictionary`
  builds a Dictionary whose indices are our ids (its four index attributes set to ours), rather
  than permuting the embedding rows: then the peer reads our batches and writes our ids as they
  are, with no mapping of inputs or outputs inside the timed loops.
* Positions: fairseq's sinusoids put all sines before all cosines and use the frequencies
  10000^(-i / (d_model/2 - 1)), where ours interleave them (sin in even, cos in odd dimensions)
  with 10000^(-2i / d_model) (§3.5), so no reordering of d_model turns one into the other. fairseq
  also numbers positions from padding_idx + 1. :class:`OurPositions` replaces ``embed_positions``
  in both stacks: it returns our table, position 0 at the first real token, and for incremental
  decoding the row of the newest position.
* Attention: fairseq's W^Q, W^K, W^V, W^O have biases; ours have none, so they are zero. Its
  heads are d_model / h wide, so d_k = d_v = d_model / h is needed (checked as for the other peers).
* The rest is configured as ours: post-norm (``encoder/decoder_normalize_before`` false, hence no
  final layer norm of either stack), ReLU, embeddings × √d_model (``no_scale_embedding`` false),
  no ``layernorm_embedding``, one embedding matrix for source, target and output projection
  (``share_all_embeddings``), the feed-forward biases and layer norms copied (LayerNorm ε 1e-5
  in both), dropout on the embedding sums and sub-layer outputs, our attention dropout, none
  inside the feed-forward network (``activation_dropout`` 0).
* Inputs: fairseq's sources end with EOS, as ours do. Its datasets left-pad sources by default;
  its model does not need it (padding is masked by token, and :class:`OurPositions` counts real
  tokens), so our right-padded batches go in unchanged. Its decoder input
  (``prev_output_tokens``) is BOS + y[:-1] here, our ``tgt_in``: ``SequenceGenerator`` is told to
  start with our BOS (it starts with EOS otherwise). fairseq zeroes the encoder's inputs at
  padding positions; their outputs are never attended to, in either model.

Search (:func:`fairseq_beam_search`) differs from ours where fairseq's ``SequenceGenerator`` does:

* Length: ours stops each sentence at its own input length (EOS counted) + 50; fairseq's limit
  is max_len_a · src_len + max_len_b for the whole batch, src_len being the padded source length.
  With a = 1, b = 50 that is the batch's longest input + 50 for every sentence: the longest gets
  our limit, the others a longer one. At its limit fairseq forces EOS; ours just stops. fairseq
  caps outputs at max_positions − 1 tokens, ours at max_positions.
* Ranking: fairseq divides a finished hypothesis's log-probability by |Y|^lenpen (|Y| counting
  EOS), not by GNMT's ((5 + |Y|) / 6)^α; lenpen is given α. A sentence ends when beam_size
  hypotheses have finished, where ours ends as soon as no live one can beat its best finished one.
* fairseq never picks PAD (and lets EOS come first only with ``min_len`` 0, set here); ours would
  pick PAD if it were the most probable token, which a trained model never makes it. It also
  averages the last decoder layer's cross-attention weights at every step (for alignments).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import warnings
from types import SimpleNamespace

import torch
from torch import Tensor, nn

from aiayn.export.marian import check_expressible
from aiayn.model import Transformer


class OurPositions(nn.Module):
    """Stands in for fairseq's ``embed_positions``: our sinusoid table (§3.5) with position 0 at
    the first real token, whatever the padding side, and the newest position when decoding
    incrementally (fairseq passes the whole prefix and an ``incremental_state`` then)."""

    def __init__(self, table: Tensor, pad_id: int):
        super().__init__()
        self.register_buffer("table", table.clone(), persistent=False)  # (max_positions, d_model)
        self.pad_id = pad_id
        self.max_positions = table.size(0)  # fairseq reads it for its length limits

    def forward(self, tokens: Tensor, incremental_state=None, timestep=None, positions=None) -> Tensor:
        """tokens: (batch, length) → (batch, length, d_model), or (batch, 1, d_model) for the
        newest position when ``incremental_state`` is given."""
        if incremental_state is not None:  # the prefix holds no padding: its last token is at length - 1
            return self.table[tokens.size(1) - 1].expand(tokens.size(0), 1, -1)  # (batch, 1, d_model)
        real = tokens.ne(self.pad_id)  # (batch, length)
        index = (real.cumsum(1) - 1).clamp(min=0)  # (batch, length): 0 at the first real token
        return self.table[index] * real.unsqueeze(-1)  # (batch, length, d_model), zero at padding


def fairseq_of(model: Transformer, vocab):
    """:func:`fairseq_peer` of ``model`` with ``vocab``'s special ids, or None (with a line saying
    so) where fairseq is not installed: it is a benchmark-only peer."""
    if importlib.util.find_spec("fairseq") is None:
        print("fairseq is not installed: its column is left out (see benchmarks/fairseq_peer.py)", file=sys.stderr)
        return None
    warnings.filterwarnings("ignore", message=".*mismatched key_padding_mask.*")  # fairseq's own masks
    return fairseq_peer(model, bos_id=vocab.bos_id, eos_id=vocab.eos_id, pad_id=vocab.pad_id, unk_id=vocab.unk_id)


def dictionary(vocab_size: int, *, bos_id: int, eos_id: int, pad_id: int, unk_id: int):
    """A fairseq ``Dictionary`` of ``vocab_size`` symbols whose special indices are our ids."""
    from fairseq.data import Dictionary

    special = {bos_id: "<s>", pad_id: "<pad>", eos_id: "</s>", unk_id: "<unk>"}
    vocab = Dictionary()  # its own specials at 0–3 are replaced below
    vocab.symbols = [special.get(i, f"<{i}>") for i in range(vocab_size)]
    vocab.count = [1] * vocab_size
    vocab.indices = {symbol: i for i, symbol in enumerate(vocab.symbols)}
    vocab.bos_index, vocab.eos_index, vocab.pad_index, vocab.unk_index = bos_id, eos_id, pad_id, unk_id
    vocab.nspecial = len(special)
    return vocab


def fairseq_peer(model: Transformer, *, bos_id: int, eos_id: int, pad_id: int, unk_id: int,
                 dropout: float | None = None):
    """A fairseq ``TransformerModel`` of ``model``'s sizes holding a copy of its weights: the same
    function (teacher-forced logits, greedy outputs) once both are in eval mode. ``dropout``
    (default: ``model``'s) is on the embedding sums and sub-layer outputs, as ours."""
    from fairseq.models.transformer import TransformerModel

    sizes = check_expressible(model)  # the limits of benchmarks/peers.py: fairseq's are the same
    if pad_id != model.pad_id:
        raise ValueError(f"pad_id {pad_id} is not the model's ({model.pad_id})")
    attention_dropout = model.encoder_layers[0].self_attention.attention_dropout if sizes["n_layers"] else 0.0
    args = argparse.Namespace(
        encoder_layers=sizes["n_layers"], decoder_layers=sizes["n_layers"],
        encoder_embed_dim=sizes["d_model"], decoder_embed_dim=sizes["d_model"],
        encoder_ffn_embed_dim=sizes["d_ff"], decoder_ffn_embed_dim=sizes["d_ff"],
        encoder_attention_heads=sizes["n_heads"], decoder_attention_heads=sizes["n_heads"],
        encoder_normalize_before=False, decoder_normalize_before=False, activation_fn="relu",
        dropout=model.embedding_dropout.p if dropout is None else dropout,
        attention_dropout=attention_dropout, activation_dropout=0.0,
        share_all_embeddings=True, no_scale_embedding=False, layernorm_embedding=False,
        max_source_positions=sizes["max_positions"], max_target_positions=sizes["max_positions"],
    )
    vocab = dictionary(sizes["vocab_size"], bos_id=bos_id, eos_id=eos_id, pad_id=pad_id, unk_id=unk_id)
    peer = TransformerModel.build_model(args, SimpleNamespace(source_dictionary=vocab, target_dictionary=vocab))
    for stack in (peer.encoder, peer.decoder):
        stack.embed_positions = OurPositions(model.src_positions.table, pad_id)
    _copy_weights(model, peer)
    return peer.train(model.training)


@torch.no_grad()
def _copy_weights(model: Transformer, peer) -> None:
    """Our weights into ``peer`` (built by :func:`fairseq_peer`); its attention biases become zero."""
    peer.encoder.embed_tokens.weight.copy_(model.src_embedding.weight)  # shared by decoder and output
    for ours, theirs in zip(model.encoder_layers, peer.encoder.layers, strict=True):
        _copy_attention(ours.self_attention, theirs.self_attn)
        theirs.self_attn_layer_norm.load_state_dict(ours.residual_1.norm.state_dict())
        theirs.fc1.load_state_dict(ours.feed_forward.w_1.state_dict())
        theirs.fc2.load_state_dict(ours.feed_forward.w_2.state_dict())
        theirs.final_layer_norm.load_state_dict(ours.residual_2.norm.state_dict())
    for ours, theirs in zip(model.decoder_layers, peer.decoder.layers, strict=True):
        _copy_attention(ours.self_attention, theirs.self_attn)
        theirs.self_attn_layer_norm.load_state_dict(ours.residual_1.norm.state_dict())
        _copy_attention(ours.cross_attention, theirs.encoder_attn)
        theirs.encoder_attn_layer_norm.load_state_dict(ours.residual_2.norm.state_dict())
        theirs.fc1.load_state_dict(ours.feed_forward.w_1.state_dict())
        theirs.fc2.load_state_dict(ours.feed_forward.w_2.state_dict())
        theirs.final_layer_norm.load_state_dict(ours.residual_3.norm.state_dict())


def _copy_attention(ours, theirs) -> None:
    for mine, other in ((ours.w_q, theirs.q_proj), (ours.w_k, theirs.k_proj), (ours.w_v, theirs.v_proj),
                        (ours.w_o, theirs.out_proj)):
        other.weight.copy_(mine.weight)
        other.bias.zero_()


def fairseq_logits(peer, src: Tensor, tgt_in: Tensor) -> Tensor:
    """Teacher-forced logits (batch, tgt_len, vocab), as our ``model(src, tgt_in)``: ``src``
    (batch, src_len) right-padded, ending in EOS; ``tgt_in`` (batch, tgt_len) = BOS + y[:-1], fed
    as fairseq's ``prev_output_tokens``. The call is fairseq's own training forward."""
    src_lengths = src.ne(peer.encoder.padding_idx).sum(-1)  # (batch,)
    logits, _ = peer(src, src_lengths, tgt_in)  # (batch, tgt_len, vocab)
    return logits


@torch.no_grad()
def fairseq_beam_search(peer, src: Tensor, *, beam_size: int = 4, alpha: float = 0.6,
                        max_len_offset: int = 50) -> list[list[int]]:
    """fairseq's ``SequenceGenerator`` on ``src`` (batch, src_len), right-padded with PAD and
    ending in EOS: the best hypothesis per sentence as token ids without BOS/EOS.

    Its limit is the batch's longest input (EOS counted) + ``max_len_offset`` for every sentence
    (max_len_a 1, max_len_b the offset); its length normalisation is score / |Y|^α (lenpen α), not
    GNMT's; see the module docstring for how that and the rest differ from our ``beam_search``.
    Like every ``SequenceGenerator``, it puts ``peer`` in eval mode."""
    from fairseq.sequence_generator import SequenceGenerator

    vocab = peer.decoder.dictionary
    generator = SequenceGenerator([peer], vocab, beam_size=beam_size, max_len_a=1, max_len_b=max_len_offset,
                                  min_len=0, len_penalty=alpha)
    src_lengths = src.ne(vocab.pad()).sum(-1)  # (batch,)
    sample = {"net_input": {"src_tokens": src, "src_lengths": src_lengths}}
    hypotheses = generator.generate([peer], sample, bos_token=vocab.bos())
    best = [sentence[0]["tokens"].tolist() for sentence in hypotheses]  # each ends in EOS
    return [ids[:-1] if ids and ids[-1] == vocab.eos() else ids for ids in best]


def fairseq_greedy(peer, src: Tensor, *, max_len_offset: int = 50) -> list[list[int]]:
    """Greedy decoding (``SequenceGenerator`` with beam 1) on ``src`` (batch, src_len); as
    :func:`fairseq_beam_search`, every sentence may run to the batch's longest input + offset."""
    return fairseq_beam_search(peer, src, beam_size=1, alpha=0.0, max_len_offset=max_len_offset)
