"""``SGLANG_DETSPEC_TOKEN_ID_SAMPLER=1``: the token-id-keyed target sampler on a non-speculative deterministic server
(integration/setup/token_id_sampler_opt_in.py).

The hook is exercised through SGLang's real ``Scheduler.init_tp_model_worker`` as the plugin patches it
(``load_plugin`` applies the ``HookRegistry`` hooks in this process): only ``TpModelWorker`` is replaced, by a stand-in
whose model runner holds a real SGLang ``Sampler`` (built without its TP-group constructor, as in
test_target_sampler.py; a real ``TpModelWorker`` loads a model on a GPU). What the swapped class samples is
test_target_sampler.py's subject.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from sglang_detspec.integration.sampling import target_sampler
from sglang_detspec.integration.setup import token_id_sampler_opt_in
from sglang_detspec.integration.setup.refusals import DetspecConfigError
from sglang_detspec.plugin import load_plugin

import sglang_verify_harness as harness

ENV = "SGLANG_DETSPEC_TOKEN_ID_SAMPLER"  # written out: the variable's name is user-facing


# --------------------------------------------------------------------------------------------------
# The variable's values
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("environ, expected", [({}, False), ({ENV: ""}, False), ({ENV: "0"}, False), ({ENV: "1"}, True)])
def test_allowed_values(environ, expected):
    assert token_id_sampler_opt_in.token_id_sampler_requested(environ) is expected


@pytest.mark.parametrize("value", ["true", "yes", "on", "2", "01", " 1", "1 ", "-1", "off"])
def test_any_other_value_is_refused_naming_the_variable_and_the_allowed_values(value):
    with pytest.raises(DetspecConfigError) as info:
        token_id_sampler_opt_in.token_id_sampler_requested({ENV: value})
    message = str(info.value)
    assert f"{ENV}={value!r}" in message and f"{ENV}=1" in message and "0" in message


def test_the_process_environment_is_read_by_default(monkeypatch):
    monkeypatch.setenv(ENV, "1")
    assert token_id_sampler_opt_in.token_id_sampler_requested() is True
    monkeypatch.setenv(ENV, "maybe")
    with pytest.raises(DetspecConfigError, match=ENV):
        token_id_sampler_opt_in.token_id_sampler_requested()
    monkeypatch.delenv(ENV)
    assert token_id_sampler_opt_in.token_id_sampler_requested() is False


# --------------------------------------------------------------------------------------------------
# Which servers it serves (real SpeculativeAlgorithm values)
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plugin_loaded():
    load_plugin()


def _algorithm(name):
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    return SpeculativeAlgorithm.from_string(name)


def test_non_speculative_deterministic_server_installs(plugin_loaded):
    assert token_id_sampler_opt_in.check_opt_in(_algorithm(None), deterministic=True) is True


def test_without_deterministic_inference_it_is_refused(plugin_loaded):
    with pytest.raises(DetspecConfigError, match="needs --enable-deterministic-inference") as info:
        token_id_sampler_opt_in.check_opt_in(_algorithm(None), deterministic=False)
    assert ENV in str(info.value)


@pytest.mark.parametrize("name", ["EAGLE", "EAGLE3", "NGRAM", "STANDALONE"])
def test_a_builtin_speculative_algorithm_is_refused_pointing_at_the_invariant_mode(plugin_loaded, name):
    with pytest.raises(DetspecConfigError) as info:
        token_id_sampler_opt_in.check_opt_in(_algorithm(name), deterministic=True)
    message = str(info.value)
    assert f"{ENV}=1 cannot be used with --speculative-algorithm {name}" in message
    assert "DETSPEC_EAGLE_INVARIANT" in message


@pytest.mark.parametrize(
    "name", ["DETSPEC_EAGLE", "DETSPEC_EAGLE3", "DETSPEC_EAGLE_INVARIANT", "DETSPEC_EAGLE3_INVARIANT"]
)
def test_a_detspec_server_needs_nothing_extra(plugin_loaded, name):
    # False: not installed here (the DETSPEC worker does it), and no error.
    assert token_id_sampler_opt_in.check_opt_in(_algorithm(name), deterministic=True) is False


# --------------------------------------------------------------------------------------------------
# The hook on SGLang's Scheduler.init_tp_model_worker
# --------------------------------------------------------------------------------------------------


class _Built:
    """Counts stand-in target workers built (a refusal must come before the weights load)."""

    count = 0


@pytest.fixture
def scheduler_factory(plugin_loaded, monkeypatch):
    """``make(spec_algorithm, sampler=None, deterministic=True)`` -> (run init_tp_model_worker, scheduler, the sampler
    the target model runner will hold)."""
    from sglang.srt.managers import tp_worker
    from sglang.srt.runtime_context import get_context

    class StandInTpModelWorker:
        sampler_to_use = None

        def __init__(self, **kwargs):
            _Built.count += 1
            self.kwargs = kwargs
            self.model_runner = SimpleNamespace(sampler=StandInTpModelWorker.sampler_to_use)

    monkeypatch.setattr(tp_worker, "TpModelWorker", StandInTpModelWorker)  # imported inside the upstream body
    _Built.count = 0

    def make(spec_algorithm, sampler=None, deterministic=True):
        from sglang.srt.managers.scheduler import Scheduler

        StandInTpModelWorker.sampler_to_use = harness.bare_sampler() if sampler is None else sampler
        # What upstream's body reads: 0.5.17 self.ps.gpu_id, 0.5.23 get_device().gpu_id.
        scheduler = SimpleNamespace(
            server_args=SimpleNamespace(), nccl_port=12345, ps=SimpleNamespace(gpu_id=0), spec_algorithm=spec_algorithm
        )

        def run():
            with get_context().override_server_args(
                enable_deterministic_inference=deterministic, sampling_backend="pytorch"
            ):
                Scheduler.init_tp_model_worker(scheduler)
            return scheduler

        return run, scheduler, StandInTpModelWorker.sampler_to_use

    return make


def test_the_hook_is_on_sglangs_target_worker_construction(plugin_loaded):
    assert token_id_sampler_opt_in.token_id_sampler_opt_in_active()
    from sglang_detspec.plugin import plugin_status

    assert plugin_status()["token_id_sampler_hook_active"] is True


def test_with_the_variable_the_target_sampler_becomes_the_detspec_sampler(scheduler_factory, monkeypatch, caplog):
    from sglang.srt.layers.sampler import Sampler

    monkeypatch.setenv(ENV, "1")
    run, scheduler, built_sampler = scheduler_factory(_algorithm(None))
    with caplog.at_level(logging.INFO, logger=token_id_sampler_opt_in.__name__):
        run()
    sampler = scheduler.tp_worker.model_runner.sampler
    assert type(sampler) is target_sampler.detspec_sampler_class()
    assert isinstance(sampler, Sampler)  # the same instance, its class swapped: SGLang's references stay valid
    assert sampler is built_sampler
    assert _Built.count == 1
    lines = [r for r in caplog.records if r.levelno == logging.INFO and ENV in r.getMessage()]
    assert len(lines) == 1 and "DetspecSampler" in lines[0].getMessage()


@pytest.mark.parametrize("value", [None, "0", ""])
def test_control_without_the_variable_the_sampler_stays_sglangs(scheduler_factory, monkeypatch, value):
    from sglang.srt.layers.sampler import Sampler

    if value is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, value)
    run, scheduler, _ = scheduler_factory(_algorithm(None))
    run()
    assert type(scheduler.tp_worker.model_runner.sampler) is Sampler
    assert _Built.count == 1


def test_on_a_detspec_server_the_hook_leaves_the_sampler_to_the_detspec_worker(scheduler_factory, monkeypatch):
    from sglang.srt.layers.sampler import Sampler

    monkeypatch.setenv(ENV, "1")
    run, scheduler, _ = scheduler_factory(_algorithm("DETSPEC_EAGLE_INVARIANT"))
    run()  # no error
    assert type(scheduler.tp_worker.model_runner.sampler) is Sampler  # the spec worker, built next, swaps it


@pytest.mark.parametrize(
    "spec, deterministic, match",
    [("EAGLE", True, "cannot be used with --speculative-algorithm EAGLE"),
     (None, False, "needs --enable-deterministic-inference")],
)
def test_refusals_come_before_the_target_worker_is_built(scheduler_factory, monkeypatch, spec, deterministic, match):
    monkeypatch.setenv(ENV, "1")
    run, scheduler, _ = scheduler_factory(_algorithm(spec), deterministic=deterministic)
    with pytest.raises(DetspecConfigError, match=match):
        run()
    assert _Built.count == 0 and not hasattr(scheduler, "tp_worker")


def test_a_bad_value_is_refused_at_the_scheduler_before_the_worker_is_built(scheduler_factory, monkeypatch):
    monkeypatch.setenv(ENV, "true")
    run, _, _ = scheduler_factory(_algorithm(None))
    with pytest.raises(DetspecConfigError, match=f"{ENV}='true' is not an allowed value"):
        run()
    assert _Built.count == 0


def test_a_foreign_sampler_is_refused_naming_the_variable(scheduler_factory, monkeypatch):
    import torch

    class CustomSampler(torch.nn.Module):
        pass

    monkeypatch.setenv(ENV, "1")
    run, _, _ = scheduler_factory(_algorithm(None), sampler=CustomSampler())
    with pytest.raises(RuntimeError, match=f"{ENV}=1 needs SGLang's own Sampler.*found CustomSampler"):
        run()
