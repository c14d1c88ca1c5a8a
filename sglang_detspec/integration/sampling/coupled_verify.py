"""The coupled verify of ``DETSPEC_*_INVARIANT``: the target's own seeded race decides every emitted token.

Why
---
Rejection sampling spends its randomness differently from plain sampling, so a seeded speculative server and a
seeded non-speculative one give different tokens for the same seed (0 of 768 24-token sequences equal, measured on
the H200 with sglang 0.5.17). The coupled verify (Daliri, Musco, Suresh, arXiv 2408.07978) instead races, at every
verified position, exactly what SGLang's non-speculative sampler races for that token:

* the probabilities: upstream ``eagle_sample``'s ``softmax(logits / T)`` (the non-speculative ``Sampler`` computes
  ``logits.div_(T)`` then ``torch.softmax``: the same float32 operations per row), then the row's own top-k /
  top-p / min-p by the project's row-local truncation, **not** renormalised -- what the plugin's token-id-keyed
  target sampler (:mod:`.target_sampler`) hands to ``sampling_from_probs_torch``;
* the noise: ``multinomial_with_seed``'s Gumbel race keyed by ``(seed, position, token id)``, where the position
  is the verified row's input position ``seq_lens + j`` (the non-speculative decode keys a token by its input
  token's position, ``forward_batch.positions``; the verify's row ``j`` reads ``candidates[:, j]`` at
  ``seq_lens + j``, its KV slot's offset);

and accepts the draft of row ``j`` while it equals the target's token. The first mismatch, or the bonus after a
fully accepted chain, emits the target's token. So every committed token is the non-speculative server's token,
whatever the draft proposed; the draft (:func:`~sglang_detspec.integration.sampling.proposal.coupled_draft_proposal`, same
key) only decides how many come out per step.

Where it runs
-------------
In place of ``chain_speculative_sampling_triton`` inside the rebound ``eagle_sample``
(:mod:`sglang_detspec.integration.sampling.verify`), with the same outputs: ``predicts[retrive_index[b, j]]`` holds the
emitted token of row ``j`` for ``j <= accepted`` (0 elsewhere, as the chain kernel leaves it), ``accept_index[b, j]``
is ``retrive_index[b, j]`` for ``j <= accepted`` (-1 elsewhere), ``accept_token_num[b]`` the accepted drafts. The
coins and ``draft_probs`` upstream prepared are not read.

Known gaps (documented, not silent): upstream applies repetition / frequency / presence penalties to the verify
logits in a relaxed form (every verified row sees the penalties of the committed tokens only), which a
non-speculative server does not; the first penalised batch logs a warning. Everything is device work: no host
synchronisation, capturable.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from sglang_detspec.integration import compat
from sglang_detspec.integration.sampling.truncation import batch_truncates, truncate_request_rows
from sglang_detspec.stream.coupled_reference import accept_and_emit

__all__ = ["coupled_chain_verify", "coupled_target_tokens", "target_race_positions"]

logger = logging.getLogger(__name__)
_warned_penalties = False


def target_race_positions(seq_lens: torch.Tensor, rows_per_request: int) -> torch.Tensor:
    """``[B, S+1]`` key positions ``seq_lens[b] + j``: the input position of verified row ``j``."""
    steps = torch.arange(rows_per_request, device=seq_lens.device, dtype=torch.int64)
    return seq_lens.to(torch.int64).view(-1, 1) + steps.view(1, -1)


def coupled_target_tokens(sampling_info: Any, target_probs: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The target's token for every verified row, ``[B, S+1]`` int64: SGLang's non-speculative seeded draw.

    ``target_probs`` ``[B, S+1, V]`` float32 is ``softmax(logits / T)``; ``positions`` ``[B, S+1]``.
    """
    bs, rows, vocab = target_probs.shape
    flat = target_probs.reshape(bs * rows, vocab)
    if batch_truncates(sampling_info):
        # renormalize=False: the non-speculative race reads the kept values as they are
        flat = truncate_request_rows(flat, sampling_info, rows, renormalize=False)
    # The race reads torch.log(flat), the op sampling_from_probs_torch runs before multinomial_with_seed; on CUDA
    # the kernel takes that log itself (bit-identical there, kernels/coupled_race.py), so no [B*(S+1), V] temporary.
    seeds = torch.repeat_interleave(sampling_info.sampling_seed.reshape(-1)[:bs].to(torch.int64), rows)
    cap = compat.seeded_race_caps_unit_uniform()
    if flat.is_cuda:
        from sglang_detspec.kernels.coupled_race_probs import coupled_race_probs

        tokens = coupled_race_probs(flat, seeds, positions.reshape(-1), cap_unit_uniform=cap)
    else:
        from sglang_detspec.stream.coupled_reference import coupled_race_reference

        tokens = coupled_race_reference(torch.log(flat), seeds, positions.reshape(-1), cap_unit_uniform=cap)
    return tokens.view(bs, rows)


def _warn_once_for_penalties(sampling_info: Any) -> None:
    global _warned_penalties
    if _warned_penalties:
        return
    if getattr(sampling_info, "acc_additive_penalties", None) is not None or getattr(
        sampling_info, "acc_scaling_penalties", None
    ) is not None:
        _warned_penalties = True
        logger.warning(
            "sglang-detspec: a batch with repetition / frequency / presence penalties reached the "
            "speculation-invariant verify. SGLang's verify applies penalties in a relaxed form, so penalised "
            "requests may differ from a non-speculative server's tokens (they stay reproducible per seed)."
        )


def coupled_chain_verify(sampling_info: Any, seq_lens: torch.Tensor, **chain_kwargs: Any) -> None:
    """Fill ``chain_speculative_sampling_triton``'s outputs by the coupled rule (module docstring).

    Takes the chain kernel's keyword arguments (``predicts``, ``accept_index``, ``accept_token_num``,
    ``candidates``, ``retrive_index``, ``target_probs`` are read; the coins and ``draft_probs`` are not).
    """
    if getattr(sampling_info, "sampling_seed", None) is None:
        raise RuntimeError(
            "DETSPEC invariant verify: the batch has no sampling seeds; the coupled race reproduces SGLang's seeded "
            "sampler and needs --enable-deterministic-inference"
        )
    if seq_lens is None:
        raise RuntimeError(
            "DETSPEC invariant verify: the verify batch has no seq_lens to key the race with; sglang-detspec needs "
            "updating for this SGLang version"
        )
    _warn_once_for_penalties(sampling_info)
    target_probs = chain_kwargs["target_probs"]
    candidates = chain_kwargs["candidates"]
    retrive_index = chain_kwargs["retrive_index"]
    predicts = chain_kwargs["predicts"]
    accept_index = chain_kwargs["accept_index"]
    accept_token_num = chain_kwargs["accept_token_num"]
    bs, rows, _ = target_probs.shape
    if tuple(candidates.shape) != (bs, rows) or tuple(retrive_index.shape) != (bs, rows):
        raise RuntimeError(
            f"DETSPEC invariant verify: candidates {tuple(candidates.shape)} / retrive_index "
            f"{tuple(retrive_index.shape)} do not match target_probs' [{bs}, {rows}] rows (a linear topk-1 chain is "
            "expected); sglang-detspec needs updating for this SGLang version"
        )
    if accept_index.dim() != 2 or accept_index.shape[0] != bs or accept_index.shape[1] < rows:
        raise RuntimeError(
            f"DETSPEC invariant verify: accept_index has shape {tuple(accept_index.shape)}, expected [{bs}, >= {rows}]"
        )
    target = coupled_target_tokens(sampling_info, target_probs, target_race_positions(seq_lens[:bs], rows))
    accepted, _ = accept_and_emit(target, candidates[:, 1:])
    steps = torch.arange(rows, device=target.device).view(1, -1)
    taken = steps <= accepted.view(-1, 1)
    # Every row of the chain has its own predicts slot; the un-emitted ones get 0, as the chain kernel leaves them.
    predicts.scatter_(
        0, retrive_index.reshape(-1).to(torch.int64), torch.where(taken, target, 0).to(predicts.dtype).reshape(-1)
    )
    accept_index[:, :rows].copy_(torch.where(taken, retrive_index.to(accept_index.dtype), -1))
    accept_token_num.copy_(accepted.to(accept_token_num.dtype))
