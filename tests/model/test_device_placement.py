"""The model, the searches, the training loss and the Marian export would run right on a GPU,
checked on the CPU (tests/helpers/devices.py says how): every tensor they create names its device,
and beam and greedy search wait on the device once per step, as search.py documents."""

from __future__ import annotations

import pytest
import torch

from aiayn.export.marian import copy_to_marian, marian_config, marian_order
from aiayn.model import Transformer, beam_search, greedy_search
from aiayn.model.loss import label_smoothed_loss
from tests.helpers.devices import DeviceNotNamed, count_host_syncs, host_tensors, tensors_name_their_device

pytestmark = pytest.mark.usefixtures("single_thread")

PAD, BOS, EOS = 0, 1, 2
V = 16
SMALL = {"n_layers": 2, "d_model": 16, "d_ff": 32, "n_heads": 2, "d_k": 8, "d_v": 8, "dropout": 0.0,
         "max_positions": 64}
# Every path of the model that makes tensors of its own: fused or written-out attention, fixed or
# learned positions, restricted self-attention (its masks), a source embedding of its own.
VARIANTS = {
    "sdpa": {},
    "explicit-learned": {"attention": "explicit", "positional": "learned"},
    "window-unshared": {"attention_window": 2, "share_embeddings": False},
}
# The host waits of one whole search outside its loop: the length limits before it (beam search:
# all of them, one tolist; greedy search: the longest, an int), and the outputs and their lengths
# (two tolist) after it.
FIXED_WAITS = {"beam_search": {"tolist": 3}, "greedy_search": {"_local_scalar_dense": 1, "tolist": 2}}


class StepCounter(Transformer):
    """A Transformer that counts its ``decode`` calls (one per search step) and raises the EOS
    logit by ``eos_bias``, so that some hypotheses end before their length limit."""

    def __init__(self, *args, eos_bias: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.eos_bias, self.steps = eos_bias, 0

    def decode(self, tgt_in, state, return_weights=False):
        self.steps += 1
        logits, state, weights = super().decode(tgt_in, state, return_weights)
        logits[..., EOS] += self.eos_bias
        return logits, state, weights


def random_model(seed: int, eos_bias: float = 0.0, **overrides) -> StepCounter:
    torch.manual_seed(seed)
    return StepCounter(V, V, eos_bias=eos_bias, **{**SMALL, **overrides}).eval()


def sources(lengths: list[int], seed: int) -> torch.Tensor:
    """Right-padded sources of ``lengths`` tokens, EOS last."""
    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths)), PAD)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.randint(3, V, (n,), generator=g)
        src[i, n - 1] = EOS
    return src


# ------------------------------------------------------------------------------ the techniques


def test_a_factory_call_without_a_device_is_caught():
    """The check works: inside ``torch.device("meta")`` alone, ``torch.arange(n)`` added to a CPU
    tensor raises (torch's own device check); with the dispatch check as well, so does using such
    a tensor as an index (which torch lets cross devices) and every factory kind; and the same
    code naming ``device=`` runs and gives the CPU result. If this failed, every other test here
    could pass without proving anything."""
    x = torch.zeros(4)
    with pytest.raises(RuntimeError, match="device"), torch.device("meta"):
        _ = x + torch.arange(4)
    forgetful = [lambda: x + torch.arange(4), lambda: x[torch.arange(2)], lambda: x * torch.full((4,), 2.0),
                 lambda: x.index_fill(0, torch.tensor([1]), 1.0), lambda: torch.cat([x, torch.zeros(1)])]
    for forgets in forgetful:
        with pytest.raises(DeviceNotNamed), tensors_name_their_device():
            forgets()
    with tensors_name_their_device():
        named = (x + torch.arange(4, device=x.device), x[torch.arange(2, device=x.device)],
                 x.index_fill(0, torch.tensor([1], device=x.device), 1.0), torch.where(x > 0, 1.0, x))
    assert [t.device.type for t in named] == ["cpu"] * 4
    assert named[0].tolist() == [0.0, 1.0, 2.0, 3.0] and named[2].tolist() == [0.0, 1.0, 0.0, 0.0]


def test_a_host_tensor_not_moved_to_the_device_is_caught():
    """A tensor made on the host (a collated batch) and computed with before ``.to(device)``
    raises, though on the CPU that move copies nothing; after it, the same computation runs."""
    weights = torch.arange(4.0)
    batch = host_tensors({"src": torch.tensor([0, 2])})
    with pytest.raises(DeviceNotNamed, match="never moved"), tensors_name_their_device():
        _ = weights[batch["src"]]
    with tensors_name_their_device():
        moved = weights[batch["src"].to(weights.device)]
    assert moved.tolist() == [0.0, 2.0]


@pytest.mark.parametrize(("kind", "wait"), [
    ("_local_scalar_dense", lambda t: t[0].item()), ("_local_scalar_dense", lambda t: int(t.max())),
    ("_local_scalar_dense", lambda t: bool(t[1] > 0)), ("_local_scalar_dense", lambda t: float(t.sum())),
    ("tolist", lambda t: t.tolist()), ("numpy", lambda t: t.numpy()), ("cpu", lambda t: t.cpu()),
    ("nonzero", lambda t: t.nonzero()), ("boolean_index", lambda t: t[t > 1]),
    ("repeat_interleave", lambda t: t.repeat_interleave(t.long())),
])
@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_the_sync_counter_sees_each_kind_of_wait(kind, wait, mode):
    """Each way of making the host wait for the device counts once, under its kind, whether
    autograd's dispatch keys run (no_grad) or not (inference_mode, where the searches run)."""
    with mode():
        t = torch.tensor([0.0, 2.0, 3.0])
        with count_host_syncs() as syncs:
            wait(t)
    assert dict(syncs.kinds) == {kind: 1}


def test_work_that_stays_on_the_device_is_not_counted():
    """What a search step does besides its stopping test (top-k, gathers, index_select, index_put
    with integer indices, where, cat, argmax) makes the host wait for nothing."""
    t = torch.tensor([[0.0, 2.0, 3.0], [1.0, 5.0, 4.0]])
    with count_host_syncs() as syncs:
        scores, ids = t.topk(2, dim=-1)
        rows = torch.arange(2, device=t.device)
        t[rows, 0] = torch.where(scores[:, 0] > 1, scores[:, 1], t[rows, 0])
        torch.cat([t.index_select(0, rows.flip(0)), ids.gather(1, ids.argmax(-1, keepdim=True)).float()], dim=1)
    assert syncs.total == 0


# ------------------------------------------------------------------------------ every tensor names its device


@pytest.mark.parametrize("variant", VARIANTS)
def test_training_forward_loss_and_backward_name_their_devices(variant):
    """Teacher forcing, the label-smoothed loss and its gradients create no tensor without a
    device, and give bit for bit what they give outside the check. Neither the forward pass nor the
    loss waits for the device (the token count stays a tensor)."""
    src, tgt = sources([5, 3, 7], seed=1), sources([6, 2, 4], seed=2)
    tgt_in = torch.cat([torch.full((3, 1), BOS), tgt[:, :-1]], dim=1)

    def run(model):
        logits = model(src, tgt_in)
        loss, nll, n_tokens = label_smoothed_loss(logits, tgt, 0.1, PAD)
        loss.backward()
        return logits.detach(), loss.detach(), nll, n_tokens, [p.grad for p in model.parameters()]

    expected = run(random_model(0, **VARIANTS[variant]).train())
    model = random_model(0, **VARIANTS[variant]).train()
    with tensors_name_their_device():
        got = run(model)
    assert all(torch.equal(a, b) for a, b in zip(got[:3], expected[:3])) and got[3] == expected[3]
    assert all(torch.equal(a, b) for a, b in zip(got[4], expected[4]))
    with torch.no_grad(), count_host_syncs() as forward_syncs:
        logits = model(src, tgt_in)
    with count_host_syncs() as loss_syncs:
        label_smoothed_loss(logits, tgt, 0.1, PAD)
    assert forward_syncs.total == 0 and loss_syncs.total == 0


@pytest.mark.parametrize("variant", VARIANTS)
def test_incremental_decoding_with_its_cache_names_its_devices(variant):
    """Decoding one token at a time, the key/value cache grown and reordered (``select``), creates
    no tensor without a device, never waits on the device, and equals teacher forcing."""
    model = random_model(0, **VARIANTS[variant])
    src = sources([5, 3, 7], seed=1)
    tgt_in = torch.cat([torch.full((3, 1), BOS), sources([6, 6, 6], seed=3)[:, :-1]], dim=1)
    with torch.no_grad():
        expected = model(src, tgt_in)
        with tensors_name_their_device(), count_host_syncs() as syncs:
            memory, src_mask, _ = model.encode(src)
            state = model.start_decoding(memory, src_mask)
            steps, before_last = [], state
            for t in range(tgt_in.size(1)):
                before_last = state
                logits, state, _ = model.decode(tgt_in[:, t : t + 1], state)
                steps.append(logits)
            order = torch.tensor([2, 0, 1], device=src.device)  # the last step again, rows reordered
            reordered, _, _ = model.decode(tgt_in[order, -1:], before_last.select(order))
    torch.testing.assert_close(torch.cat(steps, dim=1), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(reordered, steps[-1][order], rtol=1e-6, atol=1e-6)
    assert syncs.total == 0


@pytest.mark.parametrize("kv_cache", [True, False])
@pytest.mark.parametrize("variant", VARIANTS)
def test_beam_and_greedy_search_name_their_devices(variant, kv_cache):
    """Beam and greedy search create no tensor without a device, with and without the cache, and
    give the same outputs as outside the check; some sentences end early (EOS) and leave the batch,
    others run to their limit, so every branch of both loops runs."""
    src = sources([4, 9, 2, 6], seed=5)
    settings = {"bos_id": BOS, "eos_id": EOS, "max_len_offset": 4, "kv_cache": kv_cache}
    model = random_model(3, eos_bias=1.5, **VARIANTS[variant])
    expected = (beam_search(model, src, beam_size=3, alpha=0.6, **settings), greedy_search(model, src, **settings))
    with tensors_name_their_device():
        got = (beam_search(model, src, beam_size=3, alpha=0.6, **settings), greedy_search(model, src, **settings))
    assert got == expected
    limits = (src.ne(PAD).sum(-1) + 4).tolist()
    ended = [len(out) < limit for outputs in expected for out, limit in zip(outputs, limits)]
    assert any(ended) and not all(ended)  # some end early (EOS), leaving the batch; some reach their limit


# ------------------------------------------------------------------------------ one wait per step


def syncs_of(search, model: StepCounter, src: torch.Tensor, **settings) -> tuple[dict[str, int], int]:
    """The host waits of one search, by kind, and the steps it took."""
    model.steps = 0
    with count_host_syncs() as syncs:
        search(model, src, bos_id=BOS, **settings)
    return dict(syncs.kinds), model.steps


@pytest.mark.parametrize("kv_cache", [True, False])
@pytest.mark.parametrize(("search", "extra"), [(beam_search, {"beam_size": 4, "alpha": 0.6}), (greedy_search, {})])
def test_a_search_of_k_steps_waits_once_per_step(search, extra, kv_cache):
    """With an end-of-sentence id the model never produces, every sentence runs to its limit, the
    longest source length + max_len_offset steps: the waits grow by exactly one ``nonzero`` (the
    stopping test) per step, whatever K, on top of the fixed waits before and after the loop."""
    model = random_model(0)
    src = sources([5, 3, 4], seed=1)
    for offset in (2, 7, 12):
        kinds, steps = syncs_of(search, model, src, eos_id=V, max_len_offset=offset, kv_cache=kv_cache, **extra)
        assert steps == 5 + offset
        assert kinds == {**FIXED_WAITS[search.__name__], "nonzero": steps}


@pytest.mark.parametrize("beam_size", [1, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sentences_leaving_early_add_no_waits(seed, beam_size):
    """With sentences ending at different steps (leaving the batch, the search stopping early),
    beam and greedy search still wait once per step taken, plus the fixed waits."""
    model = random_model(seed, eos_bias=2.5)
    src = sources([3, 11, 6, 1, 8][: 3 + seed], seed=seed)
    beam, beam_steps = syncs_of(beam_search, model, src, eos_id=EOS, beam_size=beam_size, alpha=0.6, max_len_offset=10)
    greedy, greedy_steps = syncs_of(greedy_search, model, src, eos_id=EOS, max_len_offset=10)
    assert beam == {**FIXED_WAITS["beam_search"], "nonzero": beam_steps}
    assert greedy == {**FIXED_WAITS["greedy_search"], "nonzero": greedy_steps}
    assert 0 < greedy_steps < max(src.ne(PAD).sum(-1).tolist()) + 10  # ended before the limit


# ------------------------------------------------------------------------------ export


def test_marian_order_is_made_on_the_device_asked_for():
    """The permutation of d_model is made where the weights it indexes are, the same numbers."""
    with tensors_name_their_device():
        order = marian_order(8, device=torch.device("cpu"))
    assert order.device.type == "cpu" and order.tolist() == [0, 2, 4, 6, 1, 3, 5, 7] == marian_order(8).tolist()


def test_copying_into_marian_names_its_devices():
    """``copy_to_marian`` (the export's weight mapping: d_model reordered, Marian's biases zeroed)
    creates no tensor without a device, and the copy computes our teacher-forced logits. The
    MarianMTModel itself is built outside the check: transformers' code is not ours."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (aiayn[serve])")
    model = random_model(0)  # d_k = d_v = d_model / h, as Marian's heads are
    marian = transformers.MarianMTModel(marian_config(model, bos_id=BOS, eos_id=EOS)).eval()
    with tensors_name_their_device():
        copy_to_marian(model, marian)
    src, tgt_in = sources([5, 3], seed=1), sources([4, 6], seed=2)
    with torch.no_grad():
        theirs = marian(input_ids=src, attention_mask=src.ne(PAD).long(), decoder_input_ids=tgt_in).logits
        ours = model(src, tgt_in)
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=5e-5)
