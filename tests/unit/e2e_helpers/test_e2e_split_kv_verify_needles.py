"""CPU tests of what tests/e2e/test_e2e_split_kv_verify.py relies on before it reaches a GPU: the log lines it looks
for are the ones the spec worker's install writes when SGLANG_DETSPEC_SPLIT_KV_VERIFY=1 asks for it, and its servers
are the plain DETSPEC_EAGLE ones (graphs on and off) with only that variable added."""

import types

import pytest
import test_e2e_split_kv_verify as e2e

from e2e_spec_resolution import session_specs


def test_the_needles_are_what_the_install_logs(monkeypatch, caplog):
    pytest.importorskip("sglang.srt.layers.attention.triton_backend")
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    from sglang_detspec.integration.sampling import scheme
    from sglang_detspec.integration.workers.spec_worker_base import DetspecSpecWorker

    backend = object.__new__(TritonAttnBackend)
    backend.__dict__.update(enable_deterministic=True, split_tile_size=256, sliding_window_size=None, dcp_size=1,
                            page_size=1, use_mla=False, extend_attention_fwd_unified=lambda *a, **kw: None)

    class Worker(DetspecSpecWorker, type("Upstream", (), {"init_attention_backends": lambda self: None})):
        pass

    worker = object.__new__(Worker)
    runner = types.SimpleNamespace(attn_backend=backend, decode_attn_backend=None, decode_attn_backend_group=[])
    worker.target_worker = types.SimpleNamespace(model_runner=runner)
    monkeypatch.setenv("SGLANG_DETSPEC_SPLIT_KV_VERIFY", "1")
    monkeypatch.delenv("SGLANG_DETSPEC_DECODE_ORDER_VERIFY", raising=False)
    caplog.set_level("INFO")
    with scheme.selected(scheme.REJECTION):
        worker.init_attention_backends()
    assert e2e.INSTALLED in caplog.text and e2e.ASKED_BY in caplog.text


def test_the_servers_are_the_plain_ones_with_the_switch(monkeypatch):
    pytest.importorskip("sglang")
    from sglang_detspec.integration.setup.split_kv_verify_switch import SPLIT_KV_VERIFY_ENV

    import e2e_harness as h

    assert h.SPLIT_KV_VERIFY_ENV == SPLIT_KV_VERIFY_ENV
    specs = session_specs(h, monkeypatch)
    graph, nograph = e2e.SPLIT_KV
    assert specs[nograph].args == specs["detspec_eagle_nograph"].args
    assert [a for a in specs["detspec_eagle_graph"].args if a not in ("--chat-template", "chatml")] == specs[graph].args
    for name in e2e.SPLIT_KV:
        assert dict(specs[name].env) == {SPLIT_KV_VERIFY_ENV: "1"}
    assert SPLIT_KV_VERIFY_ENV not in dict(specs[e2e.DEFAULT].env or {})
