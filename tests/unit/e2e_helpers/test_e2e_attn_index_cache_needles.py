"""CPU tests of what tests/e2e/test_e2e_attn_index_cache.py relies on before it reaches a GPU: the log line it looks
for is the one the plugin's hook writes at its first cached layer, and its servers are the plain DETSPEC_EAGLE ones
with the cache switched on, so the GPU run fails only on GPU behaviour."""

import pytest
import test_e2e_attn_index_cache as e2e

from sglang_detspec.integration.setup import attention_index_cache as aic

from e2e_spec_resolution import session_specs


def test_first_use_needle_is_what_the_hook_logs(monkeypatch, caplog):
    """The hook runs with the cache on, on a window-less layer, around an original that does nothing."""
    monkeypatch.setattr(aic, "_active", True)
    monkeypatch.setattr(aic, "_logged_first_use", False)
    backend = type("Backend", (), {})()
    backend.build_unified_kv_indices = lambda *inputs: None
    backend.forward_metadata = object()
    layer = type("Layer", (), {"sliding_window_size": None, "layer_id": 0})()
    batch = type("Batch", (), {"extend_seq_lens": None, "extend_start_loc": None})()
    caplog.set_level("INFO")
    aic.around_forward_extend_unified(lambda *args, **kwargs: None, backend, None, None, layer, batch)
    assert e2e.FIRST_USE in caplog.text


def test_the_cached_servers_are_the_uncached_ones_with_the_switch(monkeypatch):
    pytest.importorskip("sglang")
    import e2e_harness as h

    assert h.ATTN_INDEX_CACHE_ENV == aic.ATTN_INDEX_CACHE_ENV
    specs = session_specs(h, monkeypatch)
    for cached, plain in zip(e2e.CACHED, e2e.UNCACHED):
        assert specs[cached].args == specs[plain].args, (cached, plain)
        assert dict(specs[cached].env) == {aic.ATTN_INDEX_CACHE_ENV: "1"}
        assert dict(specs[plain].env) == {aic.ATTN_INDEX_CACHE_ENV: "0"}
        assert "DETSPEC_EAGLE" in specs[cached].args
