"""Our Transformer as a Hugging Face ``MarianMTModel``: the configuration and an exact mapping of
the weights, so that the reloaded model computes the very function ours does.

MarianMT is the same architecture as ours (post-norm §3.1, embeddings × √d_model shared with the
pre-softmax projection §3.4, ReLU feed-forward, fixed sinusoids §3.5), with three differences, each
bridged exactly:

* **Biases.** Its attention projections and its output (``final_logits_bias``) have biases; ours
  have none, so they are zero.
* **The layout of the sinusoids.** Ours interleave them (dimension 2i a sine, 2i+1 the cosine of
  the same frequency); Marian's table puts all sines in the first half of d_model and the cosines
  in the second, and it recomputes that table whenever a model is loaded. So the table cannot be
  copied; instead the d_model axis of every weight is permuted (:func:`marian_order`) so that our
  dimension 2i becomes Marian's i and 2i+1 becomes d_model/2 + i. Embedding sums, residual sums,
  LayerNorm (a mean and variance over d_model, gains and biases permuted with it), attention
  (its input projections read d_model, its output projection writes it) and the tied output
  projection are all unchanged by one consistent permutation of d_model, so the logits are ours.
* **Separate embeddings** (``model.share_embeddings=false``, no paper setting) become Marian's own
  embedding of each stack and an output projection holding the target embedding's values
  (``share_encoder_decoder_embeddings`` and ``tie_word_embeddings`` false), each with d_model
  reordered the same way.
* **The decoder's first token.** Marian's checkpoints start the decoder with the pad id; ours
  starts it with BOS, which the configuration says (``decoder_start_token_id``).

What Marian cannot hold is refused by :func:`check_expressible`, naming the setting.
"""

from __future__ import annotations

import torch
from torch import Tensor

from aiayn.decoding.packages import require
from aiayn.errors import ConfigError
from aiayn.model import Transformer


def model_sizes(model: Transformer) -> dict[str, int]:
    """The sizes of ``model`` that Marian needs: vocabulary, N, d_model, d_ff, h, d_k, d_v, positions."""
    layer = model.encoder_layers[0]
    attention = layer.self_attention
    return {
        "vocab_size": model.src_embedding.weight.size(0),
        "tgt_vocab_size": model.tgt_embedding.weight.size(0),
        "n_layers": len(model.encoder_layers),
        "d_model": model.d_model,
        "d_ff": layer.feed_forward.w_1.out_features,
        "n_heads": attention.n_heads,
        "d_k": attention.d_k,
        "d_v": attention.d_v,
        "max_positions": model.max_positions,
    }


def check_expressible(model: Transformer, where: str = "the model") -> dict[str, int]:
    """``model``'s sizes, or a :class:`ConfigError` naming the setting MarianMT cannot express:
    learned positions
    (``model.positional=learned``: Marian recomputes fixed sinusoids on loading), heads whose
    d_k, d_v are not d_model / h (Marian's heads are d_model / h wide, for keys and values alike),
    or restricted self-attention (``model.attention_window``: Marian always attends to every position)."""
    if model.src_positions is not model.tgt_positions or hasattr(model.src_positions, "embedding"):
        raise ConfigError(f"{where} was trained with model.positional=learned; MarianMT recomputes fixed sinusoids "
                          "when it loads a model and cannot hold learned positions: export a model trained with "
                          "model.positional=sinusoidal")
    if getattr(model, "attention_window", None) is not None:
        raise ConfigError(f"{where} was trained with model.attention_window={model.attention_window} (self-attention "
                          "restricted to a neighbourhood, §4); MarianMT's attention sees every position and cannot "
                          "hold the restriction: export a model trained with model.attention_window=null")
    sizes = model_sizes(model)
    if sizes["d_k"] * sizes["n_heads"] != sizes["d_model"] or sizes["d_v"] != sizes["d_k"]:
        raise ConfigError(f"{where} has model.d_k={sizes['d_k']}, model.d_v={sizes['d_v']} with "
                          f"model.n_heads={sizes['n_heads']}, model.d_model={sizes['d_model']}; MarianMT's heads "
                          "need d_k = d_v = d_model / h: export a model trained with those sizes")
    return sizes


def check_the_papers_network(model: Transformer, where: str = "the model") -> None:
    """A :class:`ConfigError` for a checkpoint of a model class of one's own (``model._target_``,
    docs/extending.md): the exports map the paper's network's weights, and cannot know what
    another class computes."""
    if type(model) is not Transformer:
        kind = f"{type(model).__module__}.{type(model).__qualname__}"
        raise ConfigError(f"{where} was trained as model._target_={kind}, a model class of one's own; the export maps "
                          "the weights of aiayn.model.Transformer alone, and cannot know what another class computes: "
                          "translate and evaluate it with translate.py and evaluate.py")


def marian_order(d_model: int, device: torch.device | str | None = None) -> Tensor:
    """The permutation of d_model that turns our interleaved sinusoid layout into Marian's halves:
    Marian's dimension j is our dimension ``marian_order(d_model)[j]`` (0, 2, 4, …, 1, 3, 5, …).
    ``device``: where the weights it indexes are (None: the default device)."""
    return torch.cat([torch.arange(0, d_model, 2, device=device), torch.arange(1, d_model, 2, device=device)])


def marian_config(model: Transformer, *, bos_id: int, eos_id: int, dropout: float = 0.1, where: str = "the model"):
    """A ``MarianConfig`` of ``model``'s sizes, configured to compute as ours does: ReLU, embeddings
    scaled by √d_model, one embedding shared by both stacks and the output, BOS as the decoder's
    first token, no forced EOS at the maximum length; ``dropout`` only matters for training."""
    transformers = require("transformers")
    sizes = check_expressible(model, where)
    shared = _one_embedding(model)
    return transformers.MarianConfig(
        vocab_size=sizes["vocab_size"], d_model=sizes["d_model"], max_position_embeddings=sizes["max_positions"],
        encoder_layers=sizes["n_layers"], decoder_layers=sizes["n_layers"],
        encoder_attention_heads=sizes["n_heads"], decoder_attention_heads=sizes["n_heads"],
        encoder_ffn_dim=sizes["d_ff"], decoder_ffn_dim=sizes["d_ff"],
        activation_function="relu", scale_embedding=True, dropout=dropout, attention_dropout=0.0,
        activation_dropout=0.0, share_encoder_decoder_embeddings=shared, tie_word_embeddings=shared,
        decoder_vocab_size=sizes["tgt_vocab_size"],
        pad_token_id=model.pad_id, eos_token_id=eos_id, bos_token_id=bos_id, decoder_start_token_id=bos_id,
        forced_eos_token_id=None,
    )


@torch.no_grad()
def copy_to_marian(model: Transformer, marian):
    """Copy ``model``'s weights into ``marian`` (a ``MarianMTModel`` of :func:`marian_config`) with
    the d_model axis permuted by :func:`marian_order`; Marian's extra biases become zero. Raises
    ValueError if Marian's own sinusoid table is not our table in that order (a transformers
    version that changed it)."""
    order = marian_order(model.d_model, device=model.src_embedding.weight.device)  # indexes our weights
    for stack in (marian.model.encoder, marian.model.decoder):
        table = stack.embed_positions.weight
        if not torch.allclose(table, model.src_positions.table[: table.size(0), order].to(table), atol=1e-5):
            raise ValueError("MarianMT's sinusoid table is not ours with its dimensions reordered; this transformers "
                             "version lays out its positions differently and the mapping does not hold")
    if _one_embedding(model):
        marian.model.shared.weight.copy_(model.src_embedding.weight[:, order])
    else:  # model.share_embeddings=false: Marian's own embedding of each stack and an untied output
        marian.model.encoder.embed_tokens.weight.copy_(model.src_embedding.weight[:, order])
        marian.model.decoder.embed_tokens.weight.copy_(model.tgt_embedding.weight[:, order])
        output = model.output_projection.weight if model.output_projection is not None else model.tgt_embedding.weight
        marian.lm_head.weight.copy_(output[:, order])  # reads d_model
    marian.final_logits_bias.zero_()
    stacks = ((model.encoder_layers, marian.model.encoder.layers, "encoder"),
              (model.decoder_layers, marian.model.decoder.layers, "decoder"))
    for ours, theirs, kind in stacks:
        for layer, other in zip(ours, theirs, strict=True):
            _copy_attention(layer.self_attention, other.self_attn, order)
            _copy_norm(layer.residual_1.norm, other.self_attn_layer_norm, order)
            if kind == "decoder":
                _copy_attention(layer.cross_attention, other.encoder_attn, order)
                _copy_norm(layer.residual_2.norm, other.encoder_attn_layer_norm, order)
                _copy_norm(layer.residual_3.norm, other.final_layer_norm, order)
            else:
                _copy_norm(layer.residual_2.norm, other.final_layer_norm, order)
            other.fc1.weight.copy_(layer.feed_forward.w_1.weight[:, order])  # reads d_model
            other.fc1.bias.copy_(layer.feed_forward.w_1.bias)
            other.fc2.weight.copy_(layer.feed_forward.w_2.weight[order])  # writes d_model
            other.fc2.bias.copy_(layer.feed_forward.w_2.bias[order])
    if _ties_embeddings(marian) and marian.lm_head.weight.data_ptr() != marian.model.shared.weight.data_ptr():
        marian.lm_head.weight.copy_(marian.model.shared.weight)
    return marian


def _one_embedding(model: Transformer) -> bool:
    """Whether ``model`` has one embedding for both stacks and the output (§3.4; not with
    ``model.share_embeddings=false``: the source's and the target's)."""
    return model.output_projection is None and model.tgt_embedding is model.src_embedding


def _ties_embeddings(marian) -> bool:
    """Whether ``marian`` ties one embedding to both stacks and the output."""
    return bool(marian.config.share_encoder_decoder_embeddings and marian.config.tie_word_embeddings)


def _copy_attention(ours, theirs, order: Tensor) -> None:
    for mine, other in ((ours.w_q, theirs.q_proj), (ours.w_k, theirs.k_proj), (ours.w_v, theirs.v_proj)):
        other.weight.copy_(mine.weight[:, order])  # reads d_model; the heads' dimensions stay as they are
        other.bias.zero_()
    theirs.out_proj.weight.copy_(ours.w_o.weight[order])  # writes d_model
    theirs.out_proj.bias.zero_()


def _copy_norm(ours: torch.nn.LayerNorm, theirs: torch.nn.LayerNorm, order: Tensor) -> None:
    if ours.eps != theirs.eps:
        raise ValueError(f"layer-norm ε differs: ours {ours.eps}, Marian's {theirs.eps}")
    theirs.weight.copy_(ours.weight[order])
    theirs.bias.copy_(ours.bias[order])


def to_marian(model: Transformer, *, bos_id: int, eos_id: int, dropout: float = 0.1, where: str = "the model"):
    """A ``MarianMTModel`` (eval mode, float32) computing ``model``'s function."""
    transformers = require("transformers")
    marian = transformers.MarianMTModel(marian_config(model, bos_id=bos_id, eos_id=eos_id, dropout=dropout,
                                                      where=where))
    return copy_to_marian(model, marian).eval()
