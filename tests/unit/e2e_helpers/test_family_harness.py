"""CPU tests of what tests/e2e/test_e2e_families.py relies on before it reaches a GPU: the family servers' names and
specs (tests/e2e/family_harness.py), resolved by SGLang's own parser and resolution to what each is meant to run (or
refused there, as the GPU test expects at start-up), and the module's own plumbing on fake servers -- sweeps, checks,
the control's refusal path -- with its assertions passing and failing where they should."""

from pathlib import Path

import pytest

import e2e_checks as ec
import e2e_harness as h
import family_harness as fh
from e2e_spec_resolution import resolve_spec

# ---------------------------------------------------------------------------------------------------
# Names
# ---------------------------------------------------------------------------------------------------


def test_names_round_trip_and_other_names_are_not_family_servers():
    names = [n for p in fh.E2E_PAIRS for n in fh.pair_servers(p)] + [fh.server_name(*r) for r in fh.REFUSED]
    assert len(set(names)) == len(fh.E2E_PAIRS) * len(fh.ROLES) + len(fh.REFUSED)
    for name in names:
        assert fh.server_name(*fh.parse_server_name(name)) == name
    assert fh.parse_server_name("family_qwen3_moe_detspec_graph") == ("qwen3_moe", "detspec_graph")
    for other in ("detspec_eagle_graph", "invariant_graph", "family_qwen3_moe_nonsense", "family_llama_detspec_graph",
                  "family_qwen3_eagle3_detspec_graph", "family_qwen3_eagle3_invariant_eagle3"):  # served elsewhere
        assert fh.parse_server_name(other) is None


def test_an_unknown_server_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="no family E2E server 'detspec_graph' for pair 'qwen3_eagle3'"):
        fh.server_name("qwen3_eagle3", "detspec_graph")


# ---------------------------------------------------------------------------------------------------
# Specs, built only for the pairs named, resolved through SGLang
# ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def specs(tmp_path_factory):
    root = tmp_path_factory.mktemp("family-e2e")
    names = [n for p in fh.E2E_PAIRS for n in fh.pair_servers(p)] + [fh.server_name(*r) for r in fh.REFUSED]
    return root, fh.family_specs(root, names + ["detspec_eagle_graph"])


def test_only_the_named_pairs_are_built(tmp_path):
    got = fh.family_specs(tmp_path, [fh.server_name("qwen3_moe", "builtin_rs"), "invariant_graph"])
    assert list(got) == ["family_qwen3_moe_builtin_rs"] and got["family_qwen3_moe_builtin_rs"].name == list(got)[0]
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == ["family-qwen3_moe-v1"]
    assert fh.family_specs(tmp_path / "none", ["detspec_eagle_graph"]) == {}
    assert not (tmp_path / "none").exists()


def test_the_e2e_module_asks_for_every_served_pairs_servers_and_the_refusals():
    import test_e2e_families as e2e

    marked = {m.args[0] for p in e2e.PAIR_PARAMS for m in p.marks if m.name == "e2e_server"}
    assert marked == {n for p in fh.E2E_PAIRS for n in fh.pair_servers(p)}
    for test in (e2e.test_deepseek_mtp_on_flashinfer_is_refused_in_deterministic_mode,):
        (mark,) = [m for m in test.pytestmark if m.name == "e2e_server"]
        assert fh.parse_server_name(mark.args[0]) in fh.REFUSED
    assert set(e2e.CHECKS) | set(e2e.SWEEP_ROLES) <= set(fh.ROLES) == set(e2e.LOG_LINES)


#: role -> (algorithm as resolved, deterministic, graphs off, token-id env)
MEANT = {
    "detspec_graph": ("DETSPEC_EAGLE", True, False, False),
    "detspec_nograph": ("DETSPEC_EAGLE", True, True, False),
    "builtin_rs": ("EAGLE", False, False, False),  # NEXTN resolves to EAGLE
    "nonspec_token_id": (None, True, False, True),
    "invariant_graph": ("DETSPEC_EAGLE_INVARIANT", True, False, False),
    "invariant_nograph": ("DETSPEC_EAGLE_INVARIANT", True, True, False),
}


@pytest.mark.parametrize("role", fh.ROLES)
@pytest.mark.parametrize("pair", fh.E2E_PAIRS)
def test_served_specs_resolve_as_meant(specs, pair, role, monkeypatch):
    pytest.importorskip("sglang")
    from sglang_detspec.integration import compat
    from sglang_detspec.models.family_pairs import ensure_family_pair

    root, all_specs = specs
    spec = all_specs[fh.server_name(pair, role)]
    assert not spec.expect_exit
    sa = resolve_spec(spec, monkeypatch)
    read = lambda f: compat.read_field(sa, f, None)  # noqa: E731
    algorithm, deterministic, graphs_off, token_id = MEANT[role]
    assert read("speculative_algorithm") == algorithm
    assert read("enable_deterministic_inference") is deterministic
    assert (read("cuda_graph_backend_decode") == "disabled") is graphs_off
    assert (spec.env.get(h.TOKEN_ID_SAMPLER_ENV) == "1") is token_id
    assert read("attention_backend") == "triton"
    built = ensure_family_pair(root, pair)
    assert Path(read("model_path")) == built.target
    if algorithm is not None:
        assert Path(read("speculative_draft_model_path")) == built.draft
        assert read("speculative_num_draft_tokens") == 4 and read("speculative_eagle_topk") == 1
    if role == "builtin_rs":
        assert read("speculative_use_rejection_sampling") is True
        assert fh.BUILTIN_ALGORITHM[pair] in spec.args
    if role in ("nonspec_token_id", "invariant_graph", "invariant_nograph"):
        assert read("cuda_graph_max_bs_decode") == 32  # INVARIANT_ARGS, after the common 8


def test_deepseek_on_flashinfer_is_refused_by_sglangs_resolution(specs, monkeypatch):
    """What the GPU test expects the server to print at start-up (and the needles it looks for)."""
    pytest.importorskip("sglang")
    spec = specs[1][fh.server_name("deepseek_mtp", "detspec_flashinfer")]
    assert spec.expect_exit
    with pytest.raises(ValueError) as e:
        resolve_spec(spec, monkeypatch)
    assert fh.refusal_line(str(e.value), "supported for deterministic inference", "flashinfer"), str(e.value)


# ---------------------------------------------------------------------------------------------------
# served_settings, refusal_line, seed_sweep
# ---------------------------------------------------------------------------------------------------


def test_served_settings_keeps_the_known_fields_and_falls_back_to_the_old_endpoint():
    calls = []

    def get(url, path):
        calls.append(path)
        if path == "/server_info":
            raise h.HTTPStatusError(404, "not found")
        return {"attention_backend": "triton", "moe_runner_backend": "auto", "port": 1, "version": "0.5.17"}

    assert fh.served_settings("http://x", get) == {"attention_backend": "triton", "moe_runner_backend": "auto",
                                                   "version": "0.5.17"}
    assert calls == ["/server_info", "/get_server_info"]


def test_served_settings_says_when_no_endpoint_answers():
    def get(url, path):
        raise ConnectionRefusedError("refused")

    with pytest.raises(RuntimeError, match="neither /server_info nor /get_server_info answered"):
        fh.served_settings("http://x", get)


def test_refusal_line_is_the_last_line_with_every_needle():
    log = "a\nValueError: first   flashinfer x\nINFO flashinfer\nValueError:  second flashinfer\nend"
    assert fh.refusal_line(log, "ValueError", "flashinfer") == "ValueError: second flashinfer"
    assert fh.refusal_line(log, "ValueError", "fa3") is None


def _fake_post(calls, *, short_seed=None):
    def post(url, path, body, timeout=300):
        calls.append((url, len(body["text"])))
        out = []
        for text, sp in zip(body["text"], body["sampling_params"]):
            s = sp["sampling_seed"]
            assert sp["ignore_eos"] is True and sp["temperature"] == 1.0
            n = sp["max_new_tokens"] - (s == short_seed)
            out.append({"output_ids": [s, len(text)] + [0] * (n - 2), "meta_info": {"completion_tokens": n}})
        return out

    return post


def test_seed_sweep_keeps_seed_order_prompt_rotation_and_batch_size():
    calls = []
    got = fh.seed_sweep("http://x", list(range(1, 21)), ("a", "bb", "ccc"), max_new_tokens=5, batch=8, in_flight=16,
                        post=_fake_post(calls))
    assert [r["output_ids"][:2] for r in got] == [[s, 1 + (s - 1) % 3] for s in range(1, 21)]
    assert sorted(n for _, n in calls) == [4, 8, 8]


def test_seed_sweep_refuses_a_short_answer_naming_the_seed():
    with pytest.raises(RuntimeError, match="seed 7: expected 5 output ids"):
        fh.seed_sweep("http://x", list(range(1, 10)), ("a",), max_new_tokens=5, post=_fake_post([], short_seed=7))
    with pytest.raises(ValueError, match="1 <= batch <= in_flight"):
        fh.seed_sweep("http://x", [1], ("a",), max_new_tokens=5, batch=8, in_flight=4)


# ---------------------------------------------------------------------------------------------------
# The GPU module's plumbing on fake servers: checks, the control's refusal path, sweeps, and its assertions
# ---------------------------------------------------------------------------------------------------


class _FakeServer:
    def __init__(self, name, *, dies_with=None):
        self.name, self.base_url, self.startup_s, self.dies_with = name, f"http://fake/{name}", 1.0, dies_with

    def wait_ready(self, timeout):
        if self.dies_with:
            raise h.ServerStartError(f"server {self.name} exited with code 1 during start-up")

    def log_text(self):
        if self.dies_with:
            return f"Traceback\n  File x\n{self.dies_with}\n"
        role = fh.parse_server_name(self.name)[1]
        import test_e2e_families as e2e

        return "INFO start\n" + (e2e.LOG_LINES[role] or "INFO builtin") + " DetspecEAGLEWorkerV2\n"

    def log_tail(self, n=60):
        return self.log_text()

    def alive(self):
        return not self.dies_with


class _FakePool:
    timeout = 1

    def __init__(self, dying=None):
        self.servers = {}
        self.dying = dying or {}

    def get(self, name):
        return self.servers.setdefault(name, _FakeServer(name, dies_with=self.dying.get(name)))


def _fake_report(role, unique=1):
    profiles = ["uniform"] if role == "builtin_rs" else ["uniform", "mixed", "long", "prefix"]
    return {"unique_outputs": unique, "probe_accept_length": 2.2, "seeds_check": {"passed": True},
            "profiles": [{"name": p, "unique_outputs": unique, "trials": [{}] * 8} for p in profiles],
            "trials": [{"output_ids": [1, 2, 3]}],
            "against": {"url": "ref", "passed": True, "self_consistent": True} if role == "invariant_graph" else None}


@pytest.fixture
def fake_runs(monkeypatch, tmp_path):
    import test_e2e_families as e2e

    monkeypatch.setenv("DETSPEC_E2E_OUT", str(tmp_path))
    monkeypatch.setattr(fh, "get_json", lambda url, path: {"attention_backend": "triton",
                                                           "enable_deterministic_inference": "builtin" not in url})
    calls = []

    def run_check(srv, traffic, path, *, trials, seed, extra=()):
        pair, role = fh.parse_server_name(srv.name)
        calls.append((srv.name, traffic, trials, list(extra)))
        unique = 3 if role == "builtin_rs" or srv.name in broken else 1
        return {"returncode": int(unique > 1), "stdout": "", "stderr": "", "report": _fake_report(role, unique)}

    broken = set()
    monkeypatch.setattr(ec, "run_check", run_check)
    return e2e, calls, broken


def test_checks_run_each_role_once_with_its_traffic_and_the_reference_for_the_invariant(fake_runs):
    e2e, calls, _ = fake_runs
    runs = e2e._Runs(_FakePool(), list(fh.E2E_PAIRS))
    for pair in fh.E2E_PAIRS:
        for role in fh.ROLES:
            e2e.test_each_server_serves_what_it_was_asked(runs, pair, role)
        for role in e2e.ONE_OUTPUT:
            e2e.test_one_probe_output_under_every_profile(runs, pair, role)
            e2e.test_accept_length_shows_partly_accepted_drafts(runs, pair, role)
        e2e.test_same_tokens_with_cuda_graphs_on_and_off(runs, pair)
        e2e.test_invariant_probe_equals_the_reference(runs, pair)
        e2e.test_builtin_control_gives_several_outputs(runs, pair)
    assert len(calls) == len(fh.E2E_PAIRS) * len(e2e.CHECKS)  # measured once, for every pair at once
    for name, traffic, trials, extra in calls:
        pair, role = fh.parse_server_name(name)
        assert (traffic, trials) == e2e.CHECKS[role][:2]
        assert extra == (["--against", f"http://fake/{fh.server_name(pair, 'nonspec_token_id')}"]
                         if role == "invariant_graph" else [])
    recorded = h.load_results()
    assert recorded["check_family_deepseek_mtp_detspec_graph"]["probe_accept_length"] == 2.2
    assert recorded["family_served_family_qwen3_moe_builtin_rs"]["enable_deterministic_inference"] is False


def test_a_second_output_fails_the_detspec_check(fake_runs):
    e2e, _, broken = fake_runs
    broken.add(fh.server_name("qwen3_moe", "detspec_nograph"))
    runs = e2e._Runs(_FakePool(), ["qwen3_moe"])
    e2e.test_one_probe_output_under_every_profile(runs, "qwen3_moe", "detspec_graph")
    with pytest.raises(AssertionError):
        e2e.test_one_probe_output_under_every_profile(runs, "qwen3_moe", "detspec_nograph")


def test_a_control_upstream_refuses_is_recorded_and_skipped(fake_runs):
    e2e, calls, _ = fake_runs
    name = fh.server_name("deepseek_mtp", "builtin_rs")
    runs = e2e._Runs(_FakePool({name: "ValueError: NEXTN does not support rejection sampling"}), ["deepseek_mtp"])
    with pytest.raises(pytest.skip.Exception, match="NEXTN does not support rejection sampling"):
        e2e.test_builtin_control_gives_several_outputs(runs, "deepseek_mtp")
    assert name not in [c[0] for c in calls]
    assert "does not support" in h.load_results()["family_control_refused_deepseek_mtp"]["message"]
    e2e.test_one_probe_output_under_every_profile(runs, "deepseek_mtp", "detspec_graph")  # the others still run


def _fake_sweep_post(diverging_seed):
    def post(url, path, body, timeout=300):
        role = fh.parse_server_name(url.rsplit("/", 1)[1])[1]
        out = []
        for sp in body["sampling_params"]:
            s = sp["sampling_seed"]
            ids = [(s * 7 + i) % 1000 for i in range(sp["max_new_tokens"])]
            if role == "detspec_graph" or (role == "invariant_nograph" and s == diverging_seed):
                ids[3] = 1001
            meta = {"completion_tokens": len(ids)}
            if role != "nonspec_token_id":
                meta["spec_verify_ct"] = 16
            out.append({"output_ids": ids, "meta_info": meta})
        return out

    return post


def test_sweep_assertions_pass_on_identical_tokens_and_name_a_diverging_seed(fake_runs, monkeypatch):
    e2e, _, _ = fake_runs
    monkeypatch.setattr(fh, "post_json", _fake_sweep_post(diverging_seed=37))
    runs = e2e._Runs(_FakePool(), ["qwen3_moe"])
    e2e.test_reference_honours_the_seeds_and_repeats_itself(runs, "qwen3_moe", 100)
    e2e.test_invariant_emits_the_reference_tokens_for_every_seed(runs, "qwen3_moe", 100, "invariant_graph")
    e2e.test_invariant_speculates_and_the_control_differs(runs, "qwen3_moe", 100)
    with pytest.raises(AssertionError, match=r"99/100 identical.*'seed': 37, 'index': 3"):
        e2e.test_invariant_emits_the_reference_tokens_for_every_seed(runs, "qwen3_moe", 100, "invariant_nograph")
    summary = h.load_results()["family_invariant_qwen3_moe_n100"]
    assert summary["servers"]["invariant_graph"]["accept_length"] == 2.0
    assert summary["servers"]["detspec_graph"]["vs_reference"]["identical"] == 0
