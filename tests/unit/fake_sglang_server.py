"""A stand-in for an SGLang HTTP server, for testing ``sglang-detspec check`` on CPU.

It speaks the endpoints the checker uses, shaped like SGLang 0.5.17/0.5.23's:

* ``GET /server_info`` (and the deprecated ``/get_server_info``): resolved server arguments at top level
  (``model_path``, ``speculative_algorithm``, ``enable_deterministic_inference``, ``chunked_prefill_size``,
  ``context_length``, ``disable_radix_cache``), the scheduler's ``max_req_input_len`` and
  ``max_total_num_tokens``, ``version``, and ``internal_states[i]["avg_spec_accept_length"]``;
* ``GET /health``: 503 for the first ``starting_health_polls`` calls (SGLang answers 503 until its own
  warm-up request has finished), then 200; 404 with ``health=False`` (a build or proxy without it);
* ``POST /generate``: ``{"text", "output_ids", "meta_info": {"prompt_tokens", "cached_tokens",
  "completion_tokens", "spec_verify_ct", "spec_accept_length", ...}}`` (a list of ``n`` of them for ``n`` > 1);
  ``stream: true`` answers server-sent events (``data: {...}`` chunks, the first one right after the "prefill",
  then ``data: [DONE]``); HTTP 400 with ``{"error": {"message": ...}}`` for a malformed request or one longer
  than the context length (SGLang's checks and wording);
* ``GET|POST /flush_cache[?timeout=S]``: empties the radix cache, waiting up to S seconds for requests in
  flight, else HTTP 400 (SGLang flushes only when idle); 404 with ``flush_cache=False``;
* ``GET /metrics`` (only with ``metrics=True``, as SGLang's ``--enable-metrics``): Prometheus text with
  ``sglang:num_retracted_requests_total{...}`` (no sample before the first retraction, as a labelled counter).

Retraction (``retraction=True``): a KV pool of ``max_total_num_tokens`` that every request in flight fills with its
prompt and ``max_new_tokens``; when an arriving request makes them overflow it, the youngest request in flight (the
one arriving: SGLang retracts the request with the fewest output tokens first) is retracted once.
``meta_info.num_retractions`` reports the count on every answer (SGLang 0.5.17/0.5.23 do; ``report_retractions=False``
leaves it out), and ``served.retractions`` lets ``diverge_if`` model a server whose retracted requests change.

Prompts are "tokenized" into 3-character pieces of each word (``fake_tokenize``), so tokens per word vary
(1 to 4 here) and the checker's own length estimates are really tested. A radix cache of every prompt since the
last flush gives ``cached_tokens`` (the longest shared token prefix, at most all but the last token).

Behaviours (``mode``):

* ``deterministic``   output = f(prompt, sampling_seed, temperature, max_new_tokens);
* ``nondeterministic`` like ``deterministic`` up to token ``DIVERGE_AT``, then mixed with a global request
  counter, so every response differs from every other from that token on;
* ``batch_dependent`` like ``deterministic`` up to token ``DIVERGE_AT``, then mixed with the largest number
  of requests in flight while this one was being served (what a batch-variant sampler does);
* ``seed_ignored``    output = f(prompt) only (a greedy server);
* ``error500``        ``/generate`` answers HTTP 500 with SGLang's error body;
* ``html``            every path answers 200 ``text/html`` (some web page, not SGLang);
* ``not_found``       every path answers 404 JSON (some other API).

``diverge_if(request, served)`` (any mode but the last four): when it returns True the output switches to a
second fixed continuation from token ``DIVERGE_AT`` on -- a server whose output changes only under one
condition (``served.neighbours``: the requests in flight at any time while this one was; ``served.cached_tokens``
and ``served.cache_source``: "self" when the cache hit is this very prompt, "other" when another prompt's).

``return_logprob`` (and ``top_logprobs_num``) add ``meta_info.output_token_logprobs`` ``[[logprob, id, None], ...]``
and ``output_top_logprobs`` (per position ``[[logprob, id, None], ...]``), float32 values that are a function of the
output tokens and the seed; ``logprob_jitter_if(request, served)`` True moves the token logprob at position
``LOGPROB_JITTER_AT`` by ``LOGPROB_JITTER`` (tokens unchanged: what a batch-variant log-softmax does), and
``logprobs=False`` makes the server ignore ``return_logprob``.

Every request is recorded (``generate_requests``, ``responses``, ``timeline``) so tests can check what the
client sent and in which order.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import struct
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

DIVERGE_AT = 5
VOCAB = 500
ERROR_MESSAGE = "CUDA error: an illegal memory access was encountered"
LOGPROB_JITTER_AT = 3
LOGPROB_JITTER = 2.0**-20


def token_ids(*parts, n: int) -> list[int]:
    out = []
    for k in range(n):
        h = hashlib.sha256(("|".join(map(str, parts)) + f"|{k}").encode()).digest()
        out.append(int.from_bytes(h[:4], "little") % VOCAB)
    return out


def _float32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def fake_logprob(*parts) -> float:
    """A float32 logprob in (-16, 0] that is a function of ``parts``."""
    h = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return _float32(-int.from_bytes(h[:4], "little") / 2**28)


def detokenize(ids: list[int]) -> str:
    return "".join(f" w{i}" for i in ids)


def fake_tokenize(text: str) -> list[str]:
    return [w[i : i + 3] for w in text.split() for i in range(0, len(w), 3)]


@dataclass
class Served:
    """What the server saw while serving one request (for ``diverge_if``)."""

    neighbours: list[dict] = field(default_factory=list)
    cached_tokens: int = 0
    cache_source: str | None = None  # "self", "other" or None (nothing cached)
    retractions: int = 0  # times this request was retracted (retraction=True)


def _lcp(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class _BackloggedHTTPServer(ThreadingHTTPServer):
    # The pressure profile opens ~30 connections at once; socketserver's default listen backlog of 5 made a loaded
    # CI machine (several checks and fakes side by side) answer some with "Connection reset by peer".
    request_queue_size = 128


class FakeSGLang:
    def __init__(
        self,
        mode: str = "deterministic",
        *,
        output_ids: bool = True,
        deterministic_flag: bool | None = True,
        info_paths: tuple[str, ...] = ("/server_info", "/get_server_info"),
        speculative_algorithm: str | None = "DETSPEC_EAGLE",
        report_accept_length: bool = True,
        delay: float = 0.0,
        prefill_delay: float = 0.0,
        version: str = "0.5.23",
        accept_length: float = 2.0,
        port: int = 0,
        starting_health_polls: int = 0,
        health: bool = True,
        chunked_prefill_size: int | None = 64,
        context_length: int | None = 1024,
        max_total_num_tokens: int = 8192,
        disable_radix_cache: bool = False,
        flush_cache: bool = True,
        diverge_if: Callable[[dict, Served], bool] | None = None,
        logprobs: bool = True,
        logprob_jitter_if: Callable[[dict, Served], bool] | None = None,
        max_running_requests: int | None = 32,
        retraction: bool = False,
        metrics: bool = False,
        report_retractions: bool = True,
    ):
        self.mode = mode
        self.output_ids = output_ids
        self.deterministic_flag = deterministic_flag
        self.info_paths = info_paths
        self.speculative_algorithm = speculative_algorithm
        self.report_accept_length = report_accept_length
        self.delay = delay  # seconds a request takes after its first token
        self.prefill_delay = prefill_delay  # seconds before its first token (a streamed request's first chunk)
        self.version = version
        self.accept_length = accept_length
        self.port = port
        self.starting_health_polls = starting_health_polls
        self.health = health
        self.chunked_prefill_size = chunked_prefill_size
        self.context_length = context_length
        self.max_total_num_tokens = max_total_num_tokens
        self.max_req_input_len = min(context_length or 10**9, max_total_num_tokens) - 1
        self.disable_radix_cache = disable_radix_cache
        self.flush_cache = flush_cache
        self.diverge_if = diverge_if
        self.logprobs = logprobs
        self.logprob_jitter_if = logprob_jitter_if
        self.max_running_requests = max_running_requests
        self.retraction = retraction
        self.metrics = metrics
        self.report_retractions = report_retractions
        self.retracted_total = 0
        # (path, status) of every /health, /generate and /flush_cache request, in arrival order (0: not answered)
        self.events: list[tuple[str, int]] = []
        # (monotonic time, "arrive" | "first_chunk" | "done" | "flush", request id or None, prompt or None)
        self.timeline: list[tuple[float, str, int | None, str | None]] = []
        self.lock = threading.Lock()
        self.generate_requests: list[dict] = []
        self.responses: list[dict] = []  # the first completion of each answered request, in answer order
        self.info_requests: list[str] = []
        self.inflight = 0
        self.max_inflight = 0
        self._counter = itertools.count()
        self._live: dict[int, dict] = {}  # request id -> {"req", "served", "max_inflight"}
        self._cache: list[list[str]] = []
        self.server: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------
    def __enter__(self) -> "FakeSGLang":
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # keep test output clean
                pass

            def do_GET(self):
                fake._handle(self, "GET")

            def do_POST(self):
                fake._handle(self, "POST")

        self.server = _BackloggedHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        assert self.server is not None
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self) -> str:
        assert self.server is not None
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    # -- helpers for tests -----------------------------------------------------------------------------------
    def probe_responses(self, prompt: str) -> list[dict]:
        with self.lock:
            return [r for q, r in zip(self.generate_requests, self.responses) if q.get("text") == prompt]

    # -- request handling ------------------------------------------------------------------------------------
    def _send(self, h: BaseHTTPRequestHandler, code: int, body, ctype: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        h.send_response(code)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    @staticmethod
    def _write_chunk(h: BaseHTTPRequestHandler, data: bytes) -> None:
        h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        h.wfile.flush()

    def _note(self, what: str, rid: int | None = None, text: str | None = None) -> None:
        self.timeline.append((time.monotonic(), what, rid, text))

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        if self.mode == "html":
            page = b"<!doctype html><html><head><title>Welcome to nginx!</title></head><body>hi</body></html>"
            return self._send(h, 200, page, "text/html; charset=utf-8")
        if self.mode == "not_found":
            return self._send(h, 404, {"detail": "Not Found"})
        url = urllib.parse.urlsplit(h.path)
        if method == "GET" and url.path in self.info_paths:
            with self.lock:
                self.info_requests.append(url.path)
            return self._send(h, 200, self._server_info())
        if method == "GET" and url.path == "/health" and self.health:
            with self.lock:
                starting = sum(1 for path, _ in self.events if path == "/health") < self.starting_health_polls
                code = 503 if starting else 200
                self.events.append(("/health", code))
            return self._send(h, code, b"", "text/plain")
        if url.path == "/flush_cache" and self.flush_cache:
            return self._flush(h, urllib.parse.parse_qs(url.query))
        if method == "GET" and url.path == "/metrics" and self.metrics:
            return self._send(h, 200, self._metrics_text().encode(), "text/plain; version=0.0.4")
        if method == "POST" and url.path == "/generate":
            with self.lock:
                self.events.append(("/generate", 0))
            return self._generate(h, raw)
        return self._send(h, 404, {"detail": "Not Found"})

    def _server_info(self) -> dict:
        info = {
            "model_path": "/models/fake-tiny",
            "speculative_algorithm": self.speculative_algorithm,
            "version": self.version,
            "chunked_prefill_size": self.chunked_prefill_size,
            "context_length": self.context_length,
            "disable_radix_cache": self.disable_radix_cache,
            "max_req_input_len": self.max_req_input_len,
            "max_total_num_tokens": self.max_total_num_tokens,
            "internal_states": [{"last_gen_throughput": 1.0}],
        }
        if self.max_running_requests is not None:
            info["internal_states"][0]["effective_max_running_requests_per_dp"] = self.max_running_requests
        if self.deterministic_flag is not None:
            info["enable_deterministic_inference"] = self.deterministic_flag
        if self.speculative_algorithm and self.report_accept_length:
            info["internal_states"][0]["avg_spec_accept_length"] = 2.5
        return info

    def _metrics_text(self) -> str:
        labels = '{model_name="/models/fake-tiny",engine_type="unified",tp_rank="0",pp_rank="0"}'
        lines = ["# HELP sglang:num_running_reqs The number of running requests.", "# TYPE sglang:num_running_reqs gauge",
                 f"sglang:num_running_reqs{labels} {float(self.inflight)}",
                 "# HELP sglang:num_retracted_requests_total Total number of retracted requests.",
                 "# TYPE sglang:num_retracted_requests_total counter"]
        with self.lock:
            if self.retracted_total:
                lines += [f"sglang:num_retracted_requests_total{labels} {float(self.retracted_total)}",
                          f"sglang:num_retracted_requests_created{labels} 1.7e9"]
        return "\n".join(lines) + "\n"

    def _flush(self, h: BaseHTTPRequestHandler, query: dict) -> None:
        deadline = time.monotonic() + float(query.get("timeout", ["0"])[0])
        while True:
            with self.lock:
                if self.inflight == 0:
                    self._cache.clear()
                    self.events.append(("/flush_cache", 200))
                    self._note("flush")
                    break
                if time.monotonic() >= deadline:
                    self.events.append(("/flush_cache", 400))
                    return self._send(h, 400, b"Flush cache failed.\n", "text/plain")
            time.sleep(0.01)
        return self._send(h, 200, b"Cache flushed.\nPlease check backend logs for more details.\n", "text/plain")

    @staticmethod
    def _validate(req: dict) -> None:
        """Raise ValueError for what SGLang would answer 400 to (types and ranges of the fields the checker sends)."""
        sp = req["sampling_params"]
        if not isinstance(req["text"], str) or not isinstance(sp, dict):
            raise ValueError("text must be a string and sampling_params an object")
        if not isinstance(sp["max_new_tokens"], int) or sp["max_new_tokens"] < 0:
            raise ValueError("max_new_tokens must be a non-negative integer")
        if "sampling_seed" in sp and not isinstance(sp["sampling_seed"], int):
            raise ValueError("sampling_seed must be an integer")
        checks = {"temperature": lambda v: v >= 0, "top_p": lambda v: 0 < v <= 1, "min_p": lambda v: 0 <= v <= 1,
                  "top_k": lambda v: isinstance(v, int) and (v == -1 or v >= 1), "n": lambda v: isinstance(v, int) and v >= 1,
                  "ignore_eos": lambda v: isinstance(v, bool), "stop": lambda v: isinstance(v, (str, list))}
        for key, ok in checks.items():
            if key in sp and not ok(sp[key]):
                raise ValueError(f"invalid {key}: {sp[key]!r}")
        if req.get("return_logprob") and not isinstance(req.get("top_logprobs_num", 0), int):
            raise ValueError("top_logprobs_num must be an integer")

    def _length_error(self, tokens: int, max_new: int) -> str | None:
        if self.context_length and tokens >= self.context_length:
            return f"The input ({tokens} tokens) is longer than the model's context length ({self.context_length} tokens)."
        if self.context_length and tokens + max_new > self.context_length:
            return (f"Requested token count exceeds the model's maximum context length of {self.context_length} "
                    f"tokens. You requested a total of {tokens + max_new} tokens.")
        if tokens > self.max_req_input_len:
            return f"Input length ({tokens} tokens) exceeds the maximum allowed length ({self.max_req_input_len} tokens)."
        return None

    def _generate(self, h: BaseHTTPRequestHandler, raw: bytes) -> None:
        try:
            req = json.loads(raw)
            self._validate(req)
        except (ValueError, KeyError, TypeError) as e:
            return self._send(h, 400, {"error": {"message": f"invalid request: {e}"}})
        if self.mode == "error500":
            return self._send(h, 500, {"error": {"message": ERROR_MESSAGE, "code": 500}})
        sp, text = req["sampling_params"], req["text"]
        tokens = fake_tokenize(text)
        too_long = self._length_error(len(tokens), sp["max_new_tokens"])
        if too_long:
            return self._send(h, 400, {"error": {"message": too_long}})

        with self.lock:
            rid = next(self._counter)
            self._note("arrive", rid, text)
            served = Served()
            if not self.disable_radix_cache and self._cache:
                best = max(self._cache, key=lambda c: _lcp(tokens, c))
                served.cached_tokens = min(_lcp(tokens, best), len(tokens) - 1)
                if served.cached_tokens:
                    served.cache_source = "self" if best == tokens else "other"
            self._cache.append(tokens)
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
            for other in self._live.values():
                other["served"].neighbours.append(req)
                served.neighbours.append(other["req"])
            self._live[rid] = {"req": req, "served": served, "max_inflight": self.inflight,
                               "kv": len(tokens) + sp["max_new_tokens"]}
            if self.retraction and sum(v["kv"] for v in self._live.values()) > self.max_total_num_tokens:
                served.retractions += 1  # the arriving request is the youngest: fewest output tokens
                self.retracted_total += 1
            for v in self._live.values():
                v["max_inflight"] = max(v["max_inflight"], self.inflight)
        stream = bool(req.get("stream"))
        try:
            if self.prefill_delay:
                time.sleep(self.prefill_delay)
            if stream:
                # Chunked transfer encoding, as SGLang's server (uvicorn) sends a StreamingResponse.
                h.send_response(200)
                h.send_header("Content-Type", "text/event-stream")
                h.send_header("Transfer-Encoding", "chunked")
                h.end_headers()
                first = {"text": "", "output_ids": [], "meta_info": {"id": f"req-{rid}", "finish_reason": None}}
                self._write_chunk(h, b"data: " + json.dumps(first).encode() + b"\n\n")
                with self.lock:
                    self._note("first_chunk", rid, text)
            if self.delay:
                time.sleep(self.delay)
        finally:
            with self.lock:
                self.inflight -= 1
                live = self._live.pop(rid)
        bodies = [self._completion(req, rid, k, live["served"], live["max_inflight"], len(tokens))
                  for k in range(sp.get("n", 1))]
        with self.lock:
            self.generate_requests.append(req)
            self.responses.append(bodies[0])
            self._note("done", rid, text)
        if stream:
            self._write_chunk(h, b"data: " + json.dumps(bodies[0]).encode() + b"\n\n")
            self._write_chunk(h, b"data: [DONE]\n\n")
            self._write_chunk(h, b"")  # the terminating zero-length chunk
            return None
        return self._send(h, 200, bodies[0] if len(bodies) == 1 else bodies)

    def _completion(self, req: dict, rid: int, sample: int, served: Served, seen: int, prompt_tokens: int) -> dict:
        sp = req["sampling_params"]
        text, seed, n = req["text"], sp.get("sampling_seed", 42), sp["max_new_tokens"]
        temp = sp.get("temperature", 1.0)
        if self.mode == "seed_ignored":
            ids = token_ids(text, n=n)
        else:
            ids = token_ids(text, seed, temp, *([sample] if sample else []), n=n)  # n > 1: distinct samples
            if self.mode == "nondeterministic":
                ids = ids[:DIVERGE_AT] + token_ids(text, seed, "call", rid, n=n)[DIVERGE_AT:]
            elif self.mode == "batch_dependent":
                ids = ids[:DIVERGE_AT] + token_ids(text, seed, "batch", seen, n=n)[DIVERGE_AT:]
            if self.diverge_if is not None and self.diverge_if(req, served):
                ids = ids[:DIVERGE_AT] + token_ids(text, seed, "diverged", n=n)[DIVERGE_AT:]
        verify_ct = max(1, math.ceil(n / self.accept_length))
        meta = {
            "id": f"req-{rid}",
            "finish_reason": {"type": "length", "length": n},
            "prompt_tokens": prompt_tokens,
            "cached_tokens": served.cached_tokens,
            "completion_tokens": n,
        }
        if self.report_retractions:
            meta["num_retractions"] = served.retractions
        if self.speculative_algorithm:
            meta["spec_verify_ct"] = verify_ct
            if self.report_accept_length:
                meta["spec_accept_length"] = n / verify_ct
        if req.get("return_logprob") and self.logprobs:
            self._add_logprobs(meta, req, served, seed, ids)
        body = {"text": detokenize(ids), "meta_info": meta}
        if self.output_ids:
            body["output_ids"] = ids
        return body

    def _add_logprobs(self, meta: dict, req: dict, served: Served, seed, ids: list[int]) -> None:
        values = [fake_logprob(seed, k, t) for k, t in enumerate(ids)]
        if self.logprob_jitter_if is not None and self.logprob_jitter_if(req, served) and len(values) > LOGPROB_JITTER_AT:
            values[LOGPROB_JITTER_AT] = _float32(values[LOGPROB_JITTER_AT] - LOGPROB_JITTER)
        meta["output_token_logprobs"] = [[v, t, None] for v, t in zip(values, ids)]
        top = req.get("top_logprobs_num") or 0
        if top:
            meta["output_top_logprobs"] = [
                sorted(([fake_logprob(seed, k, "top", r), (t + r) % VOCAB, None] for r in range(top)), reverse=True)
                for k, t in enumerate(ids)
            ]
