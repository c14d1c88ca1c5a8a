"""The invariant verify's attention, in decode order, against SGLang's own decode of each token (CPU, Triton
interpreter, SGLang's real ``TritonAttnBackend.forward_decode`` / ``get_num_kv_splits`` and decode kernel).

The reference is what a non-speculative server computes: one decode forward per token, each with its own batch, the
token's K/V written first. The verify under test runs ``B x (steps + 1)`` query rows in one forward. Its outputs
and the K/V it writes must be bit-identical to the reference's. A split tile of 8 keys makes the short test
sequences span several splits, so the log-sum-exp merge runs as it does on long prompts. Control: rows that miss
their own key (length ``seq_lens + j``) must differ from the reference, so the comparison can see an off-by-one.
What the CPU cannot show (the CUDA kernel's own summation order, graph replay, a real model) is checked by the
GPU end-to-end test tests/e2e/test_e2e_invariant.py.
"""

import dataclasses
import types

import pytest
import torch

triton_backend = pytest.importorskip("sglang.srt.layers.attention.triton_backend")
from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd  # noqa: E402

from sglang_detspec.integration.sampling import verify_attention  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 32
SPLIT_TILE = 8
MAX_CONTEXT = 64
STEPS_PLUS_ONE = 3


class _Pool:
    def __init__(self, slots: int, layers: int, generator: torch.Generator):
        shape = (slots, KV_HEADS, HEAD_DIM)
        self.k = [torch.randn(shape, generator=generator).half() for _ in range(layers)]
        self.v = [torch.randn(shape, generator=generator).half() for _ in range(layers)]

    def clone(self) -> "_Pool":
        copy = object.__new__(_Pool)
        copy.k, copy.v = [t.clone() for t in self.k], [t.clone() for t in self.v]
        return copy

    def get_key_buffer(self, layer_id):
        return self.k[layer_id]

    def get_value_buffer(self, layer_id):
        return self.v[layer_id]

    def set_kv_buffer(self, layer, loc, k, v, *scales, **kwargs):
        loc = getattr(loc, "loc", loc)
        self.k[layer.layer_id][loc] = k.view(-1, KV_HEADS, HEAD_DIM).to(self.k[layer.layer_id].dtype)
        self.v[layer.layer_id][loc] = v.view(-1, KV_HEADS, HEAD_DIM).to(self.v[layer.layer_id].dtype)


def _layer(layer_id: int):
    return types.SimpleNamespace(
        layer_id=layer_id, tp_q_head_num=HEADS, tp_k_head_num=KV_HEADS, qk_head_dim=HEAD_DIM, v_head_dim=HEAD_DIM,
        scaling=HEAD_DIM**-0.5, logit_capping_method="tanh", logit_cap=0.0, k_scale=None, v_scale=None,
        xai_temperature_len=-1, sliding_window_size=-1,
    )


def _empty_metadata():
    fields = dataclasses.fields(triton_backend.ForwardMetadata)
    return triton_backend.ForwardMetadata(**{f.name: None for f in fields})


def _backend(pool: _Pool, req_to_token: torch.Tensor):
    """SGLang's TritonAttnBackend without its constructor (which needs a model runner), deterministic mode."""
    backend = object.__new__(triton_backend.TritonAttnBackend)
    backend.__dict__.update(
        token_to_kv_pool=pool, req_to_token=req_to_token, forward_metadata=_empty_metadata(),
        decode_attention_fwd=decode_attention_fwd, use_mla=False, dcp_size=1, dcp_rank=0, page_size=1,
        swa_v_head_dim=None, use_pdl=False, enable_deterministic=True, enable_lean_attention=False,
        is_draft_runner=False, split_tile_size=SPLIT_TILE, static_kv_splits=False, device_core_count=0,
        num_head=HEADS, num_kv_head=KV_HEADS, v_head_dim=HEAD_DIM, max_context_len=MAX_CONTEXT,
        max_kv_splits=MAX_CONTEXT // SPLIT_TILE, sliding_window_size=None, kv_index_translator=None,
        _translate_kv_loc=None,
    )
    return backend


def _mode(verify: bool):
    return types.SimpleNamespace(is_target_verify=lambda: verify, is_decode=lambda: not verify)


def _batch(seq_lens, req_pool_indices, out_cache_loc, verify: bool):
    seq_lens = torch.tensor(seq_lens, dtype=torch.int64)
    return types.SimpleNamespace(
        forward_mode=_mode(verify), batch_size=len(seq_lens), seq_lens=seq_lens,
        req_pool_indices=torch.tensor(req_pool_indices, dtype=torch.int64),
        out_cache_loc=torch.as_tensor(out_cache_loc, dtype=torch.int64), seq_lens_sum=int(seq_lens.sum()),
        spec_info=None, out_cache_loc_is_physical=True,  # 0.5.23's KVWriteLoc reads it
    )


def _decode_metadata(backend, req: int, length: int):
    kv_indptr = torch.tensor([0, length], dtype=torch.int32)
    num_kv_splits = torch.empty(1, dtype=torch.int32)
    backend.get_num_kv_splits(num_kv_splits, torch.tensor([length]))
    shape = (1, HEADS, backend.max_kv_splits)
    return dataclasses.replace(
        _empty_metadata(), kv_indptr=kv_indptr, kv_indices=backend.req_to_token[req, :length].to(torch.int64),
        num_kv_splits=num_kv_splits, attn_logits=torch.empty(shape + (HEAD_DIM,)), attn_lse=torch.empty(shape),
    )


#: (seq_lens, req_pool_indices): prefixes of 2 and 3 split tiles with requests out of pool order; and one request
#: alone, whose per-row request index is a broadcast view unless the rows copy it (H200, 2026-12-04: rows 1..S read
#: request 0's cache slots then, and the probe alone gave other tokens than with fillers).
BATCHES = {"two_requests": ([13, 21], [2, 0]), "one_request": ([13], [2])}


@pytest.fixture(params=list(BATCHES))
def scene(request):
    generator = torch.Generator().manual_seed(20261204)
    seq_lens, reqs = BATCHES[request.param]
    req_to_token = torch.randperm(4 * MAX_CONTEXT, generator=generator).to(torch.int32).reshape(4, MAX_CONTEXT)
    pool = _Pool(4 * MAX_CONTEXT, layers=2, generator=generator)
    rows = len(seq_lens) * STEPS_PLUS_ONE
    out_cache_loc = torch.cat([req_to_token[r, n : n + STEPS_PLUS_ONE] for r, n in zip(reqs, seq_lens)]).long()
    q = torch.randn(rows, HEADS * HEAD_DIM, generator=generator).half()
    k = torch.randn(rows, KV_HEADS * HEAD_DIM, generator=generator).half()
    v = torch.randn(rows, KV_HEADS * HEAD_DIM, generator=generator).half()
    return dict(seq_lens=seq_lens, reqs=reqs, req_to_token=req_to_token, pool=pool, out_cache_loc=out_cache_loc,
                q=q, k=k, v=v)


def _reference(scene, layer, length_of=lambda prefix, j: prefix + j + 1):
    """One decode forward per verify row, in position order, each writing its own token's K/V first."""
    pool = scene["pool"].clone()
    backend = _backend(pool, scene["req_to_token"])
    outputs = []
    for b, (req, prefix) in enumerate(zip(scene["reqs"], scene["seq_lens"])):
        for j in range(STEPS_PLUS_ONE):
            row = b * STEPS_PLUS_ONE + j
            backend.forward_metadata = _decode_metadata(backend, req, length_of(prefix, j))
            batch = _batch([prefix + j + 1], [req], scene["out_cache_loc"][row : row + 1], verify=False)
            sl = slice(row, row + 1)
            outputs.append(backend.forward_decode(scene["q"][sl], scene["k"][sl], scene["v"][sl], layer, batch))
    return torch.cat(outputs), pool


def _verify(scene, layers, capturing_buffers=False):
    pool = scene["pool"].clone()
    backend = _backend(pool, scene["req_to_token"])
    runner = types.SimpleNamespace(attn_backend=backend, decode_attn_backend=None, decode_attn_backend_group=[])
    if capturing_buffers:
        backend.cuda_graph_attn_logits = torch.full((8, HEADS, backend.max_kv_splits, HEAD_DIM), float("nan"))
        backend.cuda_graph_attn_lse = torch.full((8, HEADS, backend.max_kv_splits), float("nan"))
        backend.cuda_graph_num_kv_splits = torch.full((8,), -1, dtype=torch.int32)
        backend.cuda_graph_kv_indices = torch.full((8 * MAX_CONTEXT,), -1, dtype=torch.int64)
    assert verify_attention.install_decode_order_verify(runner) == [backend]
    batch = _batch(scene["seq_lens"], scene["reqs"], scene["out_cache_loc"], verify=True)
    outputs = []
    for layer in layers:
        if capturing_buffers:
            rows = verify_attention.build_decode_rows(backend, batch, STEPS_PLUS_ONE, capturing=True)
            backend.__dict__[verify_attention._ROWS_ATTR] = verify_attention.DecodeRows(
                rows, backend.forward_metadata, id(batch), last_layer_id=-1  # as if capture had just built them
            )
        outputs.append(backend.forward_extend(scene["q"], scene["k"], scene["v"], layer, batch))
    return outputs, pool, backend


def test_verify_rows_equal_separate_decodes_bit_for_bit(scene):
    layer = _layer(0)
    expected, expected_pool = _reference(scene, layer)
    (got,), pool, _ = _verify(scene, [layer])
    assert torch.equal(got, expected)
    assert torch.equal(pool.k[0], expected_pool.k[0]) and torch.equal(pool.v[0], expected_pool.v[0])


def test_rows_are_rebuilt_per_forward_and_shared_across_its_layers(scene):
    """Layer 1 reuses layer 0's rows; a second pass over the same batch (CUDA-graph warm-up, then capture)
    rebuilds them, and both passes give the reference."""
    layers = [_layer(0), _layer(1), _layer(0), _layer(1)]
    outputs, _, backend = _verify(scene, layers)
    for layer, got in zip(layers, outputs):
        expected, _ = _reference(scene, layer)
        assert torch.equal(got, expected)
    assert backend.__dict__[verify_attention._ROWS_ATTR].last_layer_id == 1


def test_capture_writes_into_the_backends_graph_buffers(scene):
    layer = _layer(0)
    expected, _ = _reference(scene, layer)
    (got,), _, backend = _verify(scene, [layer], capturing_buffers=True)
    assert torch.equal(got, expected)
    rows = backend.__dict__[verify_attention._ROWS_ATTR].metadata
    assert rows.attn_logits is backend.cuda_graph_attn_logits and rows.kv_indices is not backend.cuda_graph_kv_indices
    lens = [n + j + 1 for n in scene["seq_lens"] for j in range(STEPS_PLUS_ONE)]
    assert backend.cuda_graph_num_kv_splits[: len(lens)].tolist() == [-(-n // SPLIT_TILE) for n in lens]


def test_control_rows_that_miss_their_own_key_differ(scene):
    layer = _layer(0)
    expected, _ = _reference(scene, layer)
    off_by_one, _ = _reference(scene, layer, length_of=lambda prefix, j: prefix + j)
    assert not torch.equal(off_by_one, expected)


def test_non_verify_forwards_run_upstream_extend(scene):
    backend = _backend(scene["pool"].clone(), scene["req_to_token"])
    calls = []
    backend.forward_extend = lambda *a, **kw: calls.append(a) or "upstream"
    runner = types.SimpleNamespace(attn_backend=backend, decode_attn_backend=None, decode_attn_backend_group=[])
    verify_attention.install_decode_order_verify(runner)
    verify_attention.install_decode_order_verify(runner)  # idempotent: wraps once
    batch = _batch(scene["seq_lens"], scene["reqs"], scene["out_cache_loc"], verify=False)
    assert backend.forward_extend(scene["q"], scene["k"], scene["v"], _layer(0), batch) == "upstream"
    assert len(calls) == 1


@pytest.mark.parametrize(
    "change, words",
    [
        (dict(enable_deterministic=False), "--enable-deterministic-inference"),
        (dict(sliding_window_size=4), "sliding-window"),
        (dict(dcp_size=2), "--dcp-size"),
        (dict(_translate_kv_loc=lambda x: x), "translates cache locations"),
    ],
)
def test_refuses_backends_whose_verify_it_cannot_make_decode_ordered(scene, change, words):
    backend = _backend(scene["pool"], scene["req_to_token"])
    backend.__dict__.update(change)
    runner = types.SimpleNamespace(attn_backend=backend, decode_attn_backend=None, decode_attn_backend_group=[])
    with pytest.raises(RuntimeError, match=words):
        verify_attention.install_decode_order_verify(runner)
    assert "forward_extend" not in backend.__dict__


def test_refuses_a_non_triton_backend():
    runner = types.SimpleNamespace(attn_backend=object(), decode_attn_backend=None, decode_attn_backend_group=[])
    with pytest.raises(RuntimeError, match="--attention-backend triton"):
        verify_attention.install_decode_order_verify(runner)


# ---------------------------------------------------------------------------------------------------------------
# DETSPEC_EAGLE's opt-in (SGLANG_DETSPEC_DECODE_ORDER_VERIFY=1): the spec worker installs the same verify


def _spec_worker(backend):
    """A DETSPEC spec worker over a stand-in upstream whose ``init_attention_backends`` only records the call."""
    from sglang_detspec.integration.workers.spec_worker_base import DetspecSpecWorker

    class Upstream:
        def init_attention_backends(self):
            self.upstream_ran = True

    class Worker(DetspecSpecWorker, Upstream):
        pass

    worker = object.__new__(Worker)
    runner = types.SimpleNamespace(attn_backend=backend, decode_attn_backend=None, decode_attn_backend_group=[])
    worker.target_worker = types.SimpleNamespace(model_runner=runner)
    return worker


@pytest.mark.parametrize("value, installed", [("1", True), ("0", False), ("", False)])
def test_detspec_eagle_installs_the_decode_order_verify_only_when_asked(scene, monkeypatch, value, installed):
    from sglang_detspec.integration.sampling import scheme

    monkeypatch.setenv("SGLANG_DETSPEC_DECODE_ORDER_VERIFY", value)
    monkeypatch.setenv("SGLANG_DETSPEC_SPLIT_KV_VERIFY", "0")  # else the default's split-KV kernel takes the verify
    backend = _backend(scene["pool"], scene["req_to_token"])
    worker = _spec_worker(backend)
    with scheme.selected(scheme.REJECTION):
        worker.init_attention_backends()
    assert worker.upstream_ran
    assert ("forward_extend" in backend.__dict__) is installed


def test_the_opt_in_refusals_name_the_variable_not_the_invariant_algorithm(scene, monkeypatch):
    from sglang_detspec.integration.sampling import scheme

    monkeypatch.setenv("SGLANG_DETSPEC_DECODE_ORDER_VERIFY", "1")
    backend = _backend(scene["pool"], scene["req_to_token"])
    backend.__dict__.update(sliding_window_size=4)
    with scheme.selected(scheme.REJECTION), pytest.raises(RuntimeError) as refused:
        _spec_worker(backend).init_attention_backends()
    message = str(refused.value)
    assert message.startswith("SGLANG_DETSPEC_DECODE_ORDER_VERIFY=1 cannot run its verify in the decode kernel's order")
    assert "or unset SGLANG_DETSPEC_DECODE_ORDER_VERIFY." in message and "INVARIANT" not in message


def test_the_opt_in_switch_is_strict():
    from sglang_detspec.integration.setup.decode_order_verify_switch import decode_order_verify_wanted

    assert decode_order_verify_wanted({}) is False
    assert decode_order_verify_wanted({"SGLANG_DETSPEC_DECODE_ORDER_VERIFY": "1"}) is True
    with pytest.raises(Exception, match="SGLANG_DETSPEC_DECODE_ORDER_VERIFY='yes'.*Use '1'"):
        decode_order_verify_wanted({"SGLANG_DETSPEC_DECODE_ORDER_VERIFY": "yes"})
