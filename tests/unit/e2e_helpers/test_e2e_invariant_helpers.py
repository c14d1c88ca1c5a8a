"""CPU tests of what tests/e2e/test_e2e_invariant.py relies on before it reaches a GPU: the divergence summary and the
accept length over many responses (tests/e2e/e2e_harness.py), and the five server configurations, resolved by
SGLang's own parser and resolution to the algorithm, worker, verify scheme, draft and graph settings they are meant
to have (a typo in a flag would otherwise cost a GPU run)."""

import os
from pathlib import Path

import pytest

import e2e_harness as h
from e2e_spec_resolution import resolve_spec

# ---------------------------------------------------------------------------------------------------
# compare_to_reference
# ---------------------------------------------------------------------------------------------------


def test_identical_sequences():
    ref = [[1, 2, 3], [4, 5, 6]]
    got = h.compare_to_reference(ref, [list(r) for r in ref], [7, 8])
    assert got == {"n": 2, "identical": 2, "fraction_identical": 1.0, "first_divergence_histogram": {},
                   "divergences": []}


def test_first_difference_its_tokens_and_the_histogram():
    ref = [[1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 4]]
    other = [[1, 2, 3, 4], [1, 9, 3, 8], [0, 2, 3, 4], [1, 7, 7, 7]]
    got = h.compare_to_reference(ref, other, [11, 12, 13, 14])
    assert got["identical"] == 1 and got["fraction_identical"] == 0.25
    assert got["divergences"] == [
        {"seed": 12, "index": 1, "reference": 2, "got": 9},  # only the first difference counts
        {"seed": 13, "index": 0, "reference": 1, "got": 0},
        {"seed": 14, "index": 1, "reference": 2, "got": 7},
    ]
    hist = got["first_divergence_histogram"]
    assert hist == {"0": 1, "1": 2} and list(hist) == ["0", "1"]


def test_histogram_keys_are_in_numeric_order():
    ref = [[0] * 12 for _ in range(3)]
    other = [[0] * 10 + [1, 0], [0] * 2 + [1] + [0] * 9, [0] * 11 + [5]]
    assert list(h.compare_to_reference(ref, other, [1, 2, 3])["first_divergence_histogram"]) == ["2", "10", "11"]


def test_a_shorter_sequence_differs_at_its_end():
    got = h.compare_to_reference([[1, 2, 3], [1, 2]], [[1, 2], [1, 2, 3]], [5, 6])
    assert got["identical"] == 0
    assert got["divergences"] == [{"seed": 5, "index": 2, "reference": 3, "got": None},
                                  {"seed": 6, "index": 2, "reference": None, "got": 3}]


def test_only_the_first_divergences_are_kept_but_all_are_counted():
    ref = [[0, 0]] * 30
    other = [[0, 1]] * 30
    got = h.compare_to_reference(ref, other, list(range(30)), keep=20)
    assert [d["seed"] for d in got["divergences"]] == list(range(20))
    assert got["first_divergence_histogram"] == {"1": 30} and got["identical"] == 0


def test_mismatched_lengths_are_refused():
    with pytest.raises(ValueError, match="2 reference, 1 other sequences and 2 seeds"):
        h.compare_to_reference([[1], [2]], [[1]], [1, 2])
    with pytest.raises(ValueError, match="1 seeds"):
        h.compare_to_reference([[1], [2]], [[1], [2]], [1])


def test_empty_comparison():
    assert h.compare_to_reference([], [], [])["fraction_identical"] is None


# ---------------------------------------------------------------------------------------------------
# total_accept_length
# ---------------------------------------------------------------------------------------------------


def test_total_accept_length_pools_tokens_and_verify_steps():
    rs = [{"meta_info": {"completion_tokens": 32, "spec_verify_ct": 10}},
          {"meta_info": {"completion_tokens": 32, "spec_verify_ct": 22}}]
    # 64 / 32, not the mean of 3.2 and ~1.45
    assert h.total_accept_length(rs) == 2.0


def test_total_accept_length_of_a_non_speculative_server_is_none():
    # SGLang leaves spec_verify_ct out of meta_info when a request ran no verify step.
    assert h.total_accept_length([{"meta_info": {"completion_tokens": 32}}, {"meta_info": {}}]) is None
    assert h.total_accept_length([]) is None


# ---------------------------------------------------------------------------------------------------
# The seven servers, through SGLang's parser and resolution
# ---------------------------------------------------------------------------------------------------

INVARIANT_SERVERS = ("nonspec_token_id", "invariant_graph", "invariant_nograph", "invariant_draft2",
                     "detspec_rs_control", "invariant_mtp_graph", "invariant_mtp_nograph")
MULTI_LAYER_SERVERS = ("invariant_mtp_graph", "invariant_mtp_nograph")
GRAPHS_OFF_SERVERS = ("invariant_nograph", "invariant_mtp_nograph")


@pytest.fixture(scope="module")
def models_and_specs(tmp_path_factory):
    from sglang_detspec.models import tiny_models as tm

    root = tmp_path_factory.mktemp("tiny-invariant")
    models = tm.ensure_tiny_models(root, pair="weighted")
    return root, models, h.server_specs(models, "weighted")


def test_the_e2e_test_asks_for_these_servers_and_the_harness_has_them(models_and_specs):
    import test_e2e_invariant as e2e

    _, _, specs = models_and_specs
    assert set(e2e.SERVERS) == set(INVARIANT_SERVERS)
    assert {m.args[0] for m in e2e.pytestmark if m.name == "e2e_server"} == set(INVARIANT_SERVERS)
    assert set(INVARIANT_SERVERS) <= set(specs)


@pytest.mark.parametrize("name", INVARIANT_SERVERS)
def test_invariant_specs_resolve_as_meant(models_and_specs, name, monkeypatch):
    from sglang_detspec.integration import compat
    from sglang_detspec.integration.sampling import scheme
    from sglang_detspec.models import mtp_draft, second_eagle_draft

    root, models, specs = models_and_specs
    spec = specs[name]
    sa = resolve_spec(spec, monkeypatch)
    got = {f: compat.read_field(sa, f, None) for f in (
        "speculative_algorithm", "speculative_draft_model_path", "enable_deterministic_inference",
        "cuda_graph_max_bs_decode", "cuda_graph_backend_decode", "cuda_graph_backend_prefill")}
    assert got["enable_deterministic_inference"] is True
    assert got["cuda_graph_max_bs_decode"] == 32  # INVARIANT_ARGS, after the common 8
    graphs_off = {"cuda_graph_backend_decode": "disabled", "cuda_graph_backend_prefill": "disabled"}
    assert ({k: got[k] for k in graphs_off} == graphs_off) is (name in GRAPHS_OFF_SERVERS)
    assert bool(compat.read_field(sa, "enable_multi_layer_eagle", False)) is (name in MULTI_LAYER_SERVERS)
    assert (spec.env.get(h.TOKEN_ID_SAMPLER_ENV) == "1") is (name == "nonspec_token_id")
    # The tiny configs declare the served context length: no override switch (SGLang would warn of wrong outputs).
    assert "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN" not in spec.env
    if name == "nonspec_token_id":
        assert got["speculative_algorithm"] is None and got["speculative_draft_model_path"] is None
        return
    expected_draft = (second_eagle_draft.ensure_second_eagle_draft(root) if name == "invariant_draft2"
                      else mtp_draft.ensure_mtp_draft(root, pair="weighted") if name in MULTI_LAYER_SERVERS
                      else models.eagle_draft)
    assert Path(got["speculative_draft_model_path"]) == expected_draft
    assert got["speculative_algorithm"] == ("DETSPEC_EAGLE" if name == "detspec_rs_control" else "DETSPEC_EAGLE_INVARIANT")

    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from sglang_detspec.integration.workers.spec_workers import DetspecEAGLEWorkerV2, DetspecMultiLayerEagleWorkerV2

    with scheme.selected(scheme.REJECTION):  # the factory fixes the process's scheme; restored afterwards
        worker = SpeculativeAlgorithm.from_string(got["speculative_algorithm"]).create_worker(sa)
        chosen = scheme.current()
    assert worker is (DetspecMultiLayerEagleWorkerV2 if name in MULTI_LAYER_SERVERS else DetspecEAGLEWorkerV2)
    assert chosen == (scheme.REJECTION if name == "detspec_rs_control" else scheme.COUPLED)


#: tests/e2e/test_e2e_invariant_pressure.py's servers besides the reference: the small pool and SGLang's forced
#: retraction; one without the retraction replay (its control on PYTHONPATH); DETSPEC_EAGLE's as the control. All
#: but the no-replay one retract the probe on purpose (e2e_harness.RETRACT_PROBE_CONTROL).
PRESSURE_SERVERS = ("invariant_forced_retract_graph", "invariant_forced_retract_nograph",
                    "invariant_noreplay_forced_retract", "detspec_eagle_probe_retract_graph")


def test_the_pressure_e2e_test_asks_for_these_servers_and_the_harness_has_them(models_and_specs):
    import test_e2e_invariant_pressure as e2e

    _, _, specs = models_and_specs
    assert set(e2e.SERVERS) == {"nonspec_token_id", *PRESSURE_SERVERS}
    assert {m.args[0] for m in e2e.pytestmark if m.name == "e2e_server"} == set(e2e.SERVERS)
    assert set(e2e.SERVERS) <= set(specs)


@pytest.mark.parametrize("name", PRESSURE_SERVERS)
def test_invariant_pressure_specs_resolve_as_meant(models_and_specs, name, monkeypatch):
    from sglang_detspec.integration import compat

    _, models, specs = models_and_specs
    spec = specs[name]
    sa = resolve_spec(spec, monkeypatch)
    assert compat.read_field(sa, "speculative_algorithm", None) == (
        "DETSPEC_EAGLE" if name.startswith("detspec_") else "DETSPEC_EAGLE_INVARIANT")
    assert Path(compat.read_field(sa, "speculative_draft_model_path", None)) == models.eagle_draft
    assert compat.read_field(sa, "enable_deterministic_inference", None) is True
    assert compat.read_field(sa, "max_total_tokens", None) == h.PRESSURE_KV_TOKENS  # after the pair's own value
    assert compat.read_field(sa, "enable_metrics", None) is True
    assert {k: spec.env.get(k) for k in h.FORCED_RETRACT_ENV} == h.FORCED_RETRACT_ENV
    graphs_off = compat.read_field(sa, "cuda_graph_backend_decode", None) == "disabled"
    assert graphs_off is name.endswith("_nograph")
    path = spec.env.get("PYTHONPATH", "").split(os.pathsep)
    assert (str(h.NO_REPLAY_CONTROL) in path) is ("noreplay" in name)
    retracts_the_probe = str(h.RETRACT_PROBE_CONTROL) in path
    assert retracts_the_probe is ("noreplay" not in name)
    if retracts_the_probe:  # aimed at the probe the E2E module's checks send
        import test_e2e_invariant_pressure as e2e

        assert spec.env["DETSPEC_TEST_RETRACT_PROBE_SEED"] == str(e2e.SEED)


# ---------------------------------------------------------------------------------------------------
# The GPU test's own plumbing, on fake servers: sweeps, summaries and its assertions (both ways)
# ---------------------------------------------------------------------------------------------------


class _FakeServer:
    def __init__(self, name):
        self.name, self.base_url = name, f"http://fake/{name}"

    def alive(self):
        return True

    def log_tail(self, n=60):
        return ""


def _fake_tokens(seed, text, kind):
    base = [(seed * 31 + len(text) + i * 7) % 1000 for i in range(32)]
    if kind == "invariant_nograph" and seed % 10 == 3:  # 10 % of the sequences differ from token 5 on
        base[5:] = [999] * 27
    if kind == "detspec_rs_control":
        base[1:] = [(t + 1) % 1000 for t in base[1:]]  # every sequence differs at token 1
    return base


def _fake_post(calls):
    def post(url, path, body, timeout=300):
        kind = url.rsplit("/", 1)[1]
        calls.append((kind, len(body["text"])))
        out = []
        for text, sp in zip(body["text"], body["sampling_params"]):
            seed = sp["sampling_seed"]
            assert sp["max_new_tokens"] == 32 and sp["ignore_eos"] is True
            meta = {"completion_tokens": 32}
            if kind != "nonspec_token_id":  # the second draft takes other verify steps for odd seeds
                meta["spec_verify_ct"] = 15 if kind == "invariant_draft2" and seed % 2 else 16
            out.append({"output_ids": _fake_tokens(seed, text, kind), "meta_info": meta})
        return out

    return post


@pytest.fixture
def fake_run(monkeypatch, tmp_path):
    import test_e2e_invariant as e2e

    monkeypatch.setenv("DETSPEC_E2E_OUT", str(tmp_path))
    monkeypatch.setattr(e2e, "SEEDS", list(range(1, 41)))
    calls = []
    monkeypatch.setattr(h, "post_json", _fake_post(calls))
    servers = {name: _FakeServer(name) for name in e2e.SERVERS}
    return e2e, e2e._Sweeps(servers), calls


def test_sweep_summary_on_fake_servers(fake_run):
    import json

    e2e, sweeps, calls = fake_run
    r = sweeps.get("t1.0")
    assert sweeps.get("t1.0") is r  # measured once per configuration
    # 40 seeds in POSTs of BATCH per server, then RESEND (32) seeds to the reference again
    assert sorted(set(n for _, n in calls)) == [e2e.BATCH]
    assert sum(n for k, n in calls if k == "invariant_graph") == 40
    assert sum(n for k, n in calls if k == "nonspec_token_id") == 40 + 32
    s = r["summary"]["servers"]
    assert all(v["error"] is None for v in s.values())
    assert s["nonspec_token_id"]["accept_length"] is None and s["invariant_graph"]["accept_length"] == 2.0
    assert s["invariant_graph"]["vs_reference"]["identical"] == 40
    nograph = s["invariant_nograph"]["vs_reference"]
    assert nograph["identical"] == 36 and nograph["first_divergence_histogram"] == {"5": 4}
    assert [d["seed"] for d in nograph["divergences"]] == [3, 13, 23, 33]
    assert s["detspec_rs_control"]["vs_reference"]["identical"] == 0
    assert r["summary"]["draft2_vs_invariant_graph"]["identical"] == 40
    assert r["summary"]["draft2_verify_counts_differ"] == 20
    assert r["summary"]["nograph_verify_counts_equal"] == 40
    assert r["summary"]["reference_resend"]["identical"] == 32
    recorded = json.loads(h.results_path().read_text())["invariant_sweep_t1.0"]
    assert recorded["servers"]["invariant_nograph"]["vs_reference"]["identical"] == 36


def test_the_gpu_assertions_pass_and_fail_where_they_should(fake_run):
    e2e, sweeps, _ = fake_run
    e2e.test_reference_honours_the_seeds_and_repeats_itself(sweeps, "t1.0")
    e2e.test_invariant_emits_the_non_speculative_tokens(sweeps, "t1.0", "invariant_graph")
    with pytest.raises(AssertionError, match="36/40 identical"):  # 90 % < 99 %
        e2e.test_invariant_emits_the_non_speculative_tokens(sweeps, "t1.0", "invariant_nograph")
    e2e.test_a_second_draft_gives_the_same_tokens(sweeps, "t1.0")
    e2e.test_control_rejection_sampling_gives_other_tokens(sweeps, "t1.0")
    e2e.test_invariant_accept_length_shows_accepted_drafts(sweeps)  # 32 / 16 = 2.0 > 1.5


def test_a_failing_server_is_reported_not_hidden(fake_run, monkeypatch):
    e2e, sweeps, _ = fake_run
    post = h.post_json

    def broken(url, path, body, timeout=300):
        if url.endswith("invariant_draft2"):
            raise ConnectionRefusedError("refused")
        return post(url, path, body, timeout)

    monkeypatch.setattr(h, "post_json", broken)
    r = sweeps.get("t0.7")
    assert "ConnectionRefusedError" in r["summary"]["servers"]["invariant_draft2"]["error"]
    e2e.test_invariant_emits_the_non_speculative_tokens(sweeps, "t0.7", "invariant_graph")  # the others still count
    with pytest.raises(AssertionError, match="invariant_draft2: ConnectionRefusedError"):
        e2e.test_a_second_draft_gives_the_same_tokens(sweeps, "t0.7")
