"""The decode-step profile's attribution (bench/op_profile.py) and its command-line settings, on CPU.

The kernel names are ones SGLang's GPU traces show (cuBLAS ``nvjet`` / ``sm90_xmma``, SGLang's Triton attention and
deterministic kernels, the plugin's kernels, PyTorch's elementwise templates); the CPU side of the trace is a real
PyTorch profiler trace of ``F.linear`` and ``torch.mm`` with ``record_shapes``, to which GPU kernel events are added
the way a CUDA trace links them (the launching op's ``External id``).
"""

import argparse
import gzip
import importlib.util
import json
import time
from pathlib import Path

import pytest

from sglang_detspec.bench import op_profile
from sglang_detspec.bench.gemm_bench import GemmShape

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("name,category", [
    ("nvjet_tst_64x8_64x16_4x1_v_bz_TNN", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_"
     "cublas", "gemm"),
    ("matmul_kernel_persistent", "gemm"),
    ("_batch_invariant_matmul_kernel", "gemm"),
    ("bmm_kernel_persistent", "gemm"),
    ("_fwd_kernel_stage1", "attention"),
    ("_fwd_grouped_kernel_stage1", "attention"),
    ("void flashinfer::BatchDecodeWithPagedKVCacheKernel<...>", "attention"),
    ("_fused_add_rms_norm_kernel", "norm"),
    ("mean_kernel", "norm"),
    ("void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>", "norm"),
    ("void flashinfer::activation::act_and_mul_kernel<__nv_bfloat16, &silu>", "activation"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::silu_kernel(at::TensorIteratorBase&)>",
     "activation"),
    ("void flashinfer::BatchQKApplyRotaryPosIdsCosSinCacheKernel<true, 128u>", "rotary"),
    ("_log_softmax_kernel", "sampling"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, float>", "sampling"),
    ("_seeded_draft_sample_stage1_kernel", "sampling"),
    ("write_req_to_token_pool_triton", "kv_cache"),
    ("create_flashinfer_kv_indices_triton", "kv_cache"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t>>", "elementwise"),
    ("void at::native::index_elementwise_kernel<128, 4>", "elementwise"),
    ("some_unknown_kernel", "other"),
])
def test_a_kernel_falls_in_its_category(name, category):
    assert op_profile.categorize(name) == category


@pytest.mark.parametrize("op,dims,expected", [
    ("aten::mm", [[4, 2048], [2048, 4096]], (4, 2048, 4096)),
    ("aten::matmul", [[2, 3, 64], [64, 32]], (6, 64, 32)),
    ("aten::addmm", [[32], [4, 64], [64, 32], [], []], (4, 64, 32)),
    ("aten::linear", [[1, 4, 64], [32, 64], [32]], (4, 64, 32)),
    ("aten::bmm", [[8, 4, 64], [8, 64, 16]], (32, 64, 16)),
    ("aten::mm", [[4, 2048], [1024, 4096]], None),  # inner dimensions disagree
    ("aten::mm", [[4, 2048]], None),
    ("aten::linear", [[4, 64], [], []], None),
    ("aten::add", [[4, 64], [4, 64]], None),
])
def test_gemm_shape_from_input_dims(op, dims, expected):
    assert op_profile.gemm_shape(op, dims) == expected


def _cpu_trace_of_linear_and_mm():
    torch = pytest.importorskip("torch")
    a, w, b = torch.randn(4, 64), torch.randn(32, 64), torch.randn(32)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        torch.nn.functional.linear(a, w, b)
        torch.mm(torch.randn(2, 32), torch.randn(32, 128))
    return prof


def _kernel(name, ts, dur, ext=None, cat="kernel"):
    args = {} if ext is None else {"External id": ext, "correlation": 1000 + ts}
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur, "args": args}


def test_attribution_of_a_real_cpu_trace_with_gpu_kernels_added(tmp_path):
    prof = _cpu_trace_of_linear_and_mm()
    path = tmp_path / "cpu.json"
    prof.export_chrome_trace(str(path))
    trace = op_profile.read_trace(path)
    ext = {e["name"]: e["args"]["External id"] for e in trace["traceEvents"]
           if e.get("cat") == "cpu_op" and e["name"] in ("aten::addmm", "aten::mm")}
    assert set(ext) == {"aten::addmm", "aten::mm"}
    # Two steps, times in microseconds: a GEMM per op, attention, a norm, a memcpy and a GEMM with no op.
    trace["traceEvents"] += [
        _kernel("nvjet_tst_64x8_64x16_4x1_v_bz_TNN", 100, 30, ext["aten::addmm"]),
        _kernel("nvjet_tst_64x8_64x16_4x1_v_bz_TNN", 140, 50, ext["aten::mm"]),
        _kernel("_fwd_kernel_stage1", 200, 40),
        _kernel("_fused_add_rms_norm_kernel", 250, 10),
        _kernel("Memcpy HtoD (Pageable -> Device)", 270, 6, cat="gpu_memcpy"),
        _kernel("matmul_kernel_persistent", 300, 24, ext=999999),
        _kernel("nvjet_tst_64x8_64x16_4x1_v_bz_TNN", 400, 30, ext["aten::addmm"]),
    ]
    names = op_profile.shape_names_for([GemmShape("proj", 64, 32, bias=True), GemmShape("up", 32, 128)])
    got = op_profile.attribute(trace, steps=2, shape_names=names)
    assert got["steps"] == 2 and got["kernels_per_step"] == 3.5
    assert got["categories"]["gemm"] == pytest.approx((30 + 50 + 24 + 30) / 2000)
    assert got["categories"]["attention"] == pytest.approx(40 / 2000)
    assert got["categories"]["norm"] == pytest.approx(10 / 2000)
    assert got["categories"]["copy"] == pytest.approx(6 / 2000)
    assert got["kernel_ms"] == pytest.approx(190 / 2000)
    assert got["window_ms"] == pytest.approx((430 - 100) / 2000)
    assert got["gemm_shapes"]["proj"] == {"ms": pytest.approx(60 / 2000), "calls": 1.0, "m": [4]}
    assert got["gemm_shapes"]["up"] == {"ms": pytest.approx(50 / 2000), "calls": 0.5, "m": [2]}
    assert got["gemm_shapes"]["unattributed"]["calls"] == 0.5
    assert list(got["gemm_shapes"]) == ["proj", "up", "unattributed"]  # costliest first
    assert got["top_kernels"][0] == {"name": "nvjet_tst_64x8_64x16_4x1_v_bz_TNN", "category": "gemm",
                                     "ms": pytest.approx(110 / 2000), "calls": 1.5}


def test_a_trace_without_gpu_kernels_is_refused(tmp_path):
    prof = _cpu_trace_of_linear_and_mm()
    path = tmp_path / "cpu.json"
    prof.export_chrome_trace(str(path))
    with pytest.raises(ValueError, match="no GPU kernel"):
        op_profile.attribute(op_profile.read_trace(path), steps=1)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        op_profile.attribute({"traceEvents": [_kernel("x", 0, 1)]}, steps=0)


def test_read_trace_takes_gzip_and_refuses_other_json(tmp_path):
    gz = tmp_path / "t.trace.json.gz"
    with gzip.open(gz, "wt") as f:
        json.dump({"traceEvents": [_kernel("mean_kernel", 0, 5)]}, f)
    assert op_profile.attribute(op_profile.read_trace(gz), steps=1)["categories"]["norm"] == pytest.approx(0.005)
    bad = tmp_path / "bad.json"
    bad.write_text('{"events": []}')
    with pytest.raises(ValueError, match="not a Chrome trace"):
        op_profile.read_trace(bad)


def test_tables_show_each_profiled_configuration_and_skip_failed_ones():
    ok = op_profile.attribute({"traceEvents": [_kernel("matmul_kernel_persistent", 0, 2000),
                                               _kernel("_fwd_kernel_stage1", 2000, 1000)]}, steps=1)
    profiles = {"no_spec": ok, "detspec": {"error": "server did not start"}}
    table = op_profile.format_category_table(profiles)
    assert "| ms per step | no_spec |" in table and "detspec" not in table
    assert "| gemm | 2.000 |" in table and "| attention | 1.000 |" in table
    assert "| norm |" not in table  # categories that are zero everywhere are left out
    gemm = op_profile.format_gemm_table(profiles)
    assert "| unattributed | 2.000 (1) |" in gemm


def _bench_serve_args(argv):
    from sglang_detspec.bench import serving_bench

    p = argparse.ArgumentParser()
    serving_bench.add_arguments(p)
    return serving_bench, p.parse_args(["--out", "x", *argv])


def test_profile_mode_gives_the_requests_room_for_the_steps():
    serving_bench, args = _bench_serve_args(["--profile-steps", "20"])
    assert serving_bench.settings_from_args(args).output_len == 2048
    serving_bench, args = _bench_serve_args(["--profile-steps", "100"])
    assert serving_bench.settings_from_args(args).output_len == (serving_bench.PROFILE_AFTER_TOKENS
                                                                 + 100 * serving_bench.PROFILE_TOKENS_PER_STEP)
    serving_bench, args = _bench_serve_args(["--profile-steps", "20", "--profile-after-tokens", "3000"])
    assert serving_bench.settings_from_args(args).output_len == 3000 + 20 * serving_bench.PROFILE_TOKENS_PER_STEP
    serving_bench, args = _bench_serve_args(["--profile-after-tokens", "64"])
    with pytest.raises(ValueError, match="give --profile-steps N too"):
        serving_bench.settings_from_args(args)
    serving_bench, args = _bench_serve_args(["--profile-steps", "-1"])
    with pytest.raises(ValueError, match="--profile-steps must be >= 0"):
        serving_bench.settings_from_args(args)
    serving_bench, args = _bench_serve_args([])
    assert serving_bench.settings_from_args(args).output_len == 256  # throughput mode keeps its default


def test_an_output_length_too_short_for_the_profile_is_refused_naming_the_fix():
    from sglang_detspec.bench.serving_bench.profile_runner import check_profile_settings

    serving_bench, args = _bench_serve_args(["--profile-steps", "20", "--output-len", "128"])
    settings = serving_bench.settings_from_args(args)
    with pytest.raises(ValueError, match="after 512 tokens.*pass --output-len 1152 or more"):
        check_profile_settings(settings, 20)  # the default 512 tokens before the profile, then 20 x 32
    with pytest.raises(ValueError, match="pass --output-len 129 or more"):
        check_profile_settings(settings, 4, after_tokens=1)
    check_profile_settings(settings, 3, after_tokens=32)  # 128 tokens are enough for 32, then 3 steps
    with pytest.raises(ValueError, match="--profile-after-tokens must be >= 1"):
        check_profile_settings(settings, 3, after_tokens=0)


def test_the_profile_script_adds_its_defaults_but_keeps_the_users_flags():
    spec = importlib.util.spec_from_file_location("profile_ops", REPO / "scripts" / "bench" / "profile_ops.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    argv = script.with_defaults(["--out", "d", "--concurrencies=1", "--pair", "llama8b"])
    assert argv.count("--concurrencies") == 0 and "--concurrencies=1" in argv
    assert argv[argv.index("--profile-steps") + 1] == "20"
    configs = argv[argv.index("--configs") + 1].split(",")
    assert {"no_spec_fast", "no_spec", "detspec", "detspec_sglang_ops"} <= set(configs)
    from sglang_detspec.bench.serving_bench import configs as cfgs

    for name in configs:  # every default names a configuration of the table
        cfgs.config_by_name(name)


def test_the_profile_dry_run_prints_graphs_off_servers_and_the_profile(capsys):
    serving_bench, args = _bench_serve_args(["--profile-steps", "5", "--configs", "no_spec,detspec", "--dry-run"])
    assert serving_bench.run(args) == 0
    text = capsys.readouterr().out
    servers = [line for line in text.splitlines() if line.startswith("server ")]
    assert len(servers) == 2 and all("--cuda-graph-backend-decode disabled" in line for line in servers)
    assert "DETSPEC_EAGLE" in servers[1] and "/start_profile for 5 decode batches" in text
    assert "once each has generated 512 tokens" in text
    assert "sglang.bench_serving" not in text  # no throughput client in profile mode


def _fake_profile_servers(monkeypatch, tmp_path, server_class, point):
    """``run_profile`` on CPU: ``server_class`` for every server, a stand-in pair, ``point`` for every profile."""
    from types import SimpleNamespace

    from sglang_detspec.bench.serving_bench import profile_runner
    from sglang_detspec.models import midsize_models

    monkeypatch.setattr(profile_runner.server_process, "launch_skip_reason", lambda: None)
    monkeypatch.setattr(profile_runner.server_process, "Server", server_class)
    monkeypatch.setattr(profile_runner.server_process, "free_port", lambda start: start)
    monkeypatch.setattr(midsize_models, "ensure_midsize_pair",
                        lambda directory, shape: SimpleNamespace(target=tmp_path / "t", eagle_draft=tmp_path / "d"))
    monkeypatch.setattr(profile_runner, "_profile_point", lambda server, name, c, *rest: dict(point))


def test_a_profile_stopped_part_way_keeps_the_points_it_finished(tmp_path, monkeypatch):
    """``timeout -s INT`` during the second configuration: the first one's points are on disk, every server was
    stopped, and the exit code says the run was interrupted."""

    from sglang_detspec.bench.serving_bench import profile_runner

    stopped = []

    class FakeServer:
        def __init__(self, spec, port, log_path, pid_file=None):
            self.name = spec.name

        def start(self):
            pass

        def wait_ready(self, timeout):
            if self.name == "detspec":
                raise KeyboardInterrupt

        def stop(self):
            stopped.append(self.name)

    ok = op_profile.attribute({"traceEvents": [_kernel("matmul_kernel_persistent", 0, 2000)]}, steps=1)
    _fake_profile_servers(monkeypatch, tmp_path, FakeServer, ok)
    serving_bench, args = _bench_serve_args(["--profile-steps", "5", "--configs", "no_spec,detspec",
                                             "--concurrencies", "1,8"])
    settings = serving_bench.settings_from_args(args)
    rc = profile_runner.run_profile(settings, tmp_path, models_dir=tmp_path, shape=serving_bench.shape_from_args(args),
                                    steps=5)
    assert rc == 130
    assert stopped == ["no_spec", "detspec"]
    document = json.loads((tmp_path / "op_profile.json").read_text())
    assert set(document["points"]) == {"no_spec", "detspec"}
    assert set(document["points"]["no_spec"]) == {"1", "8"} and document["points"]["detspec"] == {}
    assert "| ms per step | no_spec |" in (tmp_path / "op_profile.md").read_text()


def _annotation(name, ts, dur):
    return {"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": 1}


def test_busy_time_is_the_union_of_kernel_intervals():
    assert op_profile.busy_us([(0, 10), (5, 12), (20, 25), (21, 22)]) == 17  # 0-12 and 20-25
    assert op_profile.busy_us([]) == 0


def test_host_phases_per_step_with_batch_sizes_dropped():
    trace = {"traceEvents": [
        _annotation("step[TARGET_VERIFY bs=1]", 0, 3000), _annotation("step[TARGET_VERIFY bs=8]", 10000, 5000),
        _annotation("draft", 4000, 1000), _annotation("## Call CompiledFxGraph abc123 ##", 4100, 200),
        _annotation("ProfilerStep#3", 0, 20000),
        _kernel("_fwd_kernel_stage1", 0, 1000), _kernel("_fwd_kernel_stage1", 500, 1000),
        _kernel("matmul_kernel_persistent", 10000, 2000),
    ]}
    phases = op_profile.host_phases(trace, steps=2)
    assert phases == {"step[TARGET_VERIFY]": 4.0, "draft": 0.5, "torch.compile graph call": 0.1}
    assert list(phases)[0] == "step[TARGET_VERIFY]"  # largest first
    got = op_profile.attribute(trace, steps=2)
    assert got["phases"] == phases
    assert got["gpu_busy_ms"] == pytest.approx((1500 + 2000) / 2000)  # the two overlapping kernels count once
    assert got["window_ms"] == pytest.approx(12000 / 2000)
    table = op_profile.format_phase_table({"detspec": got, "eagle_rs": {"error": "did not start"}})
    assert "| step[TARGET_VERIFY] | 4.000 |" in table and "eagle_rs" not in table
    assert "| GPU idle (window - busy) | 4.250 |" in table


def test_profile_graphs_needs_profile_steps_and_keeps_graphs_on(capsys):
    serving_bench, args = _bench_serve_args(["--profile-graphs"])
    with pytest.raises(ValueError, match="give --profile-steps N too"):
        serving_bench.settings_from_args(args)
    serving_bench, args = _bench_serve_args(["--profile-steps", "5", "--profile-graphs", "--configs", "detspec",
                                             "--dry-run"])
    assert serving_bench.run(args) == 0
    text = capsys.readouterr().out
    server = [line for line in text.splitlines() if line.startswith("server ")][0]
    assert "--cuda-graph-backend-decode disabled" not in server and "CUDA graphs on" in text


def test_a_graphs_on_profile_starts_servers_with_graphs_and_says_so(tmp_path, monkeypatch):

    from sglang_detspec.bench.serving_bench import profile_runner

    started = []

    class FakeServer:
        def __init__(self, spec, port, log_path, pid_file=None):
            started.append(list(spec.args))

        def start(self):
            pass

        def wait_ready(self, timeout):
            pass

        def stop(self):
            pass

    ok = op_profile.attribute({"traceEvents": [_kernel("matmul_kernel_persistent", 0, 2000),
                                               _annotation("draft", 0, 3000)]}, steps=1)
    _fake_profile_servers(monkeypatch, tmp_path, FakeServer, ok)
    serving_bench, args = _bench_serve_args(["--profile-steps", "5", "--configs", "detspec", "--concurrencies", "1",
                                             "--profile-graphs"])
    rc = profile_runner.run_profile(serving_bench.settings_from_args(args), tmp_path, models_dir=tmp_path,
                                    shape=serving_bench.shape_from_args(args), steps=5, graphs=args.profile_graphs)
    assert rc == 0 and len(started) == 1 and "disabled" not in started[0]
    report = (tmp_path / "op_profile.md").read_text()
    assert "CUDA graphs on" in report and "| draft | 3.000 |" in report
    assert json.loads((tmp_path / "op_profile.json").read_text())["graphs"] == "on"


# ---------------------------------------------------------------------------------------------------------------
# The profile starts at a fixed context: streamed requests counted until each has generated the tokens asked for


class _StreamingGenerate:
    """A local HTTP server whose ``/generate`` streams ``chunks`` server-sent events, each ``meta_info`` counting one
    more token, ``pause`` seconds apart (then ``[DONE]``); records the bodies it got and the ``/abort_request``s."""

    def __init__(self, chunks: int, pause: float):
        import http.server
        import threading

        outer = self
        self.bodies, self.aborts = [], []

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/abort_request":
                    outer.aborts.append(body)
                    self.send_response(200)
                    self.end_headers()
                    return
                outer.bodies.append(body)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for n in range(1, chunks + 1):
                    chunk = {"text": "x" * n, "meta_info": {"completion_tokens": n, "prompt_tokens": 3}}
                    self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                    self.wfile.flush()
                    time.sleep(pause)
                self.wfile.write(b"data: [DONE]\n\n")

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _traffic(url, c):
    from sglang_detspec.bench.serving_bench import configs as cfgs
    from sglang_detspec.bench.serving_bench.profile_runner import _Traffic

    return _Traffic(url, c, cfgs.BenchSettings(input_len=3, output_len=40), vocab=100, seed=0)


def test_the_profile_waits_until_every_request_has_generated_the_tokens():
    with _StreamingGenerate(chunks=40, pause=0.02) as server:
        traffic = _traffic(server.url, 3)
        counts = traffic.wait_generated(20, timeout=30)
        assert min(counts) >= 20 and max(counts) < 40, counts  # armed while every request still decodes
        traffic.join(30)
        assert traffic.generated == [40, 40, 40] and not traffic.errors
        assert all(body["stream"] is True and len(body["input_ids"]) == 3 for body in server.bodies)


def test_a_request_that_ends_before_the_context_is_an_error_naming_both_counts():
    with _StreamingGenerate(chunks=5, pause=0.0) as server:
        traffic = _traffic(server.url, 2)
        with pytest.raises(RuntimeError, match=r"request \d ended after 5 tokens, before every request had the 20"):
            traffic.wait_generated(20, timeout=30)


def test_the_wait_gives_up_after_its_timeout():
    with _StreamingGenerate(chunks=40, pause=0.2) as server:
        traffic = _traffic(server.url, 1)
        with pytest.raises(RuntimeError, match="not the 30 the profile waits for"):
            traffic.wait_generated(30, timeout=0.5)


def test_a_point_whose_requests_end_too_soon_aborts_them_and_fails(tmp_path):
    from types import SimpleNamespace

    from sglang_detspec.bench.serving_bench import configs as cfgs
    from sglang_detspec.bench.serving_bench import profile_runner

    with _StreamingGenerate(chunks=5, pause=0.0) as server:
        settings = cfgs.BenchSettings(input_len=3, output_len=40)
        with pytest.raises(RuntimeError, match="before every request had the 20"):
            profile_runner._profile_point(SimpleNamespace(base_url=server.url), "x", 2, 1, settings, 100, tmp_path,
                                          None, after_tokens=20)
        assert server.aborts == [{"abort_all": True}], "the requests are not left running into the next point"
