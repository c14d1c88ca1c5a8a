"""Start-up checks that a DETSPEC server runs the DETSPEC sampling code (integration/setup/scheduler_check.py; the
worker-side checks of integration/workers/worker_checks.py are exercised by the worker tests).

``check_scheduler_workers`` is the AFTER hook the plugin puts on ``Scheduler.maybe_init_draft_worker``: once the
scheduler built its speculative worker for a DETSPEC algorithm, the worker, its draft worker and the target sampler
must be the DETSPEC classes. The workers here are real DETSPEC / upstream classes built without their constructors
(those load models on a GPU); the constructor path is covered by test_single_layer_construction.py / test_multi_layer_construction.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_detspec.integration.sampling import target_sampler
from sglang_detspec.integration.setup import algorithm, retraction, scheduler_check
from sglang_detspec.plugin import load_plugin

import sglang_verify_harness as harness


def _spec_worker(cls, draft_worker, sampler):
    worker = cls.__new__(cls)
    worker._draft_worker = draft_worker
    worker._target_worker = SimpleNamespace(model_runner=SimpleNamespace(sampler=sampler))
    return worker


def _detspec_sampler():
    sampler = harness.bare_sampler()
    target_sampler.install_detspec_sampler(SimpleNamespace(sampler=sampler))
    return sampler


@pytest.fixture
def detspec_eagle():
    load_plugin()
    return algorithm.lookup("DETSPEC_EAGLE")


def test_detspec_workers_pass(detspec_eagle):
    from sglang_detspec.integration.workers.single_layer import DetspecEagleDraftWorker, DetspecEAGLEWorkerV2

    draft = DetspecEagleDraftWorker.__new__(DetspecEagleDraftWorker)
    scheduler = SimpleNamespace(
        spec_algorithm=detspec_eagle, draft_worker=_spec_worker(DetspecEAGLEWorkerV2, draft, _detspec_sampler())
    )
    retraction._enabled = False  # noqa: SLF001 - the process flag the check turns on
    assert scheduler_check.check_scheduler_workers("result", scheduler) == "result"
    assert retraction.replay_enabled()  # a checked DETSPEC scheduler replays its retracted requests
    retraction._enabled = False  # noqa: SLF001


def test_an_upstream_worker_under_a_detspec_name_is_refused(detspec_eagle):
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker, EAGLEWorkerV2

    upstream = _spec_worker(EAGLEWorkerV2, EagleDraftWorker.__new__(EagleDraftWorker), _detspec_sampler())
    with pytest.raises(RuntimeError, match="not a DETSPEC worker"):
        scheduler_check.check_scheduler_workers(None, SimpleNamespace(spec_algorithm=detspec_eagle, draft_worker=upstream))


def test_an_upstream_target_sampler_is_refused(detspec_eagle):
    from sglang_detspec.integration.workers.single_layer import DetspecEagleDraftWorker, DetspecEAGLEWorkerV2

    draft = DetspecEagleDraftWorker.__new__(DetspecEagleDraftWorker)
    worker = _spec_worker(DetspecEAGLEWorkerV2, draft, harness.bare_sampler())
    with pytest.raises(RuntimeError, match="not the DETSPEC sampler"):
        scheduler_check.check_scheduler_workers(None, SimpleNamespace(spec_algorithm=detspec_eagle, draft_worker=worker))


def test_other_algorithms_and_draftless_pipeline_stages_are_not_checked(detspec_eagle):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    builtin = SimpleNamespace(spec_algorithm=SpeculativeAlgorithm.EAGLE, draft_worker=object())
    assert scheduler_check.check_scheduler_workers(1, builtin) == 1
    draftless = SimpleNamespace(spec_algorithm=detspec_eagle, draft_worker=None)
    assert scheduler_check.check_scheduler_workers(2, draftless) == 2
    assert not retraction.replay_enabled()  # built-in servers keep upstream's retraction


def test_load_plugin_puts_the_check_on_the_scheduler():
    load_plugin()
    assert scheduler_check.scheduler_check_active()
    load_plugin()  # idempotent: registered once
    from sglang.srt.plugins.hook_registry import HookRegistry

    hooks = [h for _, h, _ in HookRegistry._hooks.get(scheduler_check.SCHEDULER_HOOK_TARGET, [])]
    assert hooks.count(scheduler_check.check_scheduler_workers) == 1
