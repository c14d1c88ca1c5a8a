"""DETSPEC verify: SGLang's own rejection-sampling verify, with a row-local target truncation.

Why
---
Upstream ``eagle_sample`` (``speculative/eagle_utils.py``, every release 0.5.17 - 0.5.23) builds the target
distribution of a verify step as ``softmax(logits / T)`` and then, **batch-wide**, calls FlashInfer /
sgl-kernel ``top_k_renorm_prob`` if any row of the batch has a top-k (greedy rows count: top_k = 1) and
``top_p_renorm_prob`` if any row has a top-p. Those kernels use float atomics (not deterministic), keep both
tokens of a k = 1 tie, JIT-compile for minutes where no prebuilt kernel exists, and ``min_p`` is ignored
altogether. A seeded request's accept / reject decisions could therefore depend on its neighbours' sampling
parameters. On 0.5.22+ the softmax itself (``sampling_softmax``) switches kernels by batch size on SM 10.3.

What DETSPEC changes (nothing else)
-----------------------------------
The DETSPEC workers' ``verify`` runs upstream's ``verify`` -> ``run_eagle_verify`` -> ``eagle_sample`` code
unchanged (:func:`~sglang_detspec.integration.upstream_code.rebind`), with these names replaced inside
``eagle_sample`` (as module globals on 0.5.23, as in-body imports on 0.5.17 - 0.5.22):

* every top-k / top-p renorm name -> :func:`_deferred_renorm`, which returns the probabilities unchanged;
* ``chain_speculative_sampling_triton`` (the rejection-sampling kernel) -> a wrapper that first applies the
  project's row-local truncation (:func:`sglang_detspec.integration.sampling.truncation.truncate_probs`: top-k, top-p and
  min-p of each row's *own* request, ties by lower index, exact fixed-point masses, renormalised; rows without
  truncation returned bit for bit) to the target probabilities, then calls the upstream kernel on the result;
* ``sampling_softmax`` (0.5.22+) -> ``torch.softmax(logits / T)``, which is what it computes on every device
  but SM 10.3, and what 0.5.17 - 0.5.21 call directly;
* ``_verify_coins`` -> the same seeded coins in one Triton launch on CUDA (:mod:`sglang_detspec.kernels.
  seeded_verify_coins`; ``SGLANG_DETSPEC_VERIFY_COINS_KERNEL=0`` keeps SGLang's torch ops).

A reduced-vocabulary ("hot token") draft (:mod:`sglang_detspec.stream.hot_vocab`; the spec worker enters
:func:`reduced_draft_vocab` around its verify) hands ``eagle_sample`` q as ``[B, S, Vd]``, which upstream's width
check (``draft_probs.shape[-1] != target_probs.shape[-1]``, every release) refuses. :func:`detspec_eagle_sample` then
hands upstream a zero-copy ``[B, S, V]`` stand-in for ``verify_input.draft_probs`` (a stride-0 view of q's first
column: the check reads only its shape) and keeps the reduced q on the verify site; the chain stand-in requires that
very stand-in back as ``draft_probs`` and runs
:func:`~sglang_detspec.kernels.hot_chain_verify.hot_chain_speculative_sampling` on the reduced q, reading it through
``target_to_draft``, after the same row-local truncation. No ``[B, S, V]`` scatter is built.

Under the coupled scheme (``DETSPEC_*_INVARIANT``, :mod:`.scheme`) the chain-kernel stand-in runs
:func:`~sglang_detspec.integration.sampling.coupled_verify.coupled_chain_verify` instead of truncating and calling the
kernel: the target's own seeded race (truncated, not renormalised) decides every emitted token.

So a row's target distribution depends only on its own logits and sampling parameters, min-p is honoured, and no
FlashInfer sampling kernel (and no JIT) is reached. The truncation kernel is launched only when the batch has a
top-k, top-p or min-p row (SGLang's own host-side ``need_*`` flags), so pure-temperature batches pay nothing.

Safety: the stand-ins only act inside the verify site this module opens (a ``ContextVar``); the names are
checked when the DETSPEC worker is built (:func:`check_verify_rebinding`), including that no *other* renorm name
is reachable from ``eagle_sample``; and after every sampled verify the chain wrapper must have run, or the step
raises instead of committing tokens from an unknown path.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import re
from typing import Any, Callable, Iterator, Optional

import torch

from sglang_detspec.integration.sampling import scheme
from sglang_detspec.integration.sampling.coupled_verify import coupled_chain_verify
from sglang_detspec.integration.sampling.truncation import batch_truncates, truncate_request_rows
from sglang_detspec.integration.setup.verify_coins_switch import verify_coins_kernel_wanted
from sglang_detspec.integration.upstream_code import Site, reachable_names, rebind
from sglang_detspec.stream.hot_vocab import HotVocab

__all__ = [
    "CHAIN_KERNEL_NAME",
    "RENORM_NAMES",
    "VerifySite",
    "check_verify_rebinding",
    "detspec_eagle_sample",
    "detspec_run_eagle_verify",
    "rebound_verify",
    "reduced_draft_vocab",
]

#: Every name under which an SGLang release hands ``eagle_sample`` a target renorm kernel (sgl-kernel,
#: FlashInfer, the Triton port on HIP).
RENORM_NAMES = (
    "top_k_renorm_prob",
    "top_p_renorm_prob",
    "top_k_renorm_probs",
    "top_p_renorm_probs",
    "top_k_renorm_probs_triton",
    "top_p_renorm_probs_triton",
)
CHAIN_KERNEL_NAME = "chain_speculative_sampling_triton"
SOFTMAX_NAME = "sampling_softmax"
_RENORM_PATTERN = re.compile(r"renorm")


@dataclasses.dataclass
class VerifySite:
    """One ``eagle_sample`` call: the batch's sampling parameters and whether the chain kernel ran.

    ``seq_lens`` (the batch's committed lengths, the offset of each request's first verified KV slot) keys the
    coupled verify's race; the rejection scheme does not read it.
    """

    sampling_info: Any
    draft_token_num: int
    seq_lens: Any = None
    chain_calls: int = 0
    #: A reduced draft's map, its ``[B, S, Vd]`` q and the ``[B, S, V]`` stand-in upstream's width check saw.
    hot_vocab: Optional[HotVocab] = None
    reduced_draft_probs: Optional[torch.Tensor] = None
    draft_probs_stand_in: Optional[torch.Tensor] = None


_VERIFY_SITE: Site[VerifySite] = Site("verify")
_REDUCED_DRAFT_VOCAB: contextvars.ContextVar[Optional[HotVocab]] = contextvars.ContextVar(
    "sglang_detspec_reduced_draft_vocab", default=None
)


@contextlib.contextmanager
def reduced_draft_vocab(hot_vocab: Optional[HotVocab]) -> Iterator[None]:
    """Verify steps inside read the draft's q through ``hot_vocab`` (None: a full-vocabulary draft)."""
    token = _REDUCED_DRAFT_VOCAB.set(hot_vocab)
    try:
        yield
    finally:
        _REDUCED_DRAFT_VOCAB.reset(token)


# ---------------------------------------------------------------------------
# Stand-ins (each built from the object the name would have resolved to)
# ---------------------------------------------------------------------------


def _deferred_renorm(_original: Callable) -> Callable:
    def deferred_renorm(probs: torch.Tensor, *_args, **_kwargs) -> torch.Tensor:
        # The row-local truncation runs once, with top-k, top-p and min-p together, right before the chain kernel.
        _VERIFY_SITE.require("target renorm")
        return probs

    return deferred_renorm


def _truncate_then_chain(original: Callable) -> Callable:
    def chain_with_row_local_truncation(*args, **kwargs):
        site = _VERIFY_SITE.require(CHAIN_KERNEL_NAME)
        target_probs = kwargs.get("target_probs")
        if target_probs is None:
            raise RuntimeError(
                f"DETSPEC verify: SGLang called {CHAIN_KERNEL_NAME} without a target_probs keyword; "
                "sglang-detspec needs updating for this SGLang version"
            )
        site.chain_calls += 1
        if scheme.current() == scheme.COUPLED:
            if args:
                raise RuntimeError(
                    f"DETSPEC invariant verify: SGLang called {CHAIN_KERNEL_NAME} with {len(args)} positional "
                    "arguments; sglang-detspec needs updating for this SGLang version"
                )
            return coupled_chain_verify(site.sampling_info, site.seq_lens, **kwargs)
        kwargs["target_probs"] = truncate_target_probs(site, target_probs)
        if site.hot_vocab is not None:
            return _hot_chain(site, args, kwargs)
        return original(*args, **kwargs)

    return chain_with_row_local_truncation


def _hot_chain(site: VerifySite, args: tuple, kwargs: dict) -> None:
    """The chain kernel's outputs for a reduced draft: the reduced q read through ``target_to_draft``."""
    if args or kwargs.get("block_verification", False):
        raise RuntimeError(
            f"DETSPEC verify with a reduced-vocabulary draft: SGLang called {CHAIN_KERNEL_NAME} with "
            f"{len(args)} positional arguments or block verification; sglang-detspec needs updating for this SGLang "
            "version"
        )
    if kwargs.get("draft_probs") is not site.draft_probs_stand_in:
        raise RuntimeError(
            f"DETSPEC verify with a reduced-vocabulary draft: {CHAIN_KERNEL_NAME} did not receive the draft "
            "distribution eagle_sample was handed; sglang-detspec needs updating for this SGLang version"
        )
    from sglang_detspec.kernels.hot_chain_verify import hot_chain_speculative_sampling

    inputs = {name: kwargs[name] for name in _HOT_CHAIN_INPUTS}
    # SGLang draws one coin per draft token ([B, S + 1]); the chain reads the first S (a view, no copy).
    inputs["uniform_samples"] = inputs["uniform_samples"][:, : inputs["candidates"].shape[1] - 1]
    hot_chain_speculative_sampling(
        **inputs,
        draft_probs=site.reduced_draft_probs,
        target_to_draft=site.hot_vocab.target_to_draft,
    )


#: The chain kernel's keywords the hot chain kernel reads as they are (``draft_probs`` is replaced; upstream's
#: ``retrive_next_*``, thresholds and ``deterministic`` are unused by its non-block path).
_HOT_CHAIN_INPUTS = (
    "predicts", "accept_index", "accept_token_num", "candidates", "retrive_index", "uniform_samples",
    "uniform_samples_for_final_sampling", "target_probs",
)


def _row_local_softmax(_original: Callable) -> Callable:
    def softmax(logits: torch.Tensor, temperatures: Optional[torch.Tensor] = None) -> torch.Tensor:
        if temperatures is not None:
            logits = logits / temperatures
        return torch.softmax(logits, dim=-1)

    return softmax


def truncate_target_probs(site: VerifySite, target_probs: torch.Tensor) -> torch.Tensor:
    """Each request's own top-k / top-p / min-p applied to its ``[steps + 1, V]`` target rows.

    Returns ``target_probs`` itself when no row of the batch truncates, else a new tensor of its shape. Not in
    place: the kernel then compacts each row's shrinking bisection bracket into the output and reads only that in
    later steps, where in place every step re-reads the whole row (kernels/row_truncation.py, step 3).
    ``eagle_sample`` reads ``target_probs`` only as the chain kernel's argument, so the new tensor replaces it there.
    """
    if not batch_truncates(site.sampling_info):
        return target_probs
    bs, draft_tokens, vocab = target_probs.shape
    if draft_tokens != site.draft_token_num:
        raise RuntimeError(
            f"DETSPEC verify: target_probs has {draft_tokens} rows per request, expected {site.draft_token_num}"
        )
    rows = target_probs.view(bs * draft_tokens, vocab)
    truncated = truncate_request_rows(rows, site.sampling_info, draft_tokens, renormalize=True)
    return truncated.view(bs, draft_tokens, vocab)


VERIFY_COINS_NAME = "_verify_coins"


def _one_launch_coins(original: Callable) -> Callable:
    """``_verify_coins`` with SGLang's seeded coins from :func:`sglang_detspec.kernels.seeded_verify_coins` (the same
    values, one launch instead of about seven: the verify samples outside every CUDA graph, so each launch is paid on
    every decode step). Unseeded batches keep SGLang's function (``torch.rand``), and so do CPU tensors unless
    Triton's interpreter runs the kernels (the CPU tests)."""
    def verify_coins(*, sampling_info, seq_lens, draft_token_num, candidates, device):
        from sglang_detspec.kernels.launch_checks import INTERPRETED

        seed = sampling_info.sampling_seed
        if seed is None or seq_lens.device != seed.device or not (seed.is_cuda or INTERPRETED):
            return original(sampling_info=sampling_info, seq_lens=seq_lens, draft_token_num=draft_token_num,
                            candidates=candidates, device=device)
        from sglang_detspec.kernels.seeded_verify_coins import seeded_verify_coins

        return seeded_verify_coins(seed, seq_lens, int(draft_token_num))

    return verify_coins


_EAGLE_SAMPLE_REPLACEMENTS = {
    **{name: _deferred_renorm for name in RENORM_NAMES},
    CHAIN_KERNEL_NAME: _truncate_then_chain,
    SOFTMAX_NAME: _row_local_softmax,
}


# ---------------------------------------------------------------------------
# The rebound call chain: worker.verify -> run_eagle_verify -> eagle_sample
# ---------------------------------------------------------------------------


def check_verify_rebinding(eagle_sample: Callable) -> None:
    """Refuse an ``eagle_sample`` whose target renorm or chain kernel DETSPEC would not intercept."""
    reachable = reachable_names(eagle_sample)
    unmapped = sorted(n for n in reachable if _RENORM_PATTERN.search(n) and n not in RENORM_NAMES)
    if unmapped:
        raise RuntimeError(
            f"sglang's eagle_sample reaches renorm kernels {unmapped} that sglang-detspec does not replace; "
            "sglang-detspec needs updating for this SGLang version"
        )
    if CHAIN_KERNEL_NAME not in reachable:
        raise RuntimeError(
            f"sglang's eagle_sample no longer reads {CHAIN_KERNEL_NAME}; sglang-detspec needs updating for this "
            "SGLang version"
        )


@functools.lru_cache(maxsize=None)
def _rebound_eagle_sample() -> Callable:
    from sglang.srt.speculative import eagle_utils

    check_verify_rebinding(eagle_utils.eagle_sample)
    replacements = dict(_EAGLE_SAMPLE_REPLACEMENTS)
    required = (CHAIN_KERNEL_NAME,)
    if verify_coins_kernel_wanted():  # read once: the first verify of the process fixes it
        replacements[VERIFY_COINS_NAME] = _one_launch_coins
        required += (VERIFY_COINS_NAME,)
    return rebind(eagle_utils.eagle_sample, replacements, required=required)


def detspec_eagle_sample(verify_input, batch, logits_output, *args, **kwargs):
    """Upstream ``eagle_sample`` with the row-local target truncation (see the module docstring)."""
    site = VerifySite(batch.sampling_info, int(verify_input.draft_token_num), seq_lens=getattr(batch, "seq_lens", None))
    hot = _REDUCED_DRAFT_VOCAB.get()
    reduced_q = getattr(verify_input, "draft_probs", None)
    with _VERIFY_SITE.entered(site), _hot_draft_probs_stand_in(site, verify_input, hot, reduced_q):
        result = _rebound_eagle_sample()(verify_input, batch, logits_output, *args, **kwargs)
    sampled = not batch.forward_mode.is_idle() and not batch.sampling_info.is_all_greedy
    if sampled and site.chain_calls == 0:
        raise RuntimeError(
            "DETSPEC verify: SGLang's eagle_sample committed a sampled batch without the rejection-sampling "
            f"kernel ({CHAIN_KERNEL_NAME}); its target truncation would not be row-local. sglang-detspec needs "
            "updating for this SGLang version"
        )
    return result


@contextlib.contextmanager
def _hot_draft_probs_stand_in(site: VerifySite, verify_input, hot: Optional[HotVocab], reduced_q) -> Iterator[None]:
    """While upstream's ``eagle_sample`` runs, ``verify_input.draft_probs`` is a ``[B, S, V]`` stride-0 view of the
    reduced q (its width check reads only the shape; only :func:`_hot_chain` consumes it, and checks it is this
    view); the reduced q itself waits on ``site``. Restored afterwards."""
    if hot is None or reduced_q is None:
        yield
        return
    if reduced_q.dim() != 3 or reduced_q.shape[-1] != hot.draft_vocab_size:
        raise RuntimeError(
            f"DETSPEC verify with a reduced-vocabulary draft of {hot.draft_vocab_size} tokens: the draft worker "
            f"handed q of shape {tuple(reduced_q.shape)}, expected [batch, steps, {hot.draft_vocab_size}]"
        )
    site.hot_vocab = hot
    site.reduced_draft_probs = reduced_q
    site.draft_probs_stand_in = reduced_q[..., :1].expand(*reduced_q.shape[:-1], hot.target_vocab_size)
    verify_input.draft_probs = site.draft_probs_stand_in
    try:
        yield
    finally:
        verify_input.draft_probs = reduced_q


@functools.lru_cache(maxsize=None)
def detspec_run_eagle_verify() -> Callable:
    """Upstream ``run_eagle_verify`` calling :func:`detspec_eagle_sample`."""
    from sglang.srt.speculative import eagle_worker_common

    return rebind(
        eagle_worker_common.run_eagle_verify,
        {"eagle_sample": lambda _original: detspec_eagle_sample},
        required=("eagle_sample",),
    )


@functools.lru_cache(maxsize=None)
def rebound_verify(owner: type) -> Callable:
    """``owner.verify`` (EAGLEWorkerV2 / MultiLayerEagleWorkerV2) calling the DETSPEC ``run_eagle_verify``."""
    return rebind(
        vars(owner)["verify"],
        {"run_eagle_verify": lambda _original: detspec_run_eagle_verify()},
        required=("run_eagle_verify",),
    )
