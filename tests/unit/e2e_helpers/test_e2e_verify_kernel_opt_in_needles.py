"""CPU tests of what the three attention-kernel opt-in E2E modules (tests/e2e/test_e2e_decode_order_verify.py,
tests/e2e/test_e2e_split_kv_verify.py, tests/e2e/test_e2e_split_kv_draft_extend.py) rely on before they reach a GPU:
the log lines they look for are the ones the spec worker's install writes when their variable asks for it, and their
servers are the plain DETSPEC_EAGLE ones (graphs on and off) with only that variable added."""

import types

import pytest
import test_e2e_decode_order_verify as decode_order
import test_e2e_split_kv_draft_extend as draft_extend
import test_e2e_split_kv_verify as split_kv

from e2e_spec_resolution import session_specs

#: (E2E module, its servers, its variable)
MODULES = {
    "decode_order": (decode_order, decode_order.DECODE_ORDER, "SGLANG_DETSPEC_DECODE_ORDER_VERIFY"),
    "split_kv": (split_kv, split_kv.SPLIT_KV, "SGLANG_DETSPEC_SPLIT_KV_VERIFY"),
    "draft_extend": (draft_extend, draft_extend.DRAFT_EXTEND, "SGLANG_DETSPEC_SPLIT_KV_DRAFT_EXTEND"),
}


def _install_log(monkeypatch, caplog, environ):
    """The log of DETSPEC_EAGLE's spec worker installing its verify attention with ``environ`` set."""
    pytest.importorskip("sglang.srt.layers.attention.triton_backend")
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    from sglang_detspec.integration.sampling import scheme
    from sglang_detspec.integration.workers.spec_worker_base import DetspecSpecWorker

    def triton_backend():
        backend = object.__new__(TritonAttnBackend)
        backend.__dict__.update(enable_deterministic=True, split_tile_size=256, sliding_window_size=None, dcp_size=1,
                                kv_index_translator=None, _translate_kv_loc=None, page_size=1, use_mla=False,
                                extend_attention_fwd_unified=lambda *a, **kw: None)
        return backend

    backend, draft_backend = triton_backend(), triton_backend()

    class Worker(DetspecSpecWorker, type("Upstream", (), {"init_attention_backends": lambda self: None})):
        pass

    worker = object.__new__(Worker)
    runner = types.SimpleNamespace(attn_backend=backend, decode_attn_backend=None, decode_attn_backend_group=[])
    worker.target_worker = types.SimpleNamespace(model_runner=runner)
    worker.draft_worker = types.SimpleNamespace(draft_runner=types.SimpleNamespace(attn_backend=draft_backend),
                                                draft_extend_attn_backend=draft_backend)
    for _, _, other in MODULES.values():
        monkeypatch.delenv(other, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    caplog.set_level("INFO")
    with scheme.selected(scheme.REJECTION):
        worker.init_attention_backends()
    return caplog.text


@pytest.mark.parametrize("which", list(MODULES))
def test_the_needles_are_what_the_install_logs(monkeypatch, caplog, which):
    module, _, variable = MODULES[which]
    log = _install_log(monkeypatch, caplog, {variable: "1"})
    assert module.INSTALLED in log and module.ASKED_BY in log
    for other, (other_module, _, _) in MODULES.items():
        # The verify's split-KV kernel is the default: it is installed beside the draft extend's opt-in.
        if other != which and not (which == "draft_extend" and other == "split_kv"):
            assert other_module.INSTALLED not in log, other


@pytest.mark.parametrize("value, present, absent", [
    ("", ("INSTALLED", "BY_DEFAULT"), ("ASKED_BY", "NOT_INSTALLED")),
    ("0", ("NOT_INSTALLED",), ("INSTALLED", "BY_DEFAULT")),
])
def test_the_split_kv_default_and_off_needles_are_what_the_install_logs(monkeypatch, caplog, value, present, absent):
    log = _install_log(monkeypatch, caplog, {"SGLANG_DETSPEC_SPLIT_KV_VERIFY": value})
    assert all(getattr(split_kv, needle) in log for needle in present), log
    assert not any(getattr(split_kv, needle) in log for needle in absent), log


@pytest.mark.parametrize("value", ["", "0"])
def test_the_draft_extend_default_needle_is_what_the_install_logs(monkeypatch, caplog, value):
    log = _install_log(monkeypatch, caplog, {"SGLANG_DETSPEC_SPLIT_KV_DRAFT_EXTEND": value})
    assert draft_extend.NOT_INSTALLED in log and draft_extend.INSTALLED not in log, log


@pytest.mark.parametrize("which", list(MODULES))
def test_the_servers_are_the_plain_ones_with_the_switch(monkeypatch, which):
    pytest.importorskip("sglang")
    import e2e_harness as h

    module, servers, variable = MODULES[which]
    specs = session_specs(h, monkeypatch)
    graph, nograph = servers
    assert specs[nograph].args == specs["detspec_eagle_nograph"].args
    assert [a for a in specs["detspec_eagle_graph"].args if a not in ("--chat-template", "chatml")] == specs[graph].args
    for name in servers:
        assert dict(specs[name].env) == {variable: "1"}
    assert variable not in dict(specs["detspec_eagle_graph"].env or {})
    assert variable not in dict(specs[module.CONTROL].env or {})


def test_the_one_stage_server_is_the_default_one_with_the_kernel_off(monkeypatch):
    pytest.importorskip("sglang")
    import e2e_harness as h

    specs = session_specs(h, monkeypatch)
    assert specs[split_kv.ONE_STAGE].args == specs[split_kv.SPLIT_KV[0]].args
    assert dict(specs[split_kv.ONE_STAGE].env) == {"SGLANG_DETSPEC_SPLIT_KV_VERIFY": "0"}


def test_the_harness_names_the_plugins_variables():
    pytest.importorskip("sglang")
    from sglang_detspec.integration.setup.decode_order_verify_switch import DECODE_ORDER_VERIFY_ENV
    from sglang_detspec.integration.setup.split_kv_verify_switch import SPLIT_KV_VERIFY_ENV

    import e2e_harness as h

    assert (h.DECODE_ORDER_VERIFY_ENV, h.SPLIT_KV_VERIFY_ENV) == (DECODE_ORDER_VERIFY_ENV, SPLIT_KV_VERIFY_ENV)
