"""aiayn.model.blocked_topk against torch's own topk: the same best scores, best first, at the
same positions wherever no two candidates score exactly alike."""

from __future__ import annotations

import pytest
import torch

from aiayn.model.blocked_topk import block_width, top_candidates


def candidates(rows: int, beam: int, vocab: int, seed: int, masked: float = 0.0) -> torch.Tensor:
    """Beam-search candidates as a step makes them: log-softmax over the vocabulary plus each beam's
    score, (rows, beam·vocab); ``masked``: the share set to -inf (a constraint, a dead beam)."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(rows, beam, 1, generator=g) * 3
    log_probs = torch.log_softmax(torch.randn(rows, beam, vocab, generator=g) * 4, -1)
    flat = (log_probs + scores).view(rows, beam * vocab)
    if masked:
        flat[torch.rand(flat.shape, generator=g) < masked] = float("-inf")
    return flat


# the default job's vocabulary at 128 sentences and at one, WMT's 37k, parsing's beam 21 (§6.3)
@pytest.mark.parametrize("rows, beam, vocab", [(128, 4, 8000), (1, 4, 8000), (3, 4, 37000), (2, 21, 16000)])
@pytest.mark.parametrize("masked", [0.0, 0.99])
def test_blocked_topk_finds_torchs_topk(rows, beam, vocab, masked):
    found = candidates(rows, beam, vocab, seed=rows + vocab, masked=masked)
    width = block_width(beam * vocab)
    assert width is not None and beam * vocab // width > 4 * 2 * beam  # the blocked path is the one tested
    scores, positions = top_candidates(found, 2 * beam)
    want_scores, want_positions = found.topk(2 * beam, dim=-1)
    assert torch.equal(scores, want_scores)  # the same values, best first
    assert torch.equal(found.gather(1, positions), scores)  # each position holds its score
    assert all(len(set(row)) == len(row) for row in positions.tolist())  # distinct candidates
    finite = torch.isfinite(want_scores)
    assert torch.equal(positions[finite], want_positions[finite])  # no ties among finite log-probs here


def test_ties_give_the_tied_scores_at_distinct_positions():
    found = torch.zeros(2, 4 * 128)
    found[0, 7], found[1, 300] = 1.0, 2.0
    scores, positions = top_candidates(found, 8)
    assert torch.equal(scores, found.topk(8, dim=-1).values)
    assert positions[0, 0] == 7 and positions[1, 0] == 300
    assert all(len(set(row)) == 8 for row in positions.tolist())


@pytest.mark.parametrize("size", [40, 8003 * 4, 512])
def test_rows_without_a_fitting_block_width_or_too_few_blocks_use_topk(size):
    found = torch.randn(3, size)
    assert block_width(8003 * 4) is None
    scores, positions = top_candidates(found, 8)
    assert torch.equal(scores, found.topk(8, dim=-1).values) and torch.equal(positions, found.topk(8, dim=-1).indices)
