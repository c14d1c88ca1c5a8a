"""Per-request checks that keep one malformed request from taking the whole server down (HTTP 400 for it alone).

SGLang answers a ``ValueError`` raised while it reads a request with HTTP 400 for that request (``/generate``: the
handler's ``except ValueError``; ``/v1/completions``, ``/v1/chat/completions``: ``OpenAIServingBase.handle_request``;
a streamed ``/generate`` gets one ``data: {"error": {..., "code": 400}}`` event). Everything it does not refuse
there reaches the scheduler, where a bad value raises inside the scheduler loop or trips a CUDA device assert and
the server dies for every user; and a ``TypeError`` / ``re.error`` raised in the tokenizer process is answered with
HTTP 500. Measured on an H100 (sglang 0.5.17, with or without the plugin): ``input_ids`` ``[5, -3, 9]`` or
``[5, 7, 5000]`` (vocabulary 1,024) killed the server with ``indexSelectSmallIndex ... srcIndex <
srcSelectDimSize``. Earlier, on an H200: ``sampling_seed = 2**64`` raised while the scheduler packed the batch's
int64 seed tensor (0.5.23 validates the seed itself; this module adds the same check, with its wording, to the
releases that lack it).

Three ``HookRegistry`` hooks, the same targets on every release 0.5.17 - 0.5.23 (read in each wheel):

* BEFORE ``GenerateReqInput.normalize_batch_and_arguments`` -- the first thing ``TokenizerManager.generate_request``
  does with a request, for ``/generate`` and for what the OpenAI endpoints build. :func:`check_request_structure`:
  the batch shape, ``sampling_params`` (an object, or one per prompt), every sampling field's type, ``n``, ``top_k``
  and ``logit_bias`` values, ``stop_regex`` syntax. SGLang's normalisation multiplies the prompt list by ``n`` and
  indexes per-prompt lists, so these must hold before it runs.
* BEFORE ``TokenizerManager._validate_one_request(obj, input_ids)`` -- once per prompt (a batch is split by then),
  with the final token ids and the model at hand. :func:`check_request_against_model`: token ids in
  ``[0, vocab)``, ``input_embeds`` rows of the model's hidden size, ``stop_token_ids``, ``top_logprobs_num``,
  ``logprob_start_len >= -1``, ``min_new_tokens`` within the context, no empty prompt.
* AFTER ``SamplingParams.verify`` -- :func:`check_sampling_seed`.

Left to SGLang because it already refuses them with HTTP 400 on every release (``tests/unit/
test_request_validation.py`` checks that it does): ``max_new_tokens`` below 0 or past the context, ``temperature``
/ ``top_p`` / ``min_p`` / the penalties out of range or NaN, ``top_k`` below 1, ``logit_bias`` keys outside the
vocabulary, ``token_ids_logprob`` ids outside it, an empty or over-long text, ``input_ids: []``; in the scheduler,
``logprob_start_len`` past the prompt and an invalid ``regex`` / ``json_schema`` / ``ebnf`` (the request is aborted
with an error, the server stays up). From 0.5.22 SGLang also checks a ``/generate`` body against its JSON schema
before any hook runs (``compat.generate_schema_gate``): wrong types and unknown fields there get its HTTP 400 and
wording (``invalid type: string "3", expected i64``); the OpenAI endpoints still reach these checks.

The checks take plain values and duck-typed request objects, so they run without SGLang.
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable, Mapping, Optional, Sequence

SAMPLING_PARAMS_VERIFY = "sglang.srt.sampling.sampling_params.SamplingParams.verify"
NORMALIZE_REQUEST = "sglang.srt.managers.io_struct.GenerateReqInput.normalize_batch_and_arguments"
VALIDATE_ONE_REQUEST = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

#: Largest ``n`` (parallel samples of one prompt) accepted. SGLang copies the prompt ``n`` times in the tokenizer
#: process before anything else looks at it, so ``n = 10**9`` would exhaust its memory.
MAX_N = 1024
#: SGLang's "whole vocabulary" ``top_k`` (``sampling_params.TOP_K_ALL``); larger values overflow the scheduler's
#: int32 ``top_ks`` tensor.
TOP_K_ALL = 1 << 30

#: ``SamplingParams`` fields that SGLang fills itself while it normalises a request; a request that sets one skips
#: that normalisation (``is_normalized``) or contradicts it.
INTERNAL_SAMPLING_FIELDS = frozenset(
    {"stop_strs", "stop_regex_strs", "stop_str_max_len", "stop_regex_max_len", "is_normalized"}
)

INTEGER, NUMBER, BOOLEAN, STRING, STRINGS, INTEGERS, OBJECT, TOKEN_BIAS = (
    "an integer", "a number", "a boolean", "a string", "a string or a list of strings", "a list of integers",
    "an object", "an object of token id -> number",
)

#: The JSON type of each ``sampling_params`` field a request may set (``null`` is accepted for every one: SGLang
#: reads it as "the default"). Fields of the installed ``SamplingParams`` missing here are passed on unchecked;
#: fields listed here that the installed release lacks are refused as unknown (SGLang would raise ``TypeError``).
SAMPLING_FIELD_TYPES = {
    "max_new_tokens": INTEGER, "min_new_tokens": INTEGER, "n": INTEGER, "beam_width": INTEGER, "top_k": INTEGER,
    "stream_interval": INTEGER, "temperature": NUMBER, "top_p": NUMBER, "min_p": NUMBER, "frequency_penalty": NUMBER,
    "presence_penalty": NUMBER, "repetition_penalty": NUMBER, "stop": STRINGS, "stop_regex": STRINGS,
    "stop_token_ids": INTEGERS, "json_schema": STRING, "regex": STRING, "ebnf": STRING, "structural_tag": STRING,
    "ignore_eos": BOOLEAN, "skip_special_tokens": BOOLEAN, "spaces_between_special_tokens": BOOLEAN,
    "no_stop_trim": BOOLEAN, "ebnf_full_assistant": BOOLEAN, "logit_bias": TOKEN_BIAS, "custom_params": OBJECT,
}

#: Per-prompt request fields that SGLang indexes by prompt (``GenerateReqInput.__getitem__``) when given as a list.
PER_PROMPT_LIST_FIELDS = ("return_logprob", "logprob_start_len", "top_logprobs_num", "return_sampling_mask")


# ---------------------------------------------------------------------------------------------------
# Checks on plain values
# ---------------------------------------------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_sampling_seed(sampling_seed: Any) -> None:
    """Raise ``ValueError`` (SGLang's per-request error type, answered with HTTP 400) for a seed that no int64 holds."""
    if sampling_seed is None:
        return
    # bool is an int subclass; SGLang 0.5.23 lets it through as 0/1 and so do we, to keep the same stream.
    if not isinstance(sampling_seed, int):
        raise ValueError(f"sampling_seed must be an integer, got {type(sampling_seed).__name__}.")
    if not INT64_MIN <= sampling_seed <= INT64_MAX:
        raise ValueError(f"sampling_seed must be in [-2**63, 2**63 - 1], got {sampling_seed}.")


def _check_field_type(name: str, value: Any, expected: str) -> None:
    ok = {
        INTEGER: _is_int,
        NUMBER: _is_number,
        BOOLEAN: lambda v: isinstance(v, bool),
        STRING: lambda v: isinstance(v, str),
        STRINGS: lambda v: isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v)),
        INTEGERS: lambda v: isinstance(v, list) and all(_is_int(t) for t in v),
        OBJECT: lambda v: isinstance(v, dict),
        TOKEN_BIAS: lambda v: isinstance(v, dict),
    }[expected](value)
    if not ok:
        raise ValueError(f"sampling_params.{name} must be {expected}, got {_type_name(value)} {_short(value)}.")


def check_sampling_params(params: Any, known_fields: Iterable[str], where: str = "sampling_params") -> None:
    """One prompt's ``sampling_params`` object: known fields of the right JSON type, and the ranges SGLang does not
    check before the scheduler (``n``, ``top_k``'s upper end, finite ``logit_bias`` values, ``stop_regex`` syntax).

    ``known_fields``: the installed ``SamplingParams`` fields (its constructor refuses any other with ``TypeError``).
    """
    if params is None:
        return
    if not isinstance(params, dict):
        raise ValueError(f"{where} must be an object, got {_type_name(params)} {_short(params)}.")
    known = set(known_fields) - INTERNAL_SAMPLING_FIELDS
    unknown = sorted(str(k) for k in params if k not in known)
    if unknown:
        raise ValueError(f"{where} has unknown field(s) {', '.join(unknown)}; known fields: {', '.join(sorted(known))}.")
    for name, value in params.items():
        if value is not None and name in SAMPLING_FIELD_TYPES:
            _check_field_type(name, value, SAMPLING_FIELD_TYPES[name])
    n = params.get("n")
    if n is not None and not 1 <= n <= MAX_N:
        raise ValueError(f"sampling_params.n must be in [1, {MAX_N}], got {n}.")
    top_k = params.get("top_k")
    if top_k is not None and top_k > TOP_K_ALL:
        raise ValueError(f"sampling_params.top_k must be -1 (whole vocabulary) or in [1, {TOP_K_ALL}], got {top_k}.")
    for token, bias in (params.get("logit_bias") or {}).items():
        if not _is_number(bias) or not math.isfinite(bias):
            raise ValueError(f"sampling_params.logit_bias[{token!r}] must be a finite number, got {_short(bias)}.")
    stop_regex = params.get("stop_regex")
    for pattern in [stop_regex] if isinstance(stop_regex, str) else stop_regex or []:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"sampling_params.stop_regex {_short(pattern)} is not a valid regular expression: {exc}.") from None
    if "sampling_seed" in params:
        check_sampling_seed(params["sampling_seed"])


def _batch_size(text: Any, input_ids: Any, input_embeds: Any) -> Optional[int]:
    """The number of prompts, None for a single prompt (SGLang's ``_determine_batch_size``), after refusing the
    shapes it would index out of range."""
    if text is not None:
        if isinstance(text, list):
            if not text:
                raise ValueError("text must be a string or a non-empty list of strings, got [].")
            return len(text)
        return None
    if input_ids is not None:
        return len(input_ids) if input_ids and isinstance(input_ids[0], list) else None
    if input_embeds is not None:
        if not isinstance(input_embeds, list) or not input_embeds or not all(
                isinstance(row, list) and row for row in input_embeds):
            raise ValueError("input_embeds must be a non-empty list of non-empty rows (one prompt) or of prompts.")
        if isinstance(input_embeds[0][0], list):
            if not all(isinstance(p, list) and p and all(isinstance(r, list) and r for r in p) for p in input_embeds):
                raise ValueError("input_embeds: every prompt of a batch must be a non-empty list of non-empty rows.")
            return len(input_embeds)
        if not all(isinstance(x, (int, float)) for row in input_embeds for x in row):
            raise ValueError("input_embeds rows must hold numbers.")
        return None
    return None


def check_request_structure(obj: Any, known_sampling_fields: Iterable[str]) -> None:
    """A whole ``/generate``-style request before SGLang normalises it: the batch shape, ``sampling_params`` (one
    object, or one per prompt of a batch) and the per-prompt lists that SGLang indexes by prompt.

    ``obj`` is anything with ``GenerateReqInput``'s attribute names (missing ones read as None).
    """
    known = list(known_sampling_fields)
    get = lambda name: getattr(obj, name, None)  # noqa: E731 - a local shorthand
    batch = _batch_size(get("text"), get("input_ids"), get("input_embeds"))
    params = get("sampling_params")
    if isinstance(params, list):
        if batch is None:
            raise ValueError("sampling_params must be an object for a single prompt, got a list.")
        if len(params) != batch:
            raise ValueError(f"sampling_params must hold one object per prompt: {batch} prompts, {len(params)} objects.")
        for i, one in enumerate(params):
            check_sampling_params(one, known, where=f"sampling_params[{i}]")
    else:
        check_sampling_params(params, known)
    for name in PER_PROMPT_LIST_FIELDS:
        value = get(name)
        if not isinstance(value, list):
            continue
        if batch is None:
            raise ValueError(f"{name} must be a single value for a single prompt, got a list.")
        if len(value) != batch:
            raise ValueError(f"{name} must hold one value per prompt: {batch} prompts, {len(value)} values.")
    token_ids_logprob = get("token_ids_logprob")
    if batch is not None and isinstance(token_ids_logprob, list) and token_ids_logprob and isinstance(
            token_ids_logprob[0], list) and len(token_ids_logprob) != batch:
        raise ValueError(f"token_ids_logprob must hold one list per prompt: {batch} prompts, "
                         f"{len(token_ids_logprob)} lists.")


def check_token_ids(field: str, ids: Sequence[Any], vocab_size: int) -> None:
    """Every id in ``[0, vocab_size)``: the embedding lookup and the samplers index the vocabulary with them."""
    for position, token in enumerate(ids):
        if not _is_int(token) or not 0 <= token < vocab_size:
            raise ValueError(f"{field}: token id {_short(token)} at position {position} is outside the model's "
                             f"vocabulary [0, {vocab_size}).")


def check_input_embeds(embeds: Sequence[Any], hidden_size: int) -> None:
    """One prompt's embeddings: a non-empty list of rows of ``hidden_size`` finite numbers."""
    if not embeds:
        raise ValueError("input_embeds must not be empty.")
    for position, row in enumerate(embeds):
        if not isinstance(row, (list, tuple)) or len(row) != hidden_size:
            size = len(row) if isinstance(row, (list, tuple)) else _type_name(row)
            raise ValueError(f"input_embeds row {position} must hold {hidden_size} numbers (the model's hidden size), "
                             f"got {size}.")
        if not all(_is_number(x) and math.isfinite(x) for x in row):
            raise ValueError(f"input_embeds row {position} must hold finite numbers.")


def check_request_against_model(obj: Any, input_ids: Optional[Sequence[Any]], *, vocab_size: int, hidden_size: int,
                                context_len: int) -> None:
    """One prompt of a request (after SGLang split a batch and tokenized it) against the served model.

    ``input_ids``: the prompt's final token ids (None when it came as ``input_embeds``). Multimodal requests'
    ids are not range-checked (processors may place their own placeholder values there).
    """
    get = lambda name: getattr(obj, name, None)  # noqa: E731 - a local shorthand
    embeds = get("input_embeds")
    if embeds is not None:
        check_input_embeds(embeds, hidden_size)
    elif input_ids is not None:
        session = get("session_params")
        if len(input_ids) == 0 and not (isinstance(session, Mapping) and session.get("id")):
            raise ValueError("the prompt is empty (no token ids): give a non-empty text or input_ids.")
        contains_mm = getattr(obj, "contains_mm_input", None)
        if not (callable(contains_mm) and contains_mm()):
            check_token_ids("input_ids", input_ids, vocab_size)
    params = get("sampling_params") or {}
    stop_token_ids = params.get("stop_token_ids")
    if stop_token_ids:
        check_token_ids("sampling_params.stop_token_ids", stop_token_ids, vocab_size)
    min_new_tokens = params.get("min_new_tokens")
    if _is_int(min_new_tokens) and min_new_tokens > context_len:
        raise ValueError(f"sampling_params.min_new_tokens must be in [0, {context_len}] (the context length), got "
                         f"{min_new_tokens}.")
    top_logprobs_num = get("top_logprobs_num")
    if top_logprobs_num is not None and (not _is_int(top_logprobs_num) or not 0 <= top_logprobs_num <= vocab_size):
        raise ValueError(f"top_logprobs_num must be in [0, {vocab_size}] (the vocabulary size), got "
                         f"{_short(top_logprobs_num)}.")
    logprob_start_len = get("logprob_start_len")
    if logprob_start_len is not None and (not _is_int(logprob_start_len) or logprob_start_len < -1):
        raise ValueError(f"logprob_start_len must be -1 (output tokens only) or a position in the prompt "
                         f"[0, prompt length], got {_short(logprob_start_len)}.")


# ---------------------------------------------------------------------------------------------------
# The hooks
# ---------------------------------------------------------------------------------------------------

_sampling_fields: Optional[frozenset] = None


def installed_sampling_fields_in_order() -> tuple:
    """The field names of the installed SGLang's ``SamplingParams``, in order (a msgspec struct; they differ per
    release: ``beam_width`` 0.5.19+, ``watermark`` 0.5.22+, ``ebnf_full_assistant`` 0.5.23)."""
    from sglang.srt.sampling.sampling_params import SamplingParams

    return tuple(SamplingParams.__struct_fields__)


def installed_sampling_fields() -> frozenset:
    """:func:`installed_sampling_fields_in_order` as a set, read once per process."""
    global _sampling_fields
    if _sampling_fields is None:
        _sampling_fields = frozenset(installed_sampling_fields_in_order())
    return _sampling_fields


def _before_normalize(obj, *args, **kwargs):
    check_request_structure(obj, installed_sampling_fields())


def _before_validate_one_request(tokenizer_manager, obj, input_ids, *args, **kwargs):
    if not hasattr(obj, "sampling_params") or not hasattr(obj, "top_logprobs_num"):
        return  # an embedding request: nothing here applies
    config = tokenizer_manager.model_config
    check_request_against_model(obj, input_ids, vocab_size=config.vocab_size, hidden_size=config.hidden_size,
                                context_len=tokenizer_manager.context_len)


def _after_verify(result, sampling_params, *args, **kwargs):
    check_sampling_seed(getattr(sampling_params, "sampling_seed", None))
    return result


#: (target, hook, HookType name) of every check.
_HOOKS = (
    (NORMALIZE_REQUEST, _before_normalize, "BEFORE"),
    (VALIDATE_ONE_REQUEST, _before_validate_one_request, "BEFORE"),
    (SAMPLING_PARAMS_VERIFY, _after_verify, "AFTER"),
)
REQUEST_VALIDATION_TARGETS = tuple(target for target, _, _ in _HOOKS)


def install_request_validation() -> list:
    """Register the request checks with ``HookRegistry`` (once per process); return their targets."""
    from sglang_detspec.integration.setup.hooks import register_once

    return [register_once(target, hook, kind) for target, hook, kind in _HOOKS]


def request_validation_active() -> bool:
    """Whether every request check currently runs in its SGLang function."""
    from sglang_detspec.integration.setup.hooks import hook_active

    return all(hook_active(target, hook) for target, hook, _ in _HOOKS)
