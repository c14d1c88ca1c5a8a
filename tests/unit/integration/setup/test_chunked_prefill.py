"""Chunked prefill under deterministic inference, on SGLang's real scheduler pieces (CPU).

Two things are checked against the installed SGLang:

* ``compat.deterministic_prefill_alignment`` against ``Scheduler.init_deterministic_inference_config`` itself
  (called on a minimal object with the configuration published), for every prefill backend and both env vars;
* why ``--chunked-prefill-size`` must be <= 0 or a multiple of that alignment: requests go through SGLang's
  real ``PrefillAdder`` round by round, the way ``Scheduler.get_new_batch_prefill`` drives it (FCFS queue, the
  running chunked request first, the scheduler's ``stash_chunked_request`` between rounds), with the real
  request-to-token pool, KV allocator, tree cache (built by SGLang's factory) and ``ScheduleBatch.
  prepare_for_extend`` allocating each round's KV. Nothing runs a model; there is no decode batch (the pool
  is large enough that running requests' reservations would change no decision here).

Expected boundaries are derived from the rule the scheduler documents: a new request's chunk is cut to a
multiple of the alignment (refused if that is zero), a running chunked request continues with a full chunk.
"""

from __future__ import annotations

import contextlib
import dataclasses
from array import array
from types import SimpleNamespace

import pytest
import torch

from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.runtime_context import get_context

from sglang_detspec.integration import compat

ALIGN_ENVS = ("SGLANG_FLASHINFER_PREFILL_SPLIT_TILE_SIZE", "SGLANG_TRITON_PREFILL_TRUNCATION_ALIGN_SIZE")
LONG = 20000          # longer than --max-prefill-tokens (16384, SGLang's default)
SHORT = 100
MAX_PREFILL_TOKENS = 16384


@pytest.fixture(autouse=True)
def _no_alignment_env(monkeypatch):
    for name in ALIGN_ENVS:
        monkeypatch.delenv(name, raising=False)


@contextlib.contextmanager
def published(**fields):
    """A published dummy configuration (what the scheduler process reads through get_exec / get_schedule)."""
    base = dict(enable_deterministic_inference=True, device="cpu", disable_radix_cache=True)
    base.update(fields)
    with get_context().override_server_args(**base) as server_args:
        yield server_args


def scheduler_alignment(server_args):
    """``truncation_align_size`` as the installed scheduler's own method sets it."""
    scheduler = SimpleNamespace(server_args=server_args)
    Scheduler.init_deterministic_inference_config(scheduler)
    return scheduler.truncation_align_size


# --------------------------------------------------------------------------------------------------
# compat's alignment table against the scheduler's
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backends", [
    dict(attention_backend="flashinfer"),
    dict(attention_backend="triton"),
    dict(attention_backend="fa3"),
    dict(attention_backend="fa3", prefill_attention_backend="flashinfer"),
    dict(attention_backend="flashinfer", prefill_attention_backend="fa3"),
    dict(attention_backend="triton", prefill_attention_backend="flashinfer"),
], ids=lambda b: "+".join(f"{k.split('_')[0]}={v}" for k, v in b.items()))
@pytest.mark.parametrize("env_value", [None, "1024", "junk"])
@pytest.mark.parametrize("deterministic", [True, False])
def test_alignment_matches_the_scheduler(monkeypatch, backends, env_value, deterministic):
    if env_value is not None:
        # Different values per variable, so reading the wrong one shows; "junk" is SGLang's parse fallback.
        monkeypatch.setenv(ALIGN_ENVS[0], env_value)
        monkeypatch.setenv(ALIGN_ENVS[1], env_value if env_value == "junk" else str(2 * int(env_value)))
    with published(enable_deterministic_inference=deterministic, **backends) as server_args:
        expected = scheduler_alignment(server_args)
        got = compat.deterministic_prefill_alignment(server_args)
    assert (None if got is None else got.tokens) == expected
    if got is not None:
        assert got.backend == compat.scheduler_prefill_backend(server_args)
        # The named variable is the one that moves the scheduler's value.
        monkeypatch.setenv(got.env_var, "768")
        with published(enable_deterministic_inference=deterministic, **backends) as server_args:
            assert scheduler_alignment(server_args) == 768


def test_flashinfer_is_aligned_on_every_release():
    # The README's guarantee depends on it: flashinfer is SGLang's deterministic prefill backend on every release.
    with published(attention_backend="flashinfer") as server_args:
        assert scheduler_alignment(server_args) == 4096
        assert compat.deterministic_prefill_alignment(server_args) == (
            4096, "SGLANG_FLASHINFER_PREFILL_SPLIT_TILE_SIZE", "flashinfer")


# --------------------------------------------------------------------------------------------------
# SGLang's PrefillAdder, round by round
# --------------------------------------------------------------------------------------------------


def _tree_cache(server_args, req_to_token_pool, allocator, chunked_prefill_size):
    """The tree cache SGLang's own factory builds for this configuration (ChunkCache / RadixCache /
    UnifiedRadixCache, depending on the release and on chunking)."""
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.registry import TreeCacheBuildContext, create_tree_cache

    disable = bool(server_args.disable_radix_cache)
    params = CacheInitParams(disable=disable, req_to_token_pool=req_to_token_pool,
                             token_to_kv_pool_allocator=allocator, page_size=1,
                             chunked_prefill_size=chunked_prefill_size)
    context = dict(server_args=server_args, params=params, is_hybrid_swa=False, is_hybrid_ssm=False,
                   enable_hierarchical_cache=False, disable_radix_cache=disable,
                   effective_chunked_prefill_size=chunked_prefill_size,  # 0.5.17 - 0.5.21 only
                   tp_worker=None, model_config=None, tp_size=1, tp_rank=0, tp_group=None)
    names = {f.name for f in dataclasses.fields(TreeCacheBuildContext)}
    return create_tree_cache(TreeCacheBuildContext(**{k: v for k, v in context.items() if k in names}))


def _extent(req):
    """This round's [start, end) of the request's prompt (0.5.17 - 0.5.21: extend_range; 0.5.22+: prefix_len /
    extend_end)."""
    if hasattr(req, "extend_range"):
        return req.extend_range.start, req.extend_range.end
    return req.prefix_len, req.extend_end


def schedule(queue, chunked_prefill_size, *, deterministic=True, rounds=12):
    """Run ``queue`` (``[(rid, prompt_len), ...]``, FCFS) through up to ``rounds`` scheduling rounds.

    Returns ``{rid: [(start, end), ...]}``: the prompt range each round prefilled for the request.
    """
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    # Scheduler.init_chunked_prefill: a size <= 0 turns chunking off.
    chunk = chunked_prefill_size if chunked_prefill_size > 0 else None
    pool_tokens = 2 * sum(n for _, n in queue) + 1024
    with published(attention_backend="flashinfer", enable_deterministic_inference=deterministic,
                   chunked_prefill_size=chunked_prefill_size) as server_args:
        align = scheduler_alignment(server_args)
        kv = MHATokenToKVPool(pool_tokens, 1, torch.float16, 1, 1, 1, "cpu", False)
        allocator = TokenToKVPoolAllocator(pool_tokens, torch.float16, "cpu", kv, False)
        req_to_token = ReqToTokenPool(len(queue) + 1, max(n for _, n in queue) + 64, "cpu", False)
        tree_cache = _tree_cache(server_args, req_to_token, allocator, chunk)
        scheduler = SimpleNamespace(tree_cache=tree_cache, disaggregation_mode=DisaggregationMode.NULL)
        model_config = SimpleNamespace(vocab_size=1 << 16, is_encoder_decoder=False, is_multimodal=False)

        waiting = []
        for i, (rid, n) in enumerate(queue):
            params = SamplingParams(max_new_tokens=8)
            params.normalize(None)
            waiting.append(Req(rid, "", array("q", [(1000 * i + t) % 30000 for t in range(n)]), params))
        done = {rid: [] for rid, _ in queue}
        chunked = None
        for _ in range(rounds):
            if chunked is not None:
                Scheduler.stash_chunked_request(scheduler, chunked)  # the previous chunk's KV becomes its prefix
            adder = PrefillAdder(1, tree_cache, allocator, None, 1.0, MAX_PREFILL_TOKENS, chunk)
            if chunked is not None:
                chunked.init_next_round_input()
                chunked = adder.add_chunked_req(chunked)
            for req in waiting:
                req.init_next_round_input(tree_cache)
                if adder.add_one_req(req, has_chunked_req=chunked is not None,
                                     truncation_align_size=align) != AddReqResult.CONTINUE:
                    break
            waiting = [r for r in waiting if r not in adder.can_run_list]
            if adder.new_chunked_req is not None:
                chunked = adder.new_chunked_req
            if not adder.can_run_list:
                continue
            for req in adder.can_run_list:
                done[req.rid].append(_extent(req))
            if chunked is not None:
                chunked.inflight_middle_chunks += 1
            ScheduleBatch.init_new(adder.can_run_list, req_to_token, allocator, tree_cache, model_config, False,
                                   SpeculativeAlgorithm.NONE, chunked_req=chunked).prepare_for_extend()
            if chunked is not None:
                chunked.inflight_middle_chunks -= 1  # process_batch_result_prefill's bookkeeping
            if not waiting and chunked is None:
                break
    return done


def boundaries(extents):
    """Offsets where a prompt was split (chunk ends before the prompt's end)."""
    return [end for _, end in extents[:-1]]


def assert_complete(extents, prompt_len):
    """The request was prefilled exactly once, contiguously, to its end."""
    assert extents, "never scheduled"
    assert extents[0][0] == 0 and extents[-1][1] == prompt_len
    assert all(a[1] == b[0] for a, b in zip(extents, extents[1:])), extents


def test_a_chunk_below_the_alignment_never_schedules_a_longer_prompt_and_blocks_the_queue():
    """--chunked-prefill-size 64 with the 4096 alignment: the H200 hang, on the real PrefillAdder."""
    long_prompt = 1000
    got = schedule([("long", long_prompt), ("short", 10)], 64, rounds=40)
    assert got == {"long": [], "short": []}
    # Without deterministic inference (no alignment) the same queue is served in 64-token chunks.
    free = schedule([("long", long_prompt), ("short", 10)], 64, deterministic=False, rounds=40)
    assert_complete(free["long"], long_prompt)
    assert boundaries(free["long"]) == list(range(64, long_prompt, 64))
    assert free["short"] == [(0, 10)]


@pytest.mark.parametrize("chunk", [4096, 8192])
def test_a_multiple_of_the_alignment_completes_the_queue_on_aligned_boundaries(chunk):
    alone = schedule([("long", LONG)], chunk)
    queued = schedule([("short", SHORT), ("long", LONG)], chunk)
    assert_complete(alone["long"], LONG)
    assert_complete(queued["long"], LONG)
    assert queued["short"] == [(0, SHORT)]
    for extents in (alone["long"], queued["long"]):
        assert all(b % 4096 == 0 for b in boundaries(extents)), extents
    # Alone, every chunk is full; behind the short request the first chunk gets what is left of the round's
    # budget cut to a multiple of 4096 (nothing: it waits for the next round) -- aligned either way, but not
    # the same offsets once chunk > 4096.
    first_queued = (chunk - SHORT) // 4096 * 4096 or chunk
    assert boundaries(alone["long"]) == list(range(chunk, LONG, chunk))
    assert boundaries(queued["long"]) == list(range(first_queued, LONG, chunk))


@pytest.mark.parametrize("chunk, short", [(5000, SHORT), (10000, 2000)])
def test_a_non_multiple_splits_prompts_off_the_alignment(chunk, short):
    """Why non-multiples are refused: follow-on chunks (add_chunked_req) skip the alignment. From twice the
    alignment on, the first cut, hence every later offset, also depends on what shared the first round."""
    alone = schedule([("long", LONG)], chunk)
    queued = schedule([("short", short), ("long", LONG)], chunk)
    assert_complete(alone["long"], LONG)
    assert_complete(queued["long"], LONG)
    first_alone = chunk // 4096 * 4096
    first_queued = (chunk - short) // 4096 * 4096 or first_alone
    assert boundaries(alone["long"]) == list(range(first_alone, LONG, chunk))
    assert boundaries(queued["long"]) == list(range(first_queued, LONG, chunk))
    assert any(b % 4096 for b in boundaries(alone["long"]))
    assert (boundaries(alone["long"]) != boundaries(queued["long"])) == (chunk >= 2 * 4096)


def test_chunking_off_serves_a_prompt_longer_than_max_prefill_tokens():
    """-1: a prompt above --max-prefill-tokens is still prefilled whole, in a round of its own."""
    alone = schedule([("long", LONG)], -1)
    queued = schedule([("short", SHORT), ("long", LONG), ("after", SHORT)], -1)
    assert alone == {"long": [(0, LONG)]}
    assert queued["short"] == [(0, SHORT)] and queued["long"] == [(0, LONG)] and queued["after"] == [(0, SHORT)]


def test_upstream_scheduler_guard_catches_short_chunks_only():
    """0.5.22+ raise at scheduler init for a chunk below the alignment (0.5.17 - 0.5.21 hang instead); no
    release refuses a larger non-multiple, which is why the plugin refuses at startup on every release."""
    check = getattr(Scheduler, "check_truncation_align_fits_chunk", None)
    if check is None:
        pytest.skip("this SGLang release has no scheduler-init guard (it hangs on the first long prompt)")
    with published(attention_backend="flashinfer") as server_args:
        align = scheduler_alignment(server_args)
    scheduler = SimpleNamespace(truncation_align_size=align, chunked_prefill_size=64, disaggregation_mode=None)
    with published(attention_backend="flashinfer"), pytest.raises(ValueError, match="aligned to 4096"):
        check(scheduler)
    scheduler.chunked_prefill_size = 5000
    with published(attention_backend="flashinfer"):
        assert check(scheduler) is None
