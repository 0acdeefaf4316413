"""Multi-head attention (§3.2): projection shapes, fused vs explicit Eq. 1, Eq. 1 by hand."""

from __future__ import annotations

import math

import pytest
import torch

from aiayn.model import attention as attention_module
from aiayn.model.attention import MultiHeadAttention

pytestmark = pytest.mark.usefixtures("single_thread")


def _mha(d_model, n_heads, d_k, d_v, seed=0) -> MultiHeadAttention:
    torch.manual_seed(seed)
    return MultiHeadAttention(d_model, n_heads, d_k, d_v).double().eval()


@pytest.mark.parametrize(
    "d_model, n_heads, d_k, d_v",
    [
        (16, 2, 5, 3),  # d_k, d_v != d_model / h
        (16, 4, 8, 2),  # h·d_k = 32 > d_model
        (16, 1, 32, 32),  # Table 3 (A)-style single head wider than d_model
    ],
)
def test_projection_and_output_shapes(d_model, n_heads, d_k, d_v):
    mha = _mha(d_model, n_heads, d_k, d_v)
    # nn.Linear stores (out_features, in_features).
    assert mha.w_q.weight.shape == (n_heads * d_k, d_model)
    assert mha.w_k.weight.shape == (n_heads * d_k, d_model)
    assert mha.w_v.weight.shape == (n_heads * d_v, d_model)
    assert mha.w_o.weight.shape == (d_model, n_heads * d_v)
    assert all(lin.bias is None for lin in (mha.w_q, mha.w_k, mha.w_v, mha.w_o))
    n_params = sum(p.numel() for p in mha.parameters())
    assert n_params == 2 * d_model * n_heads * d_k + d_model * n_heads * d_v + n_heads * d_v * d_model

    batch, q_len, k_len = 3, 4, 7
    query = torch.randn(batch, q_len, d_model, dtype=torch.float64)
    memory = torch.randn(batch, k_len, d_model, dtype=torch.float64)
    k, v = mha.project_keys_values(memory)
    assert k.shape == (batch, n_heads, k_len, d_k)
    assert v.shape == (batch, n_heads, k_len, d_v)
    for return_weights in (False, True):
        out, weights = mha(query, (k, v), return_weights=return_weights)
        assert out.shape == (batch, q_len, d_model)
        if return_weights:
            assert weights.shape == (batch, n_heads, q_len, k_len)
        else:
            assert weights is None


def test_fused_equals_explicit_with_padding_mask():
    mha = _mha(16, 4, 5, 3, seed=1)
    batch, q_len, k_len = 3, 4, 6
    query = torch.randn(batch, q_len, 16, dtype=torch.float64)
    memory = torch.randn(batch, k_len, 16, dtype=torch.float64)
    lengths = torch.tensor([6, 4, 1])
    mask = (torch.arange(k_len)[None, :] < lengths[:, None])[:, None, None, :]  # (batch, 1, 1, k_len)
    kv = mha.project_keys_values(memory)

    fused, none = mha(query, kv, mask=mask)
    explicit, weights = mha(query, kv, mask=mask, return_weights=True)
    assert none is None
    torch.testing.assert_close(fused, explicit, rtol=0, atol=1e-12)

    torch.testing.assert_close(weights.sum(-1), torch.ones(batch, 4, q_len, dtype=torch.float64))
    blocked = ~mask.expand_as(weights)
    assert blocked.any()
    assert torch.all(weights[blocked] == 0)
    assert torch.all(weights[~blocked] > 0)
    # The third sentence has a single real key: all its weight is on it.
    assert torch.all(weights[2, :, :, 0] == 1)

    # Padded keys really are ignored: changing memory at padded positions changes nothing.
    memory2 = memory.clone()
    memory2[1, 4:] = torch.randn(2, 16, dtype=torch.float64) * 10
    memory2[2, 1:] = torch.randn(5, 16, dtype=torch.float64) * 10
    fused2, _ = mha(query, mha.project_keys_values(memory2), mask=mask)
    torch.testing.assert_close(fused2, fused, rtol=0, atol=1e-12)


def test_fused_equals_explicit_causal():
    mha = _mha(16, 2, 8, 6, seed=2)
    batch, length = 2, 5
    x = torch.randn(batch, length, 16, dtype=torch.float64)
    kv = mha.project_keys_values(x)
    fused, _ = mha(x, kv, causal=True)
    explicit, weights = mha(x, kv, causal=True, return_weights=True)
    torch.testing.assert_close(fused, explicit, rtol=0, atol=1e-12)

    torch.testing.assert_close(weights.sum(-1), torch.ones(batch, 2, length, dtype=torch.float64))
    future = torch.ones(length, length, dtype=torch.bool).triu(1)
    assert torch.all(weights[..., future] == 0)
    assert torch.all(weights[..., ~future] > 0)
    assert torch.all(weights[..., 0, 0] == 1)  # the first position sees only itself

    # Causal: output at i does not depend on inputs after i.
    x2 = x.clone()
    x2[:, 3:] += torch.randn(batch, 2, 16, dtype=torch.float64)
    fused2, _ = mha(x2, mha.project_keys_values(x2), causal=True)
    torch.testing.assert_close(fused2[:, :3], fused[:, :3], rtol=0, atol=1e-12)
    assert not torch.allclose(fused2[:, 3:], fused[:, 3:])


def test_fused_equals_explicit_causal_with_padding_mask():
    mha = _mha(16, 2, 8, 8, seed=3)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]])[:, None, None, :]
    kv = mha.project_keys_values(x)
    explicit, weights = mha(x, kv, mask=mask, causal=True, return_weights=True)
    # SDPA does not accept attn_mask with is_causal; compare with the fused path on the combined mask.
    combined = mask & torch.ones(5, 5, dtype=torch.bool).tril()
    fused, _ = mha(x, kv, mask=combined)
    torch.testing.assert_close(fused, explicit, rtol=0, atol=1e-12)
    assert torch.all(weights[1, :, :, 3:] == 0)


def test_fused_equals_explicit_causal_rectangular():
    mha = _mha(8, 2, 4, 4, seed=4)
    query = torch.randn(1, 2, 8, dtype=torch.float64)
    kv = mha.project_keys_values(torch.randn(1, 4, 8, dtype=torch.float64))
    fused, _ = mha(query, kv, causal=True)
    explicit, _ = mha(query, kv, causal=True, return_weights=True)
    torch.testing.assert_close(fused, explicit, rtol=0, atol=1e-12)


def _softmax_rows(scores: list[list[float]]) -> list[list[float]]:
    out = []
    for row in scores:
        m = max(row)
        e = [math.exp(s - m) for s in row]
        out.append([x / sum(e) for x in e])
    return out


def test_eq1_by_hand_single_head_identity_projections():
    d = 4
    mha = MultiHeadAttention(d, 1, d, d).double().eval()
    with torch.no_grad():
        for lin in (mha.w_q, mha.w_k, mha.w_v, mha.w_o):
            lin.weight.copy_(torch.eye(d, dtype=torch.float64))
    torch.manual_seed(5)
    q = torch.randn(1, 3, d, dtype=torch.float64)
    kv_in = torch.randn(1, 5, d, dtype=torch.float64)

    # softmax(Q Kᵀ / √d_k) V with plain Python arithmetic.
    Q, K = q[0].tolist(), kv_in[0].tolist()
    scores = [[sum(a * b for a, b in zip(qi, kj)) / math.sqrt(d) for kj in K] for qi in Q]
    weights = _softmax_rows(scores)
    expected = [[sum(w * K[j][c] for j, w in enumerate(row)) for c in range(d)] for row in weights]

    for return_weights in (False, True):
        out, w = mha(q, mha.project_keys_values(kv_in), return_weights=return_weights)
        torch.testing.assert_close(out[0], torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12)
        if return_weights:
            torch.testing.assert_close(w[0, 0], torch.tensor(weights, dtype=torch.float64), rtol=0, atol=1e-12)


def test_multi_head_by_hand_random_projections():
    """MultiHead = Concat(head_1..head_h) W^O with head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V):
    head i uses rows [i·d_k, (i+1)·d_k) of w_q / w_k and [i·d_v, (i+1)·d_v) of w_v, and the
    scaling is by √d_k (not √d_model or √(h·d_k))."""
    d_model, h, d_k, d_v = 6, 3, 4, 2
    mha = _mha(d_model, h, d_k, d_v, seed=6)
    torch.manual_seed(7)
    query = torch.randn(2, 3, d_model, dtype=torch.float64)
    memory = torch.randn(2, 4, d_model, dtype=torch.float64)
    Wq, Wk, Wv, Wo = (lin.weight.detach() for lin in (mha.w_q, mha.w_k, mha.w_v, mha.w_o))
    heads = []
    for i in range(h):
        Qi = query @ Wq[i * d_k:(i + 1) * d_k].T
        Ki = memory @ Wk[i * d_k:(i + 1) * d_k].T
        Vi = memory @ Wv[i * d_v:(i + 1) * d_v].T
        heads.append(torch.softmax(Qi @ Ki.transpose(1, 2) / math.sqrt(d_k), dim=-1) @ Vi)
    expected = torch.cat(heads, dim=-1) @ Wo.T
    out, _ = mha(query, mha.project_keys_values(memory))
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("grad", [True, False], ids=["training", "decoding"])
def test_stacked_projections_equal_the_three_of_the_paper(grad):
    """project_self / project_keys_values take one product with W^Q, W^K, W^V stacked; they give
    each projection's own result, and the gradient of each weight as if it were applied alone."""
    mha = _mha(16, 2, 5, 3)
    x = torch.randn(3, 4, 16, dtype=torch.float64)
    with torch.set_grad_enabled(grad):
        q, (k, v) = mha.project_self(x)
        k2, v2 = mha.project_keys_values(x)
    alone = (mha.split_heads(mha.w_q(x), 5), mha.split_heads(mha.w_k(x), 5), mha.split_heads(mha.w_v(x), 3))
    for fused, plain in zip((q, k, v, k2, v2), (*alone, *alone[1:])):
        assert fused.shape == plain.shape and torch.allclose(fused, plain, atol=1e-12)
    if grad:
        weights = [mha.w_q.weight, mha.w_k.weight, mha.w_v.weight]
        stacked = torch.autograd.grad((q.sin().sum() + k.cos().sum() + v.square().sum()), weights)
        plain = torch.autograd.grad((alone[0].sin().sum() + alone[1].cos().sum() + alone[2].square().sum()), weights)
        assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(stacked, plain))


@pytest.mark.parametrize("kept_in, stepped_in, used_in", [("eval", "train", "eval"), ("train",) * 3, ("eval",) * 3],
                         ids=["validation after a step", "training mode throughout", "evaluation mode throughout"])
def test_a_forward_without_gradients_after_a_fused_adam_step_projects_with_the_new_weights(kept_in, stepped_in, used_in):
    """torch's fused Adam changes the weights in place without counting it in their versions: the
    stack kept while no gradient is taken must not outlive the step, whatever the module's mode
    (before, a validation after a fused step used the weights of the last validation; and a stack
    kept in training mode, or across a step taken in evaluation mode, was never dropped)."""
    mha = _mha(16, 2, 5, 3).float()
    x = torch.randn(3, 4, 16)
    optimizer = torch.optim.Adam(mha.parameters(), lr=0.1, fused=True)
    _switch(mha, kept_in)
    with torch.no_grad():
        before, _ = mha.project_self(x)  # builds the kept stack
    _switch(mha, stepped_in)
    q, (k, v) = mha.project_self(x)
    (q.square().sum() + k.sum() + v.sum()).backward()
    version = mha.w_q.weight._version
    optimizer.step()
    assert mha.w_q.weight._version == version, "fused Adam left the version alone (else this test shows nothing)"
    _switch(mha, used_in)
    with torch.no_grad():
        after, _ = mha.project_self(x)
    expected = mha.split_heads(mha.w_q(x), 5)
    assert not torch.allclose(before, expected) and torch.allclose(after, expected, atol=1e-6)


def _switch(module: torch.nn.Module, mode: str) -> None:
    """Into ``mode`` ("train" or "eval") only when not in it already, so that the test does not lean
    on what a switch does (it used to drop the kept stacks)."""
    if module.training != (mode == "train"):
        module.train(mode == "train")


def test_one_query_on_the_cpu_equals_sdpa():
    """A decoding step (one query) takes the written-out Eq. 1 on the CPU; it must equal SDPA's."""
    mha = _mha(16, 4, 4, 4)
    query, memory = torch.randn(5, 1, 16, dtype=torch.float64), torch.randn(5, 7, 16, dtype=torch.float64)
    mask = torch.ones(5, 1, 1, 7, dtype=torch.bool)
    mask[2:, ..., 4:] = False
    out, _ = mha(query, mha.project_keys_values(memory), mask=mask)
    q = mha.split_heads(mha.w_q(query), 4)
    k, v = mha.project_keys_values(memory)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (5, 4, 1, 4)
    assert torch.allclose(out, mha.w_o(expected.transpose(1, 2).reshape(5, 1, 16)), atol=1e-12)


@pytest.fixture
def cudnn_attention_as_torch_left_it(monkeypatch):
    """cuDNN's SDPA kernel enabled, as torch starts, and this process not yet past the model's
    once-only choice; torch's setting is put back afterwards."""
    before = torch.backends.cuda.cudnn_sdp_enabled()
    monkeypatch.setattr(attention_module, "_cudnn_attention_turned_off", False)
    torch.backends.cuda.enable_cudnn_sdp(True)
    yield
    torch.backends.cuda.enable_cudnn_sdp(before)


def test_a_model_with_sdpa_keeps_cudnn_attention_off_once(cudnn_attention_as_torch_left_it):
    """Building attention with SDPA turns cuDNN's kernel off (it plans per shape, and our lengths
    vary); the explicit form leaves torch's setting alone; a user's choice made afterwards stands."""
    MultiHeadAttention(16, 2, 8, 8, attention="explicit")
    assert torch.backends.cuda.cudnn_sdp_enabled()
    mha = _mha(16, 2, 8, 8)
    assert not torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(True)  # the user's own choice, after building the model
    x = torch.randn(2, 3, 16, dtype=torch.float64)
    mha(x, mha.project_keys_values(x))
    _mha(16, 2, 8, 8)
    assert torch.backends.cuda.cudnn_sdp_enabled()
