"""Construction: DETSPEC builds its single-layer draft worker and graph runner, builtin EAGLE keeps upstream's.

The real upstream constructors of the installed SGLang (0.5.17 or 0.5.23) run
on CPU with the model loading faked; a builtin ``EagleDraftWorker`` in the same
process must keep upstream's sampling (no DETSPEC key reaches the recorder) and
upstream's module globals.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest

from sglang_detspec.integration.sampling.target_sampler import detspec_sampler_class
from sglang_detspec.integration.workers import single_layer as sl

import sglang_verify_harness as harness
from single_layer_fakes import (  # noqa: F401  (recorder, eager_torch_compile: pytest fixtures)
    SEEDS,
    SEQ_LENS,
    TOP_KS,
    decode_forward_batch,
    eager_torch_compile,
    make_worker,
    published,
    recorder,
    sampling_info,
)


def test_builtin_eagle_worker_is_untouched(recorder):
    """Same process, builtin EagleDraftWorker: upstream sampling, no DETSPEC keys."""
    from sglang.srt.speculative import eagle_worker_v2, spec_utils

    # The DETSPEC bodies are built (cached) first, so any module mutation
    # would already be visible here.
    sl._upstream(eagle_worker_v2.EagleDraftWorker, "draft_forward")
    assert eagle_worker_v2.sample_draft_proposal is spec_utils.sample_draft_proposal
    assert eagle_worker_v2.fast_sample is spec_utils.fast_sample
    assert eagle_worker_v2.EagleDraftWorker.draft_forward.__globals__[
        "sample_draft_proposal"
    ] is spec_utils.sample_draft_proposal
    with published(enable_deterministic_inference=False):
        w = make_worker(4)
        w.__class__ = eagle_worker_v2.EagleDraftWorker
        si = sampling_info(SEEDS, TOP_KS)
        si.sampling_seed = None
        fb = decode_forward_batch(si, SEQ_LENS, first_tokens=[3, 4, 5])
        w.draft_forward(fb)
    assert recorder.calls == []



def test_spec_worker_builds_the_detspec_draft_worker_and_builtin_does_not(monkeypatch):
    import inspect

    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.speculative import eagle_worker_v2
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2

    built = []

    def fake_draft_init(self, *args, **kwargs):  # the real one loads a model on a GPU
        built.append(type(self))
        self.parallel_layout = None

    monkeypatch.setattr(EagleDraftWorker, "__init__", fake_draft_init)
    params = inspect.signature(EAGLEWorkerV2.__init__).parameters
    server_args = SimpleNamespace(
        speculative_eagle_topk=1,
        speculative_num_steps=3,
        speculative_num_draft_tokens=4,
        device="cpu",
        page_size=1,
        speculative_algorithm="EAGLE",
        speculative_adaptive=False,
    )
    target = harness.bare_target_worker()
    kwargs = dict(server_args=server_args, gpu_id=0, nccl_port=0, target_worker=target)
    if "ps" in params:  # 0.5.17 passes the ParallelState explicitly
        kwargs["ps"] = None
    with contextlib.ExitStack() as stack:
        stack.enter_context(published(speculative_num_steps=3, speculative_num_draft_tokens=4, device="cpu"))
        if "ps" not in params:  # 0.5.21+ read the pipeline rank from the runtime context
            stack.enter_context(get_parallel().override(pp_group=SimpleNamespace(is_last_rank=True)))
        # 0.5.19 - 0.5.20 still take ps but read the rank from parallel_state's group (eagle_worker_v2.py:1086).
        if hasattr(eagle_worker_v2, "get_pp_group"):
            monkeypatch.setattr(eagle_worker_v2, "get_pp_group", lambda: SimpleNamespace(is_last_rank=True))
        detspec = sl.DetspecEAGLEWorkerV2(**kwargs)
        builtin = EAGLEWorkerV2(**kwargs)
    assert type(detspec._draft_worker) is sl.DetspecEagleDraftWorker
    assert type(builtin._draft_worker) is EagleDraftWorker
    assert built == [sl.DetspecEagleDraftWorker, EagleDraftWorker]
    assert isinstance(detspec, EAGLEWorkerV2)
    # The target model runner now samples with the token-id-keyed DETSPEC sampler (the builtin worker built
    # after it shares the target worker here; a real server has one of the two).
    assert isinstance(target.model_runner.sampler, detspec_sampler_class())


def test_capture_builds_the_detspec_draft_graph_runner():
    """_capture_cuda_graphs (skipped on CPU) resolves the runner class to ours, only ours."""
    from sglang.srt.speculative import eagle_worker_v2

    rebound = sl._upstream(eagle_worker_v2.EagleDraftWorker, "_capture_cuda_graphs")
    assert rebound.__code__ is eagle_worker_v2.EagleDraftWorker._capture_cuda_graphs.__code__
    assert rebound.__globals__["EAGLEDraftCudaGraphRunner"] is sl.DetspecEAGLEDraftCudaGraphRunner
    # The draft-extend runner keeps upstream's class (it returns logits only).
    assert (
        rebound.__globals__["EAGLEDraftExtendCudaGraphRunner"]
        is eagle_worker_v2.EAGLEDraftExtendCudaGraphRunner
    )
    assert eagle_worker_v2.EAGLEDraftCudaGraphRunner is not sl.DetspecEAGLEDraftCudaGraphRunner
    assert issubclass(sl.DetspecEAGLEDraftCudaGraphRunner, eagle_worker_v2.EAGLEDraftCudaGraphRunner)


def test_simulated_acceptance_is_refused_under_deterministic_mode(monkeypatch):
    from sglang.srt.speculative import spec_utils

    monkeypatch.setattr(spec_utils, "SIMULATE_ACC_LEN", 3.0)
    with published(), pytest.raises(ValueError, match="SGLANG_SIMULATE_ACC_LEN"):
        sl.DetspecEAGLEWorkerV2(server_args=None, gpu_id=0, nccl_port=0, target_worker=None)
