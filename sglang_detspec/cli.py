"""The ``sglang-detspec`` command: ``serve``, ``check``, ``bench`` and ``demo``.

* ``serve``  launches ``python -m sglang.launch_server`` with the DETSPEC speculative algorithm and deterministic
  inference on (the embedded tiny model pair when no model is given).  Needs a CUDA GPU.
* ``check``  asks any SGLang server for one seeded probe completion many times, each time next to a different
  number and size of concurrent filler requests, and says whether the probe's output ever changed.
* ``bench``  runs the sampler benchmark (:func:`sglang_detspec.benchmark.main`).
* ``demo``   shows on CPU, with the reference sampler, that a request's draft token depends on its seed and
  never on the batch around it.

Importing this module is cheap on purpose (no torch, no requests, no SGLang at module level) so that
``sglang-detspec --help`` answers at once; each command imports what it needs.

End-to-end tests call :func:`run_check` directly; it returns a :class:`CheckResult` and raises
:class:`CliError` (one readable line, never a traceback) when the server cannot be checked.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import threading
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

PROG = "sglang-detspec"

EXIT_OK = 0
EXIT_FAIL = 1  # the command ran and a checked property does not hold
EXIT_ERROR = 2  # the command could not run (usage, unreachable server, missing GPU, ...)

DETSPEC_ALGORITHMS = ("DETSPEC_EAGLE", "DETSPEC_EAGLE3")

DEFAULT_PROMPT = "Once upon a time, in a small town by the sea, there lived"
DEFAULT_SEED = 42
DEFAULT_TRIALS = 16
DEFAULT_MAX_NEW_TOKENS = 32
DEFAULT_MAX_FILLERS = 15


class CliError(Exception):
    """A failure the user can act on; :func:`main` prints it as one line and exits with ``EXIT_ERROR``."""


class ServerUnreachable(CliError):
    """Nothing usable answered at the URL yet: connection refused, unknown host, connect timeout, or HTTP
    502/503/504 on the server-info endpoint (``--wait`` keeps polling through these)."""


# ----------------------------------------------------------------------------------------------------------------
# check: HTTP client


def normalize_url(url: str) -> str:
    """``host:port`` or ``http://host:port/`` -> ``http://host:port`` (no trailing slash)."""
    url = url.strip()
    if not url:
        raise CliError("empty --url")
    if "://" not in url:
        url = "http://" + url
    return url.rstrip("/")


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


class _Client:
    """A ``requests`` session with timeouts and urllib3 retries.

    Connection errors are retried for every method (the request never reached the server, so a retried
    ``/generate`` cannot double the load); 502/503/504 are retried only for GET (a server still starting
    up), never for ``/generate``: a failing generate must surface as an error, not hide behind a retry.
    """

    def __init__(self, url: str, *, timeout: float, api_key: str | None = None, pool_size: int = 32):
        import requests
        from requests.adapters import HTTPAdapter
        from urllib3.util.retry import Retry

        self.url = normalize_url(url)
        self.timeout = (min(10.0, timeout), timeout)
        self._requests = requests
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
        adapter = HTTPAdapter(max_retries=retry, pool_connections=2, pool_maxsize=max(pool_size, 2))
        self.session = requests.Session()
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"

    def close(self) -> None:
        self.session.close()

    def _timed_out(self, path: str) -> CliError:
        return CliError(
            f"{self.url}{path} did not answer within {self.timeout[1]:g} s (--timeout); the server is busy, stuck, "
            "or compiling kernels for a new kind of batch: its log says which"
        )

    def request(self, method: str, path: str, **kwargs):
        requests = self._requests
        try:
            return self.session.request(method, self.url + path, timeout=self.timeout, **kwargs)
        except requests.exceptions.ConnectTimeout as e:
            raise ServerUnreachable(f"cannot connect to {self.url}: connection timed out") from e
        except requests.exceptions.ConnectionError as e:
            # A read timeout wrapped by urllib3's retry arrives here as a ConnectionError too.
            reason = _root_cause(e)
            if "Read timed out" in str(e):
                raise self._timed_out(path) from e
            raise ServerUnreachable(
                f"cannot connect to {self.url}: {reason} (is the server running? "
                f"`{PROG} serve` starts one)"
            ) from e
        except requests.exceptions.Timeout as e:
            raise self._timed_out(path) from e
        except requests.exceptions.RequestException as e:
            raise CliError(f"request to {self.url}{path} failed: {_root_cause(e)}") from e

    def generate(self, payload: dict) -> dict:
        resp = self.request("POST", "/generate", json=payload)
        if resp.status_code >= 400:
            raise CliError(f"{self.url}/generate answered HTTP {resp.status_code}: {_error_message(resp)}")
        try:
            body = resp.json()
        except ValueError as e:
            raise CliError(
                f"{self.url}/generate did not answer JSON (content-type "
                f"{resp.headers.get('content-type', '?')!r}); is this an SGLang server?"
            ) from e
        if isinstance(body, list) and len(body) == 1:
            body = body[0]
        if not isinstance(body, dict) or not isinstance(body.get("text"), str):
            raise CliError(f"{self.url}/generate answered JSON without a 'text' field; is this an SGLang server?")
        return body


# ----------------------------------------------------------------------------------------------------------------
# check: results


@dataclass
class ServerInfo:
    """What the server says about itself (``/server_info``, or ``/get_server_info`` on older builds)."""

    endpoint: str
    version: str | None
    model_path: str | None
    speculative_algorithm: str | None
    deterministic_inference: bool | None
    avg_spec_accept_length: float | None = None

    @property
    def plugin_active(self) -> bool:
        return (self.speculative_algorithm or "").upper() in DETSPEC_ALGORITHMS


@dataclass
class Trial:
    """One probe completion and the load it ran next to."""

    index: int
    seed: int
    fillers: int
    filler_max_new_tokens: list[int]
    filler_prompt_words: list[int]
    text: str
    output_ids: list[int] | None
    completion_tokens: int | None = None
    spec_verify_ct: int | None = None
    spec_accept_length: float | None = None


@dataclass
class Divergence:
    """Where the first probe output that differs from trial 0's starts to differ."""

    unit: str  # "token" (output_ids) or "character" (text)
    position: int
    trial: int
    expected: Any  # trial 0's token/character at that position (None: trial 0's output ended there)
    got: Any


@dataclass
class SeedsCheck:
    """Distinct seeds must give distinct outputs; a collision means the seed is ignored (e.g. greedy decoding)."""

    seeds: list[int]
    outputs: list[Trial]
    collisions: list[tuple[int, int]]

    @property
    def passed(self) -> bool:
        return not self.collisions


@dataclass
class CheckResult:
    url: str
    server: ServerInfo
    prompt: str
    seed: int
    temperature: float
    max_new_tokens: int
    trials: list[Trial]
    compared: str  # "output_ids" or "text"
    unique_outputs: int
    divergence: Divergence | None
    seeds_check: SeedsCheck | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def deterministic(self) -> bool:
        return self.unique_outputs == 1

    @property
    def passed(self) -> bool:
        return self.deterministic and (self.seeds_check is None or self.seeds_check.passed)

    @property
    def differing_trials(self) -> list[int]:
        """Trials whose probe output differs from trial 0's."""
        use_ids = self.compared == "output_ids"
        ref = _output_key(self.trials[0], use_ids)
        return [t.index for t in self.trials if _output_key(t, use_ids) != ref]

    @property
    def probe_accept_length(self) -> float | None:
        vals = [t.spec_accept_length for t in self.trials if t.spec_accept_length is not None]
        return sum(vals) / len(vals) if vals else None

    def to_dict(self) -> dict:
        from sglang_detspec import __version__

        d = asdict(self)
        d = {
            "tool": f"{PROG} check",
            "tool_version": __version__,
            **d,
            "deterministic": self.deterministic,
            "passed": self.passed,
            "probe_accept_length": self.probe_accept_length,
            "differing_trials": self.differing_trials,
        }
        if self.seeds_check is not None:
            d["seeds_check"]["passed"] = self.seeds_check.passed
        return d


# ----------------------------------------------------------------------------------------------------------------
# check: logic

_FILLER_WORDS = (
    "river stone lantern orbit copper meadow signal harbor violet engine puzzle winter falcon ledger canyon "
    "marble thunder pocket glacier velvet compass ember saddle quartz tunnel willow anchor prism beacon"
).split()


def _is_sglang_info(data: Any) -> bool:
    return isinstance(data, dict) and "version" in data and ("model_path" in data or "internal_states" in data)


def _float_or_none(x: Any) -> float | None:
    try:
        return float(x) if x is not None else None
    except (TypeError, ValueError):
        return None


def fetch_server_info(client: _Client) -> ServerInfo:
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
    return ServerInfo(
        endpoint=endpoint,
        version=str(data["version"]) if data.get("version") is not None else None,
        model_path=data.get("model_path"),
        speculative_algorithm=data.get("speculative_algorithm"),
        deterministic_inference=bool(det) if det is not None else None,
        avg_spec_accept_length=_avg_accept_length(data),
    )


def _avg_accept_length(data: dict) -> float | None:
    """Server-wide accept length: ``internal_states[i]["avg_spec_accept_length"]`` (one entry per DP rank) in
    0.5.17 and 0.5.23; older builds put the scheduler info at top level."""
    vals = []
    states = data.get("internal_states")
    if isinstance(states, list):
        for st in states:
            if isinstance(st, dict):
                v = _float_or_none(st.get("avg_spec_accept_length"))
                if v is not None:
                    vals.append(v)
    if not vals:
        v = _float_or_none(data.get("avg_spec_accept_length"))
        if v is not None:
            vals.append(v)
    return sum(vals) / len(vals) if vals else None


def _still_starting(client: _Client) -> bool:
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


def _wait_for_server(client: _Client, wait_s: float) -> ServerInfo:
    import time

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


def _connect(client: _Client, wait_s: float) -> ServerInfo:
    if wait_s > 0:
        return _wait_for_server(client, wait_s)
    info = fetch_server_info(client)
    if _still_starting(client):
        raise CliError(
            f"{client.url}/health answers HTTP 503: the server is still starting (its warm-up request has not "
            "finished) or reports itself unhealthy; retry with --wait SECONDS"
        )
    return info


def _payload(text: str, *, temperature: float, max_new_tokens: int, seed: int) -> dict:
    # ignore_eos keeps every completion max_new_tokens long, so outputs compare position by position.
    return {
        "text": text,
        "sampling_params": {
            "temperature": temperature,
            "max_new_tokens": max_new_tokens,
            "sampling_seed": seed,
            "ignore_eos": True,
        },
    }


def _filler_plan(trials: int, max_fillers: int, max_new_tokens: int, rng: random.Random) -> list[list[dict]]:
    """Trial t runs next to round(t * max_fillers / (trials - 1)) fillers (0 for the first trial, max_fillers
    for the last) of random prompt and completion lengths, so batch size and composition differ in every trial
    and change while the probe decodes (fillers finish at different steps)."""
    plan = []
    for t in range(trials):
        n = round(t * max_fillers / (trials - 1)) if trials > 1 else 0
        fillers = []
        for j in range(n):
            words = rng.randint(3, 160)
            start = rng.randrange(len(_FILLER_WORDS))
            prompt = f"Request {t}.{j}: " + " ".join(
                _FILLER_WORDS[(start + k * 7) % len(_FILLER_WORDS)] for k in range(words)
            )
            fillers.append(
                {
                    "words": words,
                    "payload": _payload(
                        prompt,
                        temperature=1.0,
                        max_new_tokens=rng.randint(1, 2 * max_new_tokens),
                        seed=rng.randrange(2**31),
                    ),
                }
            )
        plan.append(fillers)
    return plan


def _to_trial(index: int, seed: int, fillers: list[dict], body: dict) -> Trial:
    meta = body.get("meta_info") if isinstance(body.get("meta_info"), dict) else {}
    ids = body.get("output_ids")
    if ids is None:
        ids = meta.get("output_ids")
    if not (isinstance(ids, list) and all(isinstance(i, int) for i in ids)):
        ids = None
    completion = meta.get("completion_tokens")
    verify_ct = meta.get("spec_verify_ct")
    accept = _float_or_none(meta.get("spec_accept_length"))
    if accept is None and isinstance(verify_ct, (int, float)) and verify_ct > 0 and completion:
        accept = completion / verify_ct  # what 0.5.17/0.5.23 report as spec_accept_length
    return Trial(
        index=index,
        seed=seed,
        fillers=len(fillers),
        filler_max_new_tokens=[f["payload"]["sampling_params"]["max_new_tokens"] for f in fillers],
        filler_prompt_words=[f["words"] for f in fillers],
        text=body["text"],
        output_ids=ids,
        completion_tokens=completion if isinstance(completion, int) else None,
        spec_verify_ct=verify_ct if isinstance(verify_ct, int) else None,
        spec_accept_length=accept,
    )


def _run_concurrently(pool, client: _Client, probe: dict, fillers: list[dict]) -> dict:
    """Submit half the fillers, the probe, then the other half, so the probe lands inside the load; wait for
    all of them (a failed filler is a broken server too)."""
    from concurrent.futures import wait

    half = len(fillers) // 2
    futures = [pool.submit(client.generate, f["payload"]) for f in fillers[:half]]
    probe_future = pool.submit(client.generate, probe)
    futures += [pool.submit(client.generate, f["payload"]) for f in fillers[half:]]
    wait(futures + [probe_future])
    body = probe_future.result()
    for f in futures:
        f.result()
    return body


def _output_key(trial: Trial, use_ids: bool):
    return tuple(trial.output_ids) if use_ids else trial.text


def _first_divergence(trials: list[Trial], use_ids: bool) -> Divergence | None:
    ref = _output_key(trials[0], use_ids)
    best: Divergence | None = None
    for t in trials[1:]:
        other = _output_key(t, use_ids)
        if other == ref:
            continue
        pos = next((k for k, (a, b) in enumerate(zip(ref, other)) if a != b), min(len(ref), len(other)))
        if best is None or pos < best.position:
            best = Divergence(
                unit="token" if use_ids else "character",
                position=pos,
                trial=t.index,
                expected=ref[pos] if pos < len(ref) else None,
                got=other[pos] if pos < len(other) else None,
            )
    return best


def run_check(
    url: str,
    *,
    prompt: str = DEFAULT_PROMPT,
    seed: int = DEFAULT_SEED,
    temperature: float = 1.0,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    trials: int = DEFAULT_TRIALS,
    max_fillers: int = DEFAULT_MAX_FILLERS,
    seeds: Sequence[int] | None = None,
    timeout: float = 120.0,
    wait: float = 0.0,
    api_key: str | None = None,
    progress: bool | None = False,
    plan_seed: int = 0,
) -> CheckResult:
    """Send the seeded probe ``trials`` times, each time next to a different number and size of concurrent
    filler requests, and compare the probe's outputs; with ``seeds``, also send the probe once per seed and
    report seeds that gave identical outputs.

    Raises :class:`CliError` (one line) when the server is unreachable, is not SGLang or answers an error.
    ``progress``: show a tqdm bar on stderr (None: only on a terminal).
    """
    if trials < 2:
        raise CliError("--trials must be at least 2 (one trial has nothing to compare with)")
    if max_fillers < 0:
        raise CliError("--max-fillers must be >= 0")
    if max_new_tokens < 1:
        raise CliError("--max-new-tokens must be >= 1")
    if temperature < 0:
        raise CliError("--temperature must be >= 0")
    if seeds is not None and len(set(seeds)) < 2:
        raise CliError("--seeds needs at least two distinct seeds")
    for s in [seed, *(seeds or ())]:
        if not -(2**63) <= s < 2**63:
            raise CliError(f"seed {s} is outside SGLang's sampling_seed range [-2**63, 2**63 - 1]")

    from concurrent.futures import ThreadPoolExecutor

    from tqdm import tqdm

    client = _Client(url, timeout=timeout, api_key=api_key, pool_size=max_fillers + 2)
    try:
        server = _connect(client, wait)
        warnings = []
        if server.deterministic_inference is False:
            warnings.append(
                "deterministic inference is OFF on this server (launch it with --enable-deterministic-inference, "
                f"e.g. `{PROG} serve`): sampling_seed is not honoured and outputs may change with load"
            )
        elif server.deterministic_inference is None:
            warnings.append("the server does not report enable_deterministic_inference; cannot tell if it is on")
        if temperature == 0:
            warnings.append("temperature 0 is greedy decoding: the seed plays no part in this check")

        plan = _filler_plan(trials, max_fillers, max_new_tokens, random.Random(plan_seed))
        probe = _payload(prompt, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
        results: list[Trial] = []
        total = trials + (len(seeds) if seeds else 0)
        with ThreadPoolExecutor(max_workers=max_fillers + 1, thread_name_prefix="detspec-check") as pool, tqdm(
            total=total, desc="probe trials", unit="trial", disable=(None if progress is None else not progress),
            file=sys.stderr, leave=False, dynamic_ncols=True,
        ) as bar:
            for t, fillers in enumerate(plan):
                body = _run_concurrently(pool, client, probe, fillers)
                results.append(_to_trial(t, seed, fillers, body))
                bar.set_postfix(fillers=len(fillers))
                bar.update()
            seeds_check = None
            if seeds:
                bar.set_description("seed trials")
                outs = []
                for s in seeds:
                    p = _payload(prompt, temperature=temperature, max_new_tokens=max_new_tokens, seed=s)
                    outs.append(_to_trial(len(outs), s, [], client.generate(p)))
                    bar.update()
                seeds_check = SeedsCheck(seeds=list(seeds), outputs=outs, collisions=[])

        use_ids = all(t.output_ids is not None for t in results)
        keys = {_output_key(t, use_ids) for t in results}
        if seeds_check is not None:
            ids_for_seeds = all(t.output_ids is not None for t in seeds_check.outputs)
            outs = seeds_check.outputs
            for i in range(len(outs)):
                for j in range(i + 1, len(outs)):
                    if outs[i].seed != outs[j].seed and _output_key(outs[i], ids_for_seeds) == _output_key(
                        outs[j], ids_for_seeds
                    ):
                        seeds_check.collisions.append((outs[i].seed, outs[j].seed))
        accepts = [t.spec_accept_length for t in results if t.spec_accept_length is not None]
        if accepts and max(accepts) < 1.05:
            warnings.append(
                f"the probe's speculative accept length is {sum(accepts) / len(accepts):.2f}: almost no draft token "
                "is accepted, so speculative decoding brings no speed-up on this server"
            )
        if server.speculative_algorithm:
            # Re-read: the server-wide average accept length grows with the requests this check just sent.
            try:
                server.avg_spec_accept_length = fetch_server_info(client).avg_spec_accept_length
            except CliError:
                pass
        return CheckResult(
            url=client.url,
            server=server,
            prompt=prompt,
            seed=seed,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            trials=results,
            compared="output_ids" if use_ids else "text",
            unique_outputs=len(keys),
            divergence=_first_divergence(results, use_ids) if len(keys) > 1 else None,
            seeds_check=seeds_check,
            warnings=warnings,
        )
    finally:
        client.close()


def format_check(result: CheckResult) -> str:
    s = result.server
    spec = s.speculative_algorithm or "off"
    if s.speculative_algorithm and not s.plugin_active:
        spec += " (not a DETSPEC algorithm: the sglang-detspec plugin is not in use)"
    det = {True: "on", False: "OFF", None: "unknown"}[s.deterministic_inference]
    fillers = [t.fillers for t in result.trials]
    lines = [
        f"server:  {result.url}  SGLang {s.version or '?'}  model {s.model_path or '?'}",
        f"         speculative algorithm: {spec}; deterministic inference: {det}",
        f"probe:   seed {result.seed}, temperature {result.temperature}, {result.max_new_tokens} new tokens, "
        f"{len(result.trials)} trials next to {min(fillers)}-{max(fillers)} concurrent filler requests",
    ]
    unit = "token ids (output_ids)" if result.compared == "output_ids" else "text (the server returned no output_ids)"
    lines.append(
        f"result:  {result.unique_outputs} unique probe output(s) in {len(result.trials)} trials, compared as {unit}"
    )
    d = result.divergence
    if d is not None:
        show = (lambda v: "the end" if v is None else f"id {v}") if d.unit == "token" else (
            lambda v: "the end" if v is None else repr(v))
        differ = result.differing_trials
        lines.append(
            f"         first divergence at {d.unit} {d.position}: trial 0 has {show(d.expected)}, "
            f"trial {d.trial} has {show(d.got)}; {len(differ)} of {len(result.trials) - 1} trials differ from trial 0"
        )
    acc = result.probe_accept_length
    if acc is not None or s.avg_spec_accept_length is not None:
        parts = []
        if acc is not None:
            parts.append(f"{acc:.2f} tokens per verify step on the probe")
        if s.avg_spec_accept_length is not None:
            parts.append(f"{s.avg_spec_accept_length:.2f} server average")
        lines.append("accept:  " + "; ".join(parts))
    elif s.speculative_algorithm:
        lines.append("accept:  the server reported no speculative accept length")
    sc = result.seeds_check
    if sc is not None:
        if sc.passed:
            lines.append(f"seeds:   {len(sc.seeds)} seeds gave {len(sc.seeds)} distinct outputs")
        else:
            pairs = ", ".join(f"{a} = {b}" for a, b in sc.collisions)
            lines.append(f"seeds:   distinct seeds gave identical outputs: {pairs} (is the seed ignored?)")
    if result.passed:
        lines.append("PASS: the seeded probe gave one output whatever the load" + (
            ", and distinct seeds gave distinct outputs" if sc is not None else ""))
    else:
        why = []
        if not result.deterministic:
            why.append("the seeded probe's output changed with the load")
        if sc is not None and not sc.passed:
            why.append("distinct seeds gave identical outputs")
        lines.append("FAIL: " + "; ".join(why))
    return "\n".join(lines)


def _parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(x, 0) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if len(seeds) < 2:
        raise argparse.ArgumentTypeError("give at least two seeds, e.g. --seeds 1,2,3")
    return seeds


def cmd_check(args: argparse.Namespace) -> int:
    if args.report:
        # Fail before minutes of trials, not after.
        parent = os.path.dirname(os.path.abspath(args.report))
        if not os.path.isdir(parent):
            raise CliError(f"cannot write the report {args.report}: directory {parent} does not exist")
    result = run_check(
        args.url,
        prompt=args.prompt,
        seed=args.seed,
        temperature=args.temperature,
        max_new_tokens=args.max_new_tokens,
        trials=args.trials,
        max_fillers=args.max_fillers,
        seeds=args.seeds,
        timeout=args.timeout,
        wait=args.wait,
        api_key=args.api_key,
        progress=False if args.no_progress else None,
    )
    for w in result.warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(format_check(result))
    if args.report:
        try:
            with open(args.report, "w", encoding="utf-8") as f:
                json.dump(result.to_dict(), f, indent=2)
                f.write("\n")
        except OSError as e:
            raise CliError(f"cannot write the report {args.report}: {e.strerror or e}") from e
        print(f"report:  {args.report}")
    return EXIT_OK if result.passed else EXIT_FAIL


# ----------------------------------------------------------------------------------------------------------------
# serve


@dataclass
class ServeDefaults:
    steps: int = 3
    topk: int = 1
    draft_tokens: int = 4
    attention_backend: str = "triton"
    host: str = "127.0.0.1"
    port: int = 30000


def _flags_in(args: Sequence[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in args if a.startswith("--")}


def build_serve_command(
    *,
    model_path: str | None,
    draft_model_path: str | None,
    algorithm: str,
    steps: int,
    topk: int,
    draft_tokens: int,
    attention_backend: str,
    host: str,
    port: int,
    passthrough: Sequence[str] = (),
    tiny_models_dir: str | None = None,
    env: dict | None = None,
) -> tuple[list[str], dict[str, str | None]]:
    """The ``sglang.launch_server`` command line and the environment changes for ``serve``.

    A flag given in ``passthrough`` replaces the default for that flag (SGLang's argparse would keep the last
    occurrence anyway; dropping ours keeps the printed command unambiguous).  With no ``model_path`` the
    embedded tiny target + draft pair is built once (cached) and served with dummy weights and no network.
    ``env_changes`` maps a variable to its new value, or to None for a variable to unset.
    """
    env = dict(os.environ if env is None else env)
    env_changes: dict[str, str | None] = {}  # None: unset
    tiny = model_path is None
    if tiny:
        if draft_model_path is not None:
            raise CliError("--draft-model-path needs --model-path (the tiny target comes with its own drafts)")
        try:
            from sglang_detspec.tiny_models import ensure_tiny_models
        except ImportError as e:
            raise CliError(f"the embedded tiny models are not available in this installation ({e})") from e
        from pathlib import Path

        try:
            models = ensure_tiny_models(Path(tiny_models_dir) if tiny_models_dir else None)
        except (OSError, RuntimeError) as e:
            raise CliError(f"building the tiny models failed: {e}") from e
        model_path = str(models.target)
        draft_model_path = str(models.eagle3_draft if algorithm == "DETSPEC_EAGLE3" else models.eagle_draft)
        # The tiny models carry a local tokenizer and no weights: nothing may be downloaded.
        for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
            if env.get(k) != "1":
                env_changes[k] = "1"

    if "TRITON_INTERPRET" in env:
        # Set for CPU tests; a GPU server under the Triton interpreter would crawl (or fail to launch kernels).
        env_changes["TRITON_INTERPRET"] = None

    plugins = env.get("SGLANG_PLUGINS")
    if plugins and "detspec" not in [p.strip() for p in plugins.split(",")]:
        # SGLANG_PLUGINS filters which entry points SGLang loads; without ours DETSPEC_* is an unknown algorithm.
        env_changes["SGLANG_PLUGINS"] = plugins + ",detspec"

    defaults: list[tuple[str, list[str]]] = [
        ("--model-path", [model_path]),
        ("--speculative-algorithm", [algorithm]),
    ]
    if draft_model_path is not None:
        defaults.append(("--speculative-draft-model-path", [draft_model_path]))
    defaults += [
        ("--speculative-num-steps", [str(steps)]),
        ("--speculative-eagle-topk", [str(topk)]),
        ("--speculative-num-draft-tokens", [str(draft_tokens)]),
        ("--enable-deterministic-inference", []),
        ("--attention-backend", [attention_backend]),
    ]
    if tiny:
        from sglang_detspec.tiny_models import TINY_SERVER_FLAGS

        defaults += [(flag, list(values)) for flag, values in TINY_SERVER_FLAGS]
    defaults += [("--host", [host]), ("--port", [str(port)])]

    given = _flags_in(passthrough)
    cmd = [sys.executable, "-m", "sglang.launch_server"]
    for flag, values in defaults:
        if flag not in given:
            cmd += [flag, *values]
    cmd += list(passthrough)
    return cmd, env_changes


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _plugin_installed() -> bool:
    from importlib.metadata import entry_points

    return any(ep.value.startswith("sglang_detspec") for ep in entry_points(group="sglang.srt.plugins"))


def run_forwarding_signals(cmd: Sequence[str], env: dict | None = None) -> int:
    """Run ``cmd`` and return its exit code (128 + N when killed by signal N), forwarding SIGINT, SIGTERM,
    SIGHUP and SIGQUIT to it.

    The child gets its own session so that a terminal's Ctrl-C reaches it exactly once (through us) instead of
    twice (terminal + forward); SGLang's launcher turns that one SIGINT into an orderly shutdown of its
    scheduler processes.
    """
    proc = subprocess.Popen(list(cmd), env=env, start_new_session=True)
    forwarded = [signal.SIGINT, signal.SIGTERM]
    forwarded += [getattr(signal, n) for n in ("SIGHUP", "SIGQUIT") if hasattr(signal, n)]
    previous = {}

    def forward(signum, _frame):
        if proc.poll() is None:
            try:
                proc.send_signal(signum)
            except ProcessLookupError:
                pass

    in_main = threading.current_thread() is threading.main_thread()
    if in_main:
        for s in forwarded:
            previous[s] = signal.signal(s, forward)
    try:
        rc = proc.wait()
    finally:
        if in_main:
            for s, h in previous.items():
                signal.signal(s, h)
        if proc.poll() is None:  # we are leaving on an exception: do not orphan a GPU server
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    return rc if rc >= 0 else 128 - rc


def cmd_serve(args: argparse.Namespace, passthrough: list[str]) -> int:
    if not args.dry_run:
        import importlib.util

        if importlib.util.find_spec("sglang") is None:
            raise CliError("SGLang is not installed in this Python environment (pip install sglang)")
        if not _cuda_available():
            raise CliError(
                "a CUDA GPU is needed and torch sees none on this machine (torch.cuda.is_available() is False); "
                f"`{PROG} demo` runs on CPU, `{PROG} serve --dry-run` prints the launch command"
            )
    cmd, env_changes = build_serve_command(
        model_path=args.model_path,
        draft_model_path=args.draft_model_path,
        algorithm=args.algorithm,
        steps=args.num_steps,
        topk=args.topk,
        draft_tokens=args.num_draft_tokens,
        attention_backend=args.attention_backend,
        host=args.host,
        port=args.port,
        passthrough=passthrough,
        tiny_models_dir=args.tiny_models_dir,
    )
    printable = shlex.join(cmd)
    if env_changes:
        # env(1) takes its -u options before the NAME=VALUE assignments.
        unset = [f"-u {k}" for k, v in env_changes.items() if v is None]
        assign = [f"{k}={shlex.quote(v)}" for k, v in env_changes.items() if v is not None]
        printable = " ".join(["env", *unset, *assign, printable])
    if args.dry_run:
        print(printable)
        return EXIT_OK
    if not _plugin_installed():
        print(
            f"warning: the sglang-detspec entry point is not installed in this environment, so SGLang will not "
            f"know {args.algorithm} (pip install sglang-detspec, or pip install -e . in a checkout)",
            file=sys.stderr,
        )
    print(f"{PROG}: {printable}", file=sys.stderr, flush=True)
    env = {k: v for k, v in {**os.environ, **env_changes}.items() if v is not None}
    return run_forwarding_signals(cmd, env)


# ----------------------------------------------------------------------------------------------------------------
# bench


def cmd_bench(args: argparse.Namespace, passthrough: list[str]) -> int:
    try:
        from sglang_detspec import benchmark
    except ImportError as e:
        if getattr(e, "name", None) == "sglang_detspec.benchmark":
            raise CliError("the sampler benchmark (sglang_detspec.benchmark) is not part of this installation") from e
        raise CliError(
            f"the sampler benchmark cannot be loaded: {e} (pip install 'sglang-detspec[bench]' installs its extras)"
        ) from e
    main_fn = getattr(benchmark, "main", None)
    if not callable(main_fn):
        raise CliError("sglang_detspec.benchmark has no main(argv) function")
    rc = main_fn(list(passthrough))
    return int(rc or 0)


# ----------------------------------------------------------------------------------------------------------------
# demo


@dataclass
class DemoResult:
    text: str
    passed: bool
    # The inputs and draws behind the table, so that tests can recompute them independently.
    probs: Any = None
    seeds: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    columns: dict[str, list[int]] = field(default_factory=dict)
    reseeded: list[int] = field(default_factory=list)


def _load_kernel() -> tuple[Callable, str]:
    """The fused Triton sampler and where it runs: the GPU, or Triton's interpreter on CPU tensors."""
    import torch

    if torch.cuda.is_available():
        where = "cuda"
    else:
        # Triton reads TRITON_INTERPRET when a module defining a kernel is imported, so set it first.
        os.environ.setdefault("TRITON_INTERPRET", "1")
        where = "cpu"
    try:
        from sglang_detspec import kernels
    except ImportError as e:
        raise CliError(f"the fused kernel (sglang_detspec.kernels) cannot be imported: {e}") from e
    if where == "cpu" and not kernels.INTERPRETED:
        raise CliError("no CUDA GPU, and the kernels were imported without TRITON_INTERPRET=1: "
                       "set TRITON_INTERPRET=1 to run --kernel on CPU")

    def on_device(p, s, pos, step):
        pk, ik = kernels.seeded_draft_sample(p.to(where), s.to(where), pos.to(where), step)
        return pk.cpu(), ik.cpu()

    return on_device, ("Triton on the GPU" if where == "cuda" else "Triton interpreter on CPU")


def run_demo(
    sampler: Callable | None = None, *, batch: int = 8, vocab: int = 512, extra: int = 24, kernel: bool = False
) -> DemoResult:
    """Compute, live on CPU, the invariants of the seeded draft sampler and render them as a small table.

    ``sampler`` defaults to :func:`sglang_detspec.reference.seeded_draft_sample`; tests pass a broken one to
    prove the checks can fail.  ``kernel``: add a column drawn by the fused Triton kernel (on a permuted batch),
    which must equal the reference's tokens.
    """
    import torch

    if sampler is None:
        try:
            from sglang_detspec.reference import seeded_draft_sample as sampler
        except ImportError as e:
            raise CliError(f"the reference sampler (sglang_detspec.reference) is not available: {e}") from e

    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(batch, vocab, generator=g, dtype=torch.float32) * 2.0, dim=-1)
    base_seeds = [42, 7, 2024, 31337, 4_000_000_007, 9, 1234, 55, 77777, 3, 8080, 600613]
    seeds = torch.tensor([base_seeds[i % len(base_seeds)] + 1000 * (i // len(base_seeds)) for i in range(batch)],
                         dtype=torch.int64)
    positions = torch.randint(1, 4096, (batch,), generator=g, dtype=torch.int64)

    def draw(p, s, pos):
        _, idx = sampler(p, s, pos, 0)
        return idx.reshape(-1).tolist()

    columns: list[tuple[str, list[int]]] = []
    columns.append(("alone", [draw(probs[i : i + 1], seeds[i : i + 1], positions[i : i + 1])[0] for i in range(batch)]))
    columns.append((f"batch of {batch}", draw(probs, seeds, positions)))
    perm = torch.randperm(batch, generator=g)
    permuted = draw(probs[perm], seeds[perm], positions[perm])
    unperm = [0] * batch
    for k, i in enumerate(perm.tolist()):
        unperm[i] = permuted[k]
    columns.append(("permuted", unperm))
    cut = max(1, batch * 3 // 8)
    columns.append((f"split {cut}+{batch - cut}", draw(probs[:cut], seeds[:cut], positions[:cut])
                    + draw(probs[cut:], seeds[cut:], positions[cut:])))
    # Neighbours: the same requests scattered among `extra` unrelated ones.
    other_p = torch.softmax(torch.randn(extra, vocab, generator=g) * 2.0, dim=-1)
    other_s = torch.randint(0, 2**40, (extra,), generator=g, dtype=torch.int64)
    other_pos = torch.randint(1, 4096, (extra,), generator=g, dtype=torch.int64)
    order = torch.randperm(batch + extra, generator=g)
    all_p = torch.cat([probs, other_p])[order]
    all_s = torch.cat([seeds, other_s])[order]
    all_pos = torch.cat([positions, other_pos])[order]
    mixed = draw(all_p, all_s, all_pos)
    where = {int(o): k for k, o in enumerate(order.tolist())}
    columns.append((f"+{extra} others", [mixed[where[i]] for i in range(batch)]))
    reseeded = draw(probs, seeds + 1, positions)
    kernel_where = None
    if kernel:
        kernel_fn, kernel_where = _load_kernel()
        _, kidx = kernel_fn(probs[perm], seeds[perm], positions[perm], 0)
        kernel_col = [0] * batch
        for k, i in enumerate(perm.tolist()):
            kernel_col[i] = int(kidx.reshape(-1)[k])
        columns.append(("fused kernel", kernel_col))

    same = [all(col[i] == columns[0][1][i] for _, col in columns) for i in range(batch)]
    changed = [reseeded[i] != columns[0][1][i] for i in range(batch)]

    # A real sampler, not a hash of the argmax: over many seeds one row's draws follow its probabilities.
    n_seeds = 4096
    small = torch.tensor([0.40, 0.20, 0.15, 0.10, 0.07, 0.05, 0.02, 0.01], dtype=torch.float32)
    many = draw(small.expand(n_seeds, -1).contiguous(), torch.arange(n_seeds, dtype=torch.int64) * 7919 + 1,
                torch.full((n_seeds,), 100, dtype=torch.int64))
    freq = torch.bincount(torch.tensor(many), minlength=small.numel()).double() / n_seeds
    dev = (freq - small.double()).abs().max().item()
    # 5 standard deviations of the largest-variance cell (p = 0.4): a correct sampler fails this ~never.
    limit = 5.0 * (0.4 * 0.6 / n_seeds) ** 0.5

    # Contrast: one shared RNG for the whole batch (what a seedless sampler does).
    g1 = torch.Generator().manual_seed(1)
    shared = torch.multinomial(probs, 1, generator=g1).reshape(-1).tolist()
    g1 = torch.Generator().manual_seed(1)
    shared_perm = torch.multinomial(probs[perm], 1, generator=g1).reshape(-1).tolist()
    shared_unperm = [0] * batch
    for k, i in enumerate(perm.tolist()):
        shared_unperm[i] = shared_perm[k]
    shared_changed = sum(a != b for a, b in zip(shared, shared_unperm))

    names = [name for name, _ in columns]
    widths = [max(len(n), 5) for n in names]
    layout_cells = "  ".join(f"{n:>{w}}" for n, w in zip(names, widths))
    header = f"{'req':>3} {'seed':>13} {'pos':>5} | {layout_cells} | seed+1"
    lines = [
        f"{PROG} demo: the seeded draft sampler (SGLang 0.5.23's key, reference implementation, CPU, vocab {vocab})",
        "Token drawn by each request alone, in one batch, permuted, split, among other requests; then with seed+1:",
        "",
        header,
        "-" * len(header),
    ]
    for i in range(batch):
        cells = "  ".join(f"{col[i]:>{w}}" for (_, col), w in zip(columns, widths))
        flag = "" if same[i] else "  <- batch-dependent!"
        lines.append(f"{i:>3} {int(seeds[i]):>13} {int(positions[i]):>5} | {cells} | {reseeded[i]:>6}{flag}")
    lines.append("")
    ok_layout = all(same)
    ok_seed = any(changed)
    ok_dist = dev <= limit
    mark = {True: "[ok]  ", False: "[FAIL]"}
    lines.append(f"{mark[ok_layout]} batch-invariant: {sum(same)}/{batch} requests drew one token in all "
                 f"{len(columns)} columns" + (f" (fused kernel: {kernel_where}, permuted batch)" if kernel else ""))
    lines.append(f"{mark[ok_seed]} seed-dependent: seed+1 drew a new token for {sum(changed)}/{batch} requests "
                 "(independent draws may coincide)")
    lines.append(f"{mark[ok_dist]} a true sampler: over {n_seeds} seeds, draws from p = "
                 f"{[round(x, 2) for x in small.tolist()]} hit each token at rate p +- {dev:.3f} "
                 f"(limit {limit:.3f})")
    lines.append(f"[info] contrast, one shared RNG (torch.multinomial): permuting the batch changed "
                 f"{shared_changed}/{batch} tokens")
    verdict = ok_layout and ok_seed and ok_dist
    lines.append("PASS: a request's seed, not its batch, decides its token" if verdict else
                 "FAIL: an invariant does not hold (see [FAIL] above)")
    return DemoResult(
        text="\n".join(lines),
        passed=verdict,
        probs=probs,
        seeds=seeds.tolist(),
        positions=positions.tolist(),
        columns=dict(columns),
        reseeded=reseeded,
    )


def cmd_demo(args: argparse.Namespace) -> int:
    if args.kernel == "auto":
        import torch

        use_kernel = torch.cuda.is_available()
    else:
        use_kernel = args.kernel == "on"
    result = run_demo(batch=args.batch, vocab=args.vocab, kernel=use_kernel)
    print(result.text)
    return EXIT_OK if result.passed else EXIT_FAIL


# ----------------------------------------------------------------------------------------------------------------
# argument parsing


_Formatter = argparse.RawDescriptionHelpFormatter


_MAIN_EPILOG = f"""\
examples:
  {PROG} demo                                   # CPU: the seeded sampler's invariants in one table
  {PROG} serve --port 30000                     # GPU: tiny model pair, seeded speculative decoding
  {PROG} check --url http://127.0.0.1:30000     # does a fixed seed give one output whatever the load?
  {PROG} bench                                  # GPU: fused sampler vs upstream, CSV + PNG

exit codes: 0 all good; 1 a checked property does not hold; 2 the command could not run.
"""

_SERVE_DESCRIPTION = """\
Launch `python -m sglang.launch_server` with --speculative-algorithm DETSPEC_EAGLE and
--enable-deterministic-inference. Without --model-path, serve the embedded tiny target + draft pair
(built once and cached; dummy weights; local tokenizer; no downloads). Needs a CUDA GPU. Signals are
forwarded to the server and its exit code is returned.
"""

_CHECK_DESCRIPTION = """\
Send one seeded probe prompt N times to an SGLang server's /generate, each time next to a different
number and length of concurrent filler requests, and report how many distinct probe outputs came back,
where the first one diverged, and the speculative accept length the server reports.
"""

_DEMO_DESCRIPTION = """\
Draw draft tokens with the reference seeded sampler on CPU: alone, batched, permuted, split and among
other requests, every request draws the same token; seed+1 draws a new one; over many seeds the draws
follow the probabilities. The one-minute explanation of sglang-detspec.
"""

_SERVE_EPILOG = f"""\
examples:
  {PROG} serve                                  # embedded tiny target + EAGLE draft (dummy weights)
  {PROG} serve --algorithm DETSPEC_EAGLE3       # tiny target + EAGLE3 draft
  {PROG} serve --model-path meta-llama/Llama-3.1-8B-Instruct \\
      --draft-model-path jamesliu1/sglang-EAGLE-Llama-3.1-Instruct-8B -- --tp 2
  {PROG} serve --dry-run                        # print the command, run nothing

Any option not listed above (or everything after `--`) goes to sglang.launch_server unchanged and
replaces this command's default for the same option (e.g. --mem-fraction-static 0.8).
"""

_CHECK_EPILOG = f"""\
examples:
  {PROG} check --url http://127.0.0.1:30000
  {PROG} check --url localhost:30000 --trials 32 --temperature 0.7 --report check.json
  {PROG} check --url localhost:30000 --seeds 1,2,3,4   # also: distinct seeds give distinct outputs
  {PROG} check --url localhost:30000 --wait 600        # wait for a server that is still starting

Trial t sends the probe next to round(t * max_fillers / (trials - 1)) concurrent filler requests of random
prompt and completion lengths. Works with any SGLang server, with or without the plugin.
exit codes: 0 every trial matched (and distinct seeds differed); 1 they did not; 2 could not check.
"""

_BENCH_EPILOG = f"""\
examples:
  {PROG} bench --out results/bench             # full grid: sampler_bench.csv + sampler_bench.png
  {PROG} bench --quick --batch 1 128 --vocab 163840
  {PROG} bench -- --help                        # the benchmark's own options

Every argument is passed to sglang_detspec.benchmark.main (the same as scripts/bench_sampler.py).
"""

_DEMO_EPILOG = f"""\
examples:
  {PROG} demo
  {PROG} demo --kernel on           # also the fused Triton kernel (interpreted on CPU)
  python -m sglang_detspec demo --batch 6

Runs on CPU in seconds. Exit code 1 if an invariant does not hold (they are computed live).
"""


def build_parser() -> argparse.ArgumentParser:
    from sglang_detspec import __version__

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Reproducible per-seed speculative decoding for SGLang: serve, check, benchmark, demonstrate.",
        epilog=_MAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser(
        "serve",
        help="launch an SGLang server with seeded speculative decoding (CUDA GPU)",
        description=_SERVE_DESCRIPTION,
        epilog=_SERVE_EPILOG,
        formatter_class=_Formatter,
        allow_abbrev=False,
    )
    d = ServeDefaults()
    p.add_argument("--model-path", "--model", dest="model_path", default=None,
                   help="target model (default: the embedded tiny model)")
    p.add_argument("--draft-model-path", "--speculative-draft-model-path", dest="draft_model_path", default=None,
                   help="EAGLE/EAGLE3 draft model (not needed for NEXTN/MTP targets)")
    p.add_argument("--algorithm", "--speculative-algorithm", dest="algorithm", default=DETSPEC_ALGORITHMS[0],
                   type=str.upper, choices=DETSPEC_ALGORITHMS, help="speculative algorithm (default: %(default)s)")
    p.add_argument("--num-steps", "--speculative-num-steps", dest="num_steps", type=int, default=d.steps,
                   help="draft steps per verify (default: %(default)s)")
    p.add_argument("--topk", "--speculative-eagle-topk", dest="topk", type=int, default=d.topk,
                   help="draft top-k; rejection sampling needs 1 (default: %(default)s)")
    p.add_argument("--num-draft-tokens", "--speculative-num-draft-tokens", dest="num_draft_tokens", type=int,
                   default=d.draft_tokens, help="tokens verified per step (default: %(default)s)")
    p.add_argument("--attention-backend", default=d.attention_backend,
                   help="deterministic inference allows fa3, fa4, flashinfer, triton (default: %(default)s)")
    p.add_argument("--host", default=d.host, help="address to listen on (default: %(default)s)")
    p.add_argument("--port", type=int, default=d.port, help="port to listen on (default: %(default)s)")
    p.add_argument("--tiny-models-dir", default=None,
                   help="where to build/cache the tiny models (default: the user's cache directory)")
    p.add_argument("--dry-run", action="store_true", help="print the launch command and exit (no GPU needed)")

    p = sub.add_parser(
        "check",
        help="check that a fixed seed gives one output whatever the load (any SGLang server)",
        description=_CHECK_DESCRIPTION,
        epilog=_CHECK_EPILOG,
        formatter_class=_Formatter,
        allow_abbrev=False,
    )
    p.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:30000")
    p.add_argument("--trials", type=int, default=DEFAULT_TRIALS, help="probe trials, >= 2 (default: %(default)s)")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help="the probe's sampling_seed (default: %(default)s)")
    p.add_argument("--seeds", type=_parse_seeds, default=None, metavar="S1,S2,...",
                   help="also send the probe once per seed; fail if distinct seeds give identical outputs")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="sampling temperature of the probe (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS,
                   help="probe length in tokens (default: %(default)s)")
    p.add_argument("--max-fillers", type=int, default=DEFAULT_MAX_FILLERS,
                   help="concurrent filler requests in the last, heaviest trial (default: %(default)s)")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="the probe prompt (default: %(default)r)")
    p.add_argument("--report", default=None, metavar="PATH", help="write a JSON report here")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds to wait for one response (default: %(default)s)")
    p.add_argument("--wait", type=float, default=0.0,
                   help="seconds to wait for the server to come up (default: %(default)s)")
    p.add_argument("--api-key", default=None, help="the server's --api-key, if it has one")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")

    p = sub.add_parser(
        "bench",
        help="benchmark the fused seeded sampler against SGLang's (CUDA GPU)",
        description="Run the sampler benchmark (sglang_detspec.benchmark.main) and write its CSV and PNG.",
        epilog=_BENCH_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )

    p = sub.add_parser(
        "demo",
        help="show on CPU that a seed fixes each request's draft token whatever the batch",
        description=_DEMO_DESCRIPTION,
        epilog=_DEMO_EPILOG,
        formatter_class=_Formatter,
        allow_abbrev=False,
    )
    p.add_argument("--batch", type=int, default=8, help="requests in the demo batch, 2-32 (default: %(default)s)")
    p.add_argument("--vocab", type=int, default=512, help="vocabulary size (default: %(default)s)")
    p.add_argument("--kernel", choices=("auto", "on", "off"), default="auto",
                   help="add a column drawn by the fused Triton kernel; auto: only with a CUDA GPU, on: also on "
                   "CPU through Triton's interpreter (default: %(default)s)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after `--` belongs to the wrapped program (sglang.launch_server, the benchmark).
    after: list[str] = []
    if "--" in argv:
        k = argv.index("--")
        argv, after = argv[:k], argv[k + 1 :]
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_ERROR
    if args.command not in ("serve", "bench") and (unknown or after):
        parser.parse_args(argv + after)  # reports the unrecognized arguments and exits 2
    if args.command == "demo" and not (2 <= args.batch <= 32 and args.vocab >= 8):
        parser.error("demo: --batch must be in 2..32 and --vocab >= 8")
    try:
        if args.command == "serve":
            return cmd_serve(args, unknown + after)
        if args.command == "check":
            return cmd_check(args)
        if args.command == "bench":
            return cmd_bench(args, unknown + after)
        return cmd_demo(args)
    except CliError as e:
        print(f"{PROG} {args.command}: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"{PROG} {args.command}: interrupted", file=sys.stderr)
        return 130
