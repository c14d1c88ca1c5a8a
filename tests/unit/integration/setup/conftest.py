"""Shared fixtures of the set-up tests: the plugin's hooks applied as ``plugin.py`` applies them in a server process."""

import pytest


@pytest.fixture
def hooks_applied():
    """The batch-invariant ops' hooks and the attention index cache's hook, registered and applied together (the ops'
    enable hook turns the cache on, so a server always has both); both left inactive afterwards."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_detspec.integration.setup import attention_index_cache as aic
    from sglang_detspec.integration.setup import batch_invariant_ops as bio

    bio.install_batch_invariant_ops()
    aic.install_attention_index_cache()
    HookRegistry.apply_hooks()
    assert bio.batch_invariant_ops_hooks_active() and aic.attention_index_cache_hooks_active()
    yield
    bio._set_active(False)
    aic._set_active(False)
