"""The Transformer (§3): causality, padding, incremental decoding, embeddings (§3.4), post-norm
(§3.1) and dropout placement (§5.4); its parameter counts: test_parameter_count.py."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from aiayn.model import DecoderState, Transformer
from aiayn.model.layers import DecoderLayer, EncoderLayer
from aiayn.model.positional import sinusoidal_table

pytestmark = pytest.mark.usefixtures("single_thread")


V = 13
SMALL = {"n_layers": 2, "d_model": 16, "d_ff": 32, "n_heads": 2, "d_k": 6, "d_v": 5, "max_positions": 32}


def small_model(seed: int = 0, dropout: float = 0.0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    kwargs = {**SMALL, "dropout": dropout, **overrides}
    return Transformer(kwargs.pop("src_vocab", V), kwargs.pop("tgt_vocab", V), **kwargs).double().eval()


def tokens(*shape, low=1, high=V, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, shape, generator=g)


# --------------------------------------------------------------------------------------- causality


def test_decoder_is_causal():
    model = small_model(seed=1, dropout=0.3)  # dropout is set but eval mode turns it off
    src = tokens(2, 6, seed=1)
    tgt = tokens(2, 7, seed=2)
    with torch.no_grad():
        base = model(src, tgt)
        for t in (0, 2, 5):
            changed = tgt.clone()
            changed[:, t + 1:] = (changed[:, t + 1:] + 1 + torch.arange(6 - t)) % (V - 1) + 1
            assert not torch.equal(changed[:, t + 1:], tgt[:, t + 1:])
            out = model(src, changed)
            torch.testing.assert_close(out[:, : t + 1], base[:, : t + 1], rtol=0, atol=1e-12)
            # ...while later positions do change (the test would be vacuous otherwise).
            assert (out[:, t + 1:] - base[:, t + 1:]).abs().max() > 1e-3


def test_decoder_depends_on_source():
    model = small_model(seed=2)
    tgt = tokens(1, 4, seed=3)
    with torch.no_grad():
        a = model(tokens(1, 5, seed=4), tgt)
        b = model(tokens(1, 5, seed=5), tgt)
    assert (a - b).abs().max() > 1e-3


# ---------------------------------------------------------------------------------- padding


@pytest.mark.parametrize("pad_id", [0, 4])
def test_padding_changes_no_output_at_the_real_positions(pad_id):
    model = small_model(seed=3, pad_id=pad_id)
    long_src, short_src = tokens(1, 7, seed=6)[0], tokens(1, 3, seed=7)[0]
    long_tgt, short_tgt = tokens(1, 6, seed=8)[0], tokens(1, 2, seed=9)[0]
    # Keep pad_id out of the real tokens.
    for seq in (long_src, short_src, long_tgt, short_tgt):
        seq[seq == pad_id] = pad_id + 1
    src = torch.full((2, 7), pad_id)
    src[0], src[1, :3] = long_src, short_src
    tgt = torch.full((2, 6), pad_id)
    tgt[0], tgt[1, :2] = long_tgt, short_tgt

    with torch.no_grad():
        batched = model(src, tgt)
        alone_long = model(long_src[None], long_tgt[None])
        alone_short = model(short_src[None], short_tgt[None])
    torch.testing.assert_close(batched[0], alone_long[0], rtol=0, atol=1e-10)
    torch.testing.assert_close(batched[1, :2], alone_short[0], rtol=0, atol=1e-10)

    # Encoder output at the real source positions is unaffected by padding, too.
    with torch.no_grad():
        memory, mask, _ = model.encode(src)
        memory_alone, _, _ = model.encode(short_src[None])
    assert mask.shape == (2, 1, 1, 7)
    assert mask[1, 0, 0].tolist() == [True] * 3 + [False] * 4
    torch.testing.assert_close(memory[1, :3], memory_alone[0], rtol=0, atol=1e-10)


# ------------------------------------------------------------------------- incremental decoding


@pytest.fixture(scope="module")
def decoding_setup():
    model = small_model(seed=4)
    src = tokens(3, 5, seed=10)
    src[2, 3:] = 0  # one padded source
    tgt = tokens(3, 6, seed=11)
    with torch.no_grad():
        full = model(src, tgt)
        memory, src_mask, _ = model.encode(src)
    return model, src, tgt, full, memory, src_mask


def test_incremental_one_token_at_a_time_equals_teacher_forcing(decoding_setup):
    model, _src, tgt, full, memory, src_mask = decoding_setup
    state = model.start_decoding(memory, src_mask)
    assert isinstance(state, DecoderState) and state.length == 0
    steps = []
    with torch.no_grad():
        for t in range(tgt.size(1)):
            logits, state, _ = model.decode(tgt[:, t:t + 1], state)
            assert logits.shape == (3, 1, V)
            assert state.length == t + 1
            assert all(k.shape[2] == t + 1 and v.shape[2] == t + 1 for k, v in state.self_kv)
            steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-10)


def test_incremental_chunks_on_top_of_cache_equal_teacher_forcing(decoding_setup):
    model, _src, tgt, full, memory, src_mask = decoding_setup
    state = model.start_decoding(memory, src_mask)
    chunks = []
    with torch.no_grad():
        for start, stop in ((0, 1), (1, 3), (3, 5), (5, 6)):  # q_len 2 on top of a cache
            logits, state, _ = model.decode(tgt[:, start:stop], state)
            chunks.append(logits)
        assert state.length == 6
    torch.testing.assert_close(torch.cat(chunks, dim=1), full, rtol=0, atol=1e-10)

    # A first chunk of 3 with no cache, then one token at a time.
    state = model.start_decoding(memory, src_mask)
    with torch.no_grad():
        first, state, _ = model.decode(tgt[:, :3], state)
        fourth, state, _ = model.decode(tgt[:, 3:4], state)
    torch.testing.assert_close(torch.cat([first, fourth], dim=1), full[:, :4], rtol=0, atol=1e-10)


def test_decoder_state_select_reorders_consistently(decoding_setup):
    model, src, tgt, full, memory, src_mask = decoding_setup
    order = torch.tensor([2, 0, 0, 1])
    with torch.no_grad():
        state = model.start_decoding(memory, src_mask)
        _, state, _ = model.decode(tgt[:, :3], state)
        state = state.select(order)
        assert state.length == 3
        assert state.src_mask.shape[0] == 4 and torch.equal(state.src_mask, src_mask[order])
        logits, state, _ = model.decode(tgt[order, 3:], state)
        # The same as a fresh teacher-forced run on the reordered batch.
        reference = model(src[order], tgt[order])
    torch.testing.assert_close(logits, reference[:, 3:], rtol=0, atol=1e-10)
    torch.testing.assert_close(logits, full[order, 3:], rtol=0, atol=1e-10)


# ------------------------------------------------------------------------------ embeddings §3.4


def test_shared_embeddings_are_one_parameter():
    model = small_model(seed=5, share_embeddings=True)
    assert model.src_embedding is model.tgt_embedding
    assert model.src_embedding.weight is model.tgt_embedding.weight
    assert model.output_projection is None
    weight = model.src_embedding.weight
    # Counted once among the parameters.
    assert sum(p is weight for p in model.parameters()) == 1
    # The pre-softmax projection is that same matrix: logits = x Wᵀ.
    x = torch.randn(2, 3, 16, dtype=torch.float64)
    torch.testing.assert_close(model.logits(x), x @ weight.T, rtol=0, atol=1e-12)
    # A gradient through the output projection lands in the embedding weight.
    model.logits(x).sum().backward()
    assert weight.grad is not None and weight.grad.abs().sum() > 0


def test_embedding_is_scaled_by_sqrt_d_model():
    model = small_model(seed=6)
    ids = torch.tensor([[3, 1, 12, 3]])
    weight = model.src_embedding.weight
    expected = weight[ids] * math.sqrt(16)
    torch.testing.assert_close(model.src_embedding(ids), expected, rtol=0, atol=1e-12)
    torch.testing.assert_close(model.tgt_embedding(ids), expected, rtol=0, atol=1e-12)


def test_zero_layer_model_is_scaled_embedding_plus_positions():
    """With N = 0 the whole pipeline is: W[token]·√d_model + PE, then logits through Wᵀ."""
    model = small_model(seed=7, n_layers=0)
    src = torch.tensor([[5, 2, 9]])
    tgt = torch.tensor([[1, 7]])
    weight = model.src_embedding.weight.detach()
    table = sinusoidal_table(32, 16).double()
    with torch.no_grad():
        memory, _, _ = model.encode(src)
        logits = model(src, tgt)
    torch.testing.assert_close(memory[0], weight[src[0]] * 4.0 + table[:3], rtol=0, atol=1e-12)
    torch.testing.assert_close(logits[0], (weight[tgt[0]] * 4.0 + table[:2]) @ weight.T, rtol=0, atol=1e-12)


def test_separate_vocabularies_keep_the_target_embedding_as_the_pre_softmax_matrix():
    """§3.4 with separate vocabularies: the source embedding is its own; the target embedding
    stays the pre-softmax matrix (the paper's reference [30], and tensor2tensor)."""
    model = small_model(seed=8, share_embeddings=False, src_vocab=11, tgt_vocab=17)
    src_w, tgt_w = model.src_embedding.weight, model.tgt_embedding.weight
    assert src_w.shape == (11, 16) and tgt_w.shape == (17, 16)
    assert model.src_embedding is not model.tgt_embedding and model.output_projection is None
    assert sum(p is src_w or p is tgt_w for p in model.parameters()) == 2
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in small_model(src_vocab=17, tgt_vocab=17).parameters()) + 11 * 16
    with torch.no_grad():
        logits = model(tokens(2, 4, high=11, seed=12), tokens(2, 3, high=17, seed=13))
    assert logits.shape == (2, 3, 17)
    x = torch.randn(1, 2, 16, dtype=torch.float64)
    torch.testing.assert_close(model.logits(x), x @ tgt_w.T, rtol=0, atol=1e-12)


def test_shared_embeddings_need_one_vocabulary():
    with pytest.raises(ValueError, match="share_embeddings"):
        Transformer(11, 17, share_embeddings=True, **{**SMALL, "dropout": 0.0})


# ------------------------------------------------------------------------------ post-norm §3.1


def _layer_norm_by_hand(x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)  # biased variance, as LayerNorm uses
    return (x - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


def _ffn_by_hand(x: torch.Tensor, ffn) -> torch.Tensor:
    """Eq. 2: max(0, x W_1 + b_1) W_2 + b_2."""
    hidden = torch.clamp(x @ ffn.w_1.weight.T + ffn.w_1.bias, min=0)
    return hidden @ ffn.w_2.weight.T + ffn.w_2.bias


def _randomise_norms(layer: nn.Module) -> None:
    with torch.no_grad():
        for module in layer.modules():
            if isinstance(module, nn.LayerNorm):
                module.weight.normal_(1.0, 0.3)
                module.bias.normal_(0.0, 0.3)
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.normal_(0.0, 0.3)


def test_encoder_layer_is_post_norm():
    torch.manual_seed(9)
    layer = EncoderLayer(16, 32, 2, 6, 5, dropout=0.5).double().eval()
    _randomise_norms(layer)
    x = torch.randn(2, 5, 16, dtype=torch.float64) * 3 + 1
    mask = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])[:, None, None, :]
    with torch.no_grad():
        out, _ = layer(x, mask)
        attn = layer.self_attention
        sa, _ = attn(x, attn.project_keys_values(x), mask=mask)
        y = _layer_norm_by_hand(x + sa, layer.residual_1.norm)
        expected = _layer_norm_by_hand(y + _ffn_by_hand(y, layer.feed_forward), layer.residual_2.norm)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-10)
    # Post-norm: each position of the output is normalised (before the affine part).
    g, b = layer.residual_2.norm.weight, layer.residual_2.norm.bias
    normalised = (out - b) / g
    torch.testing.assert_close(normalised.mean(-1), torch.zeros(2, 5, dtype=torch.float64), rtol=0, atol=1e-10)


def test_decoder_layer_is_post_norm():
    torch.manual_seed(10)
    layer = DecoderLayer(16, 32, 2, 6, 5, dropout=0.5).double().eval()
    _randomise_norms(layer)
    x = torch.randn(2, 4, 16, dtype=torch.float64)
    memory = torch.randn(2, 5, 16, dtype=torch.float64)
    src_mask = torch.tensor([[True] * 5, [True] * 2 + [False] * 3])[:, None, None, :]
    with torch.no_grad():
        memory_kv = layer.cross_attention.project_keys_values(memory)
        out, (k, v), _ = layer(x, memory_kv, src_mask)
        sa, _ = layer.self_attention(x, layer.self_attention.project_keys_values(x), causal=True)
        y1 = _layer_norm_by_hand(x + sa, layer.residual_1.norm)
        ca, _ = layer.cross_attention(y1, memory_kv, mask=src_mask)
        y2 = _layer_norm_by_hand(y1 + ca, layer.residual_2.norm)
        expected = _layer_norm_by_hand(y2 + _ffn_by_hand(y2, layer.feed_forward), layer.residual_3.norm)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-10)
    assert k.shape == (2, 2, 4, 6) and v.shape == (2, 2, 4, 5)


# ---------------------------------------------------------------------------- dropout §5.4


def test_dropout_active_in_train_and_off_in_eval():
    model = small_model(seed=11, dropout=0.3)
    src, tgt = tokens(2, 5, seed=14), tokens(2, 4, seed=15)
    model.train()
    with torch.no_grad():
        a, b = model(src, tgt), model(src, tgt)
    assert (a - b).abs().max() > 1e-3
    model.eval()
    with torch.no_grad():
        c, d = model(src, tgt), model(src, tgt)
    assert torch.equal(c, d)
    # In eval mode the model is the same function as one built without dropout.
    no_dropout = small_model(seed=12, dropout=0.0)
    no_dropout.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(no_dropout(src, tgt), c, rtol=0, atol=1e-12)


def test_dropout_on_every_sub_layer_output_and_on_the_embedding_sums():
    """§5.4: dropout on every sub-layer output (before the residual sum) and on the sums of the
    embeddings and positional encodings: 1 + 2N (encoder) + 3N (decoder) dropouts of rate P_drop."""
    model = small_model(seed=13, dropout=0.25, n_layers=3)
    dropouts = [m for m in model.modules() if isinstance(m, nn.Dropout)]
    assert all(m.p == 0.25 for m in dropouts)
    assert len(dropouts) == 1 + 2 * 3 + 3 * 3

    # Functional check: with every sub-layer dropout at p=1 (train mode) each residual block passes
    # x through unchanged before its LayerNorm, so an encoder layer is two LayerNorms of x.
    torch.manual_seed(14)
    layer = EncoderLayer(16, 32, 2, 6, 5, dropout=1.0).double().train()
    x = torch.randn(1, 4, 16, dtype=torch.float64)
    mask = torch.ones(1, 1, 1, 4, dtype=torch.bool)
    out, _ = layer(x, mask)
    expected = layer.residual_2.norm(layer.residual_1.norm(x))
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
