"""bench-serve ``--order interleaved``: every configuration calibrated, then rounds of one repetition per configuration
(the first one rotating), and ratios paired by round, which a slow drift of the machine cannot bias. CPU only: the
servers are fakes, the real client runs in-process over a fake bench_serving whose rate a drifting "machine" sets."""

from __future__ import annotations

import contextlib
import csv
import json
import re
import statistics
import sys
import types
from pathlib import Path

import pytest

from sglang_detspec import cli
from sglang_detspec.bench.serving_bench import configs as cfgs
from sglang_detspec.bench.serving_bench import interleaved, results

# ---------------------------------------------------------------------------------------------------------------
# The order


def test_each_round_starts_one_configuration_later():
    assert cfgs.round_order(("a", "b", "c"), 4) == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"],
                                                    ["a", "b", "c"]]
    names = ("no_spec", "eagle_rs", "eagle_det", "detspec")
    rounds = cfgs.round_order(names, len(names))
    for name in names:
        assert sorted(r.index(name) for r in rounds) == [0, 1, 2, 3], f"{name} holds every position once"
    assert cfgs.round_order(names, 1) == [list(names)]


def test_client_runs_calibrate_every_point_then_hold_rotating_rounds(tmp_path):
    settings = cfgs.BenchSettings(configs=("eagle_rs", "detspec", "no_spec_fast"), concurrencies=(1, 8),
                                  repetitions=3, parallel_start=True, order="interleaved")
    servers = {"eagle_rs": (1001, "http://e"), "detspec": (1002, "http://d"), "no_spec_fast": (1003, "http://n")}
    runs = interleaved.client_runs(servers, settings, Path("/t"), tmp_path, "python")
    calibrations, measured = runs[:6], runs[6:]
    assert [r["calibrate"] for r in calibrations] == ["eagle_rs-c1", "eagle_rs-c8", "detspec-c1", "detspec-c8",
                                                      "no_spec_fast-c1", "no_spec_fast-c8"]
    assert all(r["repetitions"] == 3 and r["min_seconds"] == settings.min_seconds for r in calibrations)
    assert [(r["round"], r["sized_by"]) for r in measured] == [
        (1, "eagle_rs-c1"), (1, "eagle_rs-c8"), (1, "detspec-c1"), (1, "detspec-c8"), (1, "no_spec_fast-c1"),
        (1, "no_spec_fast-c8"),
        (2, "detspec-c1"), (2, "detspec-c8"), (2, "no_spec_fast-c1"), (2, "no_spec_fast-c8"), (2, "eagle_rs-c1"),
        (2, "eagle_rs-c8"),
        (3, "no_spec_fast-c1"), (3, "no_spec_fast-c8"), (3, "eagle_rs-c1"), (3, "eagle_rs-c8"), (3, "detspec-c1"),
        (3, "detspec-c8")]
    for r in runs:  # each run goes to its own server, resets that server's counters, and writes its own file
        name = (r.get("calibrate") or r["sized_by"]).rsplit("-c", 1)[0]
        argv = r["argv"]
        assert argv[argv.index("--port") + 1] == str(servers[name][0]) and r["reset_url"] == servers[name][1]
        output = argv[argv.index("--output-file") + 1]
        assert output == (r.get("output_file") or str(tmp_path / f"{r['sized_by']}-round{r['round']}.jsonl"))
    assert len({r["argv"][r["argv"].index("--output-file") + 1] for r in runs}) == len(runs)
    assert interleaved.expected_resets(list(servers), settings) == len(runs)


# ---------------------------------------------------------------------------------------------------------------
# The flags


@pytest.mark.parametrize("extra", [[], ["--start", "sequential"]])
def test_interleaved_without_parallel_start_is_refused_naming_both_flags(extra, capsys):
    rc = cli.main(["bench-serve", "--out", "x", "--order", "interleaved", *extra, "--dry-run"])
    err = capsys.readouterr().err
    assert rc == cli.EXIT_ERROR and "--order interleaved needs --start parallel" in err, err
    assert "--start sequential" in err


def test_interleaved_profile_is_refused(capsys):
    rc = cli.main(["bench-serve", "--out", "x", "--order", "interleaved", "--start", "parallel", "--profile-steps",
                   "4", "--dry-run"])
    assert rc == cli.EXIT_ERROR and "--profile-steps" in capsys.readouterr().err


def test_dry_run_describes_the_rounds_and_the_estimate_counts_one_client(capsys):
    args = ["bench-serve", "--out", "x", "--start", "parallel", "--repetitions", "2", "--dry-run"]
    assert cli.main(args) == 0
    sequential = capsys.readouterr().out
    assert cli.main(args + ["--order", "interleaved"]) == 0
    out = capsys.readouterr().out
    assert "'order': 'interleaved'" in out and "'order': 'sequential'" in sequential
    assert "round" not in sequential and "order: " not in sequential, "the sequential dry run gains no order line"
    (line,) = [ln for ln in out.splitlines() if ln.startswith("order: interleaved")]
    assert "round 1: no_spec, eagle_rs, eagle_det, detspec; round 2: eagle_rs, eagle_det, detspec, no_spec" in line
    assert "round 3" not in line and "paired" in line
    seconds = [float(re.search(r"estimated duration: ~(\d+) s", t).group(1)) for t in (sequential, out)]
    # the same runs; the three configurations after the first import no client of their own
    assert seconds[0] - seconds[1] == pytest.approx(3 * cfgs._CLIENT_IMPORT_S, abs=1)


# ---------------------------------------------------------------------------------------------------------------
# Paired ratios


def _rounds_row(config, c, per_round, error=""):
    measured = [v for v in per_round if v is not None]
    return results.RunResult(config=config, concurrency=c, num_prompts=8, error=error,
                             output_tok_s=statistics.median(measured),
                             output_tok_s_min=min(measured), output_tok_s_max=max(measured),
                             output_tok_s_rounds=list(per_round))


def test_paired_ratios_cancel_a_drift_that_biases_the_ratio_of_medians():
    """detspec runs at 0.9x eagle_rs in every round while the machine slows from 100 % to 50 % of its speed. Measured
    in blocks (sequential order: detspec's three repetitions while fast, eagle_rs's while slow) the ratio of medians
    ranks detspec first (1.35); interleaved, a round whose eagle_rs run is missing does it as well (0.8 instead of
    0.9); the per-round ratios are 0.9 in every round either way."""
    speed = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5]
    sequential = [_rounds_row("detspec", 1, [900 * s for s in speed[:3]]),
                  _rounds_row("eagle_rs", 1, [1000 * s for s in speed[3:]])]
    assert results.compute_ratios(sequential)["eagle_rs"][1] == pytest.approx(0.9 * 0.9 / 0.6)
    rounds = [1.0, 0.8, 0.6]  # the machine's speed in each round
    rows = [_rounds_row("detspec", 1, [900 * s for s in rounds]),
            _rounds_row("eagle_rs", 1, [1000 * rounds[0], 1000 * rounds[1], None])]
    assert results.compute_ratios(rows)["eagle_rs"][1] == pytest.approx(720 / 900)
    paired = results.paired_ratios(rows)["eagle_rs"][1]
    assert paired["median"] == pytest.approx(0.9) and (paired["min"], paired["max"]) == pytest.approx((0.9, 0.9))
    assert paired["rounds"][:2] == pytest.approx([0.9, 0.9]) and paired["rounds"][2] is None


def test_paired_ratios_pair_each_round_and_skip_failed_points():
    rows = [_rounds_row("detspec", 8, [100.0, 120.0, 90.0]), _rounds_row("eagle_rs", 8, [200.0, 100.0, 100.0]),
            _rounds_row("no_spec", 8, [50.0, 50.0, 50.0], error="3 of 16 requests completed")]
    paired = results.paired_ratios(rows)
    assert paired["eagle_rs"][8]["rounds"] == pytest.approx([0.5, 1.2, 0.9])
    assert paired["eagle_rs"][8]["median"] == pytest.approx(0.9)
    assert (paired["eagle_rs"][8]["min"], paired["eagle_rs"][8]["max"]) == pytest.approx((0.5, 1.2))
    assert paired["no_spec"] == {8: None}, "a failed point has no paired ratio, like its ratio of medians"
    ratios = {"detspec": results.compute_ratios(rows)}
    table = results.format_paired_table(ratios, {"detspec": paired})
    assert re.search(r"detspec / eagle_rs\s+8\s+1\.000\s+0\.900\s+0\.500\s+1\.200\s+0\.500 1\.200 0\.900", table)
    medians, spread = results.paired_medians_and_spread(paired)
    line = results.format_ratios(medians, subject="detspec", spread=spread, kind="paired")
    assert "detspec / eagle_rs (goal >= 0.97), paired: c=8: 0.900 [0.500-1.200] BELOW GOAL" in line


def test_read_rounds_keeps_each_result_on_its_round(tmp_path):
    def write(name, tok_s):
        (tmp_path / name).write_text(json.dumps({
            "max_concurrency": 8, "duration": 2.0, "completed": 16, "total_output_tokens": 100,
            "output_throughput": tok_s, "median_ttft_ms": 1.0, "p99_ttft_ms": 2.0, "median_itl_ms": 3.0,
            "p99_itl_ms": 4.0, "accept_length": 2.5}) + "\n")

    write("r1", 40.0)
    write("r3", 60.0)
    files = [tmp_path / "r1", tmp_path / "r2", tmp_path / "r3"]
    row = results.read_rounds(files, config="x", concurrency=8, calibration_prompts=16)
    assert row["output_tok_s_rounds"] == [40.0, None, 60.0] and row["output_tok_s"] == 50.0
    assert row["error"] == "round 2 of 3 has no result" and row["repetitions"] == 2
    partial = results.read_rounds(files, config="x", concurrency=8, calibration_prompts=16, require_all=False)
    assert partial["error"] == "" and partial["output_tok_s_rounds"] == [40.0, None, 60.0]
    with pytest.raises(ValueError, match="no round of 1"):
        results.read_rounds([tmp_path / "r2"], config="x", concurrency=8, calibration_prompts=16)


# ---------------------------------------------------------------------------------------------------------------
# The whole run: fake servers, the real client in-process, a fake bench_serving on a drifting machine


def _interleaved_run(monkeypatch, tmp_path, interrupt_at=None):
    """Patch run_benchmark's servers and pair, and run the real client in-process over a fake bench_serving: the
    machine slows by 10 % per round (each run's file says its round), detspec's rate is 0.9x eagle_rs's and 1.5x
    no_spec's. Returns (runner, events, written, seeds): ``written`` maps (config, c, round or 0) to the rate
    written, ``seeds`` to the run's ``--seed``."""
    from bench_fakes import patch_bench_servers, recording_server

    from sglang_detspec.bench.serving_bench import client, runner

    events, written, seeds = [], {}, {}
    rate = {"no_spec": 600.0, "eagle_rs": 1000.0, "detspec": 900.0, "detspec_breakdown": 100.0}

    def cli_main():
        argv = sys.argv
        output = Path(argv[argv.index("--output-file") + 1])
        n, c = int(argv[argv.index("--num-prompts") + 1]), int(argv[argv.index("--max-concurrency") + 1])
        config, r = re.fullmatch(r"(.+)-c\d+(?:-round(\d)|-calibration)?", output.stem).groups()
        config, r = config, int(r or 0)
        if (config, r) == interrupt_at:
            raise KeyboardInterrupt
        tok_s = rate[config] * c * (1.0 - 0.1 * r)
        written[(config, c, r)] = tok_s
        events.append(("run", config, c, r))
        seeds[(config, c, r)] = int(argv[argv.index("--seed") + 1])
        with open(output, "a") as f:
            f.write(json.dumps({"max_concurrency": c, "duration": 1.0, "completed": n, "total_output_tokens": 10 * n,
                                "output_throughput": tok_s, "median_ttft_ms": 1.0, "p99_ttft_ms": 2.0,
                                "median_itl_ms": 3.0, "p99_itl_ms": 4.0, "accept_length": 2.0}) + "\n")

    def client_in_process(runs, runs_file, log, timeout):
        runs_file.write_text(json.dumps({"runs": runs}))
        with open(log, "w") as f, contextlib.redirect_stdout(f):
            rc = client.main([str(runs_file)])
        return f"bench_serving client exited {rc}"

    monkeypatch.setitem(sys.modules, "sglang.bench_serving", types.SimpleNamespace(cli_main=cli_main))
    monkeypatch.setattr(client, "_reset", lambda url: events.append(("reset", url)) or True)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    patch_bench_servers(monkeypatch, tmp_path, recording_server(events))
    monkeypatch.setattr(runner, "_client_process", client_in_process)
    return runner, events, written, seeds


SETTINGS = cfgs.BenchSettings(configs=("no_spec", "eagle_rs", "detspec"), concurrencies=(1, 8), repetitions=3,
                              min_seconds=0.0, parallel_start=True, order="interleaved")


def test_interleaved_run_measures_in_rounds_and_reports_paired_ratios(tmp_path, monkeypatch, capsys):
    from sglang_detspec.models import midsize_models

    runner, events, written, seeds = _interleaved_run(monkeypatch, tmp_path)
    rc = runner.run_benchmark(SETTINGS, tmp_path / "out", models_dir=tmp_path, shape=midsize_models.MidsizeShape())
    assert rc == 0
    base = SETTINGS.seed
    assert seeds == {(n, c, r): base + r for n in SETTINGS.configs for c in (1, 8) for r in range(4)}, \
        "each round a new prompt set, the same for every configuration in it"
    runs = [e[1:] for e in events if e[0] == "run"]
    assert runs[:6] == [(n, c, 0) for n in ("no_spec", "eagle_rs", "detspec") for c in (1, 8)], "calibrations"
    assert [(n, r) for n, c, r in runs[6:] if c == 1] == [
        ("no_spec", 1), ("eagle_rs", 1), ("detspec", 1), ("eagle_rs", 2), ("detspec", 2), ("no_spec", 2),
        ("detspec", 3), ("no_spec", 3), ("eagle_rs", 3)]
    first_run, last_run = events.index(("run", "no_spec", 1, 0)), events.index(("run", "eagle_rs", 8, 3))
    assert {("ready", n) for n in SETTINGS.configs} <= set(events[:first_run]), "every server up first"
    assert not [e for e in events[:last_run] if e[0] == "stop"], "no server released before the last round"
    assert all(events[i - 1][0] == "reset" for i, e in enumerate(events) if e[0] == "run"), "reset before each run"
    doc = json.loads((tmp_path / "out" / "bench_serve.json").read_text())
    assert doc["order"] == "interleaved"
    paired = doc["paired_ratios"]["detspec"]["eagle_rs"]["8"]
    expected = [written[("detspec", 8, r)] / written[("eagle_rs", 8, r)] for r in (1, 2, 3)]
    assert paired["rounds"] == pytest.approx(expected) and paired["median"] == pytest.approx(0.9)
    assert doc["paired_ratios"]["detspec"]["no_spec"]["1"]["median"] == pytest.approx(1.5)
    assert [r["output_tok_s_rounds"] for r in doc["rows"] if (r["config"], r["concurrency"]) == ("detspec", 1)] == [
        pytest.approx([written[("detspec", 1, r)] for r in (1, 2, 3)])]
    lines = list(csv.DictReader(open(tmp_path / "out" / "bench_serve_paired.csv")))
    (row,) = [x for x in lines if (x["subject"], x["over"], x["concurrency"]) == ("detspec", "eagle_rs", "1")]
    assert float(row["paired_median"]) == pytest.approx(0.9) and row["rounds_paired"] == "3"
    assert float(row["ratio_of_medians"]) == pytest.approx(0.9)
    printed = capsys.readouterr().out
    assert "detspec / eagle_rs (goal >= 0.97), ratio of medians: c=1: 0.900" in printed
    assert "detspec / eagle_rs (goal >= 0.97), paired: median [min - max] of the 3 per-round ratios: c=1: 0.900 " \
           "[0.900-0.900] BELOW GOAL" in printed
    assert "paired ratios: per round" in printed


def test_an_interrupted_interleaved_run_reports_the_rounds_it_measured(tmp_path, monkeypatch, capsys):
    """Ctrl-C when detspec's second round starts: every configuration keeps round 1, eagle_rs also round 2 (first
    in the rotated round 2). eagle_rs's median then holds a slower round than detspec's, so on this drifting machine
    the ratio of medians (0.953) misses the true 0.9; the paired ratio pairs round 1 alone and gives 0.9."""
    from sglang_detspec.models import midsize_models

    runner, events, written, _ = _interleaved_run(monkeypatch, tmp_path, interrupt_at=("detspec", 2))
    rc = runner.run_benchmark(SETTINGS, tmp_path / "out", models_dir=tmp_path, shape=midsize_models.MidsizeShape())
    assert rc == 1
    assert {("stop", n) for n in SETTINGS.configs} <= set(events), "every server is stopped"
    doc = json.loads((tmp_path / "out" / "bench_serve.json").read_text())
    rows = {(r["config"], r["concurrency"]): r for r in doc["rows"]}
    assert rows[("detspec", 8)]["output_tok_s_rounds"] == [pytest.approx(written[("detspec", 8, 1)]), None, None]
    assert rows[("eagle_rs", 8)]["output_tok_s_rounds"][2] is None and rows[("eagle_rs", 8)]["error"] == ""
    assert rows[("eagle_rs", 1)]["repetitions"] == 2 and rows[("no_spec", 1)]["repetitions"] == 1
    assert rows[("detspec", 1)]["output_tok_s_rounds"][1:] == [None, None]
    paired = doc["paired_ratios"]["detspec"]["eagle_rs"]["8"]
    assert paired["rounds"][0] == pytest.approx(0.9) and paired["rounds"][1:] == [None, None]
    assert paired["median"] == pytest.approx(0.9)
    of_medians = doc["ratios"]["detspec"]["eagle_rs"]["8"]
    assert of_medians == pytest.approx(0.9 * 0.9 / 0.85), "eagle_rs's median: rounds 1 and 2 (speeds 0.9, 0.8)"
    assert "interrupted" in capsys.readouterr().err


def test_the_breakdown_server_is_measured_alone_after_the_rounds(tmp_path, monkeypatch, capsys):
    import dataclasses

    from sglang_detspec.models import midsize_models

    runner, events, _, _ = _interleaved_run(monkeypatch, tmp_path)
    settings = dataclasses.replace(SETTINGS, breakdown=True)
    runner.run_benchmark(settings, tmp_path / "out", models_dir=tmp_path, shape=midsize_models.MidsizeShape())
    breakdown_runs = [i for i, e in enumerate(events) if e[:2] == ("run", runner.BREAKDOWN)]
    stops = [events.index(("stop", n)) for n in settings.configs]
    assert breakdown_runs and max(stops) < min(breakdown_runs), "every configuration's server released first"
    assert max(i for i, e in enumerate(events) if e[0] == "run" and e[1] != runner.BREAKDOWN) < min(stops)
