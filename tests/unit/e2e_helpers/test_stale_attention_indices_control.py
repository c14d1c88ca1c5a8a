"""The attention index cache's must-fail control (tests/e2e/controls/stale_attention_indices/sitecustomize.py) on
CPU: with it, SGLang's graph-capture pattern (one forward batch and metadata run eagerly, then under capture, layer
ids starting over) reuses the eager warm-up's index tensors, where the product builds new ones; eager forwards,
which bring new metadata and a new batch, still rebuild. So the GPU control server's replayed graphs read stale
indices, and test_e2e_attn_index_cache.py's control can fail only if the product's guard works."""

import importlib.util

import pytest

from sglang_detspec.integration.setup import attention_index_cache as aic

import e2e_harness as h
from e2e_spec_resolution import session_specs


def _load_control():
    path = h.STALE_ATTENTION_INDICES_CONTROL / "sitecustomize.py"
    spec = importlib.util.spec_from_file_location("stale_attention_indices_control", path)  # no install at import
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Object:
    pass


def _inputs(metadata, batch):
    return (metadata.kv_indptr, metadata.kv_indices, batch.extend_start_loc, batch.extend_seq_lens,
            batch.out_cache_loc, 2)


def _forward():
    metadata, batch = _Object(), _Object()
    metadata.kv_indptr, metadata.kv_indices = object(), object()
    batch.extend_start_loc, batch.extend_seq_lens, batch.out_cache_loc = object(), object(), object()
    return metadata, batch


def _pass(memo, metadata, batch, capturing, layers, built):
    """One model pass over ``layers`` window-less layers; ``built`` collects each real build's result."""
    results = []
    for layer_id in range(layers):
        memo.begin_layer(metadata, batch, capturing, layer_id)
        memo.armed = True
        results.append(memo.build(lambda *inputs: built.append(object()) or built[-1], *_inputs(metadata, batch)))
        memo.armed = False
    return results


@pytest.mark.parametrize("with_control", [False, True])
def test_capture_after_warm_up_reuses_the_warm_up_indices_only_under_the_control(monkeypatch, with_control):
    if with_control:
        monkeypatch.setattr(aic._UnifiedIndexMemo, "begin_layer", _load_control().stale_begin_layer)
    memo, built = aic._UnifiedIndexMemo(), []
    metadata, batch = _forward()
    warm_up = _pass(memo, metadata, batch, False, 3, built)
    captured = _pass(memo, metadata, batch, True, 3, built)
    assert warm_up == [built[0]] * 3
    if with_control:
        assert len(built) == 1 and captured == [built[0]] * 3  # the graph would read the eager tensors
    else:
        assert len(built) == 2 and captured == [built[1]] * 3


def test_the_control_still_rebuilds_for_a_new_eager_forward(monkeypatch):
    monkeypatch.setattr(aic._UnifiedIndexMemo, "begin_layer", _load_control().stale_begin_layer)
    memo, built = aic._UnifiedIndexMemo(), []
    first = _pass(memo, *_forward(), False, 2, built)
    second = _pass(memo, *_forward(), False, 2, built)
    assert len(built) == 2 and first != second


def test_the_control_server_is_the_graphs_on_cached_server_with_the_control(monkeypatch):
    pytest.importorskip("sglang")
    import test_e2e_attn_index_cache as e2e

    specs = session_specs(h, monkeypatch)
    control, plain = specs[e2e.STALE_CONTROL], specs[e2e.UNCACHED[0]]
    assert [a for a in control.args] == [a for a in plain.args if a not in ("--chat-template", "chatml")]
    assert control.env[aic.ATTN_INDEX_CACHE_ENV] == "1"
    assert control.env["PYTHONPATH"].split(":")[0] == str(h.STALE_ATTENTION_INDICES_CONTROL)
