"""Exactness of rejection sampling with a reduced-vocabulary draft (stream/hot_chain_verify.py).

The output distribution of (propose x ~ q on the hot set, accept / reject, residual) is computed from the CPU twin
itself, not from a formula: every draft x is weighted by q(x), and both coins sweep a midpoint grid of N values
(the accept coin decides ``coin * q < p``, a threshold in the coin; the final coin inverts a CDF), so each
token's probability is reproduced to within about 1/N per coin.  It must equal the target p.  The same harness
rejects two deliberately broken verifies: a residual taken over the hot set only, and q read at the target id
as if it were a draft index.
"""

import pytest
import torch

from sglang_detspec.stream.hot_chain_verify import EMIT_PAD, hot_chain_verify_reference
from sglang_detspec.stream.hot_vocab import HotVocab

N = 300  # grid points per coin
TOL = 2.5 / N  # an accept-coin and a final-coin discretisation error, with margin

VT = 7
HOT = torch.tensor([5, 1, 3, 6])  # unsorted, and not a prefix of the vocabulary
Q = torch.tensor([0.4, 0.3, 0.2, 0.1])  # draft q over HOT (target ids 5, 1, 3, 6)
P = torch.tensor([0.10, 0.05, 0.20, 0.25, 0.05, 0.15, 0.20])  # mass 0.35 off the hot set; p < q at 5 and 1


def first_token_distribution(target_to_draft, *, residual_on_hot_only=False):
    """P(first emitted token = t) of a one-draft chain verify, from the reference on the coin grids."""
    grid = (torch.arange(N, dtype=torch.float64) + 0.5) / N
    x_idx, u_idx, f_idx = torch.meshgrid(torch.arange(len(HOT)), torch.arange(N), torch.arange(N), indexing="ij")
    B = x_idx.numel()
    candidates = torch.stack([torch.zeros(B, dtype=torch.int64), HOT[x_idx.reshape(-1)]], dim=1)
    coins = grid[u_idx.reshape(-1)].to(torch.float32).view(B, 1)
    final = grid[f_idx.reshape(-1)].to(torch.float32)
    p_row = P.clone()
    if residual_on_hot_only:  # the broken verify: p restricted to H in the residual row (acceptance reads p on H)
        off = torch.ones(VT, dtype=torch.bool)
        off[HOT] = False
        p_row[off] = 0.0
    target = torch.stack([p_row, P]).expand(B, 2, VT).contiguous()
    draft = Q.view(1, 1, -1).expand(B, 1, len(HOT)).contiguous()
    accepted, emitted = hot_chain_verify_reference(candidates, coins, final, target, draft, target_to_draft)
    assert (emitted[:, 0] != EMIT_PAD).all()
    weight = (Q[x_idx.reshape(-1)] / (N * N)).to(torch.float64)
    return torch.zeros(VT, dtype=torch.float64).index_add_(0, emitted[:, 0], weight), accepted


def test_output_distribution_is_the_target():
    hv = HotVocab.from_hot_token_id(HOT, VT)
    dist, accepted = first_token_distribution(hv.target_to_draft)
    assert 0 < accepted.float().mean() < 1  # both accepts and residual draws happen
    assert (dist - P.double()).abs().max() < TOL, dist.tolist()
    # the accept rate is sum_x min(q, p): analytically 0.15 + 0.05 + 0.2 + 0.1 = 0.5
    rate = (accepted.double().view(len(HOT), N * N).mean(1) * Q.double()).sum()
    assert abs(rate - 0.5) < TOL


def test_a_residual_over_the_hot_set_only_is_caught():
    hv = HotVocab.from_hot_token_id(HOT, VT)
    dist, _ = first_token_distribution(hv.target_to_draft, residual_on_hot_only=True)
    assert (dist - P.double()).abs().max() > 10 * TOL  # tokens 0, 2, 4 are never emitted


def test_q_read_at_the_target_id_is_caught():
    """q_draft[x] instead of q_draft[target_to_draft[x]]: the map an implementation gets wrong by indexing the
    reduced q with target ids."""
    wrong = torch.where(torch.arange(VT) < len(HOT), torch.arange(VT), -1).to(torch.int32)
    dist, _ = first_token_distribution(wrong)
    assert (dist - P.double()).abs().max() > 10 * TOL


@pytest.mark.parametrize("S", [1, 3])
def test_the_full_vocabulary_path_is_the_identity_map(S):
    """A draft whose map is the identity is an ordinary full-vocabulary draft: same rule, no hot set."""
    g = torch.Generator().manual_seed(S)
    B, V = 64, 12
    target = torch.softmax(torch.randn(B, S + 1, V, generator=g), -1)
    draft = torch.softmax(torch.randn(B, S, V, generator=g), -1)
    cand = torch.randint(0, V, (B, S + 1), generator=g)
    coins, final = torch.rand(B, S, generator=g), torch.rand(B, generator=g)
    ident = torch.arange(V, dtype=torch.int32)
    accepted, emitted = hot_chain_verify_reference(cand, coins, final, target, draft, ident)
    # independent re-derivation of the first step for rows that reject it
    p1 = target[torch.arange(B), 0, cand[:, 1]]
    q1 = draft[torch.arange(B), 0, cand[:, 1]]
    assert torch.equal(accepted > 0, coins[:, 0] * q1 < p1)
    rej = accepted == 0
    residual = (target[:, 0] - draft[:, 0]).clamp(min=0)
    cdf = residual.cumsum(1)
    want = (cdf <= (final * residual.sum(1)).view(-1, 1)).sum(1).clamp(max=V - 1)
    assert torch.equal(emitted[rej, 0], want[rej])
