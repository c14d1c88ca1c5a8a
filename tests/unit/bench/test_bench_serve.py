"""``sglang-detspec bench-serve`` on CPU: its arguments, the configuration table's server flags, the bench_serving
command, reading bench_serving's result lines, the ratios, the CSV / JSON / PNG outputs and the step breakdown's
arithmetic. The GPU runs themselves are in docs/results.md (``bench-serve`` on the H200)."""

from __future__ import annotations

import csv
import importlib.util
import json
import re
from pathlib import Path

import pytest

from sglang_detspec import cli
from sglang_detspec.bench.serving_bench import configs as cfgs
from sglang_detspec.bench.serving_bench import results, step_timing

needs_sglang = pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="needs sglang installed")


def flag_value(argv, flag):
    assert argv.count(flag) == 1, (flag, argv)
    return argv[argv.index(flag) + 1]


# ---------------------------------------------------------------------------------------------------------------
# Arguments


@pytest.mark.parametrize("bad, message", [
    ("8,1", "strictly increasing"),
    ("1,1,8", "strictly increasing"),
    ("0,8", "at least 1"),
    ("1,eight", "integers"),
    (",", "at least one concurrency"),
])
def test_bad_concurrency_lists_are_refused_naming_the_problem(bad, message, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench-serve", "--out", "x", "--concurrencies", bad, "--dry-run"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--concurrencies" in err and message in err


@pytest.mark.parametrize("bad, message", [
    ("eagle_rs,nonsense", "unknown configuration 'nonsense'"),
    ("detspec,detspec", "listed twice"),
])
def test_bad_configuration_lists_are_refused(bad, message, capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench-serve", "--out", "x", "--configs", bad, "--dry-run"])
    assert message in capsys.readouterr().err


def test_settings_defaults_quick_and_explicit_options(capsys):
    parser = cli.build_parser()
    from sglang_detspec.bench import serving_bench

    s = serving_bench.settings_from_args(parser.parse_args(["bench-serve", "--out", "x"]))
    assert s.concurrencies == (1, 8, 32, 128) and s.configs == ("no_spec", "eagle_rs", "eagle_det", "detspec")
    assert not s.parallel_start and not s.breakdown and s.temperature == 1.0
    assert s.repetitions == 3 and s.min_seconds == 20.0
    q = serving_bench.settings_from_args(parser.parse_args(["bench-serve", "--out", "x", "--quick",
                                                            "--output-len", "64", "--configs", "detspec,no_spec"]))
    assert q.concurrencies == (1, 32) and q.prompts_per_concurrency == 2
    assert q.output_len == 64, "an explicit option wins over --quick"
    assert q.configs == ("no_spec", "detspec"), "table order, whatever the order given"
    with pytest.raises(ValueError, match="temperature"):
        serving_bench.settings_from_args(parser.parse_args(["bench-serve", "--out", "x", "--temperature", "0"]))
    rc = cli.main(["bench-serve", "--out", "x", "--output-len", "0", "--dry-run"])
    assert rc == cli.EXIT_ERROR and "--output-len" in capsys.readouterr().err


@pytest.mark.parametrize("flag, value, message", [
    ("--hidden", "0", "--hidden 0: must be a positive multiple of 256"),
    ("--hidden", "7", "--hidden 7: must be a positive multiple of 256"),
    ("--hidden", "384", "--hidden 384: must be a positive multiple of 256"),  # 3 heads: no whole kv half
    ("--layers", "0", "--layers 0: the target needs at least 1 layer"),
    ("--vocab", "0", "--vocab 0: must be in 4355..266499"),
    ("--vocab", "300000", "--vocab 300000: must be in 4355..266499"),
])
def test_pair_sizes_no_pair_can_have_are_refused_naming_the_flag(flag, value, message, capsys):
    rc = cli.main(["bench-serve", "--out", "x", flag, value, "--dry-run"])
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == cli.EXIT_ERROR and len(lines) == 1, err
    assert lines[0].startswith(f"sglang-detspec bench-serve: error: {message}"), err


def test_pair_sizes_given_are_the_sizes_used(capsys):
    from sglang_detspec.bench import serving_bench

    parser = cli.build_parser()
    shape = serving_bench.shape_from_args(parser.parse_args(["bench-serve", "--out", "x", "--hidden", "512",
                                                             "--layers", "2", "--vocab", "5000"]))
    assert (shape.hidden, shape.layers, shape.vocab, shape.heads, shape.kv_heads) == (512, 2, 5000, 4, 2)
    assert shape.head_dim == 128


def test_dry_run_prints_every_server_and_client_command(capsys):
    assert cli.main(["bench-serve", "--out", "x", "--quick", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert len(re.findall(r"^server ", out, re.M)) == 4 and len(re.findall(r"^client ", out, re.M)) == 2
    assert "--max-concurrency 32" in out and "estimated duration" in out


# ---------------------------------------------------------------------------------------------------------------
# The configuration table


def _server(name, settings=cfgs.BenchSettings()):
    return cfgs.server_args(cfgs.config_by_name(name), Path("/p/target"), Path("/p/draft"), settings, mem_fraction=0.2)


def test_detspec_runs_the_plugin_deterministically():
    argv = _server("detspec")
    assert flag_value(argv, "--speculative-algorithm") == "DETSPEC_EAGLE"
    assert "--enable-deterministic-inference" in argv
    assert flag_value(argv, "--speculative-draft-model-path") == "/p/draft"
    assert flag_value(argv, "--speculative-num-steps") == "3" and flag_value(argv, "--speculative-eagle-topk") == "1"


def test_builtin_configurations():
    rs, det, plain = _server("eagle_rs"), _server("eagle_det"), _server("no_spec")
    assert flag_value(rs, "--speculative-algorithm") == "EAGLE" and "--speculative-use-rejection-sampling" in rs
    assert "--enable-deterministic-inference" not in rs, "0.5.17 refuses rejection sampling in deterministic mode"
    assert flag_value(det, "--speculative-algorithm") == "EAGLE" and "--enable-deterministic-inference" in det
    assert "--speculative-use-rejection-sampling" not in det
    assert not [a for a in plain if a.startswith("--speculative")] and "--enable-deterministic-inference" in plain
    assert [c.name for c in cfgs.CONFIGS if c.builtin] == ["no_spec", "eagle_rs", "eagle_det", "no_spec_fast"]


def test_deterministic_mode_cost_is_an_opt_in_configuration():
    fast = _server("no_spec_fast")
    assert not [a for a in fast if a.startswith("--speculative")] and "--enable-deterministic-inference" not in fast
    assert "no_spec_fast" not in cfgs.DEFAULT_CONFIGS
    assert cfgs.parse_configs("no_spec_fast,no_spec") == ("no_spec", "no_spec_fast")


def test_every_configuration_shares_the_target_flags():
    s = cfgs.BenchSettings(concurrencies=(1, 64), input_len=100, output_len=50)
    for name in s.configs:
        argv = _server(name, s)
        assert flag_value(argv, "--model-path") == "/p/target"
        assert flag_value(argv, "--attention-backend") == "triton"  # no FA3 kernels in the H200 bundle
        assert flag_value(argv, "--sampling-backend") == "pytorch"  # flashinfer sampling would JIT-compile there
        assert flag_value(argv, "--cuda-graph-max-bs-decode") == "64" == flag_value(argv, "--max-running-requests")
        assert int(flag_value(argv, "--max-total-tokens")) >= 64 * (100 + 50 + 4)
        assert "--port" not in argv


def test_a_planned_but_unbuilt_configuration_is_refused_with_its_reason(monkeypatch):
    planned = cfgs.BenchConfig("planned", "a mode not built yet", "X", False, True, False, unavailable="not built yet")
    monkeypatch.setattr(cfgs, "CONFIGS", (*cfgs.CONFIGS, planned))
    with pytest.raises(ValueError, match="'planned' cannot run: not built yet"):
        cfgs.parse_configs("detspec,planned")


def test_invariant_mode_is_an_opt_in_configuration_after_detspec():
    row = cfgs.config_by_name("detspec_invariant")
    assert row.unavailable is None and row.opt_in and "detspec_invariant" not in cfgs.DEFAULT_CONFIGS
    argv = cfgs.server_args(row, Path("/t"), Path("/d"), cfgs.BenchSettings(), mem_fraction=0.2)
    assert flag_value(argv, "--speculative-algorithm") == "DETSPEC_EAGLE_INVARIANT"
    assert "--enable-deterministic-inference" in argv and "--speculative-use-rejection-sampling" not in argv
    assert cfgs.parse_configs("detspec_invariant,detspec") == ("detspec", "detspec_invariant")


def test_bench_serving_command():
    s = cfgs.BenchSettings(prompts_per_concurrency=3, input_len=100, output_len=50, seed=7)
    cmd = cfgs.bench_serving_command("py", 1234, Path("/p/target"), s, 16, Path("/o/r.jsonl"))
    assert cmd[:3] == ["py", "-m", "sglang.bench_serving"]
    assert flag_value(cmd, "--dataset-name") == "random-ids" and "--tokenize-prompt" in cmd
    assert flag_value(cmd, "--num-prompts") == "48" and flag_value(cmd, "--max-concurrency") == "16"
    assert flag_value(cmd, "--random-range-ratio") == "1.0", "fixed lengths"
    assert flag_value(cmd, "--temperature") == "1" and flag_value(cmd, "--seed") == "7"
    assert flag_value(cmd, "--output-file") == "/o/r.jsonl" and flag_value(cmd, "--port") == "1234"
    assert cfgs.num_prompts(s, 1) == cfgs.MIN_PROMPTS  # 3 requests at concurrency 1 would say little


# ---------------------------------------------------------------------------------------------------------------
# bench_serving's result line (keys and order as sglang 0.5.17's benchmark/serving.py writes its `result` dict)

SAMPLE = {
    "tag": None, "backend": "sglang", "dataset_name": "random-ids", "request_rate": float("inf"),
    "max_concurrency": 8, "sharegpt_output_len": None, "random_input_len": 256, "random_output_len": 256,
    "random_range_ratio": 1.0, "server_info": {"internal_states": [{"avg_spec_accept_length": 2.5}]},
    "duration": 12.5, "completed": 32, "total_input_tokens": 8192, "total_input_text_tokens": 8192,
    "total_input_vision_tokens": 0, "total_output_tokens": 8192, "total_output_tokens_retokenized": 8190,
    "request_throughput": 2.56, "input_throughput": 655.36, "output_throughput": 655.36, "total_throughput": 1310.72,
    "mean_e2e_latency_ms": 3000.0, "median_e2e_latency_ms": 2990.0, "std_e2e_latency_ms": 10.0,
    "p90_e2e_latency_ms": 3100.0, "p95_e2e_latency_ms": 3150.0, "p99_e2e_latency_ms": 3200.0,
    "mean_ttft_ms": 40.0, "median_ttft_ms": 38.5, "std_ttft_ms": 3.0, "p90_ttft_ms": 45.0, "p95_ttft_ms": 47.0,
    "p99_ttft_ms": 51.25, "mean_tpot_ms": 11.0, "median_tpot_ms": 11.1, "std_tpot_ms": 0.5, "p90_tpot_ms": 11.8,
    "p95_tpot_ms": 12.0, "p99_tpot_ms": 12.5, "mean_itl_ms": 11.0, "median_itl_ms": 4.75, "std_itl_ms": 6.0,
    "p90_itl_ms": 20.0, "p95_itl_ms": 21.0, "p99_itl_ms": 23.5, "concurrency": 7.9, "accept_length": 2.5,
    "max_output_tokens_per_s": 800.0, "max_concurrent_requests": 8,
}


def _line(**changes):
    return json.dumps({**SAMPLE, **changes})  # json.dumps writes inf as Infinity, as bench_serving's file has it


def test_parse_result_line():
    row = results.parse_bench_serving_line(_line(), config="detspec", concurrency=8, num_prompts=32)
    assert row["output_tok_s"] == 655.36 and row["ttft_p50_ms"] == 38.5 and row["ttft_p99_ms"] == 51.25
    assert row["itl_p50_ms"] == 4.75 and row["itl_p99_ms"] == 23.5 and row["accept_length"] == 2.5
    assert row["completed"] == 32 and row["error"] == ""


def test_parse_flags_incomplete_or_mismatched_runs():
    short = results.parse_bench_serving_line(_line(completed=30), config="x", concurrency=8, num_prompts=32)
    assert short["error"] == "30 of 32 requests completed"
    other = results.parse_bench_serving_line(_line(max_concurrency=4), config="x", concurrency=8, num_prompts=32)
    assert "concurrency 4" in other["error"]
    plain = results.parse_bench_serving_line(_line(accept_length=None), config="no_spec", concurrency=8, num_prompts=32)
    assert plain["accept_length"] is None and plain["error"] == ""
    with pytest.raises(ValueError, match="output_throughput"):
        results.parse_bench_serving_line(json.dumps({"completed": 1}), config="x", concurrency=1, num_prompts=1)


def test_read_takes_the_last_appended_line(tmp_path):
    f = tmp_path / "r.jsonl"
    f.write_text(_line(output_throughput=1.0) + "\n" + _line(output_throughput=2.0) + "\n")
    assert results.read_bench_serving_file(f, config="x", concurrency=8, num_prompts=32)["output_tok_s"] == 2.0
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="no bench_serving result"):
        results.read_bench_serving_file(tmp_path / "empty.jsonl", config="x", concurrency=8, num_prompts=32)


@needs_sglang
def test_sample_has_the_keys_the_installed_bench_serving_writes():
    """The sample above must not drift from the installed SGLang: every key of the `result = {...}` dict in its
    benchmark source, which is what the --output-file line holds."""
    spec = importlib.util.find_spec("sglang.benchmark.serving") or importlib.util.find_spec("sglang.bench_serving")
    source = Path(spec.origin).read_text()
    block = source[source.index("result = {"):]
    block = block[:block.index("\n        }\n")]
    written = set(re.findall(r'^\s+"(\w+)":', block, re.M))
    assert set(results._FIELDS.values()) <= written
    assert written == set(SAMPLE)


# ---------------------------------------------------------------------------------------------------------------
# Ratios and outputs


def _row(config, c, tok_s, error="", itl=5.0):
    return results.RunResult(config=config, concurrency=c, num_prompts=8, output_tok_s=tok_s, ttft_p50_ms=1.0,
                             ttft_p99_ms=2.0, itl_p50_ms=itl, itl_p99_ms=2 * itl, accept_length=None, completed=8,
                             duration_s=1.0, total_output_tokens=100, error=error)


ROWS = [
    _row("no_spec", 1, 100.0), _row("no_spec", 8, 400.0),
    _row("eagle_rs", 1, 250.0), _row("eagle_rs", 8, 800.0),
    _row("eagle_det", 1, 110.0), _row("eagle_det", 8, 0.0, error="server did not start"),
    _row("detspec", 1, 240.0), _row("detspec", 8, 820.0),
]


def test_ratios_divide_detspec_by_each_builtin_of_the_same_run():
    r = results.compute_ratios(ROWS)
    assert r["no_spec"] == {1: pytest.approx(2.4), 8: pytest.approx(2.05)}
    assert r["eagle_rs"] == {1: pytest.approx(0.96), 8: pytest.approx(1.025)}
    assert r["eagle_det"] == {1: pytest.approx(240 / 110), 8: None}, "a failed run gives no ratio"
    assert results.compute_ratios([r for r in ROWS if r["config"] != "detspec"]) == {}
    text = results.format_ratios(r)
    assert "detspec / eagle_rs (goal >= 0.97): c=1: 0.960 BELOW GOAL, c=8: 1.025 ok" in text
    assert "c=8: -" in text


def test_csv_and_json_round_trip(tmp_path):
    results.write_csv(tmp_path / "t.csv", ROWS)
    back = list(csv.DictReader(open(tmp_path / "t.csv")))
    assert [r["config"] for r in back] == [r["config"] for r in ROWS]
    assert float(back[7]["output_tok_s"]) == 820.0 and back[5]["error"] == "server did not start"
    assert back[0]["accept_length"] == "", "None is an empty cell"
    results.write_json(tmp_path / "t.json", {"rows": ROWS, "ratios": results.compute_ratios(ROWS)})
    doc = json.loads((tmp_path / "t.json").read_text())
    assert doc["ratios"]["eagle_rs"]["8"] == pytest.approx(1.025) and doc["ratios"]["eagle_det"]["8"] is None
    assert doc["rows"][6]["output_tok_s"] == 240.0


def test_the_test_extra_installs_the_plot_library():
    # The README's set-up installs .[test]; without matplotlib there, the plot test below cannot run.
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((Path(__file__).resolve().parents[3] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert any(re.match(r"matplotlib\b", requirement) for requirement in extras["test"]), extras["test"]


def test_plot_is_a_png(tmp_path):
    path = tmp_path / "p.png"
    results.write_plot(path, ROWS, {c.name: c.label for c in cfgs.CONFIGS}, title="t")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_table_marks_failed_runs():
    table = results.format_table(ROWS)
    assert "ERROR: server did not start" in table and table.count("\n") == len(ROWS) + 1


# ---------------------------------------------------------------------------------------------------------------
# The step breakdown's arithmetic (the hook itself needs a GPU server)


def test_breakdown_subtracts_nested_regions_and_snapshots():
    zero = {k: 0.0 for k in step_timing._REGIONS}
    before = {"steps": 10, "rows": 80, "seconds": dict(zero, step=1.0)}
    # 20 more steps: each 10 ms, draft 3 ms (1 ms of it sampling), draft extend 1 ms, verify 4 + 0.5 ms.
    after = {"steps": 30, "rows": 240, "seconds": dict(
        zero, step=1.0 + 0.200, draft=0.060, draft_extend=0.020, draft_sampling=0.020, verify_forward=0.080,
        verify_sampling=0.010)}
    s = step_timing.summarize(before, after)
    assert s["steps"] == 20 and s["mean_batch"] == 8.0 and s["step_ms"] == pytest.approx(10.0)
    p = s["phases_ms"]
    assert p["draft_forward"] == pytest.approx(3.0) and p["draft_sampling"] == pytest.approx(1.0)
    assert p["verify_forward"] == pytest.approx(4.0) and p["verify_sampling"] == pytest.approx(0.5)
    assert p["bookkeeping"] == pytest.approx(1.5) and sum(p.values()) == pytest.approx(s["step_ms"])
    assert list(p) == list(step_timing.PHASES)
    with pytest.raises(ValueError, match="no decode step"):
        step_timing.summarize(after, after)


def test_hook_is_off_without_its_environment_variable(monkeypatch):
    monkeypatch.delenv(step_timing.ENV_VAR, raising=False)
    import sys

    before = list(sys.meta_path)
    assert step_timing.install_from_env() is False and sys.meta_path == before


@needs_sglang
def test_hook_wraps_the_plugins_timed_functions_when_they_are_imported(tmp_path):
    """In a fresh interpreter (as the breakdown server's processes): the import hook patches the two modules."""
    import subprocess
    import sys

    code = (
        "from sglang_detspec.bench.serving_bench import step_timing\n"
        "assert step_timing.install_from_env()\n"
        "from sglang_detspec.integration.sampling import verify\n"
        "from sglang_detspec.integration.workers import single_layer\n"
        "assert verify.detspec_eagle_sample.__wrapped__.__name__ == 'detspec_eagle_sample'\n"
        "assert single_layer._detspec_sample_draft_proposal.__wrapped__.__name__ == '_detspec_sample_draft_proposal'\n"
        "w = single_layer.DetspecEAGLEWorkerV2\n"
        "assert w.forward_batch_generation.__qualname__.startswith('_patch_single_layer')\n"
        "assert single_layer.DetspecEagleDraftWorker._draft_extend_for_decode.__wrapped__.__qualname__ == "
        "'DetspecEagleDraftWorker._draft_extend_for_decode'\n"
        "print('OK')\n"
    )
    env = dict(__import__("os").environ, **{step_timing.ENV_VAR: str(tmp_path / "t.json")})
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stderr[-3000:]


def test_client_runs_each_argv_through_bench_servings_own_cli_main(tmp_path, monkeypatch, capsys):
    import sys
    import types

    from sglang_detspec.bench.serving_bench import client

    seen = []

    def cli_main():
        seen.append(list(sys.argv))
        if "--fail" in sys.argv:
            raise SystemExit(1)

    monkeypatch.setitem(sys.modules, "sglang.bench_serving", types.SimpleNamespace(cli_main=cli_main))
    monkeypatch.setattr(client, "_reset", lambda url: url == "http://ok")
    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps({"runs": [{"argv": ["--a", "1"], "reset_url": "http://ok"},
                                         {"argv": ["--fail"], "reset_url": "http://down"},
                                         {"argv": ["--b"], "reset_url": None}]}))
    monkeypatch.setattr(sys, "argv", ["keep"])
    assert client.main([str(runs)]) == 1, "a failed run is reported"
    assert seen == [["sglang.bench_serving", "--a", "1"], ["sglang.bench_serving", "--fail"],
                    ["sglang.bench_serving", "--b"]], "every run ran, in order, after a failure too"
    out = capsys.readouterr().out
    assert out.count("counters reset: True") == 1 and "counters reset: False" in out and "exited 1" in out


def _fake_run(monkeypatch, tmp_path, events, fake_clients, fail_to_start=(), fail_first_start=()):
    """Patch run_benchmark's servers, pair, client check and clients with fakes that record ``events``."""
    from bench_fakes import patch_bench_servers, recording_server

    from sglang_detspec.models import midsize_models

    runner = patch_bench_servers(monkeypatch, tmp_path, recording_server(events, fail_to_start, fail_first_start))
    monkeypatch.setattr(runner, "_run_clients", fake_clients)
    monkeypatch.setattr(runner.time, "sleep", lambda s: None)
    return runner, midsize_models


def test_whole_run_orchestration_with_fake_servers_and_clients(tmp_path, monkeypatch, capsys):
    """run_benchmark end to end without a GPU: every server started before any is measured (parallel start), each
    measured alone and stopped, a server that fails to start gives error rows, the report files are written."""
    from sglang_detspec.bench.serving_bench import runner

    events = []
    speed = {"no_spec": 100.0, "eagle_rs": 200.0, "detspec": 210.0, runner.BREAKDOWN: 50.0}

    def fake_clients(server, settings, pair, concurrencies, out, name):
        events.append(("measure", name))
        if name == runner.BREAKDOWN:
            (out / "step_timing.json").write_text(json.dumps({"steps": 10, "rows": 80, "seconds": dict(
                {k: 0.0 for k in step_timing._REGIONS}, step=0.1, verify_forward=0.05)}))
        return [_row(name, c, speed[name] * c) for c in concurrencies]

    runner, midsize_models = _fake_run(monkeypatch, tmp_path, events, fake_clients, fail_to_start=("eagle_det",))
    settings = cfgs.BenchSettings(concurrencies=(1, 8), breakdown=True, parallel_start=True)
    rc = runner.run_benchmark(settings, tmp_path / "out", models_dir=tmp_path, shape=midsize_models.MidsizeShape())
    assert rc == 1, "a server that did not start makes the run fail"
    names = list(settings.configs) + [runner.BREAKDOWN]
    first_measure = events.index(("measure", "no_spec"))
    assert {("ready", n) for n in names} <= set(events[:first_measure]), "all servers up before measuring"
    measured = [n for n in names if n != "eagle_det"]
    for a, b in zip(measured, measured[1:]):
        assert events.index(("stop", a)) < events.index(("measure", b)), f"{a} stopped before {b} is measured"
    assert ("measure", "eagle_det") not in events
    assert events.count(("start", "eagle_det")) == 2, "a failed parallel start is retried once, alone"
    assert events.index(("ready", runner.BREAKDOWN)) < events.index(("start", "eagle_det"), events.index(
        ("start", "eagle_det")) + 1), "the retry comes after every other server was started"
    doc = json.loads((tmp_path / "out" / "bench_serve.json").read_text())
    assert doc["ratios_detspec_over"]["eagle_rs"]["8"] == pytest.approx(1.05)
    assert doc["ratios_detspec_over"]["eagle_det"] == {"1": None, "8": None}
    assert doc["breakdown"]["phases_ms"]["verify_forward"] == pytest.approx(5.0)
    assert doc["startup_s"]["eagle_det"] is None
    rows = list(csv.DictReader(open(tmp_path / "out" / "bench_serve.csv")))
    assert [r["config"] for r in rows] == ["no_spec"] * 2 + ["eagle_rs"] * 2 + ["eagle_det"] * 2 + ["detspec"] * 2
    assert rows[4]["error"].startswith("server did not start")
    assert "--start sequential" in rows[4]["error"], "a server that failed alone too names the way out"
    printed = capsys.readouterr().out
    assert "detspec / eagle_rs (goal >= 0.97): c=1: 1.050 ok" in printed and "verify_forward" in printed
    assert (tmp_path / "out" / "step_timing_hook" / "sitecustomize.py").read_text() == step_timing.SITECUSTOMIZE


def test_a_server_that_failed_beside_the_others_is_measured_after_its_retry(tmp_path, monkeypatch, capsys):
    events = []

    def fake_clients(server, settings, pair, concurrencies, out, name):
        events.append(("measure", name))
        return [_row(name, c, 100.0 * c) for c in concurrencies]

    runner, midsize_models = _fake_run(monkeypatch, tmp_path, events, fake_clients, fail_first_start=("eagle_det",))
    settings = cfgs.BenchSettings(concurrencies=(1, 8), parallel_start=True)
    rc = runner.run_benchmark(settings, tmp_path / "out", models_dir=tmp_path, shape=midsize_models.MidsizeShape())
    assert rc == 0
    assert events.count(("start", "eagle_det")) == 2 and ("measure", "eagle_det") in events
    rows = {(r["config"], r["concurrency"]): r for r in csv.DictReader(open(tmp_path / "out" / "bench_serve.csv"))}
    assert not rows[("eagle_det", "8")]["error"] and float(rows[("eagle_det", "8")]["output_tok_s"]) == 800.0


def test_an_interrupted_run_reports_what_it_measured(tmp_path, monkeypatch, capsys):
    """Ctrl-C (or `timeout -s INT` on a lent GPU) while the third configuration runs: the first two keep their rows,
    the rest are marked not measured, every server is stopped, the files are written and the exit code is 1."""
    events = []

    def fake_clients(server, settings, pair, concurrencies, out, name):
        events.append(("measure", name))
        if name == "eagle_det":
            raise KeyboardInterrupt
        return [_row(name, c, 100.0 * c) for c in concurrencies]

    runner, midsize_models = _fake_run(monkeypatch, tmp_path, events, fake_clients)
    settings = cfgs.BenchSettings(concurrencies=(1, 8), parallel_start=True)
    rc = runner.run_benchmark(settings, tmp_path / "out", models_dir=tmp_path, shape=midsize_models.MidsizeShape())
    assert rc == 1
    rows = {(r["config"], r["concurrency"]): r for r in csv.DictReader(open(tmp_path / "out" / "bench_serve.csv"))}
    assert float(rows[("eagle_rs", "8")]["output_tok_s"]) == 800.0 and not rows[("no_spec", "1")]["error"]
    for key in [("eagle_det", "1"), ("eagle_det", "8"), ("detspec", "1"), ("detspec", "8")]:
        assert rows[key]["error"] == "not measured: the benchmark was interrupted", key
    assert ("measure", "detspec") not in events
    assert {("stop", n) for n in settings.configs} <= set(events), "every server is stopped"


@needs_sglang
def test_client_imports_bench_serving_without_hf_datasets():
    """A machine without HF `datasets` (only bench_serving's MMMU module needs it) can still run random-ids."""
    import subprocess
    import sys

    code = (
        "import sys, builtins\n"
        "real = builtins.__import__\n"
        "def imp(name, *a, **k):\n"
        "    if name.split('.')[0] == 'datasets':\n"
        "        raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = imp\n"
        "from sglang_detspec.bench.serving_bench import client\n"
        "cli_main, stubbed = client.import_cli_main()\n"
        "import sglang.benchmark.datasets as d\n"
        "assert stubbed == ['sglang.benchmark.datasets.mmmu'], stubbed\n"
        "assert d.DATASET_MAPPING['random-ids'].__name__ == 'RandomDataset'\n"
        "print('OK')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("OK"), proc.stderr[-3000:]
