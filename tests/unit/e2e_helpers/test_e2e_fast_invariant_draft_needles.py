"""CPU tests of what tests/e2e/test_e2e_fast_invariant_draft.py relies on before a GPU: its log needle is the line the
plugin writes when it puts an invariant draft on cuBLAS, its fast servers are the plain invariant servers with the
switch, and the bench configuration passes a value the plugin accepts."""

import types

import pytest
import test_e2e_fast_invariant_draft as e2e
import torch

from sglang_detspec.bench.serving_bench import configs as cfgs
from sglang_detspec.bench.serving_bench import results
from sglang_detspec.integration.setup import algorithm
from sglang_detspec.integration.setup import batch_invariant_ops as bio

from e2e_spec_resolution import invariant_session_specs


def test_the_needle_is_what_the_plugin_logs_for_an_invariant_draft(monkeypatch, caplog):
    pytest.importorskip("sglang")
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    algorithm.register_algorithms()
    monkeypatch.setenv(bio.FAST_DRAFT_ENV, "1")
    caplog.set_level("INFO")
    runner = types.SimpleNamespace(spec_algorithm=SpeculativeAlgorithm.from_string("DETSPEC_EAGLE_INVARIANT"),
                                   model=torch.nn.Identity(), is_draft_worker=True)
    bio._maybe_fast_draft(runner)
    assert e2e.FAST_DRAFT_LINE in caplog.text


def test_the_fast_servers_are_the_invariant_servers_with_the_switch(monkeypatch):
    pytest.importorskip("sglang")
    import e2e_harness as h

    assert h.FAST_INVARIANT_DRAFT_ENV == bio.FAST_DRAFT_ENV
    specs = invariant_session_specs(h, monkeypatch)
    for fast, plain in zip(e2e.FAST, ("invariant_graph", "invariant_nograph")):
        assert specs[fast].args == specs[plain].args, (fast, plain)
        assert dict(specs[fast].env) == {bio.FAST_DRAFT_ENV: "1"} and not specs[plain].env


def test_the_bench_configuration_passes_a_value_the_plugin_accepts():
    fast = cfgs.config_by_name("detspec_invariant_fast_draft")
    assert fast.algorithm == "DETSPEC_EAGLE_INVARIANT" and fast.deterministic and fast.opt_in
    assert bio.fast_draft_wanted(dict(fast.env)) is True
    assert "detspec_invariant_fast_draft" in results.SUBJECTS and fast.name not in cfgs.DEFAULT_CONFIGS
