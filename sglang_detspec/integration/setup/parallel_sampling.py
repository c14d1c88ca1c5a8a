"""Distinct, reproducible samples for ``n > 1`` on DETSPEC servers: choice ``i`` samples with a derived seed.

Where SGLang expands ``n`` (0.5.17 ``managers/tokenizer_manager.py:1770-1880``, 0.5.23 ``:2075-2195``,
``TokenizerManager._handle_batch_request``): a request whose ``sampling_params.n`` (``/generate``) or ``n``
(OpenAI ``/v1/completions``, ``/v1/chat/completions``; their ``seed`` becomes ``sampling_seed``) is above 1 is
normalised to a batch (``GenerateReqInput._handle_parallel_sampling``), but only its first ``batch_size`` items are
tokenized. The tokenizer manager then sends, per prompt, one prefix-caching warm-up (a ``copy.copy`` of the
tokenized request whose ``sampling_params`` is a *copy* with ``max_new_tokens = 0``) and then the ``n`` choices,
each a ``copy.copy`` of the same tokenized request, so all ``n`` share that prompt's one ``SamplingParams`` object,
seed included. Every copy goes through ``TokenizerManager._send_one_request`` (sync in 0.5.17, a coroutine in
0.5.23; :data:`SEND_TARGET`).

The hook: a ``HookRegistry`` BEFORE hook on ``_send_one_request``. For a DETSPEC server and a seeded request with
``n > 1`` it counts the sends that carry the same ``SamplingParams`` object: the ``k``-th (0-based) is choice ``k``
and gets a copy of the parameters with ``sampling_seed = choice_seed(seed, k)``
(:mod:`sglang_detspec.stream.choice_seeds`). Choice 0 keeps the seed, so it is the sample an ``n = 1`` request gives. The
warm-up carries its own copy of the parameters and generates nothing (``max_new_tokens = 0``): skipped. A choice
with an explicit ``max_new_tokens = 0`` samples nothing either, so skipping it changes no token.

Not changed: servers running any other algorithm (the plugin is loaded in every SGLang process, so the hook gates
on the server's ``--speculative-algorithm``), unseeded requests (they keep SGLang's deterministic default seed,
so their ``n`` samples stay identical), ``n = 1``. Opt-out (upstream behaviour, one seed for all ``n``): the server
environment ``SGLANG_DETSPEC_SAME_SEED_FOR_N=1``, or per request ``sampling_params.custom_params =
{"detspec_same_seed_for_n": true}`` (OpenAI: ``"custom_params": {...}`` in the request body), a field SGLang passes
through to the scheduler untouched unless a custom logit processor reads it.
"""

from __future__ import annotations

import copy
import os
from collections import OrderedDict
from typing import Any

from sglang_detspec.integration.setup.hooks import hook_active, register_once
from sglang_detspec.stream.choice_seeds import choice_seed

__all__ = [
    "SEND_TARGET",
    "SAME_SEED_ENV",
    "SAME_SEED_PARAM",
    "assign_choice_seed",
    "install_parallel_sampling_seeds",
    "parallel_sampling_hook_active",
]

#: The method every choice of an ``n > 1`` request passes through: the same on 0.5.17 - 0.5.23. Both releases expand
#: ``n`` in ``TokenizerManager._handle_batch_request`` (0.5.17 tokenizer_manager.py:1812-1875, 0.5.23 :2115-2183) the
#: same way: a prefix warm-up per prompt whose ``sampling_params`` is a copy with ``max_new_tokens = 0``, then ``n``
#: ``copy.copy``s of the prompt's tokenized request, sharing its one ``SamplingParams``. ``_send_one_request`` is a
#: plain method in 0.5.17 (:1540) and a coroutine in 0.5.23 (:1769); a BEFORE hook runs synchronously before the call
#: in both cases (``HookRegistry``'s wrapper calls the hook, then returns what the original returns: ``None`` or the
#: coroutine), so one hook serves both. The warm-up's rid is ``f"{logical_rid}_{uuid}"`` in 0.5.17 and a bare uuid in
#: 0.5.23, so nothing but the shared ``SamplingParams`` object identifies a prompt's choices on every release.
SEND_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._send_one_request"

#: Server-wide opt-out: ``SGLANG_DETSPEC_SAME_SEED_FOR_N=1`` keeps upstream's one seed for all n choices.
SAME_SEED_ENV = "SGLANG_DETSPEC_SAME_SEED_FOR_N"
#: Per-request opt-out: ``sampling_params.custom_params[SAME_SEED_PARAM]`` true.
SAME_SEED_PARAM = "detspec_same_seed_for_n"

#: Prompts whose n choices are still being sent; an entry is dropped after its n-th choice. A request aborted
#: half-way leaves one; the oldest are dropped beyond this many. Entries hold a reference to their
#: SamplingParams, so its id cannot be reused by another object while counted.
_MAX_PENDING = 4096
_pending: "OrderedDict[int, list]" = OrderedDict()


def _env_opt_out() -> bool:
    return os.environ.get(SAME_SEED_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _request_opt_out(sampling_params: Any) -> bool:
    custom = getattr(sampling_params, "custom_params", None)
    return isinstance(custom, dict) and bool(custom.get(SAME_SEED_PARAM))


def _is_detspec_server(tokenizer_manager: Any) -> bool:
    from sglang_detspec.integration.setup.server_args import requested_detspec_algorithm

    server_args = getattr(tokenizer_manager, "server_args", None)
    return server_args is not None and requested_detspec_algorithm(server_args) is not None


def _next_choice(sampling_params: Any, n: int) -> int:
    key = id(sampling_params)
    entry = _pending.get(key)
    if entry is None or entry[0] is not sampling_params:
        entry = [sampling_params, 0]
        _pending[key] = entry
        while len(_pending) > _MAX_PENDING:
            _pending.popitem(last=False)
    choice = entry[1]
    entry[1] += 1
    if entry[1] >= n:
        _pending.pop(key, None)
    return choice


def assign_choice_seed(tokenizer_manager: Any, tokenized_obj: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE hook on ``TokenizerManager._send_one_request``: give choice ``k`` of an ``n > 1`` request its seed."""
    sampling_params = getattr(tokenized_obj, "sampling_params", None)
    if sampling_params is None:  # an embedding request
        return None
    n = getattr(sampling_params, "n", 1) or 1
    seed = getattr(sampling_params, "sampling_seed", None)
    if n <= 1 or seed is None or getattr(sampling_params, "max_new_tokens", None) == 0:
        return None
    if not _is_detspec_server(tokenizer_manager) or _env_opt_out() or _request_opt_out(sampling_params):
        return None
    choice = _next_choice(sampling_params, n)
    if choice == 0:
        return None
    # A copy: the other choices (and the tokenized original) keep the request's own parameters.
    derived = copy.copy(sampling_params)
    derived.sampling_seed = choice_seed(seed, choice)
    tokenized_obj.sampling_params = derived
    return None


def install_parallel_sampling_seeds() -> str:
    """Register :func:`assign_choice_seed` with ``HookRegistry`` (once per process); return the target."""
    return register_once(SEND_TARGET, assign_choice_seed, "BEFORE")


def parallel_sampling_hook_active() -> bool:
    """Whether ``TokenizerManager._send_one_request`` currently runs :func:`assign_choice_seed`."""
    return hook_active(SEND_TARGET, assign_choice_seed)
