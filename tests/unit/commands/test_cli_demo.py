"""``sglang-detspec demo`` (live invariant checks on the reference sampler) and the command's general surface:
``--help`` everywhere, a light import, ``bench`` delegation."""

import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from sglang_detspec import cli, demo
from sglang_detspec.stream.reference import seeded_draft_sample


def run(*args, exe=None, timeout=180):
    cmd = [exe] if exe else [sys.executable, "-m", "sglang_detspec"]
    proc = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+) \|((?:\s+\d+)+) \|\s+(\d+)")


def test_demo_passes_and_table_is_consistent():
    proc = run("demo", "--kernel", "off")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    rows = [ROW.match(line) for line in out.splitlines()]
    rows = [r for r in rows if r]
    assert len(rows) == 8
    changed = 0
    for r in rows:
        layouts = r.group(4).split()
        assert len(layouts) == 5 and len(set(layouts)) == 1, r.group(0)
        changed += r.group(5) != layouts[0]
    assert changed >= 1
    assert out.count("[ok]") == 3 and "[FAIL]" not in out
    assert "PASS" in out
    assert len(out.splitlines()) <= 25  # compact: one screen


def test_demo_table_is_the_reference_draws():
    """Each printed row is that request's reference draw, recomputed here one request at a time."""
    res = demo.run_demo()
    rows = [r for r in (ROW.match(line) for line in res.text.splitlines()) if r]
    assert len(rows) == len(res.seeds) == 8
    for i, r in enumerate(rows):
        seed, pos = int(r.group(2)), int(r.group(3))
        assert (seed, pos) == (res.seeds[i], res.positions[i])
        p = res.probs[i : i + 1]
        _, idx = seeded_draft_sample(p, torch.tensor([seed]), torch.tensor([pos]), 0)
        assert [int(x) for x in r.group(4).split()] == [idx.item()] * 5
        _, idx1 = seeded_draft_sample(p, torch.tensor([seed + 1]), torch.tensor([pos]), 0)
        assert int(r.group(5)) == idx1.item()


def test_demo_with_the_fused_kernel():
    # On CPU the kernel runs under Triton's interpreter; the CLI sets TRITON_INTERPRET itself.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "sglang_detspec", "demo", "--kernel", "on"], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [r for r in (ROW.match(line) for line in proc.stdout.splitlines()) if r]
    assert len(rows) == 8
    for r in rows:
        layouts = r.group(4).split()
        assert len(layouts) == 6 and len(set(layouts)) == 1, r.group(0)
    assert "fused kernel" in proc.stdout


def test_demo_detects_a_kernel_that_disagrees(monkeypatch):
    def off_by_one(p, s, pos, step):
        pk, ik = seeded_draft_sample(p, s, pos, step)
        return pk, (ik + 1) % p.shape[1]

    monkeypatch.setattr(demo, "_load_kernel", lambda: (off_by_one, "test"))
    res = demo.run_demo(kernel=True)
    assert not res.passed
    assert "[FAIL] batch-invariant: 0/8" in res.text


def _batch_dependent(probs, seeds, positions, step):
    # A sampler whose key leaks the batch size: what the demo exists to rule out.
    return seeded_draft_sample(probs, seeds, positions + probs.shape[0], step)


def _seed_blind(probs, seeds, positions, step):
    idx = probs.argmax(dim=-1, keepdim=True)
    return probs.gather(1, idx), idx


def _biased(probs, seeds, positions, step):
    sq = probs * probs
    return seeded_draft_sample((sq / sq.sum(-1, keepdim=True)).float(), seeds, positions, step)


@pytest.mark.parametrize(
    "sampler, failing",
    [(_batch_dependent, ["batch-invariant"]), (_seed_blind, ["seed-dependent", "a true sampler"]),
     (_biased, ["a true sampler"])],
)
def test_demo_detects_broken_samplers(sampler, failing):
    res = demo.run_demo(sampler)
    assert not res.passed
    for line in res.text.splitlines():
        for name in ("batch-invariant", "seed-dependent", "a true sampler"):
            if name in line and line.startswith("["):
                assert line.startswith("[FAIL]") == (name in failing), line
    assert "FAIL: an invariant does not hold" in res.text


@pytest.mark.parametrize("args, message", [
    (["--batch", "1"], "argument --batch: must be in 2..32, got 1"),
    (["--batch", "0"], "argument --batch: must be in 2..32, got 0"),
    (["--batch", "33"], "argument --batch: must be in 2..32, got 33"),
    (["--batch", "x"], "argument --batch: expected an integer, got 'x'"),
    (["--vocab", "-5"], "argument --vocab: must be >= 8, got -5"),
    (["--vocab", "7"], "argument --vocab: must be >= 8, got 7"),
])
def test_demo_bad_arguments_name_the_argument_and_its_range(args, message):
    proc = run("demo", *args)
    assert proc.returncode == 2
    assert proc.stderr.startswith("usage: sglang-detspec demo"), proc.stderr
    assert f"sglang-detspec demo: error: {message}" in proc.stderr


def test_demo_accepts_the_edges_of_its_ranges():
    res = demo.run_demo(batch=2, vocab=8)
    assert res.passed and len(res.seeds) == 2


def test_demo_help_documents_the_ranges():
    out = run("demo", "--help").stdout
    assert "2..32" in out and ">= 8" in out


def test_bench_help_lists_the_benchmarks_own_options():
    proc = run("bench", "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: sglang-detspec bench")
    # The benchmark's real options (its parser lives in sglang_detspec.bench.sampler_bench.main), not only -h.
    for option in ("--out", "--quick", "--calls-per-graph", "--replays", "--vocab", "--batch"):
        assert option in proc.stdout, option
    assert "usage: bench_sampler" not in proc.stdout and "examples:" in proc.stdout


@pytest.mark.parametrize("command", ["serve", "check", "bench", "demo"])
def test_help_for_every_command(command):
    proc = run(command, "--help")
    assert proc.returncode == 0
    assert f"usage: sglang-detspec {command}" in proc.stdout
    assert "examples:" in proc.stdout


def test_main_help_and_no_command():
    proc = run("--help")
    assert proc.returncode == 0 and "examples:" in proc.stdout
    # Every code a command returns, check's 3 included.
    for code in ("0 all good", "1 a checked property does not hold", "2 the command could not run", "3 inconclusive"):
        assert code in proc.stdout, code
    for c in ("serve", "check", "bench", "demo"):
        assert c in proc.stdout
    proc = run()
    assert proc.returncode == 2 and "usage: sglang-detspec" in proc.stdout


def test_console_script_is_installed():
    exe = Path(sys.executable).parent / "sglang-detspec"
    if not exe.exists():
        pytest.skip("the sglang-detspec console script is not installed in this environment (pip install -e .)")
    proc = run("--version", exe=str(exe))
    assert proc.returncode == 0 and proc.stdout.startswith("sglang-detspec ")


def test_import_is_light():
    code = (
        "import sys, sglang_detspec.cli; "
        "print(sorted(m for m in ('torch', 'requests', 'sglang', 'tqdm', 'urllib3', 'matplotlib') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_bench_passes_arguments_and_exit_code(monkeypatch):
    # The real benchmark needs a GPU; a stand-in module records what the CLI hands it.
    calls = []
    fake = types.ModuleType("sglang_detspec.bench.sampler_bench")
    fake.main = lambda argv, prog: calls.append((argv, prog)) or 3
    monkeypatch.setitem(sys.modules, "sglang_detspec.bench.sampler_bench", fake)
    import sglang_detspec.bench

    monkeypatch.setattr(sglang_detspec.bench, "sampler_bench", fake, raising=False)
    assert cli.main(["bench", "--batch-sizes", "1,8", "--", "--out", "x.csv"]) == 3
    assert calls == [(["--batch-sizes", "1,8", "--out", "x.csv"], "sglang-detspec bench")]


def test_bench_missing_module_is_one_clear_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "sglang_detspec.bench.sampler_bench", None)
    import sglang_detspec.bench

    monkeypatch.delattr(sglang_detspec.bench, "sampler_bench", raising=False)
    assert cli.main(["bench"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "benchmark" in err[0] and "not part of this installation" in err[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the benchmark's refusal on a machine without a GPU")
def test_bench_runs_the_real_benchmark_module():
    pytest.importorskip("sglang_detspec.bench.sampler_bench", reason="the sampler benchmark is not in this checkout yet")
    proc = run("bench", "--quick", "--out", "unused-dir")
    # The real benchmark gets the arguments and answers for itself: no GPU here, so its own one-line refusal.
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("sglang-detspec bench: error: no CUDA GPU"), proc.stderr


def test_bench_usage_errors_name_the_command_the_user_typed():
    pytest.importorskip("sglang_detspec.bench.sampler_bench", reason="the sampler benchmark is not in this checkout yet")
    proc = run("bench", "--batch", "x")
    assert proc.returncode == 2
    assert "usage: sglang-detspec bench" in proc.stderr and "bench_sampler" not in proc.stderr, proc.stderr
    assert "sglang-detspec bench: error: argument --batch: invalid int value: 'x'" in proc.stderr
