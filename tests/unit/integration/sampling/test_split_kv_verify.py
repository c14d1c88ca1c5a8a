"""The split-KV verify kernel inside SGLang's real Triton backend (CPU, Triton interpreter, SGLang's own
``forward_extend`` and one-stage extend kernel), and ``SGLANG_DETSPEC_SPLIT_KV_VERIFY`` (default: the kernel where it
can serve the model; ``1``: the kernel or a refusal; ``0``: SGLang's kernel).

A verify forward of a topk-1 chain through upstream's ``forward_extend`` in deterministic mode, first as upstream runs
it (its unified kernel with the chain's custom mask), then with the kernel installed: the outputs must agree to
float16 rounding (another summation order, so not bit for bit), the K/V written must be identical, a request's rows
must be the same bits alone and beside another request, and prefill forwards must still run upstream's kernel.
Control: a custom mask that hides each draft's own key changes upstream's output beyond that tolerance, so the
comparison can see a mask the kernel gets wrong. The CUDA kernel's own numbers, graph replay and a real model are
checked on the GPU (tests/e2e/test_e2e_split_kv_verify.py, scripts/bench/bench_verify_attention.py).
"""

import dataclasses
import types

import pytest
import torch

triton_backend = pytest.importorskip("sglang.srt.layers.attention.triton_backend")
from test_verify_attention import HEAD_DIM, HEADS, KV_HEADS, _backend, _empty_metadata, _Pool  # noqa: E402
from test_verify_attention import _layer as _decode_layer  # noqa: E402

from sglang.kernels.ops.attention.extend_attention import (  # noqa: E402
    build_unified_kv_indices,
    extend_attention_fwd_unified,
)
from sglang.srt.layers.radix_attention import AttentionType  # noqa: E402

from sglang_detspec.integration.sampling import split_kv_verify  # noqa: E402

STEPS_PLUS_ONE = 4
SPLIT_TILE = 16
MAX_CONTEXT = 128


def _mode(verify: bool, draft_extend: bool = False):
    return types.SimpleNamespace(is_target_verify=lambda: verify, is_draft_extend_v2=lambda: draft_extend,
                                 is_decode=lambda: False)


def _layer(layer_id):
    layer = _decode_layer(layer_id)
    layer.__dict__.update(is_cross_attention=False, attn_type=AttentionType.DECODER)
    return layer


def _real_backend(pool, req_to_token):
    backend = _backend(pool, req_to_token)
    backend.__dict__.update(
        split_tile_size=SPLIT_TILE, max_context_len=MAX_CONTEXT, max_kv_splits=MAX_CONTEXT // SPLIT_TILE,
        extend_attention_fwd_unified=extend_attention_fwd_unified, build_unified_kv_indices=build_unified_kv_indices,
        allow_bidirectional_attention_in_extend=False, device=torch.device("cpu"),
        use_dense_fp8_chunked_prefill=False,  # 0.5.23
    )
    return backend


def _chain_mask(prefix_lens, hide_own_key=False):
    """Upstream's custom mask of a topk-1 chain: row j sees the prefix and drafts 0..j (0..j-1 with the control)."""
    parts = []
    for prefix in prefix_lens:
        kv_len = prefix + STEPS_PLUS_ONE
        seen = torch.arange(kv_len)[None, :] < (prefix + torch.arange(STEPS_PLUS_ONE) + 1)[:, None]
        if hide_own_key:
            seen[torch.arange(1, STEPS_PLUS_ONE), prefix + torch.arange(1, STEPS_PLUS_ONE)] = False
        parts.append(seen.reshape(-1))
    mask = torch.cat(parts)
    indptr = torch.zeros(len(prefix_lens) + 1, dtype=torch.int64)
    indptr[1:] = torch.cumsum(torch.tensor([(p + STEPS_PLUS_ONE) * STEPS_PLUS_ONE for p in prefix_lens]), 0)
    return mask, indptr


def _verify_forward(scene, backend, hide_own_key=False):
    """Upstream's TARGET_VERIFY metadata for the scene's batch, and one layer's forward_extend."""
    prefix_lens, reqs = scene["seq_lens"], scene["reqs"]
    bs = len(prefix_lens)
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(torch.tensor(prefix_lens, dtype=torch.int32), 0)
    kv_indices = torch.cat([scene["req_to_token"][r, :n] for r, n in zip(reqs, prefix_lens)]).to(torch.int64)
    mask, mask_indptr = _chain_mask(prefix_lens, hide_own_key)
    backend.forward_metadata = dataclasses.replace(
        _empty_metadata(), kv_indptr=kv_indptr, kv_indices=kv_indices,
        qo_indptr=torch.arange(0, (bs + 1) * STEPS_PLUS_ONE, STEPS_PLUS_ONE, dtype=torch.int32),
        custom_mask=mask, mask_indptr=mask_indptr, max_extend_len=STEPS_PLUS_ONE,
    )
    seq_lens = torch.tensor(prefix_lens, dtype=torch.int64)
    batch = types.SimpleNamespace(
        forward_mode=_mode(True), batch_size=bs, seq_lens=seq_lens, seq_lens_cpu=seq_lens,
        req_pool_indices=torch.tensor(reqs), out_cache_loc=scene["out_cache_loc"], extend_seq_lens=None,
        extend_start_loc=None, extend_prefix_lens=None, positions=None, mha_one_shot=False,  # 0.5.23
        attn_attend_prefix_cache=None,
        spec_info=types.SimpleNamespace(draft_token_num=STEPS_PLUS_ONE), out_cache_loc_is_physical=True,
    )
    return backend.forward_extend(scene["q"], scene["k"], scene["v"], _layer(0), batch)


def _draft_extend_forward(scene, backend):
    """Upstream's DRAFT_EXTEND_V2 metadata for the scene's batch (the draft re-reads the verified chain: the same
    tokens per request, causal over its prefix, no mask; ``seq_lens`` count the chain, as upstream's prepare sets
    them), and one layer's forward_extend."""
    prefix_lens, reqs = scene["seq_lens"], scene["reqs"]
    bs = len(prefix_lens)
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(torch.tensor(prefix_lens, dtype=torch.int32), 0)
    kv_indices = torch.cat([scene["req_to_token"][r, :n] for r, n in zip(reqs, prefix_lens)]).to(torch.int64)
    backend.forward_metadata = dataclasses.replace(
        _empty_metadata(), kv_indptr=kv_indptr, kv_indices=kv_indices,
        qo_indptr=torch.arange(0, (bs + 1) * STEPS_PLUS_ONE, STEPS_PLUS_ONE, dtype=torch.int32),
        custom_mask=None, mask_indptr=None, max_extend_len=STEPS_PLUS_ONE,
    )
    seq_lens = torch.tensor(prefix_lens, dtype=torch.int64) + STEPS_PLUS_ONE
    extend_seq_lens = torch.full((bs,), STEPS_PLUS_ONE, dtype=torch.int32)
    batch = types.SimpleNamespace(
        forward_mode=_mode(False, draft_extend=True), batch_size=bs, seq_lens=seq_lens, seq_lens_cpu=seq_lens,
        req_pool_indices=torch.tensor(reqs), out_cache_loc=scene["out_cache_loc"], extend_seq_lens=extend_seq_lens,
        extend_start_loc=None, extend_prefix_lens=torch.tensor(prefix_lens, dtype=torch.int32), positions=None,
        mha_one_shot=False, attn_attend_prefix_cache=None, spec_info=None, out_cache_loc_is_physical=True,
    )
    return backend.forward_extend(scene["q"], scene["k"], scene["v"], _layer(0), batch)


def _runner(backend, **extra):
    return types.SimpleNamespace(attn_backend=backend, decode_attn_backend=None, decode_attn_backend_group=[], **extra)


def _install(backend, required=True):
    return split_kv_verify.install_split_kv_verify(_runner(backend), required=required)


#: (prefix lens, request pool rows): prefixes spanning several 16-key tiles, out of pool order; one request alone.
BATCHES = {"two_requests": ([45, 13], [2, 0]), "one_request": ([45], [2])}


def _scene(name, seed=20261207):
    generator = torch.Generator().manual_seed(seed)
    seq_lens, reqs = BATCHES[name]
    req_to_token = torch.randperm(4 * MAX_CONTEXT, generator=generator).to(torch.int32).reshape(4, MAX_CONTEXT)
    rows = len(seq_lens) * STEPS_PLUS_ONE
    out_cache_loc = torch.cat([req_to_token[r, n: n + STEPS_PLUS_ONE] for r, n in zip(reqs, seq_lens)]).long()
    return dict(
        seq_lens=seq_lens, reqs=reqs, req_to_token=req_to_token, out_cache_loc=out_cache_loc,
        pool=_Pool(4 * MAX_CONTEXT, layers=1, generator=generator),
        q=torch.randn(rows, HEADS * HEAD_DIM, generator=generator).half(),
        k=torch.randn(rows, KV_HEADS * HEAD_DIM, generator=generator).half(),
        v=torch.randn(rows, KV_HEADS * HEAD_DIM, generator=generator).half(),
    )


@pytest.fixture(params=list(BATCHES))
def scene(request):
    return _scene(request.param)


def _run(scene, install, hide_own_key=False):
    pool = scene["pool"].clone()
    backend = _real_backend(pool, scene["req_to_token"])
    if install:
        _install(backend)
    return _verify_forward(scene, backend, hide_own_key).clone(), pool


def test_matches_upstreams_verify_and_writes_the_same_cache(scene):
    want, want_pool = _run(scene, install=False)
    got, pool = _run(scene, install=True)
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-3, atol=2e-3)
    assert torch.equal(pool.k[0], want_pool.k[0]) and torch.equal(pool.v[0], want_pool.v[0])


def test_control_a_wrong_mask_is_seen():
    scene = _scene("two_requests")
    want, _ = _run(scene, install=False)
    wrong, _ = _run(scene, install=False, hide_own_key=True)
    assert (wrong.float() - want.float()).abs().max() > 2e-2


def _draft_worker(backend, **runner_extra):
    return types.SimpleNamespace(draft_runner=types.SimpleNamespace(attn_backend=backend, **runner_extra),
                                 draft_extend_attn_backend=backend)


def _run_draft_extend(scene, install):
    pool = scene["pool"].clone()
    backend = _real_backend(pool, scene["req_to_token"])
    if install:
        assert split_kv_verify.install_split_kv_draft_extend(_draft_worker(backend)) == [backend]
    return _draft_extend_forward(scene, backend).clone(), pool


def test_the_draft_extend_matches_upstreams_and_writes_the_same_cache(scene, monkeypatch):
    want, want_pool = _run_draft_extend(scene, install=False)
    ran = []
    kernel = split_kv_verify.split_kv_verify_attention
    monkeypatch.setattr(split_kv_verify, "split_kv_verify_attention", lambda *a, **k: ran.append(1) or kernel(*a, **k))
    got, pool = _run_draft_extend(scene, install=True)
    assert ran == [1]
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-3, atol=2e-3)
    assert torch.equal(pool.k[0], want_pool.k[0]) and torch.equal(pool.v[0], want_pool.v[0])
    # Control: the verify's backend leaves a draft extend to upstream's kernel, bit for bit.
    pool = scene["pool"].clone()
    verify_backend = _real_backend(pool, scene["req_to_token"])
    _install(verify_backend)
    assert torch.equal(_draft_extend_forward(scene, verify_backend), want)


@pytest.mark.parametrize("forward", ["verify", "draft_extend"])
def test_a_request_gives_the_same_bits_alone_and_beside_another(forward):
    run = {"verify": _run, "draft_extend": _run_draft_extend}[forward]
    scene = _scene("two_requests")
    together, _ = run(scene, install=True)
    first = slice(0, STEPS_PLUS_ONE)
    alone_scene = dict(scene, seq_lens=scene["seq_lens"][:1], reqs=scene["reqs"][:1],
                       out_cache_loc=scene["out_cache_loc"][first], q=scene["q"][first], k=scene["k"][first],
                       v=scene["v"][first])
    alone, _ = run(alone_scene, install=True)
    assert torch.equal(alone, together[:STEPS_PLUS_ONE])


def test_the_draft_extends_backend_leaves_verifies_to_upstream_and_refuses_a_masked_extend(scene):
    backend = _real_backend(scene["pool"].clone(), scene["req_to_token"])
    calls = []
    backend.extend_attention_fwd_unified = lambda *args, **kwargs: calls.append(kwargs["custom_mask"])
    split_kv_verify.install_split_kv_draft_extend(_draft_worker(backend))
    _verify_forward(scene, backend)  # a verify batch on the draft's backend: not what it serves
    assert len(calls) == 1 and calls[0] is not None
    backend.__dict__[split_kv_verify._VERIFY_BATCH_ATTR] = types.SimpleNamespace()  # a draft extend is running
    with pytest.raises(RuntimeError, match="SPLIT_KV_DRAFT_EXTEND=1 cannot serve this draft's extend: a draft extend "
                                           "layer uses a custom mask"):
        backend.extend_attention_fwd_unified(*range(11), custom_mask="mask")
    assert len(calls) == 1


def test_one_backend_cannot_serve_both_the_verify_and_the_draft_extend(scene):
    backend = _real_backend(scene["pool"], scene["req_to_token"])
    _install(backend)
    with pytest.raises(RuntimeError, match="serves both the target's verify and the draft's extend"):
        split_kv_verify.install_split_kv_draft_extend(_draft_worker(backend))


def test_the_draft_extend_backends_of_single_and_multi_layer_drafts():
    first, second, eager = object(), object(), object()
    single = types.SimpleNamespace(draft_runner=types.SimpleNamespace(attn_backend=first),
                                   draft_extend_attn_backend=first)
    assert split_kv_verify.draft_extend_backends(single) == (single.draft_runner, [first])
    no_extend_backend = types.SimpleNamespace(draft_runner=types.SimpleNamespace(attn_backend=eager),
                                              draft_extend_attn_backend=None)
    assert split_kv_verify.draft_extend_backends(no_extend_backend)[1] == [eager]
    runners = [types.SimpleNamespace(attn_backend=first), types.SimpleNamespace(attn_backend=second)]
    multi = types.SimpleNamespace(draft_runner_list=runners, draft_extend_attn_backend_list=[first, second])
    assert split_kv_verify.draft_extend_backends(multi) == (runners[0], [first, second])


def test_a_draft_the_kernel_cannot_serve_is_refused(scene):
    backend = _real_backend(scene["pool"], scene["req_to_token"])
    backend.use_mla = True
    with pytest.raises(RuntimeError, match="cannot serve this draft's extend: the model uses multi-head latent"):
        split_kv_verify.install_split_kv_draft_extend(_draft_worker(backend))
    assert split_kv_verify._ORIGINALS_ATTR not in backend.__dict__


def test_outside_a_verify_the_unified_kernel_is_upstreams(scene):
    """Prefill and draft extend call the unified kernel with no verify batch noted: upstream's kernel runs."""
    backend = _real_backend(scene["pool"].clone(), scene["req_to_token"])
    calls = []
    backend.extend_attention_fwd_unified = lambda *args, **kwargs: calls.append((args, kwargs))
    _install(backend)
    _install(backend)  # idempotent: wraps once
    backend.extend_attention_fwd_unified(*range(11), custom_mask="mask")
    assert len(calls) == 1 and calls[0][0] == tuple(range(11)) and calls[0][1]["custom_mask"] == "mask"


#: What the kernel cannot serve: the backend's change, the reason its refusal and the default's log line must name, and
#: the flag the refusal must offer (None: only the variable's way out).
BLOCKERS = [
    (dict(enable_deterministic=False), "not in deterministic mode", "Pass --enable-deterministic-inference"),
    (dict(use_mla=True), "multi-head latent attention", None),
    (dict(sliding_window_size=4), "sliding-window layers", None),
    (dict(page_size=16), "pages of 16 tokens", "Pass --page-size 1"),
    (dict(dcp_size=2), "decode context parallelism", "Drop --dcp-size"),
]
WAY_OUT = "unset SGLANG_DETSPEC_SPLIT_KV_VERIFY (SGLang's kernel where the split-KV kernel cannot serve) or set it to 0."


@pytest.mark.parametrize("change, reason, flag", BLOCKERS)
def test_asked_for_it_refuses_backends_it_cannot_serve(scene, change, reason, flag):
    backend = _real_backend(scene["pool"], scene["req_to_token"])
    backend.__dict__.update(change)
    with pytest.raises(RuntimeError, match=reason) as refused:
        _install(backend)
    assert "forward_extend" not in backend.__dict__
    message = str(refused.value)
    assert message.startswith("SGLANG_DETSPEC_SPLIT_KV_VERIFY=1 cannot serve")
    assert message.lower().endswith(WAY_OUT.lower())
    assert flag is None or f"{flag}, or unset" in message


@pytest.mark.parametrize("change, reason, flag", BLOCKERS)
def test_by_default_backends_it_cannot_serve_keep_sglangs_kernel_and_the_log_says_why(scene, change, reason, flag,
                                                                                        caplog):
    backend = _real_backend(scene["pool"], scene["req_to_token"])
    backend.__dict__.update(change)
    with caplog.at_level("INFO", logger=split_kv_verify.__name__):
        assert _install(backend, required=False) == []
    assert "forward_extend" not in backend.__dict__
    assert any(split_kv_verify.NOT_INSTALLED_LOG in r.message and reason in r.message for r in caplog.records), \
        caplog.text


def test_by_default_a_servable_backend_gets_the_kernel_and_the_log_says_so(scene, caplog):
    backend = _real_backend(scene["pool"], scene["req_to_token"])
    with caplog.at_level("INFO", logger=split_kv_verify.__name__):
        assert _install(backend, required=False) == [backend]
    assert split_kv_verify.INSTALLED_LOG in caplog.text and "SGLANG_DETSPEC_SPLIT_KV_VERIFY=0 turns it off" in caplog.text


def test_refuses_a_quantised_kv_cache_when_asked_and_keeps_sglangs_kernel_by_default(scene):
    backend = _real_backend(scene["pool"], scene["req_to_token"])
    runner = _runner(backend, kv_cache_dtype=torch.float8_e4m3fn)
    with pytest.raises(RuntimeError, match="holds torch.float8_e4m3fn.*Drop --kv-cache-dtype"):
        split_kv_verify.install_split_kv_verify(runner, required=True)
    assert split_kv_verify.install_split_kv_verify(runner, required=False) == []
    assert "forward_extend" not in backend.__dict__
    runner.kv_cache_dtype = torch.bfloat16
    assert split_kv_verify.install_split_kv_verify(runner, required=True) == [backend]


def test_refuses_a_non_triton_backend():
    runner = types.SimpleNamespace(attn_backend=object(), decode_attn_backend=None, decode_attn_backend_group=[])
    with pytest.raises(RuntimeError, match="--attention-backend triton"):
        split_kv_verify.install_split_kv_verify(runner, required=True)
    assert split_kv_verify.install_split_kv_verify(runner, required=False) == []


@pytest.mark.parametrize("required", [True, False])
def test_a_verify_layer_with_what_the_kernel_does_not_apply(scene, required, monkeypatch):
    """Attention sinks are seen only when a layer's verify runs: refused when asked for; by default that layer runs
    SGLang's kernel at every verify, and a layer without them still runs the plugin's."""
    backend = _real_backend(scene["pool"].clone(), scene["req_to_token"])
    calls = []
    backend.extend_attention_fwd_unified = lambda *args, **kwargs: calls.append(kwargs["sinks"])
    _install(backend, required=required)
    backend.__dict__[split_kv_verify._VERIFY_BATCH_ATTR] = types.SimpleNamespace()  # a verify forward is running
    if required:
        with pytest.raises(RuntimeError, match="attention sinks"):
            backend.extend_attention_fwd_unified(*range(11), sinks="sinks")
        assert calls == []
    else:
        backend.extend_attention_fwd_unified(*range(11), sinks="sinks")
        backend.extend_attention_fwd_unified(*range(11), sinks="sinks")
        assert calls == ["sinks", "sinks"]
        ran = []
        monkeypatch.setattr(split_kv_verify, "split_kv_verify_attention", lambda *args, **kwargs: ran.append(1))
        verify = _verify_forward(scene, backend)  # a layer without sinks: the plugin's kernel
        assert ran and calls == ["sinks", "sinks"] and verify is not None


# ---------------------------------------------------------------------------------------------------------------
# The switch: strict values, never beside the decode-order verify, never under the invariant algorithms


def test_the_switch_is_strict_and_yields_to_the_decode_order_verify():
    from sglang_detspec.integration.setup.split_kv_verify_switch import AUTO, OFF, ON, split_kv_verify_setting

    assert split_kv_verify_setting({}) == AUTO
    assert split_kv_verify_setting({"SGLANG_DETSPEC_SPLIT_KV_VERIFY": ""}) == AUTO
    assert split_kv_verify_setting({"SGLANG_DETSPEC_SPLIT_KV_VERIFY": "0"}) == OFF
    assert split_kv_verify_setting({"SGLANG_DETSPEC_SPLIT_KV_VERIFY": "1"}) == ON
    assert split_kv_verify_setting({"SGLANG_DETSPEC_DECODE_ORDER_VERIFY": "1"}) == OFF
    with pytest.raises(Exception, match="SGLANG_DETSPEC_SPLIT_KV_VERIFY='on'.*Use '1'"):
        split_kv_verify_setting({"SGLANG_DETSPEC_SPLIT_KV_VERIFY": "on"})
    with pytest.raises(Exception, match="cannot be combined: both replace the verify's attention kernel"):
        split_kv_verify_setting({"SGLANG_DETSPEC_SPLIT_KV_VERIFY": "1", "SGLANG_DETSPEC_DECODE_ORDER_VERIFY": "1"})


def _worker_with(backend, draft_backend=None):
    from sglang_detspec.integration.workers.spec_worker_base import DetspecSpecWorker

    class Worker(DetspecSpecWorker, type("Upstream", (), {"init_attention_backends": lambda self: None})):
        pass

    worker = object.__new__(Worker)
    worker.target_worker = types.SimpleNamespace(model_runner=_runner(backend))
    worker.draft_worker = _draft_worker(draft_backend or _real_backend(backend.token_to_kv_pool, backend.req_to_token))
    return worker


def _install_under(scene, monkeypatch, which_scheme, verify="", draft_extend=""):
    """The target's and the draft's backends after the spec worker's ``init_attention_backends`` with the two switches
    at ``verify`` / ``draft_extend`` under ``which_scheme``."""
    from sglang_detspec.integration.sampling import scheme

    monkeypatch.setenv("SGLANG_DETSPEC_SPLIT_KV_VERIFY", verify)
    monkeypatch.setenv("SGLANG_DETSPEC_SPLIT_KV_DRAFT_EXTEND", draft_extend)
    monkeypatch.delenv("SGLANG_DETSPEC_DECODE_ORDER_VERIFY", raising=False)
    backend = _real_backend(scene["pool"], scene["req_to_token"])
    draft_backend = _real_backend(scene["pool"], scene["req_to_token"])
    with scheme.selected(which_scheme):
        _worker_with(backend, draft_backend).init_attention_backends()
    return backend, draft_backend


@pytest.mark.parametrize("value, installed", [("1", True), ("0", False), ("", True)])
def test_detspec_eagle_installs_the_kernel_unless_turned_off(scene, monkeypatch, value, installed):
    from sglang_detspec.integration.sampling import scheme

    backend, draft_backend = _install_under(scene, monkeypatch, scheme.REJECTION, verify=value)
    assert (split_kv_verify._ORIGINALS_ATTR in backend.__dict__) is installed
    assert split_kv_verify._ORIGINALS_ATTR not in draft_backend.__dict__  # the draft extend is opt-in


@pytest.mark.parametrize("which_scheme", ["rejection", "coupled"])
@pytest.mark.parametrize("verify", ["0", ""])
@pytest.mark.parametrize("draft_extend, installed", [("1", True), ("0", False), ("", False)])
def test_the_draft_extend_kernel_runs_only_when_asked_under_either_scheme(scene, monkeypatch, caplog, which_scheme,
                                                                         verify, draft_extend, installed):
    from sglang_detspec.integration.sampling import scheme

    chosen = {"rejection": scheme.REJECTION, "coupled": scheme.COUPLED}[which_scheme]
    with caplog.at_level("INFO"):
        _, draft_backend = _install_under(scene, monkeypatch, chosen, verify=verify, draft_extend=draft_extend)
    assert draft_backend.__dict__.get(split_kv_verify._SERVES_ATTR) == (split_kv_verify.DRAFT_EXTEND if installed
                                                                       else None)
    if installed:
        assert "asked for by SGLANG_DETSPEC_SPLIT_KV_DRAFT_EXTEND=1" in caplog.text
    else:
        assert f"{split_kv_verify.DRAFT_NOT_INSTALLED_LOG} (the default; SGLANG_DETSPEC_SPLIT_KV_DRAFT_EXTEND=1" in caplog.text


def test_the_draft_extend_switch_is_strict():
    from sglang_detspec.integration.setup.split_kv_draft_extend_switch import split_kv_draft_extend_wanted

    assert split_kv_draft_extend_wanted({}) is False
    assert split_kv_draft_extend_wanted({"SGLANG_DETSPEC_SPLIT_KV_DRAFT_EXTEND": "0"}) is False
    assert split_kv_draft_extend_wanted({"SGLANG_DETSPEC_SPLIT_KV_DRAFT_EXTEND": "1"}) is True
    with pytest.raises(Exception, match="SGLANG_DETSPEC_SPLIT_KV_DRAFT_EXTEND='yes'.*Use '1'"):
        split_kv_draft_extend_wanted({"SGLANG_DETSPEC_SPLIT_KV_DRAFT_EXTEND": "yes"})


def test_an_opted_in_draft_the_kernel_cannot_serve_is_refused_at_start(scene, monkeypatch):
    from sglang_detspec.integration.sampling import scheme

    monkeypatch.setenv("SGLANG_DETSPEC_SPLIT_KV_DRAFT_EXTEND", "1")
    backend = _real_backend(scene["pool"], scene["req_to_token"])
    draft_backend = _real_backend(scene["pool"], scene["req_to_token"])
    draft_backend.page_size = 16
    with scheme.selected(scheme.REJECTION), pytest.raises(RuntimeError) as refused:
        _worker_with(backend, draft_backend).init_attention_backends()
    message = str(refused.value)
    assert message.startswith("SGLANG_DETSPEC_SPLIT_KV_DRAFT_EXTEND=1 cannot serve this draft's extend: the KV cache "
                              "has pages of 16 tokens")
    assert message.endswith("Pass --page-size 1, or unset SGLANG_DETSPEC_SPLIT_KV_DRAFT_EXTEND (SGLang's kernel for the "
                            "draft extend).")


@pytest.mark.parametrize("value", ["1", ""])
def test_detspec_eagle_on_mla_is_refused_when_asked_and_served_by_default(scene, monkeypatch, value):
    from sglang_detspec.integration.sampling import scheme

    monkeypatch.setenv("SGLANG_DETSPEC_SPLIT_KV_VERIFY", value)
    monkeypatch.delenv("SGLANG_DETSPEC_DECODE_ORDER_VERIFY", raising=False)
    backend = _real_backend(scene["pool"], scene["req_to_token"])
    backend.use_mla = True
    with scheme.selected(scheme.REJECTION):
        if value == "1":
            with pytest.raises(RuntimeError, match="multi-head latent attention"):
                _worker_with(backend).init_attention_backends()
        else:
            _worker_with(backend).init_attention_backends()
    assert split_kv_verify._ORIGINALS_ATTR not in backend.__dict__


def test_the_decode_order_verify_wins_over_the_default(scene, monkeypatch):
    from sglang_detspec.integration.sampling import scheme, verify_attention

    monkeypatch.delenv("SGLANG_DETSPEC_SPLIT_KV_VERIFY", raising=False)
    monkeypatch.setenv("SGLANG_DETSPEC_DECODE_ORDER_VERIFY", "1")
    backend = _real_backend(scene["pool"], scene["req_to_token"])
    worker = _worker_with(backend)
    with scheme.selected(scheme.REJECTION):
        worker.init_attention_backends()
    assert split_kv_verify._ORIGINALS_ATTR not in backend.__dict__
    assert verify_attention._PATCHED_ATTR in backend.__dict__
    assert split_kv_verify._ORIGINALS_ATTR not in worker.draft_worker.draft_extend_attn_backend.__dict__
