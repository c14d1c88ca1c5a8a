"""The checker's HTTP side: ``--url`` validation, a ``requests`` client for SGLang's ``/generate``,
``/flush_cache`` and server-info endpoints, and waiting for a server that is still starting.

Everything here speaks HTTP only; nothing imports SGLang, so the checker runs against any SGLang server
from any machine.
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any, Callable

from sglang_detspec.command_base import DETSPEC_ALGORITHMS, PROG, CliError

_HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*\.?$")
_EXAMPLE_URL = "http://127.0.0.1:30000"


class ServerUnreachable(CliError):
    """Nothing usable answered at the URL yet: connection refused, unknown host, connect timeout, or HTTP
    502/503/504 on the server-info endpoint (``--wait`` keeps polling through these)."""


def parse_server_url(text: str) -> str:
    """Validate ``--url`` and return it as ``http(s)://HOST[:PORT][/PATH]`` without a trailing slash.

    Without a scheme the value must be ``HOST:PORT`` (``localhost:30000``): a bare word is a typo far more
    often than a server on port 80, and would otherwise surface minutes later as a DNS failure.
    """
    raw = text.strip()
    hint = f"give the server as http://HOST:PORT, e.g. {_EXAMPLE_URL}"
    if not raw:
        raise CliError(f"--url is empty; {hint}")
    has_scheme = "://" in raw
    parts = urllib.parse.urlsplit(raw if has_scheme else "http://" + raw)
    if parts.scheme.lower() not in ("http", "https"):
        raise CliError(f"--url {text!r}: scheme {parts.scheme!r} is not http or https; {hint}")
    try:
        port = parts.port
    except ValueError:
        raise CliError(f"--url {text!r}: the port must be a number in 1-65535; {hint}") from None
    host = parts.hostname or ""
    if not host:
        raise CliError(f"--url {text!r} names no host; {hint}")
    if "[" not in parts.netloc and not _HOSTNAME.match(host):
        raise CliError(f"--url {text!r}: {host!r} is not a host name or IP address; {hint}")
    if port == 0:
        raise CliError(f"--url {text!r}: port 0 is not a server port; {hint}")
    if not has_scheme and port is None:
        raise CliError(f"--url {text!r} is neither HOST:PORT nor http://HOST[:PORT]; {hint}")
    if parts.username or parts.password:
        raise CliError(f"--url {text!r} carries credentials; pass the server's key with --api-key instead")
    if parts.query or parts.fragment:
        raise CliError(f"--url {text!r} has a query or fragment; give only the server's address, {hint}")
    netloc = parts.netloc.lower()
    return f"{parts.scheme.lower()}://{netloc}{parts.path.rstrip('/')}"


def _root_cause(exc: BaseException) -> str:
    """The innermost readable reason of a requests/urllib3 connection error (they nest three levels deep)."""
    seen = set()
    best = None
    stack = [exc]
    while stack:
        e = stack.pop()
        if id(e) in seen or e is None:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and getattr(e, "strerror", None):
            best = e.strerror
        for a in getattr(e, "args", ()):
            if isinstance(a, BaseException):
                stack.append(a)
        for attr in ("reason", "__cause__", "__context__"):
            inner = getattr(e, attr, None)
            if isinstance(inner, BaseException):
                stack.append(inner)
    if best:
        return best
    text = str(exc)
    for marker in ("Connection refused", "Name or service not known", "No route to host", "timed out"):
        if marker in text:
            return marker
    return text.splitlines()[0][:200] if text else type(exc).__name__


#: what urllib3 says when a connection that had been opened closes before any response byte
_DROPPED_UNANSWERED = "Connection aborted"

_DNS_FAILURES = ("Name or service not known", "nodename nor servname", "Temporary failure in name resolution",
                 "No address associated with hostname", "getaddrinfo failed")


def _error_message(resp) -> str:
    """SGLang answers ``{"error": {"message": ...}}`` (or ``{"error": "..."}``, FastAPI ``{"detail": ...}``)."""
    try:
        body = resp.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body.get("message")))
        if isinstance(err, dict):
            err = err.get("message", err)
        if err is not None:
            return " ".join(str(err).split())[:300]
    text = " ".join((resp.text or "").split())
    return text[:200] if text else (resp.reason or "no body")


def _completion_bodies(body: Any) -> list[dict] | None:
    """``/generate`` answers one dict, or a list of dicts (``n`` > 1); None when it is neither."""
    bodies = body if isinstance(body, list) else [body]
    if bodies and all(isinstance(b, dict) and isinstance(b.get("text"), str) for b in bodies):
        return bodies
    return None


class Client:
    """A ``requests`` session with timeouts and urllib3 retries.

    Connection errors are retried for every method (the request never reached the server, so a retried
    ``/generate`` cannot double the load); 502/503/504 are retried only for GET (a server still starting
    up), never for ``/generate``: a failing generate must surface as an error, not hide behind a retry.

    Every POST gets a connection of its own, closed once its response is read. SGLang's uvicorn closes a
    keep-alive connection after ``SGLANG_TIMEOUT_KEEP_ALIVE`` seconds idle (5 by default); a POST written on a
    pooled connection at that instant is dropped unanswered (``RemoteDisconnected``), and a POST is not
    retried, so reusing connections can fail ``check`` under traffic whose requests take about 5 s (the
    likely cause of an H100 pressure run's ``RemoteDisconnected``, 2026-12-05, while the server logged no
    error). Sending ``Connection: close`` alone is not enough: a server that closes without saying so in its
    answer (``http.server`` does) leaves the client's pool holding the closed connection. GETs keep the
    pool: urllib3 retries their reads.
    """

    def __init__(self, url: str, *, timeout: float, api_key: str | None = None, pool_size: int = 32):
        import requests

        self.url = parse_server_url(url)
        self.timeout = (min(10.0, timeout), timeout)
        self._requests = requests
        self._api_key = api_key
        self.session = self._new_session(max(pool_size, 2))

    def _new_session(self, pool_size: int):
        from requests.adapters import HTTPAdapter
        from urllib3.util.retry import Retry

        retry = Retry(
            total=3,
            connect=3,
            read=1,
            status=2,
            backoff_factor=0.2,
            status_forcelist=(502, 503, 504),
            allowed_methods=frozenset({"GET"}),
            raise_on_status=False,
        )
        adapter = HTTPAdapter(max_retries=retry, pool_connections=2, pool_maxsize=pool_size)
        session = self._requests.Session()
        session.mount("http://", adapter)
        session.mount("https://", adapter)
        if self._api_key:
            session.headers["Authorization"] = f"Bearer {self._api_key}"
        return session

    def close(self) -> None:
        self.session.close()

    def _timed_out(self, path: str) -> CliError:
        return CliError(
            f"{self.url}{path} did not answer within {self.timeout[1]:g} s (--timeout); the server is busy, stuck, "
            "or compiling kernels for a new kind of batch: its log says which"
        )

    def request(self, method: str, path: str, **kwargs):
        requests = self._requests
        session = self.session
        if method == "POST":  # a fresh pool, closed at once: the connection closes when the response is released
            session = self._new_session(1)
            kwargs["headers"] = {**kwargs.get("headers", {}), "Connection": "close"}
        try:
            return session.request(method, self.url + path, timeout=self.timeout, **kwargs)
        except requests.exceptions.ConnectTimeout as e:
            raise ServerUnreachable(f"cannot connect to {self.url}: connection timed out") from e
        except requests.exceptions.ConnectionError as e:
            # A read timeout wrapped by urllib3's retry arrives here as a ConnectionError too.
            reason = _root_cause(e)
            if "Read timed out" in str(e):
                raise self._timed_out(path) from e
            if method == "POST" and _DROPPED_UNANSWERED in str(e):  # it reached the server: not "unreachable"
                raise CliError(f"{self.url}{path}: the server closed the connection without answering: {reason}; "
                               "its log says why (a crash, an out-of-memory kill, or a proxy in between timing "
                               "out)") from e
            if any(marker in str(e) or marker in reason for marker in _DNS_FAILURES):
                host = urllib.parse.urlsplit(self.url).hostname
                raise ServerUnreachable(f"cannot connect to {self.url}: the host name {host!r} does not resolve "
                                        f"({reason}); check --url") from e
            raise ServerUnreachable(
                f"cannot connect to {self.url}: {reason} (is the server running? `{PROG} serve` starts one)"
            ) from e
        except requests.exceptions.Timeout as e:
            raise self._timed_out(path) from e
        except requests.exceptions.RequestException as e:
            raise CliError(f"request to {self.url}{path} failed: {_root_cause(e)}") from e
        finally:
            if session is not self.session:
                session.close()

    def _generate_error(self, resp) -> CliError:
        return CliError(f"{self.url}/generate answered HTTP {resp.status_code}: {_error_message(resp)}")

    def generate(self, payload: dict) -> list[dict]:
        """POST ``/generate``; the completions (one per ``n``), each with ``text`` and ``meta_info``."""
        resp = self.request("POST", "/generate", json=payload)
        if resp.status_code >= 400:
            raise self._generate_error(resp)
        try:
            body = resp.json()
        except ValueError as e:
            raise CliError(
                f"{self.url}/generate did not answer JSON (content-type "
                f"{resp.headers.get('content-type', '?')!r}); is this an SGLang server?"
            ) from e
        bodies = _completion_bodies(body)
        if bodies is None:
            raise CliError(f"{self.url}/generate answered JSON without a 'text' field; is this an SGLang server?")
        return bodies

    def generate_streamed(self, payload: dict, on_first_chunk: Callable[[], None]) -> dict:
        """POST ``/generate`` with ``stream: true``; call ``on_first_chunk`` when the first chunk arrives (SGLang
        sends it once the request's prefill has produced its first token) and return the last chunk."""
        requests = self._requests
        resp = self.request("POST", "/generate", json={**payload, "stream": True}, stream=True)
        try:
            if resp.status_code >= 400:
                raise self._generate_error(resp)
            last = None
            try:
                for line in resp.iter_lines():
                    if not line.startswith(b"data:"):
                        continue
                    data = line[len(b"data:"):].strip()
                    if data == b"[DONE]":
                        break
                    try:
                        chunk = json.loads(data)
                    except ValueError as e:
                        raise CliError(f"{self.url}/generate streamed a chunk that is not JSON: {data[:80]!r}") from e
                    if isinstance(chunk, dict) and "error" in chunk:
                        err = chunk["error"]
                        msg = err.get("message", err) if isinstance(err, dict) else err
                        raise CliError(f"{self.url}/generate streamed an error: {msg}")
                    if last is None:
                        on_first_chunk()
                    last = chunk
            except requests.exceptions.RequestException as e:
                if "timed out" in str(e):
                    raise self._timed_out("/generate") from e
                raise CliError(f"streaming from {self.url}/generate failed: {_root_cause(e)}") from e
            if not isinstance(last, dict):
                raise CliError(f"{self.url}/generate streamed no completion chunk; is this an SGLang server?")
            return last
        finally:
            resp.close()

    def flush_cache(self, wait_s: float) -> None:
        """Empty the server's radix (prefix) cache: SGLang's ``/flush_cache`` (0.5.17 - 0.5.23, GET or POST).

        SGLang flushes only while no request is running or waiting; ``timeout`` asks it to wait that long for
        its queue to drain instead of refusing at once.
        """
        resp = self.request("POST", "/flush_cache", params={"timeout": f"{wait_s:g}"})
        if resp.status_code in (401, 403):
            raise CliError(f"{self.url}/flush_cache answered HTTP {resp.status_code}: the server wants an API key "
                           "(--api-key; a server with --admin-api-key wants that one)")
        if resp.status_code in (404, 405):
            raise CliError(f"{self.url}/flush_cache answered HTTP {resp.status_code}: this server cannot empty its "
                           "prefix cache, which the prefix profile needs; leave it out (--traffic uniform,mixed,long)")
        if resp.status_code >= 400:
            raise CliError(f"{self.url}/flush_cache answered HTTP {resp.status_code}: {_error_message(resp)} "
                           f"(SGLang flushes only when no request is running; is another client using the server?)")


@dataclass
class ServerInfo:
    """What the server says about itself (``/server_info``, or ``/get_server_info`` on older builds)."""

    endpoint: str
    version: str | None
    model_path: str | None
    speculative_algorithm: str | None
    deterministic_inference: bool | None
    avg_spec_accept_length: float | None = None
    # What the traffic profiles size their requests by (None: the server did not say).
    chunked_prefill_size: int | None = None  # -1: chunked prefill disabled
    context_length: int | None = None
    max_req_input_len: int | None = None
    max_total_num_tokens: int | None = None
    disable_radix_cache: bool | None = None
    max_running_requests: int | None = None  # what the scheduler runs at once (the pressure profile sizes by it)

    @property
    def plugin_active(self) -> bool:
        return (self.speculative_algorithm or "").upper() in DETSPEC_ALGORITHMS


def _is_sglang_info(data: Any) -> bool:
    return isinstance(data, dict) and "version" in data and ("model_path" in data or "internal_states" in data)


def float_or_none(x: Any) -> float | None:
    try:
        return float(x) if x is not None else None
    except (TypeError, ValueError):
        return None


def _int_or_none(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def fetch_server_info(client: Client) -> ServerInfo:
    """Identify an SGLang server.  ``/server_info`` is the current name (0.5.17 and 0.5.23 both have it and keep
    ``/get_server_info`` as a deprecated alias); both carry the resolved server arguments at top level."""
    tried = []
    for path in ("/server_info", "/get_server_info"):
        resp = client.request("GET", path)
        if resp.status_code in (404, 405):
            tried.append(f"{path} -> HTTP {resp.status_code}")
            continue
        if resp.status_code in (401, 403):
            raise CliError(
                f"{client.url}{path} answered HTTP {resp.status_code}: the server wants an API key (--api-key)"
            )
        if resp.status_code in (502, 503, 504):
            # A server (or the proxy in front of it) that is still starting: --wait keeps polling.
            raise ServerUnreachable(
                f"{client.url}{path} answered HTTP {resp.status_code} (still starting?): {_error_message(resp)}"
            )
        if resp.status_code >= 400:
            raise CliError(f"{client.url}{path} answered HTTP {resp.status_code}: {_error_message(resp)}")
        try:
            data = resp.json()
        except ValueError:
            ctype = resp.headers.get("content-type", "?").split(";")[0]
            raise CliError(
                f"{client.url} is not an SGLang server: {path} answered {ctype!r}, not SGLang's JSON server info"
            ) from None
        if not _is_sglang_info(data):
            raise CliError(
                f"{client.url} is not an SGLang server: {path} answered JSON without SGLang's "
                "'version'/'model_path' fields"
            )
        return _parse_server_info(path, data)
    raise CliError(f"{client.url} is not an SGLang server: {'; '.join(tried)}")


def _parse_server_info(endpoint: str, data: dict) -> ServerInfo:
    det = data.get("enable_deterministic_inference")
    radix_off = data.get("disable_radix_cache")
    return ServerInfo(
        endpoint=endpoint,
        version=str(data["version"]) if data.get("version") is not None else None,
        model_path=data.get("model_path"),
        speculative_algorithm=data.get("speculative_algorithm"),
        deterministic_inference=bool(det) if det is not None else None,
        avg_spec_accept_length=_avg_accept_length(data),
        chunked_prefill_size=_int_or_none(data.get("chunked_prefill_size")),
        # Scheduler facts (max_req_input_len, max_total_num_tokens) sit at top level on 0.5.17 and 0.5.23.
        context_length=_int_or_none(data.get("context_length")),
        max_req_input_len=_int_or_none(data.get("max_req_input_len")),
        max_total_num_tokens=_int_or_none(data.get("max_total_num_tokens")),
        disable_radix_cache=bool(radix_off) if radix_off is not None else None,
        max_running_requests=_max_running_requests(data),
    )


def _max_running_requests(data: dict) -> int | None:
    """The scheduler's own limit, ``internal_states[i]["effective_max_running_requests_per_dp"]`` (0.5.17 and 0.5.23:
    scheduler.get_internal_state), else the server argument ``max_running_requests`` (None when not given)."""
    states = data.get("internal_states")
    if isinstance(states, list):
        vals = [_int_or_none(st.get("effective_max_running_requests_per_dp")) for st in states if isinstance(st, dict)]
        vals = [v for v in vals if v]
        if vals:
            return min(vals)
    return _int_or_none(data.get("max_running_requests")) or None


#: SGLang's Prometheus counter of retracted requests (observability/metrics_collector.py in 0.5.17 and 0.5.23,
#: incremented by the scheduler's decode retraction); ``/metrics`` exists only with ``--enable-metrics``.
RETRACTED_REQUESTS_METRIC = "sglang:num_retracted_requests_total"


def parse_metric_total(text: str, name: str) -> int | None:
    """The sum of every sample of ``name`` (all label sets) in Prometheus text, or None when there is none."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        metric = head.split("{", 1)[0].strip()
        if metric != name:
            continue  # e.g. the counter's ..._created sample
        try:
            total += float(value)
        except ValueError:
            continue
        seen = True
    return int(total) if seen else None


def retracted_requests_total(client: Client) -> int | None:
    """The server's retraction counter from ``/metrics``; None when it has no metrics (no --enable-metrics) or
    reports no such counter. Only an observation: never fails the check."""
    try:
        resp = client.request("GET", "/metrics")
    except CliError:
        return None
    if resp.status_code != 200:
        return None
    text = resp.text or ""
    total = parse_metric_total(text, RETRACTED_REQUESTS_METRIC)
    # A labelled counter has no sample until its first increment: SGLang's other metrics there mean "none yet".
    return 0 if total is None and "sglang:" in text else total


def _avg_accept_length(data: dict) -> float | None:
    """Server-wide accept length: ``internal_states[i]["avg_spec_accept_length"]`` (one entry per DP rank) in
    0.5.17 and 0.5.23; older builds put the scheduler info at top level."""
    vals = []
    states = data.get("internal_states")
    if isinstance(states, list):
        for st in states:
            if isinstance(st, dict):
                v = float_or_none(st.get("avg_spec_accept_length"))
                if v is not None:
                    vals.append(v)
    if not vals:
        v = float_or_none(data.get("avg_spec_accept_length"))
        if v is not None:
            vals.append(v)
    return sum(vals) / len(vals) if vals else None


def _still_starting(client: Client) -> bool:
    """True while ``/health`` answers HTTP 503.

    SGLang (0.5.17 and 0.5.23) answers ``/server_info`` as soon as its HTTP server is up, but ``/health``
    with 503 until its own warm-up request (greedy, "The capital city of France is") has finished, or
    when it is unhealthy.  Probes must not start before: they would share batches with that greedy
    request, and on SGLang 0.5.17 a verify batch mixing greedy and sampled rows calls flashinfer's
    ``top_k_renorm_probs``, which JIT-compiles for minutes (or fails) where flashinfer has no prebuilt
    kernels -- on the H200 this made the first probe time out.  Any other answer (200, or 404 from a
    build or proxy without the endpoint) counts as ready.
    """
    return client.request("GET", "/health").status_code == 503


def _wait_for_server(client: Client, wait_s: float) -> ServerInfo:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            info = fetch_server_info(client)
            if not _still_starting(client):
                return info
            if time.monotonic() >= deadline:
                raise CliError(
                    f"{client.url}/health still answers HTTP 503 after --wait {wait_s:g} s: the server has not "
                    "finished its warm-up, or reports itself unhealthy (see its log)"
                )
        except ServerUnreachable:
            if time.monotonic() >= deadline:
                raise
        time.sleep(min(2.0, max(0.1, deadline - time.monotonic())))


def connect(client: Client, wait_s: float) -> ServerInfo:
    """The server's info once it is up and past its own warm-up; with ``wait_s`` > 0, poll that long for it."""
    if wait_s > 0:
        return _wait_for_server(client, wait_s)
    info = fetch_server_info(client)
    if _still_starting(client):
        raise CliError(
            f"{client.url}/health answers HTTP 503: the server is still starting (its warm-up request has not "
            "finished) or reports itself unhealthy; retry with --wait SECONDS"
        )
    return info
