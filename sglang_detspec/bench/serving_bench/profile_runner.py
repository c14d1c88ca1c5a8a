"""``bench-serve --profile-steps N``: where each configuration's decode step spends its GPU time, op by op.

For every configuration (one server at a time, CUDA graphs off so every kernel is launched by an op the trace
records; ``--profile-graphs`` keeps them on, to see the host's share of a replayed step) and every concurrency
``c``: ``c`` streamed requests of ``--input-len`` random token ids and ``--output-len`` new tokens (``ignore_eos``)
are sent at once; once each has generated ``--profile-after-tokens`` tokens (so every configuration is profiled at
the same context, which attention time grows with), SGLang's own profiler (``/start_profile`` with
``profile_by_stage``: exactly ``N`` decode batches, CPU and GPU activities, ``record_shapes``) records ``N`` steps
and writes a Chrome trace; :mod:`sglang_detspec.bench.op_profile` attributes its kernels to categories and the GEMMs
to the pair's weight shapes; the rest of the requests is aborted.  A speculative step is one scheduler batch: the
draft steps, the verify forward and the draft extend together.

Writes ``op_profile.json`` (every point's attribution, host phases and the top kernels), ``op_profile.md`` (the
tables: by category, by GEMM weight, and the host's ms per step in each of SGLang's annotated phases with the GPU's
busy and idle time) and keeps the traces under ``traces/``.  A point whose requests finished before the trace was
written is an error (the batch shrank while it was profiled): raise ``--output-len``.
"""

from __future__ import annotations

import json
import random
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional

from sglang_detspec import server_process
from sglang_detspec.bench import op_profile
from sglang_detspec.bench.serving_bench import configs as cfgs

__all__ = ["run_profile", "check_profile_settings"]

GRAPHS_OFF = ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]
#: How long a point waits for its requests to reach ``--profile-after-tokens``: eager DETSPEC steps took up to 36 ms
#: for ~2.6 tokens on an H100 (docs/results.md), so 0.1 s per token is ample.
_WAIT_BASE_S, _WAIT_PER_TOKEN_S = 120.0, 0.1
_TRACE_TIMEOUT_S = 180.0


def _log(msg: str) -> None:
    print(f"[bench-serve profile] {msg}", file=sys.stderr, flush=True)


class _Traffic:
    """``c`` concurrent streamed ``/generate`` requests in threads; records how many tokens each one has generated,
    and when and how it ended."""

    def __init__(self, base_url: str, c: int, settings: cfgs.BenchSettings, vocab: int, seed: int):
        rng = random.Random(seed)
        self.generated: List[int] = [0] * c
        self.ended: List[Optional[float]] = [None] * c
        self.errors: List[str] = []
        self.threads = []
        for i in range(c):
            body = {"input_ids": [rng.randrange(16, vocab) for _ in range(settings.input_len)],
                    "sampling_params": {"temperature": settings.temperature, "max_new_tokens": settings.output_len,
                                        "ignore_eos": True},
                    "stream": True}
            t = threading.Thread(target=self._one, args=(base_url, body, i), daemon=True)
            self.threads.append(t)
        for t in self.threads:
            t.start()

    def _one(self, base_url: str, body: dict, i: int) -> None:
        req = urllib.request.Request(base_url + "/generate", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=3600) as r:
                for raw in r:  # server-sent events: "data: {...}" lines, each chunk's meta_info counts the tokens
                    line = raw.decode(errors="replace").strip()
                    if line.startswith("data:") and line != "data: [DONE]":
                        meta = json.loads(line[len("data:"):]).get("meta_info") or {}
                        self.generated[i] = max(self.generated[i], int(meta.get("completion_tokens") or 0))
        except Exception as e:  # an aborted request answers with an error: recorded, judged by the caller
            self.errors.append(f"{type(e).__name__}: {str(e)[:200]}")
        self.ended[i] = time.time()

    def wait_generated(self, tokens: int, timeout: float) -> List[int]:
        """Block until every request has generated ``tokens`` tokens; returns the counts then. Raises RuntimeError if
        a request ends first or ``timeout`` passes."""
        deadline = time.time() + timeout
        while True:
            ended = [i for i, e in enumerate(self.ended) if e is not None]  # read before the counts: theirs are final
            counts = list(self.generated)
            if ended:  # the profiled batch would be smaller than c
                raise RuntimeError(f"request {ended[0]} ended after {counts[ended[0]]} tokens, before every request "
                                   f"had the {tokens} the profile waits for ({'; '.join(self.errors) or 'no error'})")
            if min(counts) >= tokens:
                return counts
            if time.time() > deadline:
                raise RuntimeError(f"the requests had generated {min(counts)} - {max(counts)} tokens after "
                                   f"{timeout:.0f} s, not the {tokens} the profile waits for")
            time.sleep(0.05)

    def finished_before(self, t: float) -> int:
        return sum(1 for e in self.ended if e is not None and e <= t)

    def join(self, timeout: float) -> None:
        deadline = time.time() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.time()))


def _post(base_url: str, path: str, payload: dict, timeout: float = 60) -> str:
    """POST JSON to one of SGLang's control endpoints, which answer in plain text (``Start profiling.``)."""
    req = urllib.request.Request(base_url + path, data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        raise server_process.HTTPStatusError(e.code, e.read().decode(errors="replace")) from None


def _disarm(server, traces: Path) -> None:
    """Leave SGLang's profiler as it was before the point. Its by-stage mode stays set after the decode trace, and
    the next point's first prefill would start a prefill profile that outlives that point; a plain start and stop
    (CPU only, written to ``traces/disarm``) clears the mode."""
    _post(server.base_url, "/start_profile", {"output_dir": str(traces / "disarm"), "activities": ["CPU"],
                                              "with_stack": False, "record_shapes": False, "profile_id": "disarm"})
    _post(server.base_url, "/stop_profile", {})


def _wait_trace(directory: Path, profile_id: str, server: server_process.Server) -> Path:
    """The decode trace SGLang writes as ``{profile_id}-TP-0-DECODE.trace.json.gz``, once its size stops growing."""
    deadline = time.time() + _TRACE_TIMEOUT_S
    size = -1
    while time.time() < deadline:
        if not server.alive():
            raise RuntimeError(f"the server exited while profiling; log {server.log_path}:\n{server.log_tail(40)}")
        found = sorted(directory.glob(f"{profile_id}-*DECODE*.trace.json*"))
        if found:
            now = found[0].stat().st_size
            if now == size and now > 0:
                return found[0]
            size = now
        time.sleep(1.0)
    raise RuntimeError(f"no decode trace {directory}/{profile_id}-*DECODE*.trace.json.gz after {_TRACE_TIMEOUT_S:.0f} "
                       f"s (see {server.log_path})")


def _end_traffic(server, traffic: _Traffic, profile_id: str, settings) -> None:
    """Abort a point's requests and wait for them, freeing the batch for the next point."""
    try:
        _post(server.base_url, "/abort_request", {"abort_all": True})
    except (OSError, server_process.HTTPStatusError) as e:
        _log(f"{profile_id}: /abort_request failed ({e}); waiting for the requests to end")
    traffic.join(max(120.0, settings.output_len * 0.05))


def _profile_point(server, name: str, c: int, steps: int, settings, vocab: int, traces: Path,
                   shape_names, after_tokens: int) -> dict:
    profile_id = f"{name}-c{c}"
    traffic = _Traffic(server.base_url, c, settings, vocab, seed=settings.seed + c)
    # Every configuration is profiled at the same context: attention time grows with it, and a faster server would
    # otherwise be profiled further into its requests.
    try:
        generated = traffic.wait_generated(after_tokens, timeout=_WAIT_BASE_S + _WAIT_PER_TOKEN_S * after_tokens)
    except RuntimeError:
        _end_traffic(server, traffic, profile_id, settings)  # never left running into the next point's profile
        raise
    _post(server.base_url, "/start_profile", {
        "output_dir": str(traces), "num_steps": steps, "activities": ["CPU", "GPU"], "record_shapes": True,
        "with_stack": False, "profile_by_stage": True, "profile_id": profile_id})
    _log(f"{profile_id}: profiler armed for the next {steps} decode batches")
    trace_path = _wait_trace(traces, profile_id, server)
    done_early = traffic.finished_before(trace_path.stat().st_mtime)
    _end_traffic(server, traffic, profile_id, settings)  # the rest of the requests is not needed
    _disarm(server, traces)
    if done_early:
        return {"error": f"{done_early} of {c} requests ended before the trace was written (the profiled batch "
                         f"shrank): raise --output-len", "trace": str(trace_path)}
    summary = op_profile.attribute(op_profile.read_trace(trace_path), steps, shape_names)
    summary.update({"trace": str(trace_path), "concurrency": c,
                    "context_when_armed": [settings.input_len + min(generated), settings.input_len + max(generated)]})
    _log(f"{profile_id}: {summary['kernel_ms']:.3f} ms of kernels per step (window {summary['window_ms']:.3f} ms), "
         f"GEMM {summary['categories']['gemm']:.3f} ms")
    return summary


def check_profile_settings(settings: cfgs.BenchSettings, steps: int, after_tokens: Optional[int] = None) -> None:
    """Refuse settings whose requests would end while profiled: ``--output-len`` must hold the ``after_tokens`` the
    profile waits for and then give every profiled step
    :data:`~sglang_detspec.bench.serving_bench.PROFILE_TOKENS_PER_STEP` tokens (up to 4 tokens a speculative step;
    the trace is written after the steps)."""
    from sglang_detspec.bench.serving_bench import PROFILE_AFTER_TOKENS, PROFILE_TOKENS_PER_STEP

    after_tokens = PROFILE_AFTER_TOKENS if after_tokens is None else after_tokens
    if steps < 1:
        raise ValueError(f"--profile-steps must be >= 1, got {steps}")
    if after_tokens < 1:
        raise ValueError(f"--profile-after-tokens must be >= 1, got {after_tokens}")
    need = after_tokens + steps * PROFILE_TOKENS_PER_STEP
    if settings.output_len < need:
        raise ValueError(f"--output-len {settings.output_len} is too short to profile {steps} decode steps after "
                         f"{after_tokens} tokens: the requests would end while profiled; pass --output-len {need} or "
                         "more (or a smaller --profile-after-tokens)")


def run_profile(settings: cfgs.BenchSettings, out: Path, *, models_dir: Optional[Path], shape, steps: int,
                start_timeout: float = 420.0, graphs: bool = False, after_tokens: Optional[int] = None) -> int:
    """Profile every configuration of ``settings`` at every concurrency (module docstring), each point once its
    requests have generated ``after_tokens`` tokens (default :data:`..PROFILE_AFTER_TOKENS`); the exit code is 0 when
    every point was profiled, 1 when some failed, 2 when nothing could run."""
    from sglang_detspec.bench.serving_bench import PROFILE_AFTER_TOKENS

    after_tokens = PROFILE_AFTER_TOKENS if after_tokens is None else after_tokens
    check_profile_settings(settings, steps, after_tokens)
    reason = server_process.launch_skip_reason()
    if reason:
        _log(reason)
        return 2
    import tempfile

    from sglang_detspec.bench.gemm_bench import llama_gemm_shapes
    from sglang_detspec.models import midsize_models

    out = Path(out).resolve()
    traces = out / "traces"
    traces.mkdir(parents=True, exist_ok=True)
    pair = midsize_models.ensure_midsize_pair(models_dir or Path(tempfile.gettempdir()) / "sglang-detspec-models", shape)
    shape_names = op_profile.shape_names_for(llama_gemm_shapes(shape.hidden, shape.heads, shape.kv_heads,
                                                               shape.head_dim, shape.intermediate, shape.vocab))
    points: Dict[str, Dict[int, dict]] = {}
    try:
        from tqdm import tqdm

        bar = tqdm(total=len(settings.configs) * len(settings.concurrencies), desc="profile points", file=sys.stderr)
    except ImportError:
        bar = None
    try:
        _profile_configs(settings, out, traces, pair, shape, steps, shape_names, start_timeout, points, bar, graphs,
                         after_tokens)
    except KeyboardInterrupt:  # timeout -s INT: keep what was measured
        _log("interrupted: the report below holds the points profiled so far")
        _report(out, settings, shape, steps, points, graphs=graphs)
        return 130
    finally:
        if bar is not None:
            bar.close()
    return _report(out, settings, shape, steps, points, graphs=graphs)


def _profile_configs(settings, out: Path, traces: Path, pair, shape, steps: int, shape_names, start_timeout: float,
                     points: Dict[str, Dict[int, dict]], bar, graphs: bool, after_tokens: int) -> None:
    """One server per configuration, in turn, every concurrency on it; the report is rewritten after each
    configuration, so a run stopped part-way leaves its finished points on disk."""
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    for name in settings.configs:
        config = cfgs.config_by_name(name)
        spec = server_process.ServerSpec(name, cfgs.server_args(config, pair.target, pair.eagle_draft, settings,
                                                                mem_fraction=0.5) + ([] if graphs else GRAPHS_OFF),
                                         env=dict(env, **dict(config.env)))
        server = server_process.Server(spec, server_process.free_port(34000), out / f"server-{name}.log",
                                       pid_file=out / "server_pids.txt")
        points[name] = {}
        try:
            server.start()
            server.wait_ready(start_timeout)
            for c in settings.concurrencies:
                try:
                    points[name][c] = _profile_point(server, name, c, steps, settings, shape.vocab, traces,
                                                     shape_names, after_tokens)
                except (RuntimeError, ValueError, OSError, server_process.HTTPStatusError) as e:
                    points[name][c] = {"error": str(e).splitlines()[0][:400]}
                    _log(f"{name} c={c}: {points[name][c]['error']}")
                if bar is not None:
                    bar.update(1)
        except server_process.ServerStartError as e:
            for c in settings.concurrencies:
                points[name][c] = {"error": f"server did not start: {str(e).splitlines()[0]}"}
        finally:
            server.stop()
        _report(out, settings, shape, steps, points, quiet=True, graphs=graphs)


def _report(out: Path, settings, shape, steps: int, points: Dict[str, Dict[int, dict]], quiet: bool = False,
            graphs: bool = False) -> int:
    """Write op_profile.json / .md for the configurations in ``points`` (print the tables unless ``quiet``); 0 when
    every point of every configuration in ``settings`` was profiled, else 1."""
    import dataclasses

    version = server_process.sglang_version()
    document = {"sglang": version, "shape": dataclasses.asdict(shape), "steps": steps,
                "settings": dataclasses.asdict(settings), "graphs": "on" if graphs else "off",
                "configs": {n: cfgs.config_by_name(n).label for n in settings.configs},
                "points": {n: {str(c): p for c, p in per.items()} for n, per in points.items()}}
    (out / "op_profile.json").write_text(json.dumps(document, indent=1, sort_keys=True) + "\n")
    sections = [f"# Decode-step profile, sglang {version}, pair {shape.tag()}, {steps} steps per point, CUDA graphs "
                f"{'on' if graphs else 'off'}, input {settings.input_len} tokens, T={settings.temperature:g}"]
    for c in settings.concurrencies:
        per_config = {n: points[n].get(c) for n in settings.configs if n in points}
        sections.append(op_profile.format_category_table(per_config, title=f"\n## Concurrency {c}: by category\n"))
        contexts = [f"{n} {p['context_when_armed'][0]} - {p['context_when_armed'][1]}"
                    for n, p in per_config.items() if p and "context_when_armed" in p]
        if contexts:
            sections.append(f"\nContext of the requests (prompt + generated tokens) when the profile was armed: "
                            f"{'; '.join(contexts)}.")
        sections.append(op_profile.format_gemm_table(per_config, title=f"\n## Concurrency {c}: GEMM by weight\n"))
        sections.append(op_profile.format_phase_table(per_config, title=f"\n## Concurrency {c}: host phases\n"))
        errors = [f"- {n}: {p['error']}" for n, p in per_config.items() if p and "error" in p]
        if errors:
            sections.append("\nFailed points:\n" + "\n".join(errors))
    text = "\n".join(sections) + "\n"
    (out / "op_profile.md").write_text(text)
    if not quiet:
        print(text)
        print(f"results: {out / 'op_profile.json'}, {out / 'op_profile.md'}, traces in {out / 'traces'}")
    missing = [n for n in settings.configs if len(points.get(n, {})) < len(settings.concurrencies)]
    failed = any("error" in p for per in points.values() for p in per.values())
    return 1 if failed or missing else 0
