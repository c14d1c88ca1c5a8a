"""CPU twin of the chain rejection-sampling verify with a reduced-vocabulary ("hot token") draft.

Rejection sampling stays exact when the draft's q is supported on a subset H of the target vocabulary: the draft
proposes x ~ q (x a TARGET id in H, :mod:`sglang_detspec.stream.hot_vocab`), the verify accepts with probability
min(1, p(x) / q(x)), and on rejection draws from the residual max(p - q, 0) normalised over the WHOLE target
vocabulary, with q = 0 off H -- so every target token outside H keeps its full mass p(t) in the residual.  Then the
emitted token is distributed exactly as p (Leviathan et al. 2023, Chen et al. 2023; the proof never uses the
draft's support).  Here q is read through ``target_to_draft`` (int32 ``[V]``, -1 off H; ``HotVocab``): q(x) =
``draft_probs[b, row, target_to_draft[x]]``.

The rule, step for step SGLang 0.5.23's ``speculative_sampling_classic_kernel`` (its non-block path, which every
DETSPEC verify runs; block verification is refused), for one request with drafts x_1..x_S:

* step s (1 <= s <= S, row r = s - 1, while every earlier draft was accepted): accept x_s iff ``0 < q(x_s) <= 1``
  and ``coin[s-1] * q(x_s) < p_r(x_s)`` (float32);
* final row r = number accepted: if all S were accepted, the bonus is drawn from p_S itself; else from
  ``val = max(p_r - q_r, 0)`` with ``q_r`` 0 off H and wherever it is not a probability (NaN, inf, negative);
  the token is the first v with ``cumsum(val)[v] > final_coin * sum(val)``, else ``V - 1`` (SGLang's fallback
  when the residual is empty).

Sums are float32 (torch's order here; the Triton kernel's blockwise order can differ in the last bits, which moves
the drawn token only when ``final_coin * sum`` falls within rounding of a CDF boundary).  Builds ``[B, V]``
tensors: for CPU tests and audits; the kernel is :mod:`sglang_detspec.kernels.hot_chain_verify`.
"""

from __future__ import annotations

from typing import Tuple

import torch

from .hot_vocab import NOT_HOT

__all__ = ["EMIT_PAD", "check_hot_chain_inputs", "hot_chain_verify_reference", "hot_draft_q_of"]

#: Entries of the emitted-token matrix past the accepted prefix and its one correction / bonus token.
EMIT_PAD = -1


def check_hot_chain_inputs(candidates, coins, final_coins, target_probs, draft_probs, target_to_draft) -> None:
    """Shapes of a chain verify with a reduced draft (no values read: capture-safe).

    ``candidates`` int ``[B, S+1]`` (column 0 the last verified token, then the S drafts, as TARGET ids);
    ``coins`` float32 ``[B, S]``; ``final_coins`` float32 ``[B]``; ``target_probs`` float32 ``[B, S+1, V]``;
    ``draft_probs`` float32 ``[B, S, Vd]`` (the reduced q of each draft step); ``target_to_draft`` int32 ``[V]``.
    """
    if not isinstance(target_probs, torch.Tensor) or target_probs.dim() != 3:
        raise ValueError(f"target_probs must be [batch, drafts + 1, vocab], got {getattr(target_probs, 'shape', None)}")
    B, S1, V = target_probs.shape
    if not isinstance(candidates, torch.Tensor) or tuple(candidates.shape) != (B, S1) or candidates.dtype not in (
        torch.int32, torch.int64
    ):
        raise ValueError(f"candidates must be an int32/int64 [{B}, {S1}] tensor of target ids, got "
                         f"{getattr(candidates, 'dtype', None)} {tuple(getattr(candidates, 'shape', ()))}")
    if not isinstance(draft_probs, torch.Tensor) or draft_probs.dim() != 3 or tuple(draft_probs.shape[:2]) != (
        B, S1 - 1
    ):
        raise ValueError(f"draft_probs must be the reduced q [{B}, {S1 - 1}, Vd], got "
                         f"{tuple(getattr(draft_probs, 'shape', ()))}")
    if draft_probs.shape[2] > V:
        raise ValueError(f"draft_probs has {draft_probs.shape[2]} columns, more than the target's {V}")
    if not isinstance(target_to_draft, torch.Tensor) or target_to_draft.dtype != torch.int32 \
            or tuple(target_to_draft.shape) != (V,):
        raise ValueError(f"target_to_draft must be int32 [{V}] (HotVocab.target_to_draft), got "
                         f"{getattr(target_to_draft, 'dtype', None)} {tuple(getattr(target_to_draft, 'shape', ()))}")
    if not isinstance(coins, torch.Tensor) or tuple(coins.shape) != (B, S1 - 1):
        raise ValueError(f"coins must be [{B}, {S1 - 1}], got {tuple(getattr(coins, 'shape', ()))}")
    if not isinstance(final_coins, torch.Tensor) or final_coins.numel() != B:
        raise ValueError(f"final_coins must hold {B} values, got {getattr(final_coins, 'numel', lambda: '?')()}")
    for name, t in (("target_probs", target_probs), ("draft_probs", draft_probs)):
        if t.dtype != torch.float32:
            raise ValueError(f"{name} must be float32, got {t.dtype}")


def hot_draft_q_of(draft_row: torch.Tensor, target_to_draft: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """q at TARGET ids ``tokens`` (any shape ``[B, ...]``) from reduced rows ``draft_row`` ``[B, Vd]``: 0 off H."""
    d = target_to_draft.to(torch.int64)[tokens]
    hot = d != NOT_HOT
    flat = d.clamp(min=0).reshape(d.shape[0], -1)
    q = draft_row.gather(1, flat).reshape(d.shape)
    return torch.where(hot, q, torch.zeros((), dtype=q.dtype))


def hot_chain_verify_reference(
    candidates: torch.Tensor,
    coins: torch.Tensor,
    final_coins: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    target_to_draft: torch.Tensor,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(accept_len int64 [B], emitted int64 [B, S+1])``: the accepted drafts, then the correction or bonus token,
    then :data:`EMIT_PAD` (the module docstring gives the rule)."""
    check_hot_chain_inputs(candidates, coins, final_coins, target_probs, draft_probs, target_to_draft)
    B, S1, V = target_probs.shape
    S = S1 - 1
    rows = torch.arange(B, device=target_probs.device)
    cand = candidates.to(torch.int64)
    accepted = torch.zeros(B, dtype=torch.int64, device=target_probs.device)
    alive = torch.ones(B, dtype=torch.bool, device=target_probs.device)
    for s in range(1, S + 1):
        x = cand[:, s]
        p = target_probs[rows, s - 1, x]
        q = hot_draft_q_of(draft_probs[:, s - 1], target_to_draft, x.view(-1, 1)).view(-1)
        ok = alive & (q > 0) & (q <= 1) & (coins[:, s - 1] * q < p)
        accepted += ok.to(torch.int64)
        alive = ok
    all_accepted = accepted == S
    p_row = target_probs[rows, accepted]  # [B, V]
    residual_row = accepted.clamp(max=max(S - 1, 0))
    if S > 0:
        q_row = hot_draft_q_of(draft_probs[rows, residual_row], target_to_draft,
                               torch.arange(V, device=p_row.device).expand(B, V))
        q_row = torch.where((q_row >= 0) & (q_row <= 1), q_row, torch.zeros((), dtype=q_row.dtype))
        diff = p_row - q_row
        residual = torch.where(diff > 0, diff, torch.zeros((), dtype=diff.dtype))
        val = torch.where(all_accepted.view(-1, 1), p_row, residual)
    else:
        val = p_row
    cdf = torch.cumsum(val, dim=1)
    target_u = final_coins.reshape(-1) * val.sum(dim=1)
    above = cdf > target_u.view(-1, 1)
    final = torch.where(above.any(dim=1), above.to(torch.int8).argmax(dim=1), torch.full_like(accepted, V - 1))
    steps = torch.arange(S1, device=p_row.device).view(1, -1)
    emitted = torch.where(steps < accepted.view(-1, 1), cand.roll(-1, dims=1), torch.full_like(cand, EMIT_PAD))
    emitted = torch.where(steps == accepted.view(-1, 1), final.view(-1, 1), emitted)
    return accepted, emitted
