"""A stand-in for an SGLang HTTP server, for testing ``sglang-detspec check`` on CPU.

It speaks the two endpoints the checker uses, shaped like SGLang 0.5.17/0.5.23's:

* ``GET /server_info`` (and the deprecated ``/get_server_info``): resolved server arguments at top level
  (``model_path``, ``speculative_algorithm``, ``enable_deterministic_inference``), ``version``, and
  ``internal_states[i]["avg_spec_accept_length"]``;
* ``GET /health``: 503 for the first ``starting_health_polls`` calls (SGLang answers 503 until its own
  warm-up request has finished), then 200; 404 with ``health=False`` (a build or proxy without it);
* ``POST /generate``: ``{"text", "output_ids", "meta_info": {"completion_tokens", "spec_verify_ct",
  "spec_accept_length", ...}}``, or ``{"error": {"message": ...}}`` with HTTP 400 for a malformed request.

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

Every request is recorded (``generate_requests``, ``responses``) so tests can check what the client sent.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DIVERGE_AT = 5
VOCAB = 500
ERROR_MESSAGE = "CUDA error: an illegal memory access was encountered"


def token_ids(*parts, n: int) -> list[int]:
    out = []
    for k in range(n):
        h = hashlib.sha256(("|".join(map(str, parts)) + f"|{k}").encode()).digest()
        out.append(int.from_bytes(h[:4], "little") % VOCAB)
    return out


def detokenize(ids: list[int]) -> str:
    return "".join(f" w{i}" for i in ids)


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
        version: str = "0.5.23",
        accept_length: float = 2.0,
        port: int = 0,
        starting_health_polls: int = 0,
        health: bool = True,
    ):
        self.mode = mode
        self.output_ids = output_ids
        self.deterministic_flag = deterministic_flag
        self.info_paths = info_paths
        self.speculative_algorithm = speculative_algorithm
        self.report_accept_length = report_accept_length
        self.delay = delay
        self.version = version
        self.accept_length = accept_length
        self.port = port
        self.starting_health_polls = starting_health_polls
        self.health = health
        # (path, status) of every /health and /generate request, in arrival order (status 0: not yet answered)
        self.events: list[tuple[str, int]] = []
        self.lock = threading.Lock()
        self.generate_requests: list[dict] = []
        self.responses: list[dict] = []
        self.info_requests: list[str] = []
        self.inflight = 0
        self.max_inflight = 0
        self._counter = itertools.count()
        self._live: dict[int, list[int]] = {}  # request id -> [max in-flight seen while it was served]
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

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
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

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        if self.mode == "html":
            page = b"<!doctype html><html><head><title>Welcome to nginx!</title></head><body>hi</body></html>"
            return self._send(h, 200, page, "text/html; charset=utf-8")
        if self.mode == "not_found":
            return self._send(h, 404, {"detail": "Not Found"})
        if method == "GET" and h.path in self.info_paths:
            with self.lock:
                self.info_requests.append(h.path)
            return self._send(h, 200, self._server_info())
        if method == "GET" and h.path == "/health" and self.health:
            with self.lock:
                starting = sum(1 for path, _ in self.events if path == "/health") < self.starting_health_polls
                code = 503 if starting else 200
                self.events.append(("/health", code))
            return self._send(h, code, b"", "text/plain")
        if method == "POST" and h.path == "/generate":
            with self.lock:
                self.events.append(("/generate", 0))
            return self._generate(h, raw)
        return self._send(h, 404, {"detail": "Not Found"})

    def _server_info(self) -> dict:
        info = {
            "model_path": "/models/fake-tiny",
            "speculative_algorithm": self.speculative_algorithm,
            "version": self.version,
            "internal_states": [{"last_gen_throughput": 1.0}],
        }
        if self.deterministic_flag is not None:
            info["enable_deterministic_inference"] = self.deterministic_flag
        if self.speculative_algorithm and self.report_accept_length:
            info["internal_states"][0]["avg_spec_accept_length"] = 2.5
        return info

    def _generate(self, h: BaseHTTPRequestHandler, raw: bytes) -> None:
        try:
            req = json.loads(raw)
            sp = req["sampling_params"]
            text = req["text"]
            seed = sp["sampling_seed"]
            temp = sp["temperature"]
            n = sp["max_new_tokens"]
            # The checker compares completions position by position: it must ask for fixed-length outputs.
            if sp.get("ignore_eos") is not True or not isinstance(seed, int) or not isinstance(n, int):
                raise ValueError("bad sampling_params")
        except (ValueError, KeyError, TypeError) as e:
            return self._send(h, 400, {"error": {"message": f"invalid request: {e}"}})
        if self.mode == "error500":
            return self._send(h, 500, {"error": {"message": ERROR_MESSAGE, "code": 500}})

        with self.lock:
            rid = next(self._counter)
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
            self._live[rid] = [self.inflight]
            for v in self._live.values():
                v[0] = max(v[0], self.inflight)
        try:
            if self.delay:
                time.sleep(self.delay)
        finally:
            with self.lock:
                self.inflight -= 1
                seen = self._live.pop(rid)[0]

        if self.mode == "seed_ignored":
            ids = token_ids(text, n=n)
        else:
            ids = token_ids(text, seed, temp, n=n)
            if self.mode == "nondeterministic":
                ids = ids[:DIVERGE_AT] + token_ids(text, seed, "call", rid, n=n)[DIVERGE_AT:]
            elif self.mode == "batch_dependent":
                ids = ids[:DIVERGE_AT] + token_ids(text, seed, "batch", seen, n=n)[DIVERGE_AT:]
        verify_ct = max(1, math.ceil(n / self.accept_length))
        meta = {
            "id": f"req-{rid}",
            "finish_reason": {"type": "length", "length": n},
            "prompt_tokens": len(text.split()),
            "completion_tokens": n,
            "cached_tokens": 0,
        }
        if self.speculative_algorithm:
            meta["spec_verify_ct"] = verify_ct
            if self.report_accept_length:
                meta["spec_accept_length"] = n / verify_ct
        body = {"text": detokenize(ids), "meta_info": meta}
        if self.output_ids:
            body["output_ids"] = ids
        with self.lock:
            self.generate_requests.append(req)
            self.responses.append(body)
        return self._send(h, 200, body)
