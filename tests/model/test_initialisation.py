"""Initialisation, where the paper is silent: tensor2tensor's (transformer_base_v1), checked
against its formulas. Glorot-uniform dense weights (bound √(6 / (fan_in + fan_out))), zero
biases, LayerNorm at the identity, and N(0, d_model^-0.5) for the embeddings (the target's being
the pre-softmax matrix), with one vocabulary or two."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from aiayn.model import Transformer

D = 64
SIZES = {"n_layers": 1, "d_model": D, "d_ff": 256, "n_heads": 4, "d_k": 16, "d_v": 8, "max_positions": 16}


def build(src_vocab: int, tgt_vocab: int, share: bool) -> Transformer:
    torch.manual_seed(0)
    return Transformer(src_vocab, tgt_vocab, share_embeddings=share, **SIZES)


def test_dense_layers_are_glorot_uniform_with_zero_biases_and_layer_norm_the_identity():
    model = build(3000, 3000, share=True)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 2 * (4 + 2) + 4  # encoder: attention's 4 + FFN's 2; decoder: 2 attentions + FFN
    for layer in linears:
        bound = math.sqrt(6.0 / (layer.in_features + layer.out_features))
        weight = layer.weight.detach()
        assert weight.abs().max() <= bound
        assert weight.std().item() == pytest.approx(bound / math.sqrt(3.0), rel=0.1)  # uniform's std
        if layer.bias is not None:
            assert not layer.bias.any()
    for norm in (m for m in model.modules() if isinstance(m, nn.LayerNorm)):
        assert bool((norm.weight == 1).all()) and not norm.bias.any()


@pytest.mark.parametrize("share", [True, False], ids=["tied", "separate-vocabularies"])
def test_embeddings_and_the_pre_softmax_matrix_start_normal_with_std_d_model_to_the_minus_half(share):
    model = build(3000 if share else 2000, 3000, share=share)
    assert model.output_projection is None  # the pre-softmax matrix is the target embedding (§3.4)
    for weight in (model.src_embedding.weight, model.tgt_embedding.weight):
        assert weight.detach().std().item() == pytest.approx(D**-0.5, rel=0.03)
        assert weight.detach().mean().abs().item() < 0.01
