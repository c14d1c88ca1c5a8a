"""scripts/lossless_check.py on CPU, and its accept-all-drafts control (tests/e2e/controls/accept_all_drafts).

The script: argument rules, seeds, the /generate batch it sends and how it reads answers, the table and verdicts,
the three server configurations (built from the package's tiny-pair server arguments), and a whole run against in-process fake servers
(tokens from small Markov chains; the "control" fake only differs when the script really put the accept-all
sitecustomize on its PYTHONPATH) -- exit 0, 1 and 2 as documented. ``--help`` works without importing torch.

The control: on SGLang's real ``eagle_sample`` (Triton chain kernel interpreted on CPU, as in
test_verify_row_local.py), with the sitecustomize loaded every draft is accepted, the accepted tokens are the drafts,
and the bonus token is the product's own wherever the product also accepted every draft.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "lossless_check.py"
CONTROL = REPO / "tests" / "e2e" / "controls" / "accept_all_drafts"


def _load_script():
    spec = importlib.util.spec_from_file_location("lossless_check_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


lc = _load_script()


# ---------------------------------------------------------------------------------------------------------------
# Arguments, seeds, requests, answers


def test_defaults_and_quick():
    args = lc.parse_args(["--out", "x"])
    assert (args.n, args.max_new_tokens, args.concurrency, args.batch) == (10_000, 24, 64, 16)
    assert args.cuda_graph_max_bs == 64 and args.baseline_seeds == "disjoint"
    assert lc.parse_args(["--out", "x", "--quick"]).n == 1000
    assert lc.parse_args(["--out", "x", "--concurrency", "32", "--batch", "8"]).cuda_graph_max_bs == 32


@pytest.mark.parametrize("argv, message", [
    (["--quick", "--n", "50"], "give one of them"),
    (["--n", "1"], "--n must be at least 2"),
    (["--batch", "65"], "cannot exceed --concurrency"),
    (["--max-new-tokens", "1"], "--max-new-tokens must be at least 2"),
    (["--prompt", "  "], "--prompt must not be empty"),
])
def test_bad_arguments_name_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        lc.parse_args(["--out", "x", *argv])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_seeds_disjoint_and_same():
    assert lc.role_seeds("detspec", 3, "disjoint") == [1, 2, 3]
    assert lc.role_seeds("control", 3, "disjoint") == [1, 2, 3]
    assert lc.role_seeds("baseline", 3, "disjoint") == [4, 5, 6]
    assert lc.role_seeds("baseline", 3, "same") == [1, 2, 3]


def test_batch_payload_is_one_list_of_texts_and_params():
    payload = lc.batch_payload("hello", [7, 8], 24)
    assert payload["text"] == ["hello", "hello"]
    assert [p["sampling_seed"] for p in payload["sampling_params"]] == [7, 8]
    assert all(p == {"temperature": 1.0, "max_new_tokens": 24, "ignore_eos": True, "sampling_seed": p["sampling_seed"]}
               for p in payload["sampling_params"])


def _answer(ids, verify=None):
    meta = {"completion_tokens": len(ids)}
    if verify is not None:
        meta["spec_verify_ct"] = verify
    return {"text": "", "output_ids": ids, "meta_info": meta}


def test_batch_answers_are_read_in_order_with_accept_lengths():
    got = lc.parse_batch_response([_answer([1, 2, 3], 2), _answer([4, 5, 6], 1)], [10, 11], 3)
    assert got.tokens == [[1, 2, 3], [4, 5, 6]]
    assert (got.completion_tokens, got.verify_steps) == (6, 3)
    assert got.accept_length == 2.0
    assert lc.parse_batch_response([_answer([1, 2])], [1], 2).accept_length is None
    merged = lc.merge([got, lc.parse_batch_response([_answer([7, 8, 9], 3)], [12], 3)])
    assert merged.tokens[-1] == [7, 8, 9] and merged.accept_length == 9 / 6


@pytest.mark.parametrize("resp, match", [
    ([_answer([1, 2, 3])], "returned 1 answers"),
    ({"error": "x"}, "returned dict"),
    ([_answer([1, 2, 3]), _answer([1, 2])], "seed 11: 2 output ids, expected 3"),
    ([_answer([1, 2, 3]), {"text": "abc"}], "seed 11: the answer has no output_ids"),
])
def test_malformed_answers_are_refused(resp, match):
    with pytest.raises(ValueError, match=match):
        lc.parse_batch_response(resp, [10, 11], 3)


def test_verdicts_and_table():
    assert lc.verdict("detspec", 0.5, 1e-3, 1e-6) == (True, "PASS (p > 0.001)")
    assert lc.verdict("detspec", 1e-4, 1e-3, 1e-6)[0] is False
    assert lc.verdict("control", 1e-9, 1e-3, 1e-6)[0] is True
    assert lc.verdict("control", 1e-4, 1e-3, 1e-6) == (False, "NOT rejected (p >= 1e-06): no power")
    table = lc.format_table([
        {"label": "A vs B", "n": 10000, "positions_p": 0.4567, "transitions_p": 2.5e-7, "combined_p": 0.0,
         "accept_length": 2.5612, "verdict": "PASS"},
        {"label": "C vs B", "n": 10, "positions_p": 1.0, "transitions_p": 1.0, "combined_p": 1.0, "accept_length": None,
         "verdict": "x"},
    ]).splitlines()
    assert table[0].startswith("| comparison | N | per-position min p (Bonferroni) | pooled-transition p |")
    assert table[2] == "| A vs B | 10,000 | 0.457 | 2.5e-07 | < 1e-300 | 2.56 | PASS |"
    assert table[3] == "| C vs B | 10 | 1.000 | 1.000 | 1.000 | n/a | x |"


def test_accept_length_when_every_draft_is_accepted():
    # 24 tokens: 1 from the prefill + 6 verify steps of 4 (the last cut to 3) -> 4.0; 10 tokens: 1 + 3 steps -> 10/3.
    assert lc.all_drafts_accept_length(24, 4) == 4.0
    assert lc.all_drafts_accept_length(10, 4) == 10 / 3
    assert lc.all_drafts_accept_length(5, 4) == 5.0


def test_position_zero_is_described_not_counted():
    assert "identical in every pair" in lc.position_zero_note(True, "same", 1.0)
    assert "NOT identical" in lc.position_zero_note(False, "same", 1.0)
    assert "p = 0.250; not counted" in lc.position_zero_note(None, "disjoint", 0.25)


# ---------------------------------------------------------------------------------------------------------------
# Server configurations (the package's tiny-pair server arguments, stdlib only)


@pytest.fixture
def harness():
    """The server launcher the script uses (the package's, shared with the E2E tests)."""
    from sglang_detspec import server_process

    return server_process


def _models():
    from sglang_detspec.models.tiny_models import TinyModels

    return TinyModels(Path("/m/target"), Path("/m/eagle"), Path("/m/eagle3"))


def test_server_configurations(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/already/there")
    specs = lc.server_specs(Path("/m/target"), Path("/m/eagle"),
                            lc.parse_args(["--out", "x", "--concurrency", "48", "--batch", "12"]))
    detspec, baseline, control = specs["detspec"].args, specs["baseline"].args, specs["control"].args
    for argv in (detspec, baseline):
        assert argv.count(lc.GRAPH_BS_FLAG) == 1 and argv[argv.index(lc.GRAPH_BS_FLAG) + 1] == "48"
        assert argv.count(lc.RUNNING_FLAG) == 1 and argv[argv.index(lc.RUNNING_FLAG) + 1] == "48"
        assert "--enable-deterministic-inference" in argv and argv[argv.index("--model-path") + 1] == "/m/target"
        assert "--cuda-graph-backend-decode" not in argv, "CUDA graphs stay on"
    assert detspec[detspec.index("--speculative-algorithm") + 1] == "DETSPEC_EAGLE"
    assert detspec[detspec.index("--speculative-draft-model-path") + 1] == "/m/eagle"
    assert not [a for a in baseline if a.startswith("--speculative")], "the baseline is not speculative"
    assert control == detspec
    path = specs["control"].env["PYTHONPATH"].split(":")
    assert path == [str(CONTROL), "/already/there"] and (CONTROL / "sitecustomize.py").is_file()
    assert "PYTHONPATH" not in specs["detspec"].env and "PYTHONPATH" not in specs["baseline"].env
    assert all("SGLANG_DETSPEC_REDUCED_VOCAB" not in spec.env for spec in specs.values())


def test_reduced_vocab_pair_configurations(monkeypatch):
    """--pair qwen3_eagle3: DETSPEC_EAGLE3 on the reduced draft as users serve it (no environment variable)."""
    monkeypatch.setenv("PYTHONPATH", "/already/there")
    args = lc.parse_args(["--out", "x", "--pair", "qwen3_eagle3"])
    specs = lc.server_specs(Path("/q/target"), Path("/q/eagle3"), args)
    detspec, baseline, control = specs["detspec"].args, specs["baseline"].args, specs["control"].args
    assert detspec[detspec.index("--speculative-algorithm") + 1] == "DETSPEC_EAGLE3"
    assert detspec[detspec.index("--speculative-draft-model-path") + 1] == "/q/eagle3"
    assert baseline[baseline.index("--model-path") + 1] == "/q/target" == detspec[detspec.index("--model-path") + 1]
    assert not [a for a in baseline if a.startswith("--speculative")]
    assert control == detspec
    assert specs["control"].env["PYTHONPATH"].split(":")[0] == str(CONTROL)
    assert all("SGLANG_DETSPEC_REDUCED_VOCAB" not in spec.env for spec in specs.values())


def test_token_map_pair_configurations(monkeypatch):
    """--pair weighted_token_map: DETSPEC_EAGLE on the weighted pair's EAGLE draft with --speculative-token-map (no
    environment variable: the retired opt-in is gone), in the product and the control only; the baseline is the plain
    weighted target."""
    monkeypatch.setenv("PYTHONPATH", "/already/there")
    args = lc.parse_args(["--out", "x", "--pair", "weighted_token_map"])
    specs = lc.server_specs(Path("/m/target"), Path("/m/eagle"), args, token_map=Path("/m/hot.pt"))
    detspec, baseline, control = specs["detspec"].args, specs["baseline"].args, specs["control"].args
    assert detspec[detspec.index("--speculative-algorithm") + 1] == "DETSPEC_EAGLE"
    assert detspec[detspec.index("--speculative-draft-model-path") + 1] == "/m/eagle"
    assert detspec.count("--speculative-token-map") == 1
    assert detspec[detspec.index("--speculative-token-map") + 1] == "/m/hot.pt"
    assert "--load-format" not in detspec, "the weighted pair loads its safetensors, not dummy weights"
    assert baseline[baseline.index("--model-path") + 1] == "/m/target" == detspec[detspec.index("--model-path") + 1]
    assert not [a for a in baseline if a.startswith("--speculative")]
    assert control == detspec
    assert specs["detspec"].env == {} and specs["baseline"].env == {}
    assert list(specs["control"].env) == ["PYTHONPATH"]
    assert specs["control"].env["PYTHONPATH"].split(":") == [str(CONTROL), "/already/there"]


def test_a_token_map_goes_with_the_token_map_pair_only():
    with pytest.raises(ValueError, match="--pair weighted_token_map"):
        lc.server_specs(Path("/m/target"), Path("/m/eagle"), lc.parse_args(["--out", "x", "--pair", "weighted_token_map"]))
    with pytest.raises(ValueError, match="only for it"):
        lc.server_specs(Path("/m/target"), Path("/m/eagle"), lc.parse_args(["--out", "x"]), token_map=Path("/m/hot.pt"))


def test_token_map_pair_builds_the_weighted_token_map(monkeypatch, tmp_path):
    import torch

    import sglang_detspec.models.tiny_models as tiny_models

    monkeypatch.setattr(tiny_models, "ensure_tiny_models", lambda root, pair: _models())
    target, draft, token_map = lc.pair_models("weighted_token_map", tmp_path)
    assert (target, draft) == (Path("/m/target"), Path("/m/eagle"))
    assert token_map.is_file() and tmp_path in token_map.parents
    ids = torch.load(str(token_map), weights_only=True)
    assert len(ids) == 512 == len(set(ids))
    assert lc.pair_models("weighted", tmp_path)[2] is None


def test_with_flag_replaces_or_appends():
    assert lc.with_flag(["--a", "1", "--b", "2"], "--a", "9") == ["--a", "9", "--b", "2"]
    assert lc.with_flag(["--b", "2"], "--a", "9") == ["--b", "2", "--a", "9"]
    assert lc.with_flag(["--a", "1", "--a", "2"], "--a", "9") == ["--a", "9", "--a", "9"]  # argparse: the last wins


def test_help_runs_without_torch_or_sglang():
    probe = (
        "import runpy, sys\n"
        f"sys.argv = ['lossless_check.py', '--help']\n"
        "try:\n"
        f"    runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "print('heavy:', sorted(m for m in ('torch', 'sglang', 'numpy', 'scipy') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "--baseline-seeds" in out.stdout and "heavy: []" in out.stdout


# ---------------------------------------------------------------------------------------------------------------
# A whole run against fake servers


STATES = 12


def _chain_tokens(seed: int, length: int, stay: float) -> list:
    """A sticky Markov chain: the same law for every seed, one draw per seed."""
    rng = np.random.default_rng(seed)
    x = [int(rng.integers(STATES))]
    for _ in range(length - 1):
        x.append(x[-1] if rng.random() < stay else int(rng.integers(STATES)))
    return x


class _FakeServer:
    """Stands in for server_process.Server: an HTTP /generate that answers lists; ``stay`` sets its chain."""

    # role -> "good"; "broken" (the other chain, only with the accept-all sitecustomize on PYTHONPATH);
    # "wrong" (the other chain regardless); "short" (one token too few)
    behaviour = {}

    def __init__(self, spec, port, log_path, pid_file=None):
        self.spec, self.name, self.log_path, self.startup_s = spec, spec.name, log_path, 0.1
        controlled = str(CONTROL) in spec.env.get("PYTHONPATH", "")
        self.mode = self.behaviour.get(spec.name, "good")
        if self.mode == "broken" and not controlled:
            self.mode = "good"  # the control only breaks when the accept-all sitecustomize is really on its path
        self.broken = self.mode in ("broken", "wrong")
        self.speculative = "--speculative-algorithm" in spec.args

    def command(self):
        return ["fake", *self.spec.args]

    def start(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                body = json.dumps([server.answer(p) for p in req["sampling_params"]]).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def answer(self, params):
        n = params["max_new_tokens"] - (1 if self.mode == "short" else 0)
        ids = _chain_tokens(params["sampling_seed"], n, 0.6 if self.broken else 0.3)
        meta = {"completion_tokens": n}
        if self.speculative:
            meta["spec_verify_ct"] = -(-(n - 1) // (4 if self.broken else 2))  # the first token is the prefill's
        return {"text": "", "output_ids": ids, "meta_info": meta}

    def wait_ready(self, timeout):
        pass

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake_run(harness, monkeypatch, tmp_path):
    import sglang_detspec.models.tiny_models as tiny_models

    monkeypatch.setattr(harness, "Server", _FakeServer)
    monkeypatch.setattr(harness, "launch_skip_reason", lambda: None)
    monkeypatch.setattr(harness, "sglang_version", lambda: "fake")
    monkeypatch.setattr(tiny_models, "ensure_tiny_models", lambda root, pair: _models())

    def run(behaviour, *extra):
        monkeypatch.setattr(_FakeServer, "behaviour", behaviour)
        out = tmp_path / "out"
        rc = lc.main(["--out", str(out), "--n", "600", "--max-new-tokens", "10", "--concurrency", "32", *extra])
        return rc, out

    return run


def test_whole_run_passes_and_rejects_the_control(fake_run, capsys):
    rc, out = fake_run({"control": "broken"})
    printed = capsys.readouterr().out
    assert rc == 0, printed
    report = json.loads((out / "lossless.json").read_text())
    assert report["pass"] is True
    assert report["comparisons"]["detspec"]["ok"] and report["comparisons"]["control"]["ok"]
    assert report["comparisons"]["control"]["combined_p"] < 1e-6 < 1e-3 < report["comparisons"]["detspec"]["combined_p"]
    assert report["servers"]["detspec"]["accept_length"] == 2.0 and report["servers"]["control"]["accept_length"] == 10 / 3
    assert report["servers"]["baseline"]["accept_length"] is None
    assert report["servers"]["baseline"]["seeds"] == [601, 1200]
    tokens = np.load(out / "tokens.npz")
    assert tokens["detspec"].shape == (600, 10) and tokens["baseline_seeds"][0] == 601
    assert tokens["detspec"][5].tolist() == _chain_tokens(6, 10, 0.3), "row i is seed i + 1"
    assert "| DETSPEC_EAGLE vs non-speculative | 600 |" in printed and "PASS: DETSPEC_EAGLE matches" in printed
    assert "WARNING" not in printed
    assert (out / "lossless.md").read_text().startswith("| comparison |")


def test_whole_run_fails_when_the_control_is_not_broken(fake_run, capsys):
    rc, out = fake_run({})
    printed = capsys.readouterr().out
    assert rc == 1
    assert "NOT rejected" in printed and "WARNING: the control's accept length is 2.00, not 3.33" in printed


def test_whole_run_fails_when_the_product_differs(fake_run, capsys):
    rc, _ = fake_run({"detspec": "wrong", "control": "broken"})
    assert rc == 1 and "FAIL (p <= 0.001)" in capsys.readouterr().out


def test_a_short_answer_is_an_error_exit(fake_run, capsys):
    rc, out = fake_run({"baseline": "short"})
    assert rc == 2 and "9 output ids, expected 10" in capsys.readouterr().err
    assert json.loads((out / "lossless.json").read_text())["pass"] is False


# ---------------------------------------------------------------------------------------------------------------
# The accept-all-drafts control on SGLang's real eagle_sample (CPU)


@pytest.fixture
def verify_on_cpu(monkeypatch):
    harness = pytest.importorskip("sglang_verify_harness")
    from sglang_detspec.integration.sampling import verify

    with harness.eagle_sample_on_cpu(monkeypatch):
        verify._rebound_eagle_sample.cache_clear()
        yield harness, verify
    verify._rebound_eagle_sample.cache_clear()


def _load_control(monkeypatch, verify):
    # setitem first: monkeypatch puts the product's entry back after the test.
    table = verify._EAGLE_SAMPLE_REPLACEMENTS
    monkeypatch.setitem(table, verify.CHAIN_KERNEL_NAME, table[verify.CHAIN_KERNEL_NAME])
    spec = importlib.util.spec_from_file_location("accept_all_drafts_sitecustomize", CONTROL / "sitecustomize.py")
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    verify._rebound_eagle_sample.cache_clear()


def test_control_accepts_every_draft_and_keeps_a_valid_bonus(verify_on_cpu, monkeypatch):
    harness, verify = verify_on_cpu
    n = 4
    params = [harness.Params(seed=s) for s in range(1, 13)]
    rows = harness.verify_rows(len(params), n, seed=3)
    seq_lens = [17 + 3 * i for i in range(len(params))]

    def run():
        with harness.deterministic_rs(n):
            predict, accept = harness.run_eagle_sample(verify.detspec_eagle_sample, rows, params, seq_lens, n)
        return predict.tolist(), accept.tolist()

    product = run()
    assert min(product[1]) < n, "not vacuous: the product rejects some drafts of these rows"
    full_rows = [r for r, a in enumerate(product[1]) if a == n]
    assert full_rows, "some row accepts every draft in the product too (its bonus is compared below)"
    _load_control(monkeypatch, verify)
    predict, accept = run()
    assert accept == [n] * len(params)
    for r, row in enumerate(rows):
        assert predict[r][: n - 1] == row.draft_tokens[1:].tolist(), f"row {r}: the accepted tokens are the drafts"
        bonus = predict[r][n - 1]
        assert 0 <= bonus < row.target_logits.shape[-1]
        if r in full_rows:
            assert predict[r] == product[0][r], f"row {r}: the bonus is the target sample the product draws"
