"""bench-serve's measured points: a calibration run sizes ``--repetitions`` runs that together last at least
``--min-seconds``; the table gives their median and min - max, the ratios their spread; configurations carry the
environment that picks the batch-invariant kernels. CPU only: the client runs a fake bench_serving."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from sglang_detspec import cli
from sglang_detspec.bench.serving_bench import configs as cfgs
from sglang_detspec.bench.serving_bench import results

LINE = {"max_concurrency": 8, "duration": 2.0, "completed": 16, "total_output_tokens": 100, "output_throughput": 50.0,
        "median_ttft_ms": 1.0, "p99_ttft_ms": 2.0, "median_itl_ms": 3.0, "p99_itl_ms": 4.0, "accept_length": 2.5}


def _line(**changes) -> str:
    return json.dumps({**LINE, **changes})


def test_repetition_size_comes_from_the_calibration_rate():
    s = cfgs.BenchSettings(repetitions=3, min_seconds=30.0)
    # 16 requests took 2 s: 10 s per repetition wants 80 requests, +10 % margin = 88, rounded up to whole waves of 8.
    assert cfgs.repetition_prompts(16, 2.0, s, 8) == 88
    assert cfgs.repetition_prompts(16, 100.0, s, 8) == 16, "never fewer than the calibration's requests"
    assert cfgs.repetition_prompts(16, 0.001, s, 8) == 16 * cfgs.MAX_SCALE, "bounded"
    assert cfgs.repetition_prompts(16, 0.0, s, 8) == 16


@pytest.mark.parametrize("flag, value, message", [("--repetitions", "0", "--repetitions"),
                                                  ("--min-seconds", "-1", "--min-seconds")])
def test_bad_repetition_settings_are_refused(flag, value, message, capsys):
    rc = cli.main(["bench-serve", "--out", "x", flag, value, "--dry-run"])
    assert rc == cli.EXIT_ERROR and message in capsys.readouterr().err


def test_read_repetitions_takes_the_median_and_range_of_the_measured_runs(tmp_path):
    f = tmp_path / "r.jsonl"
    f.write_text("\n".join([_line(output_throughput=999.0, completed=8),  # the calibration run: not measured
                            _line(output_throughput=40.0, median_itl_ms=5.0, duration=10.0),
                            _line(output_throughput=60.0, median_itl_ms=3.0, duration=9.0),
                            _line(output_throughput=50.0, median_itl_ms=4.0, duration=11.0)]) + "\n")
    row = results.read_repetitions(f, 3, config="detspec", concurrency=8, calibration_prompts=8)
    assert row["output_tok_s"] == 50.0 and row["itl_p50_ms"] == 4.0
    assert (row["output_tok_s_min"], row["output_tok_s_max"]) == (40.0, 60.0)
    assert row["duration_s"] == 30.0 and row["repetitions"] == 3 and row["error"] == ""
    assert row["num_prompts"] == 16 and row["completed"] == 48


def test_read_repetitions_flags_missing_and_short_runs(tmp_path):
    f = tmp_path / "r.jsonl"
    f.write_text(_line() + "\n" + _line() + "\n")
    with pytest.raises(ValueError, match="1 measured runs of 3"):
        results.read_repetitions(f, 3, config="x", concurrency=8, calibration_prompts=16)
    f.write_text("\n".join([_line(), _line(), _line(completed=12), _line()]) + "\n")
    row = results.read_repetitions(f, 3, config="x", concurrency=8, calibration_prompts=16)
    assert row["error"] == "12 of 16 requests completed"


def _row(config, c, median, low, high):
    return results.RunResult(config=config, concurrency=c, num_prompts=8, output_tok_s=median, output_tok_s_min=low,
                             output_tok_s_max=high, error="")


def test_ratio_spread_pairs_the_slowest_with_the_fastest():
    rows = [_row("detspec", 1, 100.0, 90.0, 110.0), _row("eagle_rs", 1, 100.0, 80.0, 120.0)]
    assert results.compute_ratios(rows)["eagle_rs"][1] == pytest.approx(1.0)
    low, high = results.ratio_spread(rows)["eagle_rs"][1]
    assert low == pytest.approx(90 / 120) and high == pytest.approx(110 / 80)


def test_goals_apply_only_at_their_concurrencies():
    rows = [_row("detspec", c, 100.0, 100.0, 100.0) for c in (1, 8, 32)]
    rows += [_row("no_spec_fast", c, 100.0, 100.0, 100.0) for c in (1, 8, 32)]
    text = results.format_ratios(results.compute_ratios(rows), subject="detspec")
    assert "detspec / no_spec_fast (goal >= 1.2 at c = 1, 8): c=1: 1.000 BELOW GOAL" in text
    assert "c=32: 1.000," not in text and text.rstrip().endswith("c=32: 1.000")
    plugin = [_row("no_spec_plugin_ops", 1, 95.0, 95.0, 95.0), _row("no_spec_fast", 1, 100.0, 100.0, 100.0)]
    text = results.format_ratios(results.compute_ratios(plugin, subject="no_spec_plugin_ops"),
                                 subject="no_spec_plugin_ops")
    assert "no_spec_plugin_ops / no_spec_fast (goal >= 0.9): c=1: 0.950 ok" in text


def test_configurations_pick_the_kernels_by_environment():
    sglang_ops = cfgs.config_by_name("detspec_sglang_ops")
    assert dict(sglang_ops.env) == {"SGLANG_DETSPEC_OPS": "sglang"} and sglang_ops.algorithm == "DETSPEC_EAGLE"
    reference = cfgs.config_by_name("no_spec_plugin_ops")
    assert dict(reference.env) == {"SGLANG_DETSPEC_TOKEN_ID_SAMPLER": "1"} and reference.deterministic
    assert reference.algorithm is None
    assert not dict(cfgs.config_by_name("detspec").env), "DETSPEC_EAGLE runs the plugin's kernels by default"
    assert {"detspec_sglang_ops", "no_spec_plugin_ops"}.isdisjoint(cfgs.DEFAULT_CONFIGS)
    uncached = cfgs.config_by_name("detspec_no_attn_cache")
    assert dict(uncached.env) == {"SGLANG_DETSPEC_ATTN_INDEX_CACHE": "0"} and uncached.algorithm == "DETSPEC_EAGLE"
    assert uncached.deterministic and not uncached.builtin and uncached.opt_in
    assert "detspec_no_attn_cache" not in cfgs.DEFAULT_CONFIGS and "detspec_no_attn_cache" in results.SUBJECTS


def test_the_attention_cache_configurations_pass_values_the_plugin_reads_as_named():
    from sglang_detspec.integration.setup.attention_index_cache import attention_index_cache_wanted

    assert attention_index_cache_wanted(dict(cfgs.config_by_name("detspec_no_attn_cache").env)) is False
    assert attention_index_cache_wanted(dict(cfgs.config_by_name("detspec").env)) is True  # the default


def test_the_split_k_configuration_turns_the_splits_off_and_detspec_keeps_them():
    from sglang_detspec.integration.setup.batch_invariant_ops import gemm_split_k_wanted

    no_split = cfgs.config_by_name("detspec_no_split_k")
    assert no_split.algorithm == "DETSPEC_EAGLE" and no_split.opt_in and "detspec_no_split_k" in results.SUBJECTS
    assert gemm_split_k_wanted(dict(no_split.env)) is False
    assert gemm_split_k_wanted(dict(cfgs.config_by_name("detspec").env)) is True


def test_the_one_stage_verify_configuration_turns_the_split_kv_kernel_off_and_detspec_keeps_the_default():
    from sglang_detspec.integration.setup.split_kv_verify_switch import AUTO, OFF, split_kv_verify_setting

    one_stage = cfgs.config_by_name("detspec_one_stage_verify")
    assert one_stage.algorithm == "DETSPEC_EAGLE" and one_stage.opt_in and "detspec_one_stage_verify" in results.SUBJECTS
    assert split_kv_verify_setting(dict(one_stage.env)) == OFF
    assert split_kv_verify_setting(dict(cfgs.config_by_name("detspec").env)) == AUTO


def test_the_draft_extend_configuration_opts_in_and_detspec_does_not():
    from sglang_detspec.integration.setup.split_kv_draft_extend_switch import split_kv_draft_extend_wanted

    draft_extend = cfgs.config_by_name("detspec_split_kv_draft_extend")
    assert draft_extend.algorithm == "DETSPEC_EAGLE" and draft_extend.opt_in
    assert "detspec_split_kv_draft_extend" in results.SUBJECTS
    assert split_kv_draft_extend_wanted(dict(draft_extend.env)) is True
    assert split_kv_draft_extend_wanted(dict(cfgs.config_by_name("detspec").env)) is False


def test_the_llama8b_pair_has_llama_3_8b_shapes():
    parser = cli.build_parser()
    from sglang_detspec.bench import serving_bench

    shape = serving_bench.shape_from_args(parser.parse_args(["bench-serve", "--out", "x", "--pair", "llama8b"]))
    assert (shape.hidden, shape.layers, shape.heads, shape.kv_heads, shape.intermediate, shape.vocab) == (
        4096, 32, 32, 8, 14336, 128256)
    default = serving_bench.shape_from_args(parser.parse_args(["bench-serve", "--out", "x"]))
    assert (default.hidden, default.layers, default.vocab) == (2048, 16, 32000)


def test_client_calibrates_then_runs_sized_repetitions(tmp_path, monkeypatch, capsys):
    from sglang_detspec.bench.serving_bench import client

    out = tmp_path / "r.jsonl"
    seen = []

    def cli_main():
        n, seed = int(sys.argv[sys.argv.index("--num-prompts") + 1]), int(sys.argv[sys.argv.index("--seed") + 1])
        seen.append((n, seed))
        with open(out, "a") as f:  # bench_serving appends one line per run; 8 requests take 1 s here
            f.write(_line(completed=n, duration=n / 8, max_concurrency=4) + "\n")

    monkeypatch.setitem(sys.modules, "sglang.bench_serving", types.SimpleNamespace(cli_main=cli_main))
    monkeypatch.setattr(client, "_reset", lambda url: True)
    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps({"runs": [{"argv": ["--num-prompts", "8", "--seed", "7", "--x"], "reset_url": "http://ok",
                                          "repetitions": 2, "min_seconds": 20.0, "concurrency": 4,
                                          "output_file": str(out)}]}))
    monkeypatch.setattr(sys, "argv", ["keep"])
    assert client.main([str(runs)]) == 0
    # calibration 8 requests in 1 s -> 10 s per repetition wants 80, +10 % = 88 (whole waves of 4); each repetition
    # draws its own prompts (a seeded server would otherwise replay one set of trajectories in every repetition)
    assert seen == [(8, 7), (88, 8), (88, 9)]
    assert capsys.readouterr().out.count("counters reset: True") == 3, "reset before every run"
    row = results.read_repetitions(out, 2, config="x", concurrency=4, calibration_prompts=8)
    assert row["duration_s"] == pytest.approx(22.0) and row["error"] == ""


def test_dry_run_shows_sequential_starts_and_repetitions(capsys):
    assert cli.main(["bench-serve", "--out", str(Path("x")), "--configs", "detspec,detspec_sglang_ops",
                     "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "'parallel_start': False" in out and "'repetitions': 3" in out
