"""The target model's seeded sampler, keyed by token id on every path.

Why
---
Under ``--enable-deterministic-inference`` SGLang's target ``Sampler`` (``layers/sampler.py``) draws every token it
samples -- for a DETSPEC server: the first token after each prefill -- with ``multinomial_with_seed``, a Gumbel race
keyed by ``(seed, position, column)``. On the simple path (no row of the batch has top-k, top-p or min-p) the column
is the **token id**. As soon as one row of the batch has any of them (a greedy neighbour counts: top_k = 1),
``top_k_top_p_min_p_sampling_from_probs_torch`` handles *every* row: it sorts the probabilities and hashes the noise
by **rank**, so a temperature-only request draws a different token depending on its neighbours (on 2,000 replayed
rows, 1,983 changed). With a seed, min-p also asserts there (upstream #33695).

What DETSPEC changes
--------------------
The target model runner's ``Sampler`` becomes a ``DetspecSampler`` (:func:`detspec_sampler_class`), whose ``_sample_from_probs`` is upstream's
body with ``top_k_top_p_min_p_sampling_from_probs_torch`` replaced by :func:`_sample_by_token_id` when the batch is
seeded: each row's own top-k / top-p / min-p is applied by the project's row-local truncation (ties by lower index,
exact masses, kept values bit-identical, not renormalised -- a Gumbel race needs no normalisation), then the row is
sampled exactly like the simple path, ``sampling_from_probs_torch`` keyed by token id. A row without truncation
therefore draws the same token as it would in a batch without any top-k / top-p / min-p neighbour. Unseeded batches
(not deterministic mode) keep upstream's function.

Known difference (inherited, tiny): SGLang samples an all-greedy batch by ``argmax(logits)`` but a greedy row in a
sampled batch by the first maximum of ``softmax(logits)``; the two differ only when two logits round to the same
float32 probability.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from sglang_detspec.integration.sampling.truncation import truncate_probs
from sglang_detspec.integration.upstream_code import rebind

__all__ = ["SORTED_SAMPLER_NAME", "detspec_sampler_class", "install_detspec_sampler", "sample_by_token_id"]

SORTED_SAMPLER_NAME = "top_k_top_p_min_p_sampling_from_probs_torch"


def sample_by_token_id(
    sorted_sampler: Callable,
    probs: torch.Tensor,
    top_ks: torch.Tensor,
    top_ps: torch.Tensor,
    min_ps: torch.Tensor,
    need_min_p_sampling: bool,
    sampling_seed,
    positions: torch.Tensor,
    *,
    return_filtered_probs: bool = False,
    **_upstream_only,
):
    """Seeded top-k / top-p / min-p sampling whose noise is keyed by token id (see the module docstring).

    ``sorted_sampler`` is upstream's function, used unchanged for unseeded batches. ``_upstream_only`` takes
    0.5.22+'s ``max_top_k`` (an unseeded shortcut upstream itself skips under a seed).
    """
    if sampling_seed is None:
        return sorted_sampler(
            probs, top_ks, top_ps, min_ps, need_min_p_sampling, sampling_seed, positions,
            **({"return_filtered_probs": True} if return_filtered_probs else {}), **_upstream_only,
        )
    from sglang.srt.layers.sampler import sampling_from_probs_torch

    kept = truncate_probs(probs, top_ks, top_ps, min_ps if need_min_p_sampling else None, renormalize=False)
    token_ids = sampling_from_probs_torch(kept, sampling_seed=sampling_seed, positions=positions)
    if not return_filtered_probs:
        return token_ids
    # 0.5.20+ sampling-mask capture: weights in vocabulary order, so the token permutation is the identity.
    identity = torch.arange(kept.shape[-1], device=kept.device, dtype=torch.int32).expand_as(kept)
    selected = kept.gather(1, token_ids.long().view(-1, 1)).view(-1)
    return token_ids, kept, identity, selected


def _keyed_by_token_id(sorted_sampler: Callable) -> Callable:
    return functools.partial(sample_by_token_id, sorted_sampler)


@functools.lru_cache(maxsize=None)
def _detspec_sample_from_probs() -> Callable:
    from sglang.srt.layers.sampler import Sampler

    return rebind(
        vars(Sampler)["_sample_from_probs"],
        {SORTED_SAMPLER_NAME: _keyed_by_token_id},
        required=(SORTED_SAMPLER_NAME,),
    )


@functools.lru_cache(maxsize=None)
def detspec_sampler_class() -> type:
    """The ``DetspecSampler`` class (built lazily: importing SGLang's sampler pulls in the model stack)."""
    from sglang.srt.layers.sampler import Sampler

    class DetspecSampler(Sampler):
        """SGLang's ``Sampler`` whose seeded top-k / top-p / min-p path is keyed by token id."""

        def _sample_from_probs(self, *args, **kwargs):
            return _detspec_sample_from_probs()(self, *args, **kwargs)

    return DetspecSampler


def install_detspec_sampler(model_runner: Any) -> None:
    """Make ``model_runner.sampler`` a DetspecSampler (the same instance, its class swapped).

    Swapping the class keeps every reference to the instance valid. Refused for anything but SGLang's own
    ``Sampler``: deterministic inference forces the ``pytorch`` sampling backend, so any other class means a
    custom sampler whose seeded path sglang-detspec has not checked.
    """
    from sglang.srt.layers.sampler import Sampler

    sampler = getattr(model_runner, "sampler", None)
    cls = detspec_sampler_class()
    if isinstance(sampler, cls):
        return
    if type(sampler) is not Sampler:
        raise RuntimeError(
            f"DETSPEC speculative decoding needs SGLang's own target Sampler, found {type(sampler).__name__}: "
            "a custom sampler backend (register_sampler_backend) is not supported with DETSPEC algorithms"
        )
    _detspec_sample_from_probs()  # check the rebinding now, at worker construction, not at the first request
    sampler.__class__ = cls
