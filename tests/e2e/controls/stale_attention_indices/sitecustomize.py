"""E2E harness only (never installed, never on a user's path): the attention index cache with a stale record.

Why: ``SGLANG_DETSPEC_ATTN_INDEX_CACHE=1`` (``sglang_detspec/integration/setup/attention_index_cache.py``) must never
let a CUDA graph read index tensors built outside it. SGLang's graph capture runs the same forward batch and the same
attention metadata eagerly (warm-up) and then under capture; the product's memo starts a new record when the capture
state changes or a layer id goes back. This control removes both conditions: a record is kept for as long as the
metadata and the forward batch are the same objects, so every captured layer reuses the index tensors of the eager
warm-up. A replayed graph then attends over the warm-up's KV slots instead of the request's, which must change the
tokens of ``tests/e2e/test_e2e_attn_index_cache.py``'s graphs-on control server (eager forwards build new metadata
and a new batch each time and are unaffected). The replaced records are kept alive, so the graphs read stale but
allocated, in-range indices: wrong tokens, not a crashed server.

Put on PYTHONPATH by ``tests/e2e/e2e_harness.py`` (``with_control(STALE_ATTENTION_INDICES_CONTROL, ...)``);
``tests/unit/e2e_helpers/test_stale_attention_indices_control.py`` checks on CPU that it keeps the warm-up's record
where the product drops it.
"""

_kept_alive = []


def stale_begin_layer(memo, metadata, batch, capturing, layer_id):
    """``_UnifiedIndexMemo.begin_layer`` keyed by (metadata, batch) alone: no capture-state or layer-order reset."""
    from sglang_detspec.integration.setup import attention_index_cache as cache

    same_objects = memo.inputs is not None and cache._same(memo.metadata, metadata) and cache._same(memo.batch, batch)
    if not same_objects:
        if memo.outputs is not None:
            _kept_alive.append((memo.inputs, memo.outputs))
        memo.metadata, memo.batch, memo.capturing = cache._reference(metadata), cache._reference(batch), capturing
        memo.inputs = memo.outputs = None
    memo.last_layer_id = layer_id


def install() -> None:
    from sglang_detspec.integration.setup import attention_index_cache as cache

    cache._UnifiedIndexMemo.begin_layer = stale_begin_layer


if __name__ == "sitecustomize":  # imported by Python at start-up; a unit test imports it under another name
    install()
