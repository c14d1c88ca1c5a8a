"""Harness for the end-to-end tests: real ``python -m sglang.launch_server`` processes on the tiny
model pair (weighted by default), HTTP trials whose batch composition changes, and a JSON results file.

Only the standard library is used at import time, so the test modules import (and skip) on a machine
without a GPU or without SGLang. Server start-up costs 70-120 s on an H200 for the tiny pair, so a pool
(``e2e_servers``, with the knobs that start the servers) starts every configuration the selected tests need *at
once* (they are small: a capped KV pool each) and each test waits only for its own server.

``DETSPEC_E2E_OUT`` (optional) is the directory for ``e2e_results.json`` and the server logs (default:
``$TMPDIR/detspec-e2e``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Optional, Sequence

# The server process and its HTTP helpers live in the package (bench-serve and the GPU scripts use them too);
# re-exported here under the names the tests use. Standard library only, like this harness.
from sglang_detspec import server_process
from sglang_detspec.models.tiny_servers import (  # noqa: F401 (re-exported)
    CONTEXT_LENGTH,
    CUDA_GRAPH_MAX_BS,
    GRAPHS_OFF,
    SPEC_SHAPE,
    common_args,
    eagle_args,
    tiny_pair,
)
from sglang_detspec.server_process import (  # noqa: F401 (re-exported)
    GPU_SKIP_REASON,
    RUN_HINT,
    HTTPStatusError,
    ServerSpec,
    ServerStartError,
    free_port,
    get_json,
    post_json,
    sglang_version,
    version_tuple,
)

# tests/conftest.py's GPU_SKIP_REASON is the same wording: every GPU test skips with it on CPU (a test module cannot
# import conftest: pytest loads each conftest.py as the module "conftest" in turn).

# ---------------------------------------------------------------------------------------------
# Skip logic


def e2e_skip_reason() -> Optional[str]:
    """Why the E2E tests cannot run here, or None (:func:`sglang_detspec.server_process.launch_skip_reason`)."""
    return server_process.launch_skip_reason()


# ---------------------------------------------------------------------------------------------
# What every E2E module starts and ends with


def register_cuda_ci(*args, **kwargs):
    """SGLang's CI marker (``sglang.test.ci.ci_register.register_cuda_ci``), a no-op where SGLang is missing.

    Each E2E module calls it once at module level with constant arguments: SGLang's CI tooling reads that call by
    AST (``tests/e2e/test_e2e_registration.py`` checks it does), so the call itself must stay in every module.
    """
    try:
        from sglang.test.ci.ci_register import register_cuda_ci as register
    except ImportError:  # sglang not installed: the marker is a runtime no-op anyway
        return None
    return register(*args, **kwargs)


def module_marks(*servers: str) -> list:
    """An E2E module's ``pytestmark``: ``gpu``, the skip where no E2E run is possible (:func:`e2e_skip_reason`'s
    reason), and an ``e2e_server`` mark for each server configuration the whole module uses."""
    import pytest

    skip = e2e_skip_reason()
    return [pytest.mark.gpu, pytest.mark.skipif(skip is not None, reason=skip or ""),
            *[pytest.mark.e2e_server(name) for name in servers]]


def run_module(path: str) -> None:
    """``python tests/e2e/test_e2e_<name>.py`` runs that module under pytest, verbose (how SGLang's CI runs a file)."""
    import pytest

    sys.exit(pytest.main([path, "-v", "-s"]))


# ---------------------------------------------------------------------------------------------
# Results file


def out_dir() -> Path:
    d = Path(os.environ.get("DETSPEC_E2E_OUT") or (Path(tempfile.gettempdir()) / "detspec-e2e"))
    d.mkdir(parents=True, exist_ok=True)
    return d


_results_lock = threading.Lock()


def results_path() -> Path:
    return out_dir() / "e2e_results.json"


def load_results() -> dict:
    p = results_path()
    if p.is_file():
        try:
            return json.loads(p.read_text())
        except ValueError:
            return {}
    return {}


def record(key: str, value) -> None:
    """Merge ``value`` under ``key`` into the results JSON, rewriting it at once so a run killed by
    a time limit still leaves every number measured so far."""
    with _results_lock:
        data = load_results()
        data[key] = value
        data.setdefault("_meta", {})
        data["_meta"].update({"sglang": _safe_version(), "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
        tmp = results_path().with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, results_path())
    print(f"[detspec-e2e] {key} = {json.dumps(value)[:400]}", flush=True)


def _safe_version() -> str:
    try:
        return sglang_version()
    except Exception:  # pragma: no cover - informational only
        return "unknown"


# ---------------------------------------------------------------------------------------------
# Server configurations

#: The pressure profile's servers (tests/e2e/test_e2e_pressure.py): a KV pool small enough that 31 requests of a few
#: hundred tokens overflow it, so SGLang retracts running requests; metrics on, for its retraction counter. These
#: flags come after the tiny pair's own --max-total-tokens, and SGLang's parser keeps the last one.
PRESSURE_KV_TOKENS = 4096
PRESSURE_ARGS = ["--max-total-tokens", str(PRESSURE_KV_TOKENS), "--enable-metrics"]


#: Forced retraction: SGLang's own test knob (``SGLANG_TEST_RETRACT``, scheduler.py in 0.5.17 - 0.5.23) retracts the
#: running request with the fewest output tokens every ``SGLANG_TEST_RETRACT_INTERVAL`` decode steps whenever more
#: than one runs, so a probe sent after the pressure fillers is retracted in most loaded trials, not by chance.
#: (Every 3 steps, upstream's default, a check of 12 trials took over 3 minutes on the H200: every retracted
#: DETSPEC request regenerates its tokens.)
FORCED_RETRACT_ENV = {"SGLANG_TEST_RETRACT": "1", "SGLANG_TEST_RETRACT_INTERVAL": "12"}

#: A test-harness-only control (tests/e2e/controls/no_retraction_replay/sitecustomize.py): DETSPEC whose retracted
#: requests are re-prefilled as upstream does, without the replay from the prompt.
NO_REPLAY_CONTROL = Path(__file__).resolve().parent / "controls" / "no_retraction_replay"

#: A test-harness-only control (tests/e2e/controls/retract_the_probe/sitecustomize.py): SGLang's retraction order with
#: the probe (the request seeded PRESSURE_PROBE_SEED) retracted first once it holds 32 output tokens, twice per request.
#: Without it the replay's rewound fillers, having the fewest output tokens, took every forced retraction and the
#: invariant servers' probe was never retracted (H100, 2026-12-05: 0 of 11 loaded trials, graphs on and off).
RETRACT_PROBE_CONTROL = Path(__file__).resolve().parent / "controls" / "retract_the_probe"
#: The probe seed of the pressure checks whose servers run RETRACT_PROBE_CONTROL (``check --seed``).
PRESSURE_PROBE_SEED = 1234
PROBE_RETRACT_ENV = {**FORCED_RETRACT_ENV, "DETSPEC_TEST_RETRACT_PROBE_SEED": str(PRESSURE_PROBE_SEED),
                     "DETSPEC_TEST_RETRACT_PROBE_AFTER": "32", "DETSPEC_TEST_RETRACT_PROBE_TIMES": "2"}

#: A test-harness-only control (tests/e2e/controls/upstream_target_sampler/sitecustomize.py): DETSPEC with its
#: target sampler handing every seeded top-k / top-p / min-p batch back to SGLang's rank-keyed sorted sampler.
UPSTREAM_SAMPLER_CONTROL = Path(__file__).resolve().parent / "controls" / "upstream_target_sampler"

#: A test-harness-only control (tests/e2e/controls/stale_attention_indices/sitecustomize.py): the attention index
#: cache keeping the eager warm-up's record inside CUDA-graph capture, so replayed graphs read stale indices.
STALE_ATTENTION_INDICES_CONTROL = Path(__file__).resolve().parent / "controls" / "stale_attention_indices"


def with_control(control_dir: Path, env: Dict[str, str]) -> Dict[str, str]:
    """``env`` plus a PYTHONPATH that puts a test-only control's ``sitecustomize`` first (before the caller's)."""
    return dict(env, PYTHONPATH=os.pathsep.join([str(control_dir), *filter(None, [os.environ.get("PYTHONPATH")])]))


def server_specs(models, pair: Optional[str] = None) -> Dict[str, ServerSpec]:
    """Every configuration the E2E tests use, by name. ``models`` is a ``TinyModels`` of ``pair``."""
    pair = pair or tiny_pair()
    base = common_args(models.target, pair)
    eagle = ["--speculative-draft-model-path", str(models.eagle_draft)] + SPEC_SHAPE
    eagle3 = ["--speculative-draft-model-path", str(models.eagle3_draft)] + SPEC_SHAPE
    det = ["--enable-deterministic-inference"]
    rs = ["--speculative-use-rejection-sampling"]
    # The two configurations scripts/run_sglang_harness.py also serves: built by the one shared helper.
    detspec = base + eagle_args(models.eagle_draft, "DETSPEC_EAGLE", deterministic=True)
    control_env = with_control(UPSTREAM_SAMPLER_CONTROL, {})
    specs = [
        # --chat-template: the tiny tokenizer has none, and test_e2e_rollouts.py sends /v1/chat/completions here.
        ServerSpec("detspec_eagle_graph", detspec + ["--chat-template", "chatml"]),
        ServerSpec("detspec_eagle_nograph", detspec + GRAPHS_OFF),
        ServerSpec("detspec_eagle_nooverlap", detspec + ["--disable-overlap-schedule"]),
        ServerSpec("detspec_eagle3_graph", base + eagle3 + ["--speculative-algorithm", "DETSPEC_EAGLE3"] + det),
        ServerSpec("detspec_eagle_chunk4096", detspec + ["--chunked-prefill-size", "4096"]),
        # Refused at start-up: a chunk below the deterministic prefill alignment would starve the queue.
        ServerSpec("detspec_eagle_chunk64", detspec + ["--chunked-prefill-size", "64"], expect_exit=True),
        ServerSpec("detspec_upstream_sampler_control", detspec, env=control_env),
        ServerSpec("builtin_eagle_rs", base + eagle_args(models.eagle_draft, "EAGLE", rejection_sampling=True)),
        ServerSpec(
            "builtin_eagle_rs_det",
            base + eagle + ["--speculative-algorithm", "EAGLE"] + rs + det,
            # sglang 0.5.17-0.5.22 refuse this combination; 0.5.23 accepts it (seeded in-tree).
            expect_exit=version_tuple(_safe_version()) < (0, 5, 23),
        ),
        ServerSpec("detspec_eagle_pressure_graph", detspec + PRESSURE_ARGS),
        ServerSpec("detspec_eagle_pressure_nograph", detspec + GRAPHS_OFF + PRESSURE_ARGS),
        # The control under the same pressure: built-in EAGLE's rejection sampling draws from the global RNG.
        ServerSpec("builtin_eagle_rs_pressure", base + eagle + ["--speculative-algorithm", "EAGLE"] + rs + PRESSURE_ARGS),
        # Retraction forced every few steps on top of the small pool, aimed at the probe (RETRACT_PROBE_CONTROL:
        # left to SGLang's order, the replaying fillers took every forced retraction, H100 2026-12-06); and the
        # control without the replay, which must change the retracted probe.
        ServerSpec("detspec_eagle_forced_retract_graph", detspec + PRESSURE_ARGS,
                   env=with_control(RETRACT_PROBE_CONTROL, PROBE_RETRACT_ENV)),
        ServerSpec("detspec_eagle_forced_retract_nograph", detspec + GRAPHS_OFF + PRESSURE_ARGS,
                   env=with_control(RETRACT_PROBE_CONTROL, PROBE_RETRACT_ENV)),
        ServerSpec("detspec_noreplay_forced_retract", detspec + PRESSURE_ARGS,
                   env=with_control(NO_REPLAY_CONTROL, FORCED_RETRACT_ENV)),
        # The deterministic Triton attention's unified KV indices built once per forward (test_e2e_attn_index_cache).
        ServerSpec("detspec_eagle_attn_cache_graph", detspec + ["--chat-template", "chatml"],
                   env={ATTN_INDEX_CACHE_ENV: "1"}),
        ServerSpec("detspec_eagle_attn_cache_nograph", detspec + GRAPHS_OFF, env={ATTN_INDEX_CACHE_ENV: "1"}),
        ServerSpec("detspec_eagle_attn_cache_stale_control", detspec,
                   env=with_control(STALE_ATTENTION_INDICES_CONTROL, {ATTN_INDEX_CACHE_ENV: "1"})),
        # The same servers with the cache turned off (SGLang's per-layer build): the tokens the cached ones must give.
        ServerSpec("detspec_eagle_no_attn_cache_graph", detspec + ["--chat-template", "chatml"],
                   env={ATTN_INDEX_CACHE_ENV: "0"}),
        ServerSpec("detspec_eagle_no_attn_cache_nograph", detspec + GRAPHS_OFF, env={ATTN_INDEX_CACHE_ENV: "0"}),
        # The target's verify attention in the decode kernel's order (test_e2e_decode_order_verify).
        ServerSpec("detspec_eagle_decode_verify_graph", detspec, env={DECODE_ORDER_VERIFY_ENV: "1"}),
        ServerSpec("detspec_eagle_decode_verify_nograph", detspec + GRAPHS_OFF, env={DECODE_ORDER_VERIFY_ENV: "1"}),
        # The target's verify attention in the plugin's split-KV verify kernel, asked for (the default serves it too),
        # and in SGLang's one-stage extend kernel (test_e2e_split_kv_verify).
        ServerSpec("detspec_eagle_split_kv_verify_graph", detspec, env={SPLIT_KV_VERIFY_ENV: "1"}),
        ServerSpec("detspec_eagle_split_kv_verify_nograph", detspec + GRAPHS_OFF, env={SPLIT_KV_VERIFY_ENV: "1"}),
        ServerSpec("detspec_eagle_one_stage_verify", detspec, env={SPLIT_KV_VERIFY_ENV: "0"}),
        # The draft's extend of each verified chain in the split-KV verify kernel (test_e2e_split_kv_draft_extend).
        ServerSpec("detspec_eagle_split_kv_draft_extend_graph", detspec, env={SPLIT_KV_DRAFT_EXTEND_ENV: "1"}),
        ServerSpec("detspec_eagle_split_kv_draft_extend_nograph", detspec + GRAPHS_OFF,
                   env={SPLIT_KV_DRAFT_EXTEND_ENV: "1"}),
    ]
    specs += multi_layer_specs(models, pair, base)
    specs += invariant_specs(models, base, pair)
    return {spec.name: spec for spec in specs}


def multi_layer_args(models, pair: str) -> List[str]:
    """Draft flags for multi-layer EAGLE: ``pair``'s tiny MiMo-V2-style MTP draft (built beside ``models`` on first
    use, weights only for the weighted pair) and the flags it needs (``tiny_models.MTP_SERVER_FLAGS``:
    ``--enable-multi-layer-eagle``, ``--disable-hybrid-swa-memory``, ``--chunked-prefill-size -1``)."""
    from sglang_detspec.models.mtp_draft import MTP_SERVER_FLAGS, ensure_mtp_draft

    draft = ensure_mtp_draft(Path(models.target).parent.parent, pair=pair)  # the cache root of ``models``
    flags = [part for flag, values in MTP_SERVER_FLAGS for part in (flag, *values)]
    return ["--speculative-draft-model-path", str(draft), *SPEC_SHAPE, *flags]


def multi_layer_specs(models, pair: str, base: List[str]) -> List[ServerSpec]:
    """Multi-layer EAGLE (SGLang's MultiLayerEagleWorkerV2, one MTP layer per draft step) on the tiny pair's target.

    With the triton backend the draft-extend graphs are captured per step (DETSPEC re-samples between replays);
    only FlashAttention-3 rebuilds its metadata in-graph, so ``detspec_mtp_fa3_graph`` is the one that runs the
    single-CUDA-graph draft-extend runner (``multi_layer_eagle_worker_v2.py:393-401``)."""
    mtp = base + multi_layer_args(models, pair)
    detspec = mtp + ["--speculative-algorithm", "DETSPEC_EAGLE", "--enable-deterministic-inference"]
    return [
        ServerSpec("detspec_mtp_graph", detspec),
        ServerSpec("detspec_mtp_nograph", detspec + GRAPHS_OFF),
        # Its 3 layers' draft extends in the split-KV verify kernel (test_e2e_split_kv_draft_extend).
        ServerSpec("detspec_mtp_split_kv_draft_extend_graph", detspec, env={SPLIT_KV_DRAFT_EXTEND_ENV: "1"}),
        ServerSpec("detspec_mtp_fa3_graph", detspec + ["--attention-backend", "fa3"]),
        # Refused at start-up: the radix cache would let another prompt's tokens into the draft KV (server_args.py).
        ServerSpec("detspec_mtp_radix", [a for a in detspec if a != "--disable-radix-cache"], expect_exit=True),
        # The control: the same pair, SGLang's own multi-layer worker with its (global-RNG) rejection sampling.
        ServerSpec("builtin_mtp_rs",
                   mtp + ["--speculative-algorithm", "EAGLE", "--speculative-use-rejection-sampling"]),
    ]


#: The switch (on by default) that builds the deterministic Triton attention's unified KV indices once per forward.
ATTN_INDEX_CACHE_ENV = "SGLANG_DETSPEC_ATTN_INDEX_CACHE"
#: The opt-in that runs DETSPEC_EAGLE's verify attention in the decode kernel's order.
DECODE_ORDER_VERIFY_ENV = "SGLANG_DETSPEC_DECODE_ORDER_VERIFY"
#: Whether DETSPEC_EAGLE's verify attention runs in the plugin's split-KV verify kernel (unset: where it can serve).
SPLIT_KV_VERIFY_ENV = "SGLANG_DETSPEC_SPLIT_KV_VERIFY"
#: The opt-in that runs the draft's extend of each verified chain in the same kernel.
SPLIT_KV_DRAFT_EXTEND_ENV = "SGLANG_DETSPEC_SPLIT_KV_DRAFT_EXTEND"
FAST_INVARIANT_DRAFT_ENV = "SGLANG_DETSPEC_FAST_INVARIANT_DRAFT"

#: The opt-in switch that keys a NON-speculative deterministic server's seeded sampler by token id, as DETSPEC
#: servers' target sampler does (needed for top-k / top-p rows to match; temperature-only rows match without it).
TOKEN_ID_SAMPLER_ENV = "SGLANG_DETSPEC_TOKEN_ID_SAMPLER"

#: The speculation-invariance servers (tests/e2e/test_e2e_invariant.py) run 64 requests at once, so decode batches
#: of up to 32 (the tiny pair's --max-running-requests) replay CUDA graphs instead of only the 1..8 of the other
#: configurations; the parser keeps the last value of a flag.
INVARIANT_ARGS = ["--cuda-graph-max-bs-decode", "32"]


def invariant_specs(models, base: List[str], pair: str) -> List[ServerSpec]:
    """Speculation invariance (DETSPEC_EAGLE_INVARIANT): the non-speculative reference, the invariant algorithm with
    graphs on and off, with a second draft (``tiny_models.ensure_second_eagle_draft``: the pair's recipe, another
    seed) and on multi-layer EAGLE (the pair's MTP draft, per-step draft-extend graphs on and off), and
    DETSPEC_EAGLE's rejection sampling as the control that must differ from the reference."""
    from sglang_detspec.models.second_eagle_draft import ensure_second_eagle_draft

    draft2 = ensure_second_eagle_draft(Path(models.target).parent.parent)  # the cache root of ``models``
    invariant = base + eagle_args(models.eagle_draft, "DETSPEC_EAGLE_INVARIANT", deterministic=True) + INVARIANT_ARGS
    invariant_mtp = (base + multi_layer_args(models, pair)
                     + ["--speculative-algorithm", "DETSPEC_EAGLE_INVARIANT", "--enable-deterministic-inference"]
                     + INVARIANT_ARGS)
    return [
        ServerSpec("nonspec_token_id", base + ["--enable-deterministic-inference"] + INVARIANT_ARGS,
                   env={TOKEN_ID_SAMPLER_ENV: "1"}),
        ServerSpec("invariant_graph", invariant),
        ServerSpec("invariant_nograph", invariant + GRAPHS_OFF),
        ServerSpec("invariant_draft2",
                   base + eagle_args(draft2, "DETSPEC_EAGLE_INVARIANT", deterministic=True) + INVARIANT_ARGS),
        ServerSpec("detspec_rs_control",
                   base + eagle_args(models.eagle_draft, "DETSPEC_EAGLE", deterministic=True) + INVARIANT_ARGS),
        ServerSpec("invariant_mtp_graph", invariant_mtp),
        ServerSpec("invariant_mtp_nograph", invariant_mtp + GRAPHS_OFF),
        # The invariant draft's GEMMs on cuBLAS (tests/e2e/test_e2e_fast_invariant_draft.py).
        ServerSpec("invariant_fast_draft_graph", invariant, env={FAST_INVARIANT_DRAFT_ENV: "1"}),
        ServerSpec("invariant_fast_draft_nograph", invariant + GRAPHS_OFF, env={FAST_INVARIANT_DRAFT_ENV: "1"}),
        # Under memory pressure (tests/e2e/test_e2e_invariant_pressure.py): the small pool and SGLang's forced
        # retraction of the pressure profile's servers, graphs on and off; and the same without the retraction
        # replay, to measure whether the invariant mode needs it (its re-prefill samples with the same key).
        # The servers with the replay have their probe retracted on purpose (RETRACT_PROBE_CONTROL); so has the
        # control, DETSPEC_EAGLE's rejection sampling, which must keep its tokens but not be the reference.
        ServerSpec("invariant_forced_retract_graph", invariant + PRESSURE_ARGS,
                   env=with_control(RETRACT_PROBE_CONTROL, PROBE_RETRACT_ENV)),
        ServerSpec("invariant_forced_retract_nograph", invariant + GRAPHS_OFF + PRESSURE_ARGS,
                   env=with_control(RETRACT_PROBE_CONTROL, PROBE_RETRACT_ENV)),
        ServerSpec("invariant_noreplay_forced_retract", invariant + PRESSURE_ARGS,
                   env=with_control(NO_REPLAY_CONTROL, FORCED_RETRACT_ENV)),
        ServerSpec("detspec_eagle_probe_retract_graph",
                   base + eagle_args(models.eagle_draft, "DETSPEC_EAGLE", deterministic=True) + PRESSURE_ARGS,
                   env=with_control(RETRACT_PROBE_CONTROL, PROBE_RETRACT_ENV)),
    ]


# ---------------------------------------------------------------------------------------------
# Probe requests (HTTP helpers: post_json / get_json above, from the package)


PROBE_PROMPT = "The river ran past the old mill, where the miller kept a ledger of"
PROBE_MAX_NEW_TOKENS = 48
FILLER_BASE = (
    "Speculative decoding lets a small draft model propose several tokens that a large target model "
    "then checks in one forward pass. "
)


def probe_params(seed: int, max_new_tokens: int = PROBE_MAX_NEW_TOKENS) -> dict:
    return {"temperature": 1.0, "max_new_tokens": max_new_tokens, "ignore_eos": True, "sampling_seed": seed}


def generate(base_url: str, text: str, sampling_params: dict, timeout: float = 300) -> dict:
    return post_json(base_url, "/generate", {"text": text, "sampling_params": sampling_params}, timeout=timeout)


def output_key(resp: dict) -> tuple:
    """What "the same output" means: the generated token ids (the text too, as a cross-check)."""
    ids = resp.get("output_ids")
    return (tuple(ids) if ids is not None else None, resp.get("text"))


def accept_length(resp: dict) -> Optional[float]:
    meta = resp.get("meta_info", {})
    ct = meta.get("spec_verify_ct")
    if not ct:
        return None
    return meta["completion_tokens"] / ct


def total_accept_length(responses: Sequence[dict]) -> Optional[float]:
    """Completion tokens per verify step over ``responses`` together (SGLang's accept length, as
    :func:`accept_length` per request); None when none of them ran a verify step (a non-speculative server)."""
    tokens = verify = 0
    for resp in responses:
        meta = resp.get("meta_info", {})
        if meta.get("spec_verify_ct"):
            tokens += meta["completion_tokens"]
            verify += meta["spec_verify_ct"]
    return tokens / verify if verify else None


def compare_to_reference(reference: Sequence[Sequence[int]], other: Sequence[Sequence[int]], seeds: Sequence[int],
                         *, keep: int = 20) -> dict:
    """How many of ``other``'s sequences equal ``reference``'s, pairwise (sequence ``i`` is seed ``seeds[i]``'s).

    For each differing pair: the first index where they differ (a prefix of the other counts as differing at its
    end, the missing token None). Keeps the first ``keep`` of those in full (seed, index, both tokens) and a histogram
    of every first-difference index (JSON keys: the index as a string, in increasing order)."""
    if not len(reference) == len(other) == len(seeds):
        raise ValueError(f"compare_to_reference: {len(reference)} reference, {len(other)} other sequences and "
                         f"{len(seeds)} seeds; give one of each per request")
    identical, histogram, divergences = 0, {}, []
    for seed, ref, got in zip(seeds, reference, other):
        ref, got = list(ref), list(got)
        if ref == got:
            identical += 1
            continue
        at = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), min(len(ref), len(got)))
        histogram[at] = histogram.get(at, 0) + 1
        if len(divergences) < keep:
            divergences.append({"seed": seed, "index": at, "reference": ref[at] if at < len(ref) else None,
                                "got": got[at] if at < len(got) else None})
    n = len(reference)
    return {
        "n": n,
        "identical": identical,
        "fraction_identical": identical / n if n else None,
        "first_divergence_histogram": {str(k): histogram[k] for k in sorted(histogram)},
        "divergences": divergences,
    }


def filler_request(i: int) -> tuple:
    """The i-th filler: a different prompt length and output length per index, its own seed, so
    the probe shares each trial's batches with a different mix of sequence lengths."""
    text = FILLER_BASE * (1 + (i * 5) % 11) + f" Filler number {i}."
    params = {"temperature": 1.0, "max_new_tokens": 24 + (i * 17) % 73, "ignore_eos": True, "sampling_seed": 1000 + i}
    return text, params


def changing_batch_trials(base_url: str, seed: int, n_trials: int = 16, prompt: str = PROBE_PROMPT,
                          max_new_tokens: int = PROBE_MAX_NEW_TOKENS) -> List[dict]:
    """Trial t (1-based) sends the probe together with t-1 concurrent fillers; returns the probe's
    responses. All requests of a trial are released by one barrier so they share batches."""
    probes = []
    for t in range(1, n_trials + 1):
        reqs = [(prompt, probe_params(seed, max_new_tokens))] + [filler_request(i) for i in range(t - 1)]
        barrier = threading.Barrier(len(reqs))

        def send(r, barrier=barrier):  # this trial's barrier, bound at definition rather than looked up per call
            barrier.wait()
            return generate(base_url, r[0], r[1])

        with ThreadPoolExecutor(max_workers=len(reqs)) as ex:
            results = list(ex.map(send, reqs))
        probes.append(results[0])
    return probes


def summarize_trials(probes: Sequence[dict]) -> dict:
    keys = [output_key(p) for p in probes]
    accept = [accept_length(p) for p in probes]
    acc = [a for a in accept if a is not None]
    return {
        "trials": len(probes),
        "unique_outputs": len(set(keys)),
        "accept_length_per_trial": [round(a, 4) if a is not None else None for a in accept],
        "mean_accept_length": round(sum(acc) / len(acc), 4) if acc else None,
        "verify_steps_per_trial": [p.get("meta_info", {}).get("spec_verify_ct") for p in probes],
        "completion_tokens": probes[0].get("meta_info", {}).get("completion_tokens") if probes else None,
        "first_output_ids": list(keys[0][0]) if keys and keys[0][0] is not None else None,
        "first_output_text": keys[0][1] if keys else None,
    }
