"""Malformed and hostile requests for a live SGLang server, each with the outcome it must get (issue 31).

:func:`generate_cases` draws a seeded list of :class:`FuzzCase` over ``/generate``, ``/v1/completions`` and
``/v1/chat/completions``: wrong types, out-of-range numbers, NaN / Infinity (raw JSON tokens, as Python's ``json``
writes them), huge lists and bodies, nested garbage, unknown fields, huge ``n``, batches mixing good and bad
prompts, invalid ``regex`` / ``json_schema`` / ``stop_regex``, token ids outside the vocabulary, client disconnects
mid-stream, plus plain good requests. Each case says what it expects:

* ``reject``  -- a 4xx (a streamed ``/generate`` answers 200 with one ``data: {"error": {"code": 400}}`` event: its
  code counts); ``refused_by`` says whether the tokenizer process refuses it (``door``) or the scheduler aborts it
  (``scheduler``: an invalid grammar, ``logprob_start_len`` past the prompt);
* ``accept``  -- a 2xx (good requests, and malformed-looking ones SGLang rightly ignores: unknown top-level fields);
* ``disconnect`` -- the client hangs up mid-request; no status, only the server must stay up.

NOT_COVERED: ``/v1/chat/completions`` with a JSON body that is not an object (``null``, ``[1]``, ``"text"``) or a
non-object ``response_format`` answers HTTP 500 on sglang 0.5.17 (its ``ChatCompletionRequest`` "before" validators
call ``values.get`` first; an ``AttributeError`` is not a validation error), with or without the plugin. The server
stays up; no HookRegistry target reaches that code (pydantic holds the validators), so the mix leaves it out.

:func:`send_case` sends one case over its own connection (raw ``http.client``: bodies are bytes, disconnects are
real) and :func:`judge` compares the outcome with the expectation. Standard library only.
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional
from urllib.parse import urlparse

GENERATE, COMPLETIONS, CHAT = "/generate", "/v1/completions", "/v1/chat/completions"
REJECT, ACCEPT, DISCONNECT = "reject", "accept", "disconnect"
DOOR, SCHEDULER = "door", "scheduler"


@dataclass
class FuzzCase:
    index: int
    kind: str
    endpoint: str
    body: bytes
    expect: str
    refused_by: str = DOOR
    stream: bool = False
    content_type: str = "application/json"


@dataclass
class Outcome:
    status: Optional[int]  # the effective status (a streamed error event's code), None: no answer
    http_status: Optional[int] = None
    error: Optional[str] = None  # "timeout", "connection: ..." when no answer came
    seconds: float = 0.0
    detail: str = ""


@dataclass
class Model:
    """What the generator needs to know of the served model."""

    vocab_size: int = 1024
    hidden_size: int = 256
    context_len: int = 16384


WORDS = ("river", "mill", "ledger", "draft", "token", "seed", "batch", "verify", "sample", "target")


def _text(rng: random.Random, words: int = 6) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _good_ids(rng: random.Random, m: Model, n: int = 6) -> List[int]:
    return [rng.randrange(3, m.vocab_size) for _ in range(n)]


def _bad_id(rng: random.Random, m: Model) -> int:
    return rng.choice([-1, -3, -(2**31), m.vocab_size, m.vocab_size + 1, 5000, 2**31 - 1, 2**40])


def _small(rng: random.Random) -> dict:
    return {"max_new_tokens": rng.randint(1, 4), "temperature": rng.choice([0, 0.7, 1.0])}


WRONG_TYPES = {
    "max_new_tokens": ["4", 4.5, [4], {"v": 4}, True], "temperature": ["hot", [1.0], {"t": 1}, True],
    "top_p": ["0.9", [0.9]], "top_k": ["5", 5.5, [5]], "n": ["2", 2.5, [2], "many"],
    "stop": [5, [1, 2], {"s": "x"}], "stop_token_ids": [5, "5", [1.5], ["a"]], "regex": [5, ["a"]],
    "json_schema": [{"type": "object"}, 7], "ignore_eos": ["yes", 1], "logit_bias": [[1, 2], "x", 5],
    "min_new_tokens": ["1", 1.5], "stream_interval": ["x", 1.5], "custom_params": ["x", [1]],
    "sampling_seed": ["7", 7.5, 2**64],
}

OUT_OF_RANGE = [
    ("temperature", -1), ("top_p", 0), ("top_p", 1.5), ("top_k", -2), ("top_k", 0), ("top_k", 2**40), ("min_p", 2),
    ("min_p", -0.5), ("frequency_penalty", 5), ("presence_penalty", -5), ("repetition_penalty", 0),
    ("repetition_penalty", 9), ("max_new_tokens", -1), ("max_new_tokens", 10**9), ("min_new_tokens", -1),
    ("n", 0), ("n", -1), ("n", 1025), ("n", 10**6), ("n", 10**12),
]


def _generate_body(rng, m, **fields) -> dict:
    body = {"sampling_params": _small(rng)}
    body.update(fields)
    if "text" not in body and "input_ids" not in body and "input_embeds" not in body:
        body["text"] = _text(rng)
    return body


# Each maker returns (endpoint, body: dict | bytes, expect, refused_by, extra) -- extra: dict of FuzzCase fields.
def _ids_outside_vocab(rng, m):
    ids = _good_ids(rng, m)
    ids[rng.randrange(len(ids))] = _bad_id(rng, m)
    if rng.random() < 0.5:
        return GENERATE, _generate_body(rng, m, input_ids=ids), REJECT
    return COMPLETIONS, {"prompt": ids, "max_tokens": 3}, REJECT


def _batch_mixing_good_and_bad(rng, m):
    rows = [_good_ids(rng, m, rng.randint(2, 8)) for _ in range(rng.randint(2, 5))]
    bad = rng.randrange(len(rows))
    choice = rng.random()
    if choice < 0.4:
        rows[bad][0] = _bad_id(rng, m)
        return GENERATE, _generate_body(rng, m, input_ids=rows), REJECT
    if choice < 0.6:
        rows[bad] = []
        return GENERATE, _generate_body(rng, m, input_ids=rows), REJECT
    params = [_small(rng) for _ in rows]
    name = rng.choice(sorted(WRONG_TYPES))
    params[bad][name] = rng.choice(WRONG_TYPES[name])
    if choice < 0.8:
        return GENERATE, {"input_ids": rows, "sampling_params": params}, REJECT
    return GENERATE, {"input_ids": rows, "sampling_params": params[:-1]}, REJECT  # one object short


def _wrong_type(rng, m):
    name = rng.choice(sorted(WRONG_TYPES))
    params = _small(rng)
    params[name] = rng.choice(WRONG_TYPES[name])
    return GENERATE, {"text": _text(rng), "sampling_params": params, "stream": rng.random() < 0.3}, REJECT


def _out_of_range(rng, m):
    name, value = rng.choice(OUT_OF_RANGE)
    if rng.random() < 0.6:
        params = _small(rng)
        params["temperature"] = 1.0  # temperature 0 makes SGLang replace top_k by 1 (greedy)
        params[name] = value
        return GENERATE, {"text": _text(rng), "sampling_params": params}, REJECT
    openai = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}.get(name, name)
    if name == "sampling_seed":
        openai = "seed"
    return COMPLETIONS, {"prompt": _text(rng), "max_tokens": 3, openai: value}, REJECT


def _logprob_fields(rng, m):
    prompt = _good_ids(rng, m, 5)
    case = rng.randrange(5)
    if case == 0:
        return GENERATE, _generate_body(rng, m, input_ids=prompt, return_logprob=True,
                                        top_logprobs_num=rng.choice([m.vocab_size + 1, 10**6, -1])), REJECT
    if case == 1:
        return GENERATE, _generate_body(rng, m, input_ids=prompt, return_logprob=True,
                                        logprob_start_len=rng.choice([-2, -100])), REJECT
    if case == 2:
        return GENERATE, _generate_body(rng, m, input_ids=prompt, return_logprob=True,
                                        token_ids_logprob=[1, _bad_id(rng, m)]), REJECT
    if case == 3:  # past the prompt: the scheduler aborts it (not a door check)
        return GENERATE, _generate_body(rng, m, input_ids=prompt, return_logprob=True,
                                        logprob_start_len=len(prompt) + 5), REJECT, SCHEDULER
    return CHAT, {"messages": [{"role": "user", "content": _text(rng)}], "max_tokens": 3, "logprobs": True,
                  "top_logprobs": rng.choice([m.vocab_size + 1, 10**5])}, REJECT


def _stop_and_bias(rng, m):
    case = rng.randrange(4)
    params = _small(rng)
    if case == 0:
        params["stop_token_ids"] = [2, _bad_id(rng, m)]
        params["min_new_tokens"] = 1
    elif case == 1:
        params["logit_bias"] = {str(_bad_id(rng, m)): 1.0}
    elif case == 2:
        params["stop_regex"] = rng.choice(["(", "[a-", "*x", "(?P<", "a{2,1}"])
    else:
        return COMPLETIONS, {"prompt": _text(rng), "max_tokens": 3, "logit_bias": {str(_bad_id(rng, m)): 5}}, REJECT
    return GENERATE, {"text": _text(rng), "sampling_params": params}, REJECT


def _nan_and_infinity(rng, m):
    token = rng.choice(["NaN", "Infinity", "-Infinity"])
    where = rng.randrange(4)
    if where == 0:
        body = '{"text": "%s", "sampling_params": {"max_new_tokens": 3, "temperature": %s}}' % (_text(rng), token)
    elif where == 1:
        body = '{"text": "%s", "sampling_params": {"max_new_tokens": 3, "logit_bias": {"5": %s}}}' % (_text(rng), token)
    elif where == 2:
        row = ", ".join(["0.1"] * (m.hidden_size - 1) + [token])
        body = '{"input_embeds": [[%s]], "sampling_params": {"max_new_tokens": 2}}' % row
    else:
        body = '{"prompt": "%s", "max_tokens": 3, "top_p": %s}' % (_text(rng), token)
        return COMPLETIONS, body.encode(), REJECT
    return GENERATE, body.encode(), REJECT


def _input_embeds(rng, m):
    case = rng.randrange(3)
    if case == 0:
        embeds = [[0.01] * rng.choice([1, m.hidden_size - 1, m.hidden_size + 1]) for _ in range(3)]
    elif case == 1:
        embeds = [[0.01] * m.hidden_size, [0.01] * (m.hidden_size // 2)]
    else:
        embeds = rng.choice([[], [[]], [[[]]]])
    return GENERATE, {"input_embeds": embeds, "sampling_params": {"max_new_tokens": 2}}, REJECT


def _nested_garbage(rng, m):
    garbage = rng.choice([{"a": {"b": [1, {"c": None}]}}, [[["x"]]], 12345, None, True, {"text": "nested"}])
    case = rng.randrange(6)
    if case == 0:
        return GENERATE, {"text": garbage if garbage is not None else {"x": 1}, "sampling_params": _small(rng)}, REJECT
    if case == 1:
        return GENERATE, {"text": _text(rng), "sampling_params": rng.choice([[_small(rng)], "max", 7, [1, 2]])}, REJECT
    if case == 2:
        return GENERATE, {"input_ids": rng.choice([[1, [2]], ["a", 2], [1.5, 2], "1 2 3", [[1], 2]]),
                          "sampling_params": _small(rng)}, REJECT
    if case == 3:
        return CHAT, {"messages": rng.choice(["hi", [{"content": "no role"}], [{"role": "wizard", "content": "x"}],
                                              [{"role": "user", "content": {"deep": [garbage]}}], []]),
                      "max_tokens": 3}, REJECT
    if case == 4:
        return GENERATE, {"text": [_text(rng), _text(rng)], "return_logprob": [True], "sampling_params": _small(rng)}, \
            REJECT
    return GENERATE, {"sampling_params": _small(rng)}, REJECT  # no prompt at all


def _grammar(rng, m):
    params = _small(rng)
    case = rng.randrange(3)
    if case == 0:
        params["regex"] = rng.choice(["(", "[a-", "a{3,1}", "(?<=x"])
    elif case == 1:
        params["json_schema"] = rng.choice(["{not json", '{"type": "no-such-type"}', "[1, 2", '{"type": 5}'])
    else:
        params["regex"], params["json_schema"] = "a+", '{"type": "object"}'  # two grammars: refused at the door
        return GENERATE, {"text": _text(rng), "sampling_params": params}, REJECT
    return GENERATE, {"text": _text(rng), "sampling_params": params}, REJECT, SCHEDULER


def _unknown_fields(rng, m):
    name = "x_" + "".join(rng.choice("abcdefgh") for _ in range(6))
    case = rng.randrange(3)
    if case == 0:  # an unknown sampling field: SGLang's constructor would raise TypeError (HTTP 500)
        params = _small(rng)
        params[name] = 1
        return GENERATE, {"text": _text(rng), "sampling_params": params}, REJECT
    if case == 1:  # an unknown top-level field: SGLang ignores it
        return GENERATE, {"text": _text(rng), "sampling_params": _small(rng), name: {"any": [1]}}, ACCEPT
    return COMPLETIONS, {"prompt": _text(rng), "max_tokens": 2, name: 1}, ACCEPT


def _huge(rng, m):
    case = rng.randrange(4)
    if case == 0:  # past the context
        return GENERATE, {"input_ids": [7] * (m.context_len + rng.randint(1, 1000)), "sampling_params": _small(rng)}, \
            REJECT
    if case == 1:
        ids = [3] * 50000 + [_bad_id(rng, m)]
        return GENERATE, {"text": _text(rng), "sampling_params": {"max_new_tokens": 2, "stop_token_ids": ids}}, REJECT
    if case == 2:
        bias = {str(m.vocab_size + i): 1.0 for i in range(20000)}
        return GENERATE, {"text": _text(rng), "sampling_params": {"max_new_tokens": 2, "logit_bias": bias}}, REJECT
    return COMPLETIONS, {"prompt": _text(rng), "max_tokens": 10**12}, REJECT


def _oversized_body(rng, m):
    if rng.random() < 0.5:  # about 1.5 MB of text: tokenized, then past the context
        return GENERATE, {"text": "river mill " * 150000, "sampling_params": {"max_new_tokens": 2}}, REJECT
    return COMPLETIONS, {"prompt": [5] * 300000, "max_tokens": 2}, REJECT


def _not_json(rng, m):
    endpoint = rng.choice([GENERATE, COMPLETIONS, CHAT])
    bodies = [b"not json", b"", b"{", b'{"text": "x"', b"\xff\xfe\x00"]
    if endpoint != CHAT:  # see NOT_COVERED
        bodies += [b"[1, 2, 3]", b"null", b'"text"']
    return endpoint, rng.choice(bodies), REJECT


def _wrong_content_type(rng, m):
    body = json.dumps({"prompt": _text(rng), "max_tokens": 2}).encode()
    return rng.choice([COMPLETIONS, CHAT]), body, REJECT, DOOR, {"content_type": "text/plain"}


def _good(rng, m):
    case = rng.randrange(5)
    if case == 0:
        return GENERATE, {"text": _text(rng), "sampling_params": _small(rng)}, ACCEPT
    if case == 1:
        return GENERATE, {"input_ids": [_good_ids(rng, m, 4), _good_ids(rng, m, 3)],
                          "sampling_params": [_small(rng), _small(rng)]}, ACCEPT
    if case == 2:
        return GENERATE, {"input_ids": _good_ids(rng, m), "return_logprob": True, "top_logprobs_num": 3,
                          "sampling_params": {"max_new_tokens": 2, "n": 2, "stop_token_ids": [1, 2]}}, ACCEPT
    if case == 3:
        return COMPLETIONS, {"prompt": _text(rng), "max_tokens": 3, "seed": rng.randrange(2**31)}, ACCEPT
    return CHAT, {"messages": [{"role": "user", "content": _text(rng)}], "max_tokens": 3}, ACCEPT


def _disconnect(rng, m):
    if rng.random() < 0.5:
        return GENERATE, {"text": _text(rng), "stream": True, "sampling_params": {"max_new_tokens": 48,
                                                                                   "ignore_eos": True}}, DISCONNECT
    return COMPLETIONS, {"prompt": _text(rng), "max_tokens": 48, "stream": rng.random() < 0.5}, DISCONNECT


#: (maker, weight): the mix of a fuzz run.
MAKERS: Dict[str, tuple] = {
    "ids_outside_vocab": (_ids_outside_vocab, 10), "batch_mixing_good_and_bad": (_batch_mixing_good_and_bad, 8),
    "wrong_type": (_wrong_type, 12), "out_of_range": (_out_of_range, 10), "logprob_fields": (_logprob_fields, 6),
    "stop_and_bias": (_stop_and_bias, 6), "nan_and_infinity": (_nan_and_infinity, 5), "input_embeds": (_input_embeds, 4),
    "nested_garbage": (_nested_garbage, 8), "grammar": (_grammar, 3), "unknown_fields": (_unknown_fields, 6),
    "huge": (_huge, 2), "oversized_body": (_oversized_body, 0.5), "not_json": (_not_json, 4),
    "wrong_content_type": (_wrong_content_type, 1.5), "good": (_good, 10), "disconnect": (_disconnect, 4),
}


def make_case(index: int, kind: str, rng: random.Random, model: Model) -> FuzzCase:
    out = MAKERS[kind][0](rng, model)
    endpoint, body, expect = out[:3]
    refused_by = out[3] if len(out) > 3 else DOOR
    extra = out[4] if len(out) > 4 else {}
    stream = isinstance(body, dict) and bool(body.get("stream"))
    if isinstance(body, dict) and endpoint != GENERATE:
        body = {"model": "default", **body}
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return FuzzCase(index, kind, endpoint, raw, expect, refused_by, stream, **extra)


def generate_cases(seed: int, count: int, model: Optional[Model] = None,
                   kinds: Optional[List[str]] = None) -> List[FuzzCase]:
    """``count`` cases drawn with ``random.Random(seed)`` from :data:`MAKERS` by weight (or only ``kinds``), for
    ``model`` (default: the tiny pair's shape)."""
    model = model or Model()
    rng = random.Random(seed)
    names = kinds or sorted(MAKERS)
    weights = [MAKERS[k][1] for k in names]
    return [make_case(i, rng.choices(names, weights)[0], rng, model) for i in range(count)]


# ---------------------------------------------------------------------------------------------------
# Sending and judging


def _effective_stream_status(first_event: str) -> Optional[int]:
    """A streamed response's first ``data:`` event: its error code, if it is an error."""
    payload = first_event[len("data:"):].strip() if first_event.startswith("data:") else ""
    if not payload or payload == "[DONE]":
        return None
    try:
        data = json.loads(payload)
    except ValueError:
        return None
    err = data.get("error") if isinstance(data, dict) else None
    if isinstance(err, dict):
        code = err.get("code")
        return int(code) if isinstance(code, int) or (isinstance(code, str) and code.isdigit()) else 400
    return None


def send_case(base_url: str, case: FuzzCase, timeout: float = 60.0) -> Outcome:
    """Send ``case`` on a connection of its own; a disconnect case hangs up after the headers (or at once)."""
    url = urlparse(base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=timeout)
    start = time.monotonic()
    try:
        conn.request("POST", case.endpoint, body=case.body,
                     headers={"Content-Type": case.content_type, "Connection": "close"})
        if case.expect == DISCONNECT and not case.stream:
            return Outcome(None, error="disconnected", seconds=time.monotonic() - start)
        resp = conn.getresponse()
        status = resp.status
        if case.expect == DISCONNECT:
            resp.readline()
            return Outcome(None, status, error="disconnected", seconds=time.monotonic() - start)
        if resp.getheader("Content-Type", "").startswith("text/event-stream"):
            first = ""
            for raw in resp:
                line = raw.decode(errors="replace").strip()
                if line:
                    first = first or line
            effective = _effective_stream_status(first) or status
            return Outcome(effective, status, seconds=time.monotonic() - start, detail=first[:300])
        body = resp.read().decode(errors="replace")
        return Outcome(status, status, seconds=time.monotonic() - start, detail=body[:300])
    except socket.timeout:
        return Outcome(None, error="timeout", seconds=time.monotonic() - start)
    except (OSError, http.client.HTTPException) as exc:
        return Outcome(None, error=f"connection: {type(exc).__name__}: {exc}"[:200], seconds=time.monotonic() - start)
    finally:
        conn.close()


def judge(case: FuzzCase, outcome: Outcome, *, scheduler_present: bool = True) -> str:
    """``ok``, or what went wrong: ``5xx``, ``timeout``, ``no_answer``, ``accepted_malformed`` (2xx for a reject
    case), ``refused_good`` (4xx for an accept case). Without a real scheduler (the CPU stand-in), a case the
    scheduler would refuse only needs an answer below 500."""
    if case.expect == DISCONNECT:
        return "ok" if outcome.error == "disconnected" else ("5xx" if (outcome.status or 0) >= 500 else "ok")
    if outcome.status is None:
        return "timeout" if outcome.error == "timeout" else "no_answer"
    if outcome.status >= 500:
        return "5xx"
    if case.expect == REJECT:
        if 400 <= outcome.status < 500:
            return "ok"
        if case.refused_by == SCHEDULER and not scheduler_present:
            return "ok"
        return "accepted_malformed"
    return "ok" if 200 <= outcome.status < 300 else "refused_good"


def summarize(cases: List[FuzzCase], outcomes: List[Outcome], verdicts: List[str]) -> dict:
    """Counts for the report: requests tried, 2xx / 4xx / 5xx, timeouts, disconnects, verdicts by kind."""
    statuses = [o.status for o in outcomes]
    by_kind: Dict[str, Dict[str, int]] = {}
    for case, verdict in zip(cases, verdicts):
        entry = by_kind.setdefault(case.kind, {})
        entry[verdict] = entry.get(verdict, 0) + 1
    return {
        "requests": len(cases),
        "2xx": sum(1 for s in statuses if s is not None and 200 <= s < 300),
        "4xx": sum(1 for s in statuses if s is not None and 400 <= s < 500),
        "5xx": sum(1 for s in statuses if s is not None and s >= 500),
        "timeouts": sum(1 for o in outcomes if o.error == "timeout"),
        "no_answer": sum(1 for o in outcomes if o.error and o.error.startswith("connection")),
        "not_sent": sum(1 for o in outcomes if o.error and o.error.startswith("not sent")),
        "disconnects": sum(1 for o in outcomes if o.error == "disconnected"),
        "expected_accept_2xx": sum(1 for c, o in zip(cases, outcomes)
                                   if c.expect == ACCEPT and o.status and 200 <= o.status < 300),
        "bad_verdicts": sum(1 for v in verdicts if v != "ok"),
        "verdicts_by_kind": by_kind,
    }


def run_cases(base_url: str, cases: List[FuzzCase], *, workers: int = 8, timeout: float = 60.0,
              between: Optional[Callable[[int], None]] = None, every: int = 250,
              stop: Optional[Callable[[List[Outcome]], bool]] = None) -> List[Outcome]:
    """Send ``cases`` with ``workers`` threads, in chunks of ``every``; ``between(sent)`` runs after each chunk (the
    probe), and ``stop(outcomes so far)`` True ends the run early (the server is lost): the rest are not sent."""
    from concurrent.futures import ThreadPoolExecutor

    outcomes: List[Outcome] = []
    with ThreadPoolExecutor(workers) as pool:
        for start in range(0, len(cases), every):
            if stop is not None and stop(outcomes):
                outcomes += [Outcome(None, error="not sent: the server was lost")] * (len(cases) - start)
                break
            outcomes += list(pool.map(lambda c: send_case(base_url, c, timeout), cases[start:start + every]))
            if between is not None:
                between(len(outcomes))
    return outcomes


__all__ = ["FuzzCase", "Outcome", "Model", "MAKERS", "generate_cases", "make_case", "send_case", "judge", "summarize",
           "run_cases"]
