"""A request whose seed no int64 holds is refused alone (HTTP 400), instead of crashing the scheduler.

Found on the H200 with sglang 0.5.17: ``sampling_seed = 2**64`` passed ``SamplingParams.verify`` and then raised
inside the scheduler while building the batch's int64 seed tensor, which took the server down. The test runs
SGLang's real plugin loader in a fresh interpreter and then SGLang's real ``SamplingParams.verify`` - the call
the tokenizer manager makes for every request - so it exercises the hook as a server applies it.
"""

import json
import os
import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent(
    r"""
    import json, os
    os.environ["SGLANG_PLUGINS"] = "detspec"
    import sglang.srt.plugins as plugins
    plugins.load_plugins()
    from sglang.srt.sampling.sampling_params import SamplingParams

    def outcome(**kw):
        try:
            SamplingParams(max_new_tokens=8, **kw).verify(1024)
        except ValueError as exc:
            return "ValueError: " + str(exc)
        return "ok"

    print(json.dumps({
        "too_big": outcome(sampling_seed=2**64),
        "too_small": outcome(sampling_seed=-(2**63) - 1),
        "not_int": outcome(sampling_seed=1.5),
        "max": outcome(sampling_seed=2**63 - 1),
        "min": outcome(sampling_seed=-(2**63)),
        "none": outcome(),
    }))
    """
)


def _run():
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_out_of_range_and_non_integer_seeds_are_refused_in_range_seeds_pass():
    out = _run()
    assert out["too_big"] == f"ValueError: sampling_seed must be in [-2**63, 2**63 - 1], got {2**64}."
    assert out["too_small"] == f"ValueError: sampling_seed must be in [-2**63, 2**63 - 1], got {-(2**63) - 1}."
    assert out["not_int"].startswith("ValueError: sampling_seed must be an integer")
    assert out["max"] == "ok"
    assert out["min"] == "ok"
    assert out["none"] == "ok"


# ---------------------------------------------------------------------------------------------------
# Every other checked field, through SGLang's real HTTP server on CPU (tests/unit/sglang_cpu_http_server.py: the
# real plugin loader and HookRegistry, the real TokenizerManager, FastAPI app and OpenAI handlers; only the
# scheduler is a stand-in that answers at once and records what reached it).

import sys as _sys  # noqa: E402
import urllib.error  # noqa: E402
import urllib.request  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from sglang_detspec.integration import compat  # noqa: E402
from sglang_detspec.integration.setup import request_validation as rv  # noqa: E402

_sys.path.insert(0, str(Path(__file__).resolve().parent))
from sglang_cpu_http_server import CpuServer  # noqa: E402

VOCAB, HIDDEN, CONTEXT = 1024, 256, 16384  # the embedded dummy target (checked against the server below)
SP = {"max_new_tokens": 2}
CHAT_MSG = [{"role": "user", "content": "hello there"}]

#: (case id, endpoint, body refused, words its 400 message must hold, body with a good value that must pass)
PLUGIN_CHECKS = [
    ("input_ids_negative", "/generate", {"input_ids": [5, -3, 9], "sampling_params": SP}, ["input_ids", "-3", "[0, 1024)"],
     {"input_ids": [5, 3, 9], "sampling_params": SP}),
    ("input_ids_past_vocab", "/generate", {"input_ids": [5, 7, 5000], "sampling_params": SP},
     ["input_ids", "5000", "[0, 1024)"], {"input_ids": [5, 7, 1023], "sampling_params": SP}),
    ("input_ids_batch_one_bad", "/generate", {"input_ids": [[5, 7], [1024]], "sampling_params": SP},
     ["input_ids", "1024", "[0, 1024)"], {"input_ids": [[5, 7], [0]], "sampling_params": SP}),
    ("input_ids_batch_empty_row", "/generate", {"input_ids": [[5, 7], []], "sampling_params": SP},
     ["prompt is empty"], {"input_ids": [[5, 7], [8]], "sampling_params": SP}),
    ("openai_prompt_ids", "/v1/completions", {"model": "m", "prompt": [5, -1], "max_tokens": 2},
     ["input_ids", "-1", "[0, 1024)"], {"model": "m", "prompt": [5, 1], "max_tokens": 2}),
    ("input_embeds_width", "/generate", {"input_embeds": [[0.1] * 255], "sampling_params": SP},
     ["input_embeds", "256", "got 255"], {"input_embeds": [[0.1] * 256], "sampling_params": SP}),
    ("input_embeds_empty", "/generate", {"input_embeds": [], "sampling_params": SP}, ["input_embeds", "non-empty"],
     {"input_embeds": [[0.0] * 256, [0.1] * 256], "sampling_params": SP}),
    ("stop_token_ids", "/generate", {"text": "hi", "sampling_params": {**SP, "stop_token_ids": [2, 1024]}},
     ["stop_token_ids", "1024", "[0, 1024)"], {"text": "hi", "sampling_params": {**SP, "stop_token_ids": [2, 1023]}}),
    ("openai_stop_token_ids", "/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 2,
                                                 "stop_token_ids": [-5]}, ["stop_token_ids", "-5"],
     {"model": "m", "prompt": "hi", "max_tokens": 2, "stop_token_ids": [5]}),
    ("n_huge", "/generate", {"text": "hi", "sampling_params": {**SP, "n": 10**8}}, ["sampling_params.n", "[1, 1024]",
                                                                                 "100000000"],
     {"text": "hi", "sampling_params": {**SP, "n": 3}}),
    ("n_zero_openai", "/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 2, "n": 0},
     ["sampling_params.n", "[1, 1024]", "got 0"], {"model": "m", "prompt": "hi", "max_tokens": 2, "n": 2}),
    ("n_string", "/generate", {"text": "hi", "sampling_params": {**SP, "n": "3"}}, ["sampling_params.n", "integer"],
     {"text": "hi", "sampling_params": {**SP, "n": 1}}),
    ("top_logprobs_num", "/generate", {"text": "hi", "return_logprob": True, "top_logprobs_num": 1025,
                                       "sampling_params": SP}, ["top_logprobs_num", "[0, 1024]", "1025"],
     {"text": "hi", "return_logprob": True, "top_logprobs_num": 5, "sampling_params": SP}),
    ("openai_logprobs", "/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 2, "logprobs": 5000},
     ["top_logprobs_num", "5000"], {"model": "m", "prompt": "hi", "max_tokens": 2}),
    ("chat_top_logprobs", "/v1/chat/completions", {"model": "m", "messages": CHAT_MSG, "max_tokens": 2,
                                                   "logprobs": True, "top_logprobs": 100000},
     ["top_logprobs"], {"model": "m", "messages": CHAT_MSG, "max_tokens": 2}),
    ("logprob_start_len", "/generate", {"text": "hi", "return_logprob": True, "logprob_start_len": -2,
                                        "sampling_params": SP}, ["logprob_start_len", "-1", "got -2"],
     {"text": "hi there", "return_logprob": True, "logprob_start_len": 1, "sampling_params": SP}),
    ("min_new_tokens_past_context", "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": None,
                                                                                   "min_new_tokens": 10**6}},
     ["min_new_tokens", str(CONTEXT), "1000000"], {"text": "hi", "sampling_params": {"max_new_tokens": 3,
                                                                             "min_new_tokens": 1}}),
    ("top_k_past_int32", "/generate", {"text": "hi", "sampling_params": {**SP, "top_k": 2**40}},
     ["top_k", "1073741824"], {"text": "hi", "sampling_params": {**SP, "top_k": 2**30}}),
    ("logit_bias_value", "/generate", {"text": "hi", "sampling_params": {**SP, "logit_bias": {"5": "high"}}},
     ["logit_bias", "finite number", "high"], {"text": "hi", "sampling_params": {**SP, "logit_bias": {"5": -100}}}),
    ("wrong_type_max_new_tokens", "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": "2"}},
     ["max_new_tokens", "integer", "str"], {"text": "hi", "sampling_params": {"max_new_tokens": 2}}),
    ("wrong_type_json_schema", "/generate", {"text": "hi", "sampling_params": {**SP, "json_schema": {"type": "x"}}},
     ["json_schema", "string"], {"text": "hi", "sampling_params": {**SP, "json_schema": '{"type": "object"}'}}),
    ("unknown_sampling_field", "/generate", {"text": "hi", "sampling_params": {**SP, "tempurature": 1}},
     ["unknown field", "tempurature"], {"text": "hi", "sampling_params": {**SP, "temperature": 1}}),
    ("internal_sampling_field", "/generate", {"text": "hi", "sampling_params": {**SP, "is_normalized": True}},
     ["unknown field", "is_normalized"], {"text": "hi", "sampling_params": SP}),
    ("stop_regex", "/generate", {"text": "hi", "sampling_params": {**SP, "stop_regex": "(ab"}},
     ["stop_regex", "(ab", "regular expression"], {"text": "hi", "sampling_params": {**SP, "stop_regex": "a+b"}}),
    ("sampling_params_per_prompt", "/generate", {"text": ["a", "b"], "sampling_params": [SP]},
     ["one object per prompt", "2 prompts"], {"text": ["a", "b"], "sampling_params": [SP, SP]}),
    ("sampling_params_list_single", "/generate", {"text": "a", "sampling_params": [SP]},
     ["sampling_params", "single prompt"], {"text": "a", "sampling_params": SP}),
    ("per_prompt_list_length", "/generate", {"text": ["a", "b"], "return_logprob": [True], "sampling_params": SP},
     ["return_logprob", "one value per prompt"], {"text": ["a", "b"], "return_logprob": [True, False],
                                                   "sampling_params": SP}),
    ("text_empty_batch", "/generate", {"text": [], "sampling_params": SP}, ["text", "non-empty"],
     {"text": ["a"], "sampling_params": SP}),
    ("sampling_seed_past_int64", "/generate", {"text": "hi", "sampling_params": {**SP, "sampling_seed": 2**64}},
     ["sampling_seed"], {"text": "hi", "sampling_params": {**SP, "sampling_seed": 2**63 - 1}}),
]

#: Fields SGLang itself refuses with HTTP 400 on every release: (case id, endpoint, body, words of its message).
SGLANG_CHECKS = [
    ("max_new_tokens_negative", "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": -1}},
     ["max_new_tokens", "at least 0"]),
    ("max_new_tokens_past_context", "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 10**9}},
     ["context length"]),
    ("openai_max_tokens_past_context", "/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 10**9},
     ["context length"]),
    ("input_past_context", "/generate", {"input_ids": [7] * (CONTEXT + 5), "sampling_params": SP}, ["context length"]),
    ("logit_bias_key_past_vocab", "/generate", {"text": "hi", "sampling_params": {**SP, "logit_bias": {"1024": 1.0}}},
     ["logit_bias", "1023", "1024"]),
    ("openai_logit_bias_key_negative", "/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 2,
                                                            "logit_bias": {"-4": 1.0}}, ["logit_bias", "-4"]),
    ("token_ids_logprob_past_vocab", "/generate", {"text": "hi", "return_logprob": True,
                                                   "token_ids_logprob": [1, 1024], "sampling_params": SP},
     ["token_ids_logprob", "1024", "[0, 1024)"]),
    ("temperature_negative", "/generate", {"text": "hi", "sampling_params": {**SP, "temperature": -1}},
     ["temperature"]),
    ("top_p_zero", "/generate", {"text": "hi", "sampling_params": {**SP, "top_p": 0}}, ["top_p", "(0, 1]"]),
    ("top_k_zero", "/generate", {"text": "hi", "sampling_params": {**SP, "temperature": 1, "top_k": 0}}, ["top_k"]),
    ("min_p_two", "/generate", {"text": "hi", "sampling_params": {**SP, "min_p": 2}}, ["min_p", "[0, 1]"]),
    ("repetition_penalty_zero", "/generate", {"text": "hi", "sampling_params": {**SP, "repetition_penalty": 0}},
     ["repetition_penalty"]),
    ("two_grammars", "/generate", {"text": "hi", "sampling_params": {**SP, "regex": "a", "json_schema": "{}"}},
     ["Only one of"]),
    ("input_ids_empty", "/generate", {"input_ids": [], "sampling_params": SP}, ["input_ids cannot be empty"]),
    ("text_empty", "/generate", {"text": "", "sampling_params": SP}, ["empty"]),
    ("no_prompt", "/generate", {"sampling_params": SP}, ["text, input_ids or input_embeds"]),
]


def _post(base_url, path, body):
    data = json.dumps(body).encode()
    req = urllib.request.Request(base_url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


@pytest.fixture(scope="module")
def cpu_server():
    pytest.importorskip("sglang")
    srv = CpuServer(validation=True)
    try:
        yield srv
    finally:
        srv.close()


def test_the_cpu_server_serves_the_model_the_cases_assume(cpu_server):
    rec = cpu_server.record()
    assert (rec["vocab_size"], rec["hidden_size"], rec["context_len"]) == (VOCAB, HIDDEN, CONTEXT)


@pytest.mark.parametrize("case", PLUGIN_CHECKS, ids=[c[0] for c in PLUGIN_CHECKS])
def test_a_bad_value_is_refused_naming_the_field_and_a_good_one_passes(cpu_server, case):
    _, path, bad, words, good = case
    before = cpu_server.record()["requests"]
    status, text = _post(cpu_server.base_url, path, bad)
    assert status == 400, (status, text[:600])
    answer = json.loads(text)
    schema_gate = compat.generate_schema_gate() if path == "/generate" else None
    schema_refusal = None
    if schema_gate is not None:
        import orjson  # the server's parser (an integer past 64 bits becomes a float); the gate sees its parse

        schema_refusal = schema_gate(orjson.loads(json.dumps(bad)))
    if schema_refusal is not None:
        # 0.5.22+: SGLang's own /generate schema check refuses it before the plugin's hooks run, in its wording.
        assert answer == {"error": schema_refusal}, answer
    else:
        message = answer["error"]["message"] if isinstance(answer.get("error"), dict) else answer.get("message")
        for word in words:
            assert word in message, (word, message)
    assert cpu_server.record()["requests"] == before, "a refused request reached the scheduler"
    status, text = _post(cpu_server.base_url, path, good)
    assert status == 200, (status, text[:600])
    assert cpu_server.record()["fatal"] == []


@pytest.mark.parametrize("case", SGLANG_CHECKS, ids=[c[0] for c in SGLANG_CHECKS])
def test_sglang_itself_refuses(cpu_server, case):
    _, path, bad, words = case
    status, text = _post(cpu_server.base_url, path, bad)
    assert status == 400, (status, text[:600])
    for word in words:
        assert word in text, (word, text[:600])


def test_a_streamed_generate_gets_the_refusal_as_an_error_event(cpu_server):
    status, text = _post(cpu_server.base_url, "/generate", {"input_ids": [1, 2048], "stream": True,
                                                           "sampling_params": SP})
    assert status == 200  # SGLang's /generate stream: HTTP 200, then one error event
    first = json.loads(text.split("\n")[0][len("data:"):])
    assert first["error"]["code"] == 400 and "input_ids" in first["error"]["message"]


def test_the_hooks_are_the_ones_sglangs_loader_applied():
    """Every target is the same dotted path on every release and resolves on the installed one."""
    pytest.importorskip("sglang")
    import pkgutil

    for target in rv.REQUEST_VALIDATION_TARGETS:
        assert callable(pkgutil.resolve_name(target)), target


def test_the_type_table_names_only_fields_of_some_release_and_internal_fields_follow_the_api_ones():
    """The installed SamplingParams: its API fields come before ``stop_strs``; every field after that is one the
    check refuses (internal) or one SGLang's own OpenAI renderer sets (``ebnf_full_assistant``, 0.5.23)."""
    pytest.importorskip("sglang")
    fields = list(rv.installed_sampling_fields_in_order())
    internal = fields[fields.index("stop_strs"):]
    assert set(internal) <= rv.INTERNAL_SAMPLING_FIELDS | {"ebnf_full_assistant"}, internal
    release_only = {"beam_width", "ebnf_full_assistant"}  # 0.5.19+, 0.5.23
    assert set(rv.SAMPLING_FIELD_TYPES) - release_only <= set(fields)


def test_the_pure_checks_run_without_sglang():
    from types import SimpleNamespace

    with pytest.raises(ValueError, match=r"input_ids: token id -1 at position 0 .*\[0, 10\)"):
        rv.check_request_against_model(SimpleNamespace(input_ids=[-1], sampling_params={}), [-1], vocab_size=10,
                                       hidden_size=4, context_len=100)
    rv.check_request_against_model(SimpleNamespace(input_ids=[9], sampling_params={}), [9], vocab_size=10,
                                   hidden_size=4, context_len=100)
    with pytest.raises(ValueError, match="sampling_params.n must be in"):
        rv.check_request_structure(SimpleNamespace(text="a", sampling_params={"n": 0}), ["n"])
    rv.check_request_structure(SimpleNamespace(text="a", sampling_params={"n": 2}), ["n"])
    # Non-finite numbers cannot come through FastAPI's JSON parser (it refuses NaN / Infinity), but can through
    # the Engine API or another front end.
    with pytest.raises(ValueError, match=r"logit_bias\['5'\] must be a finite number"):
        rv.check_sampling_params({"logit_bias": {"5": float("inf")}}, ["logit_bias"])
    with pytest.raises(ValueError, match="input_embeds row 0 must hold finite numbers"):
        rv.check_input_embeds([[0.0, float("nan")]], 2)
