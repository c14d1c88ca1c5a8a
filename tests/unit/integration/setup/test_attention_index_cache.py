"""The per-forward cache of the deterministic Triton attention's unified KV indices (SGLANG_DETSPEC_ATTN_INDEX_CACHE).

SGLang's own ``TritonAttnBackend._forward_extend_unified`` runs here with the plugin's hook applied by
``HookRegistry``, and SGLang's own ``build_unified_kv_indices`` (a Triton kernel, under the interpreter) builds the
indices. What cannot run on CPU is the backend's construction (it sizes GPU buffers from a model runner) and the
attention kernel itself: the test's backend is a namespace with the attributes the function reads, and its
``extend_attention_fwd_unified`` records the indices each layer would attend over. The expected indices are written
out here from their definition (each request's prefix KV slots, then its verify tokens' slots), not from SGLang.
"""

from __future__ import annotations

import inspect
import types

import pytest
import torch

from sglang_detspec.integration.setup import algorithm
from sglang_detspec.integration.setup import attention_index_cache as aic

DRAFT_TOKENS = 3


@pytest.fixture(autouse=True)
def detspec_algorithms_registered():
    algorithm.register_algorithms()


@pytest.fixture
def cache_on(hooks_applied):
    aic._set_active(True)
    yield
    aic._set_active(False)


class _Object:
    """A plain attribute holder that, like SGLang's dataclasses, can be weakly referenced."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


class _Layer(_Object):
    def __init__(self, layer_id, sliding_window_size=None):
        from sglang.srt.layers.radix_attention import AttentionType

        super().__init__(layer_id=layer_id, sliding_window_size=sliding_window_size, k_scale=None, v_scale=None,
                         tp_q_head_num=2, qk_head_dim=4, v_head_dim=4, scaling=0.5, xai_temperature_len=-1,
                         attn_type=AttentionType.DECODER)


def _forward(prefix_slots, first_free_slot):
    """A TARGET_VERIFY forward: (metadata, batch) for requests whose prefixes sit in ``prefix_slots`` (a list of
    lists) and whose DRAFT_TOKENS verify tokens get slots from ``first_free_slot`` on."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    bs = len(prefix_slots)
    kv_indptr = torch.tensor([0] + [sum(len(p) for p in prefix_slots[: i + 1]) for i in range(bs)], dtype=torch.int32)
    kv_indices = torch.tensor([s for p in prefix_slots for s in p], dtype=torch.int64)
    metadata = _Object(kv_indptr=kv_indptr, kv_indices=kv_indices, window_kv_indptr=kv_indptr,
                       window_kv_indices=kv_indices, aligned_window_kv_indptr=None, aligned_window_kv_indices=None,
                       out_cache_loc_full_physical=None, swa_out_cache_loc=None,
                       qo_indptr=torch.arange(0, (bs + 1) * DRAFT_TOKENS, DRAFT_TOKENS, dtype=torch.int32),
                       max_extend_len=DRAFT_TOKENS, custom_mask=None, mask_indptr=None)
    batch = _Object(batch_size=bs, extend_seq_lens=None, extend_start_loc=None, extend_prefix_lens=None,
                    forward_mode=ForwardMode.TARGET_VERIFY, spec_info=_Object(draft_token_num=DRAFT_TOKENS),
                    seq_lens=torch.tensor([len(p) + DRAFT_TOKENS for p in prefix_slots], dtype=torch.int64),
                    out_cache_loc=torch.arange(first_free_slot, first_free_slot + bs * DRAFT_TOKENS,
                                               dtype=torch.int64))
    return metadata, batch


def _expected(prefix_slots, first_free_slot):
    rows = []
    for i, prefix in enumerate(prefix_slots):
        start = first_free_slot + i * DRAFT_TOKENS
        rows.append(list(prefix) + list(range(start, start + DRAFT_TOKENS)))
    return rows


class _Backend:
    """What ``_forward_extend_unified`` reads of a ``TritonAttnBackend``, with SGLang's real index builder."""

    def __init__(self, sliding_window_pool=False):
        from sglang.kernels.ops.attention.extend_attention import build_unified_kv_indices

        self.device = "cpu"
        self.page_size = 1
        self.use_sliding_window_kv_pool = sliding_window_pool
        self.token_to_kv_pool = _Object(get_key_buffer=lambda layer_id: torch.zeros(1),
                                        get_value_buffer=lambda layer_id: torch.zeros(1))
        self.forward_metadata = None
        self.builds = 0
        self.attended = []  # per layer call: the indices the attention kernel was given, as per-request lists

        def counted_build(*args, **kwargs):
            self.builds += 1
            return build_unified_kv_indices(*args, **kwargs)

        self.build_unified_kv_indices = counted_build

    def extend_attention_fwd_unified(self, q, o, k_buffer, v_buffer, k_descale, v_descale, qo_indptr, kv_indptr,
                                     kv_indices, prefix_lens, max_extend_len, **kwargs):
        assert prefix_lens.dtype == torch.int32
        self.attended.append([kv_indices[kv_indptr[i]: kv_indptr[i + 1]].tolist() for i in range(len(kv_indptr) - 1)])

    def run(self, metadata, batch, layers):
        from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

        self.forward_metadata = metadata
        q = torch.zeros(batch.batch_size * DRAFT_TOKENS, 8)
        for layer in layers:
            TritonAttnBackend._forward_extend_unified(self, q, torch.empty_like(q), layer, batch, True, 0.0, None)
            assert batch.extend_seq_lens is None and batch.extend_start_loc is None, "injected fields not restored"


FORWARD_A = ([[7, 8, 9], [20, 21, 22, 23, 24]], 100)
FORWARD_B = ([[3, 4], [50, 51, 52, 53]], 200)


def test_window_less_layers_of_one_forward_share_one_build_and_a_new_forward_rebuilds(cache_on):
    backend = _Backend()
    layers = [_Layer(i) for i in range(4)]
    backend.run(*_forward(*FORWARD_A), layers)
    assert backend.builds == 1
    assert backend.attended == [_expected(*FORWARD_A)] * 4
    backend.attended.clear()
    backend.run(*_forward(*FORWARD_B), layers)  # a memo that never invalidates would give FORWARD_A's slots
    assert backend.builds == 2
    assert backend.attended == [_expected(*FORWARD_B)] * 4


def test_a_new_forward_batch_alone_rebuilds(cache_on):
    """Same metadata object, new batch (other verify slots): the indices must follow the batch."""
    backend = _Backend()
    layers = [_Layer(i) for i in range(2)]
    metadata, batch = _forward(*FORWARD_A)
    backend.run(metadata, batch, layers)
    _, other_batch = _forward(FORWARD_A[0], 300)
    backend.attended.clear()
    backend.run(metadata, other_batch, layers)
    assert backend.builds == 2 and backend.attended == [_expected(FORWARD_A[0], 300)] * 2


def test_the_same_forward_run_again_rebuilds(cache_on):
    """SGLang's graph capture runs one forward batch eagerly, then under capture: the second pass (layer ids starting
    over) must launch its own index build, never reuse the first pass's tensors."""
    backend = _Backend()
    layers = [_Layer(i) for i in range(3)]
    metadata, batch = _forward(*FORWARD_A)
    backend.run(metadata, batch, layers)
    backend.run(metadata, batch, layers)
    assert backend.builds == 2
    assert backend.attended == [_expected(*FORWARD_A)] * 6


def test_entering_graph_capture_rebuilds(cache_on, monkeypatch):
    backend = _Backend()
    metadata, batch = _forward(*FORWARD_A)
    backend.run(metadata, batch, [_Layer(0), _Layer(1)])
    monkeypatch.setattr(aic, "_capturing", lambda: True)
    backend.run(metadata, batch, [_Layer(2), _Layer(3)])
    assert backend.builds == 2


def test_sliding_window_layers_run_sglangs_code_untouched(cache_on):
    backend = _Backend()
    layers = [_Layer(0), _Layer(1, sliding_window_size=16), _Layer(2), _Layer(3, sliding_window_size=16)]
    backend.run(*_forward(*FORWARD_A), layers)
    assert backend.builds == 3, "one shared build for the window-less layers, one per sliding-window layer"
    assert backend.attended == [_expected(*FORWARD_A)] * 4


@pytest.mark.parametrize("why", ["cache off", "sliding-window pool"])
def test_every_layer_builds_when_the_cache_does_not_apply(hooks_applied, why):
    if why == "cache off":
        aic._set_active(False)
    else:
        aic._set_active(True)
    backend = _Backend(sliding_window_pool=why == "sliding-window pool")
    backend.run(*_forward(*FORWARD_A), [_Layer(i) for i in range(3)])
    assert backend.builds == 3
    assert backend.attended == [_expected(*FORWARD_A)] * 3


def test_build_argument_positions_match_sglang():
    from sglang.kernels.ops.attention.extend_attention import build_unified_kv_indices

    names = list(inspect.signature(build_unified_kv_indices).parameters)
    assert len(names) == aic.BUILD_ARGUMENTS
    for field, position in aic.DERIVED_FIELDS:
        assert names[position] == field


# ---------------------------------------------------------------------------------------------------------------
# Which servers the switch (tests/unit/integration/setup/test_env_switch.py: its values) turns the cache on for


def _enable(monkeypatch):
    """What SGLang's enable_batch_invariant_mode does that matters here (the CUDA registration cannot run on CPU)."""
    from sglang.srt.batch_invariant_ops import batch_invariant_ops as sgl

    def original(model_runner):
        monkeypatch.setattr(sgl, "_batch_invariant_MODE", True)

    return original


def _runner(name):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return types.SimpleNamespace(spec_algorithm=SpeculativeAlgorithm.from_string(name), is_draft_worker=False,
                                 model=None)


@pytest.fixture
def published():
    """SGLang's runtime config as a scheduler process has it (the ops hook reads --rl-on-policy-target from it)."""
    from sglang.srt.runtime_context import publish, reset_context
    from sglang.srt.server_args import ServerArgs

    publish(ServerArgs(model_path="dummy", device="cpu"), role="scheduler")
    yield
    reset_context()


@pytest.fixture
def enable_hook(hooks_applied, published, monkeypatch):
    """The batch-invariant ops' hook on ``maybe_enable_batch_invariant_mode`` (it turns the cache on), with SGLang's
    own ops chosen so that no GEMM self-check runs; the cache's switch is read whatever the ops."""
    from sglang_detspec.integration.setup import batch_invariant_ops as bio
    from sglang_detspec.integration.setup import token_id_sampler_opt_in

    monkeypatch.setenv(bio.OPS_ENV, "sglang")
    monkeypatch.setattr(token_id_sampler_opt_in, "token_id_sampler_requested", lambda: False)
    return lambda runner: bio.around_enable_batch_invariant_mode(_enable(monkeypatch), runner)


@pytest.mark.parametrize("env", ["1", None])
def test_enable_hook_turns_the_cache_on_for_a_detspec_server_and_logs_it(enable_hook, monkeypatch, caplog, env):
    if env is None:  # the default
        monkeypatch.delenv(aic.ATTN_INDEX_CACHE_ENV, raising=False)
    else:
        monkeypatch.setenv(aic.ATTN_INDEX_CACHE_ENV, env)
    caplog.set_level("INFO")
    enable_hook(_runner("DETSPEC_EAGLE"))
    assert aic.attention_index_cache_active()
    assert "attention index cache on: SGLang's deterministic Triton attention builds" in caplog.text
    assert f"{aic.ATTN_INDEX_CACHE_ENV}=0 turns it off" in caplog.text


@pytest.mark.parametrize("name, env", [("EAGLE", "1"), (None, "1"), ("EAGLE", None), (None, None),
                                       ("DETSPEC_EAGLE", "0")])
def test_enable_hook_leaves_the_cache_off_elsewhere(enable_hook, monkeypatch, caplog, name, env):
    if env is None:
        monkeypatch.delenv(aic.ATTN_INDEX_CACHE_ENV, raising=False)
    else:
        monkeypatch.setenv(aic.ATTN_INDEX_CACHE_ENV, env)
    caplog.set_level("INFO")
    enable_hook(_runner(name))
    assert not aic.attention_index_cache_active()
    # only an explicit 1 on a server the cache does not serve is worth a warning; the default stays quiet
    assert (f"{aic.ATTN_INDEX_CACHE_ENV}=1 is ignored on this" in caplog.text) is (env == "1")


def test_enable_hook_leaves_the_cache_off_outside_deterministic_mode(hooks_applied, published, monkeypatch):
    from sglang.srt.batch_invariant_ops import batch_invariant_ops as sgl

    from sglang_detspec.integration.setup import batch_invariant_ops as bio

    monkeypatch.setenv(aic.ATTN_INDEX_CACHE_ENV, "1")
    monkeypatch.setattr(sgl, "_batch_invariant_MODE", False)
    bio.around_enable_batch_invariant_mode(lambda runner: None, _runner("DETSPEC_EAGLE"))
    assert not aic.attention_index_cache_active()
