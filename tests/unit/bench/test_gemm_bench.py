"""The GEMM benchmark's plumbing (sglang_detspec/bench/gemm_bench.py) on CPU: shapes, the goal check, and ``run`` /
``tune`` end to end on tiny shapes with the CUDA-graph timer replaced by a stand-in that runs each timed function
once (the plugin's kernel under TRITON_INTERPRET=1) and reports a time chosen by the test.  What the numbers are
on a GPU needs the GPU (``scripts/bench/bench_gemm.py``)."""

import csv
import json

import pytest
import torch

from sglang_detspec.bench import gemm_bench as bench
from sglang_detspec.bench.gemm_bench import PAIRS, GemmShape, format_shape_table, goal_check, tune_candidates
from sglang_detspec.kernels.batch_invariant_gemm import BLOCK_K, GemmConfig, launch_config, launch_plan

TINY = {"tiny": (GemmShape("proj", 64, 32), GemmShape("fc", 128, 16, bias=True))}


def test_pairs_are_the_two_benchmark_models():
    mid = {s.name: (s.k, s.n, s.bias) for s in PAIRS["midsize"]}
    assert mid == {"qkv": (2048, 4096, False), "o": (2048, 2048, False), "gate_up": (2048, 11264, False),
                   "down": (5632, 2048, False), "lm_head": (2048, 32000, False), "eagle_fc": (4096, 2048, True)}
    big = {s.name: (s.k, s.n) for s in PAIRS["llama8b"]}
    assert big == {"qkv": (4096, 6144), "o": (4096, 4096), "gate_up": (4096, 28672), "down": (14336, 4096),
                   "lm_head": (4096, 128256), "eagle_fc": (8192, 4096)}


@pytest.mark.parametrize("bucket", bench.TUNE_BUCKETS)
def test_tune_candidates_keep_block_k_and_fit_their_bucket(bucket):
    for quick in (False, True):
        candidates = tune_candidates(bucket, quick)
        assert candidates and len(set(candidates)) == len(candidates)
        assert all(c.block_k == BLOCK_K for c in candidates)
        assert all(c.block_m <= max(bucket, 16) * 2 for c in candidates)
    assert len(tune_candidates(bucket, True)) < len(tune_candidates(bucket, False))


def _row(m, ratio, shape="o"):
    return dict(pair="midsize", shape=shape, k=2048, n=2048, m=m, plugin_over_cublas=ratio, plugin_config="x")


def test_goal_check_judges_m_up_to_512_only():
    met, lines = goal_check([_row(1, 1.2), _row(512, 1.25), _row(1024, 3.0)])
    assert met and lines == ["goal: plugin within 1.25x of cuBLAS at every M in 1-512: MET"]
    met, lines = goal_check([_row(1, 1.2), _row(64, 1.3, "down"), _row(4096, 0.9)])
    assert not met and "MISSED at 1 of 2" in lines[0] and "down" in lines[1] and "M=64: 1.3x" in lines[1]
    met, lines = goal_check([_row(1024, 1.0)])
    assert not met and "no rows in range" in lines[0]


def test_shape_table_literal_round_trips():
    best = {(2048, 4096): [(16, GemmConfig(16, 32, 4, 6)), (32, GemmConfig(32, 64, 4, 4, group_size_m=4))]}
    text = format_shape_table(best)
    namespace = {"GemmConfig": GemmConfig, "Dict": dict, "Tuple": tuple}
    exec(text, namespace)
    assert namespace["SHAPE_LAUNCH_TABLE"] == {(2048, 4096): ((16, GemmConfig(16, 32, 4, 6)),
                                                              (32, GemmConfig(32, 64, 4, 4, group_size_m=4)))}
    with pytest.raises(ValueError, match="block_k 32"):
        format_shape_table({(64, 64): [(16, GemmConfig(16, 16, block_k=32))]})


@pytest.fixture
def fake_timer(monkeypatch):
    """Replace the GPU timing: each timed function runs once; its time is ``times(config)`` for the plugin (the
    launch it used, None for the default), 10.0 for cuBLAS, 40.0 for SGLang's stand-in."""
    state = {"config": "unset", "times": lambda config: 11.0}
    real_matmul = bench.matmul

    def spy_matmul(a, b, bias=None, *, out_dtype=None, config=None, split_k=None):
        state["config"], state["split_k"] = config, split_k
        return real_matmul(a, b, bias, out_dtype=out_dtype, config=config, split_k=split_k)

    def fake_graph_time_us(fn, args, calls_per_graph, replays):
        state["config"], state["other"] = "unset", 10.0  # cuBLAS leaves both as they are
        fn(*args)
        config = state["config"]
        return [state["other"] if config == "unset" else state["times"](config)] * replays

    def sglang_stand_in(a, b, bias):
        state["other"] = 40.0
        out = torch.mm(a.float(), b.float())
        return (out if bias is None else out + bias.float()).to(a.dtype)

    monkeypatch.setattr(bench, "matmul", spy_matmul)
    monkeypatch.setattr(bench, "graph_time_us", fake_graph_time_us)
    monkeypatch.setattr(bench, "copy_bandwidth_gbs", lambda device: 1000.0)
    monkeypatch.setattr(bench, "load_sglang_gemm", lambda: (sglang_stand_in, "a stand-in"))
    monkeypatch.setattr(bench, "PAIRS", TINY)
    monkeypatch.setattr(bench, "_L2_FLUSH_BYTES", 8192)  # 2 weight copies of the tiny shapes, not 16
    return state


def test_run_writes_one_row_per_shape_and_m_with_the_ratios(tmp_path, fake_timer):
    logged = []
    rows = bench.run(tmp_path, pairs=["tiny"], ms=[1, 5, 600], replays=3, log=logged.append,
                     device=torch.device("cpu"))
    assert [(r["shape"], r["m"]) for r in rows] == [(s, m) for s in ("proj", "fc") for m in (1, 5, 600)]
    for r in rows:
        assert (r["cublas_median_us"], r["plugin_median_us"], r["sglang_median_us"]) == (10.0, 11.0, 40.0)
        assert (r["plugin_over_cublas"], r["sglang_over_cublas"]) == (1.1, 4.0)
        assert r["plugin_config"] == launch_config(r["m"], r["k"], r["n"], bench.batch_invariant_gemm.INTERPRETER_SMS).short()
        assert "split" not in r["plugin_config"]
        assert r["floor_us"] == round((r["k"] * r["n"] + r["m"] * (r["k"] + r["n"])) * 2 / 1000.0 / 1e3, 2)
        assert r["plugin_equals_sglang"] in (True, False)
    assert "goal: plugin within 1.25x of cuBLAS at every M in 1-512: MET" in logged
    header = logged.index("plugin / cuBLAS     " + "     M=1     M=5   M=600")
    assert logged[header + 1:header + 3] == ["tiny proj" + " " * 11 + "    1.10" * 3, "tiny fc" + " " * 13 + "    1.10" * 3]
    assert logged[header + 4] == "tiny proj" + " " * 11 + "    4.00" * 3
    with open(tmp_path / "gemm_bench.csv") as f:
        assert len(list(csv.DictReader(f))) == 6
    meta = json.loads((tmp_path / "gemm_bench.json").read_text())["meta"]
    assert meta["goal_met"] is True and meta["device"] == "cpu"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    assert (tmp_path / "gemm_bench_tiny.png").stat().st_size > 0


def _unique_time(config):
    return (config.block_n * 1000 + config.block_m * 10 + config.num_stages + config.num_warps / 100
            + config.mask_rows / 1000)


def test_tune_picks_the_fastest_bit_identical_launch(tmp_path, fake_timer, monkeypatch):
    # the fastest candidate of the 16-row bucket is made to return other bits: it must be reported and left out
    fastest = min(tune_candidates(16, quick=True), key=_unique_time)
    fake_timer["times"] = lambda config: 0.5 if config == fastest else _unique_time(config)
    spy = bench.matmul

    def perturbing(a, b, bias=None, *, out_dtype=None, config=None, split_k=None):
        out = spy(a, b, bias, out_dtype=out_dtype, config=config, split_k=split_k)
        if config == fastest:
            out = out.clone()
            out[0, 0] = out[0, 0] + 1
        return out

    monkeypatch.setattr(bench, "matmul", perturbing)
    logged = []
    text = bench.tune(tmp_path, pairs=["tiny"], quick=True, replays=2, log=logged.append, device=torch.device("cpu"))
    namespace = {"GemmConfig": GemmConfig, "Dict": dict, "Tuple": tuple}
    exec(text, namespace)
    table = namespace["SHAPE_LAUNCH_TABLE"]
    assert set(table) == {(64, 32), (128, 16)}
    sms = bench.batch_invariant_gemm.INTERPRETER_SMS
    for (k, n), entries in table.items():
        assert [bound for bound, _ in entries] == list(bench.TUNE_BUCKETS[:2])
        for bound, config in entries:
            timed = set(tune_candidates(bound, quick=True)) | {launch_config(bound, k, n, sms)}
            assert config == min(timed - {fastest}, key=_unique_time)
    assert any(line.startswith("NOT BIT-IDENTICAL") for line in logged)
    assert sum(line.endswith(fastest.short()) for line in logged) == 2  # once per shape, in the report
    assert (tmp_path / "gemm_tune_table.py").read_text().endswith(text + "\n")
    with open(tmp_path / "gemm_tune.csv") as f:
        assert any(r["bit_identical"] == "False" for r in csv.DictReader(f))


def test_run_with_a_forced_split_times_and_names_the_split(tmp_path, fake_timer, monkeypatch):
    monkeypatch.setattr(bench.batch_invariant_gemm, "SPLIT_PROGRAMS_MAX_M", 64)  # M = 100: folded
    rows = bench.run(tmp_path, pairs=["tiny"], ms=[2, 100], replays=2, log=lambda line: None,
                     device=torch.device("cpu"), split_k=2)
    sms = bench.batch_invariant_gemm.INTERPRETER_SMS
    for r in rows:  # K = 64 is one slice: no split there; K = 128 splits in two
        plan = launch_plan(r["m"], r["k"], r["n"], sms, 2)
        assert plan.splits == (2 if r["k"] == 128 else 1)
        suffix = "" if plan.splits == 1 else " split 2 folded" if r["m"] > 64 else " split 2"
        assert r["plugin_config"] == plan.config.short() + suffix
    assert fake_timer["split_k"] == 2  # the timed plugin call ran with the split
    assert json.loads((tmp_path / "gemm_bench.json").read_text())["meta"]["split_k"] == 2


def test_small_m_probe_times_the_default_and_masked_launch_of_each_m(tmp_path, fake_timer):
    fake_timer["times"] = lambda config: 20.0 if config.mask_rows else 30.0
    rows = bench.probe_small_m(tmp_path, pairs=["tiny"], replays=2, log=lambda line: None, device=torch.device("cpu"))
    assert [(r["shape"], r["m"]) for r in rows] == [(s, m) for s in ("proj", "fc") for m in bench.PROBE_MS]
    sms = bench.batch_invariant_gemm.INTERPRETER_SMS
    for r in rows:
        assert r["config"] == launch_config(r["m"], r["k"], r["n"], sms).short()
        assert (r["cublas_us"], r["unmasked_us"], r["masked_us"]) == (10.0, 30.0, 20.0)
        assert r["masked_equal"] is True  # masking rows past M changes no stored row
    with open(tmp_path / "gemm_probe_small_m.csv") as f:
        assert len(list(csv.DictReader(f))) == len(rows)


def test_split_programs_max_m_sets_the_kernels_bound_or_refuses(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench.batch_invariant_gemm, "SPLIT_PROGRAMS_MAX_M", 512)
    with pytest.raises(SystemExit) as refused:
        bench.main(["--out", str(tmp_path), "--split-programs-max-m", "-1"])
    assert refused.value.code == 2 and "--split-programs-max-m: M must be >= 0" in capsys.readouterr().err
    assert bench.batch_invariant_gemm.SPLIT_PROGRAMS_MAX_M == 512
    monkeypatch.setattr(bench.torch.cuda, "is_available", lambda: False)
    assert bench.main(["--out", str(tmp_path), "--split-programs-max-m", "64"]) == 2  # no GPU here
    assert bench.batch_invariant_gemm.SPLIT_PROGRAMS_MAX_M == 64
    assert not launch_plan(64, 5632, 2048, 132).fold_splits and launch_plan(65, 5632, 2048, 132).fold_splits


@pytest.mark.parametrize("ms", [["256", "64"], ["64", "64"]])
def test_tune_buckets_must_increase(tmp_path, capsys, ms):
    with pytest.raises(SystemExit) as refused:
        bench.main(["--out", str(tmp_path), "--tune", "--ms", *ms])
    assert refused.value.code == 2 and "the buckets must be increasing, each once" in capsys.readouterr().err


def test_tune_times_only_the_buckets_asked_for(tmp_path, fake_timer):
    text = bench.tune(tmp_path, pairs=["tiny"], quick=True, replays=2, log=lambda line: None,
                      device=torch.device("cpu"), buckets=[32])
    namespace = {"GemmConfig": GemmConfig, "Dict": dict, "Tuple": tuple}
    exec(text, namespace)
    assert {bound for rows in namespace["SHAPE_LAUNCH_TABLE"].values() for bound, _ in rows} == {32}
    with open(tmp_path / "gemm_tune.csv") as f:
        assert {r["bucket"] for r in csv.DictReader(f)} == {"32"}
