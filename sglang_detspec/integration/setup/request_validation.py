"""Per-request checks that keep one bad request from taking the whole server down.

SGLang 0.5.17 - 0.5.22 accept any Python integer as ``sampling_seed``; under ``--enable-deterministic-inference``
the scheduler later packs the batch's seeds into an int64 tensor, and a seed outside int64 raises there, inside
the scheduler loop, which kills the server for every user (seen on the H200 with sglang 0.5.17 and
``sampling_seed = 2**64``). SGLang 0.5.23 validates the seed in ``SamplingParams.verify``, which runs in the
tokenizer process, so the request fails alone with HTTP 400. This module adds the same check, with 0.5.23's
wording, to the releases that lack it, through an AFTER hook on ``SamplingParams.verify``.
"""

from __future__ import annotations

from typing import Any

SAMPLING_PARAMS_VERIFY = "sglang.srt.sampling.sampling_params.SamplingParams.verify"

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def check_sampling_seed(sampling_seed: Any) -> None:
    """Raise ``ValueError`` (SGLang's per-request error type, answered with HTTP 400) for a seed that no int64 holds."""
    if sampling_seed is None:
        return
    # bool is an int subclass; SGLang 0.5.23 lets it through as 0/1 and so do we, to keep the same stream.
    if not isinstance(sampling_seed, int):
        raise ValueError(f"sampling_seed must be an integer, got {type(sampling_seed).__name__}.")
    if not INT64_MIN <= sampling_seed <= INT64_MAX:
        raise ValueError(f"sampling_seed must be in [-2**63, 2**63 - 1], got {sampling_seed}.")


def _after_verify(result, sampling_params, *args, **kwargs):
    check_sampling_seed(getattr(sampling_params, "sampling_seed", None))
    return result


def install_request_validation() -> str:
    """Register the seed check on ``SamplingParams.verify`` with ``HookRegistry`` (once per process)."""
    from sglang_detspec.integration.setup.hooks import register_once

    return register_once(SAMPLING_PARAMS_VERIFY, _after_verify, "AFTER")
