"""Construction: DETSPEC builds its multi-layer draft worker and single-CG runner, builtin EAGLE keeps upstream's.

The upstream constructors and ``_capture_cuda_graphs`` of the installed SGLang
(0.5.17 or 0.5.23) run on CPU with model loading and GPU checks faked; the
DETSPEC bodies see the DETSPEC names through private globals while the
upstream modules (which a builtin EAGLE worker in the same process reads) are
never mutated.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import sglang.srt.speculative.multi_layer_eagle_draft_extend_cuda_graph_runner as mlr
import sglang.srt.speculative.multi_layer_eagle_worker_v2 as mlw

from sglang_detspec.integration.sampling.target_sampler import detspec_sampler_class
from sglang_detspec.integration.workers import multi_layer as ml

import sglang_verify_harness as harness
from multi_layer_fakes import (  # noqa: F401  (spy: a pytest fixture)
    NUM_DRAFT_TOKENS,
    NUM_STEPS,
    FakeBackend,
    make_draft_worker,
    make_sampling_info,
    rebound_globals,
    run_prefill,
    spy,
    step_logits,
)

# --------------------------------------------------------------------------
# the upstream modules keep their names; the stand-in needs a known site
# --------------------------------------------------------------------------


def test_upstream_modules_are_not_mutated(spy, monkeypatch):
    """Builtin EAGLE in the same process keeps the upstream names."""
    from sglang.srt.speculative import spec_utils

    before = {
        n: getattr(mlw, n)
        for n in ("sample_draft_proposal", ml._SINGLE_CG_RUNNER_NAME, "MultiLayerEagleDraftWorker")
    }
    info = make_sampling_info([1, 2], [1.0, 1.0], [1 << 30, 1 << 30])
    run_prefill(make_draft_worker(step_logits(2, seed=1)), [4, 5], info, monkeypatch)
    assert len(spy) == NUM_STEPS
    for name, value in before.items():
        assert getattr(mlw, name) is value
    assert mlw.sample_draft_proposal is spec_utils.sample_draft_proposal
    assert mlw.MultiLayerEagleDraftWorker is not ml.DetspecMultiLayerEagleDraftWorker
    # ... while the DETSPEC bodies see the DETSPEC names.
    g = rebound_globals("_draft_extend_for_prefill")
    assert g["sample_draft_proposal"] is ml._detspec_sample_draft_proposal
    g = rebound_globals("__init__", owner=mlw.MultiLayerEagleWorkerV2)
    assert g["MultiLayerEagleDraftWorker"] is ml.DetspecMultiLayerEagleDraftWorker


def test_stand_in_refuses_unknown_caller():
    with pytest.raises(RuntimeError, match="outside a known draft site"):
        ml._detspec_sample_draft_proposal(torch.zeros(1, 4), torch.ones(1, 1))


# --------------------------------------------------------------------------
# capture: the DETSPEC worker builds the DETSPEC single-CG runner, builtin not
# --------------------------------------------------------------------------


@pytest.fixture
def capture_env(monkeypatch):
    """Let _capture_cuda_graphs reach the runner choice on CPU; record the runner built."""
    built = []

    def fake_init(self, eagle_worker):
        built.append(self)
        self.eagle_worker = eagle_worker

    fakes = {
        "_is_cpu": False,
        "check_cuda_graph_backend": lambda *a, **k: False,
        "get_available_gpu_memory": lambda *a, **k: 0.0,
    }
    # The DETSPEC body reads its private globals, the builtin one the module.
    detspec_globals = rebound_globals("_capture_cuda_graphs")
    for name, value in fakes.items():
        monkeypatch.setitem(detspec_globals, name, value)
        monkeypatch.setattr(mlw, name, value)
    monkeypatch.setattr(
        mlr.OneGraphMultiLayerEagleMultiStepDraftExtendCudaGraphRunner, "__init__", fake_init
    )
    monkeypatch.setenv("SGLANG_ENABLE_SINGLE_CG_DRAFT", "1")
    monkeypatch.delenv("SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH", raising=False)
    return built


def capture_with(cls, logits):
    worker = make_draft_worker(logits)
    worker.__class__ = cls
    for r in worker.draft_runner_list:
        r.attn_backend = FakeBackend()
    worker.gpu_id = 0
    worker._specialized_graph_memory_usage = {}
    worker._specialized_graph_time_usage = {}
    worker._capture_cuda_graphs()
    return worker


def test_capture_uses_detspec_single_cg_runner_only_for_detspec(capture_env):
    upstream_cls = mlw.OneGraphMultiLayerEagleMultiStepDraftExtendCudaGraphRunner
    logits = step_logits(1, seed=9)

    detspec = capture_with(ml.DetspecMultiLayerEagleDraftWorker, logits)
    assert type(detspec.cuda_graph_runner_for_draft_extend) is ml.DetspecOneGraphDraftExtendRunner
    assert mlw.OneGraphMultiLayerEagleMultiStepDraftExtendCudaGraphRunner is upstream_cls

    builtin = capture_with(mlw.MultiLayerEagleDraftWorker, logits)
    assert type(builtin.cuda_graph_runner_for_draft_extend) is upstream_cls
    assert len(capture_env) == 2


def test_detspec_runner_overrides_the_upstream_sampler_hook():
    # The in-graph sampler upstream selects when draft_probs exists.
    assert "_sample_draft_proposal" in vars(mlr.MultiLayerEagleDraftExtendCudaGraphRunner)
    assert "_sample_draft_proposal" in vars(ml.DetspecSingleCGStepRunner)
    assert "prepare" in vars(mlr.MultiLayerEagleMultiStepDraftExtendCudaGraphRunner)
    assert hasattr(mlw, ml._SINGLE_CG_RUNNER_NAME)


# --------------------------------------------------------------------------
# the spec worker: upstream __init__ of each version, DETSPEC draft worker
# --------------------------------------------------------------------------


def test_worker_builds_detspec_draft_worker(monkeypatch):
    import inspect

    built = []

    def fake_draft_init(self, *args, **kwargs):  # model loading needs a GPU
        built.append(args)
        self.parallel_layout = None

    monkeypatch.setattr(ml.DetspecMultiLayerEagleDraftWorker, "__init__", fake_draft_init)
    target = harness.bare_target_worker()
    spec = dict(speculative_eagle_topk=1, speculative_num_steps=NUM_STEPS,
                speculative_num_draft_tokens=NUM_DRAFT_TOKENS)
    if "ps" in inspect.signature(mlw.MultiLayerEagleWorkerV2.__init__).parameters:
        # 0.5.17 - 0.5.20: (server_args, gpu_id, ps, nccl_port, target_worker); 0.5.17 reads server_args,
        # 0.5.18 - 0.5.20 already read the page size from the runtime context (get_schedule()).
        server_args = SimpleNamespace(device="cpu", page_size=1,
                                      speculative_algorithm="EAGLE", **spec)
        from sglang.srt.runtime_context import get_context

        ctx = get_context().override_server_args(speculative_algorithm="EAGLE", device="cpu", page_size=1, **spec)
        kwargs = dict(server_args=server_args, gpu_id=0, ps=None, nccl_port=1,
                      target_worker=target)
    else:
        # 0.5.21+: (server_args, gpu_id, nccl_port, target_worker), reads the runtime context.
        from sglang.test.test_utils import published_topology

        ctx = published_topology(speculative_algorithm="EAGLE", device="cpu", **spec)
        kwargs = dict(server_args=None, gpu_id=0, nccl_port=1, target_worker=target)
    with ctx:
        worker = ml.DetspecMultiLayerEagleWorkerV2(**kwargs)
    assert type(worker._draft_worker) is ml.DetspecMultiLayerEagleDraftWorker
    assert len(built) == 1 and built[0][-1] is target
    assert worker.speculative_num_steps == NUM_STEPS
    assert isinstance(worker, mlw.MultiLayerEagleWorkerV2)
    # The target model runner now samples with the token-id-keyed DETSPEC sampler.
    assert isinstance(target.model_runner.sampler, detspec_sampler_class())
