"""The GPU runners' plumbing, on CPU: ``scripts/run_gpu_checks.sh`` hands each part the arguments it was given (run
with a stand-in ``$PYTHON`` that records its command lines), and ``scripts/gpu_stage.sh`` stops with the fix when
the SGLang bundle is missing. What the parts themselves do needs the GPU (the scripts they call)."""

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

# A stand-in interpreter: records every command line (one per line) and exits 0. The runner's own pre-check (a
# heredoc on stdin) is recorded as "-".
_STAND_IN = """#!/bin/sh
printf '%s\\n' "$*" >> "{log}"
cat > /dev/null
exit 0
"""


def _run_checks(tmp_path, *args):
    log = tmp_path / "calls.log"
    python = tmp_path / "python"
    python.write_text(_STAND_IN.format(log=log))
    python.chmod(0o755)
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "run_gpu_checks.sh"), str(tmp_path / "out"), *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHON": str(python)}, stdin=subprocess.DEVNULL)
    return proc, log.read_text().splitlines() if log.exists() else []


def test_each_part_gets_its_own_arguments(tmp_path):
    proc, calls = _run_checks(
        tmp_path, "--only", "kernel,bench,e2e", "--kernel-args", "--only coupled",
        "--bench-args", "--coupled-launches 1024x4,2048x8", "--e2e-tests",
        "tests/e2e/test_e2e_invariant.py tests/e2e/test_e2e_invariant_pressure.py", "--pytest-args", "-k check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = str(tmp_path / "out")
    assert calls[0] == "-"  # the pre-check
    assert calls[1:] == [
        f"scripts/gpu_kernel_checks.py --out {out} --only coupled",
        f"scripts/bench/bench_sampler.py --out {out}",
        f"scripts/bench/bench_verify_schemes.py --out {out} --coupled-launches 1024x4,2048x8",
        "-m pytest tests/e2e/test_e2e_invariant.py tests/e2e/test_e2e_invariant_pressure.py -v -s -rs "
        "-p no:cacheprovider -k check",
    ]
    assert "kernel: exit 0" in proc.stdout and "e2e: exit 0" in proc.stdout


def test_defaults_run_every_e2e_test_and_pass_nothing_extra(tmp_path):
    proc, calls = _run_checks(tmp_path, "--only", "kernel,e2e", "--quick")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert calls[1:] == [f"scripts/gpu_kernel_checks.py --out {tmp_path / 'out'} --quick",
                         "-m pytest tests/e2e -v -s -rs -p no:cacheprovider"]


def test_an_unknown_part_or_argument_is_refused(tmp_path):
    proc, calls = _run_checks(tmp_path, "--only", "kernels")
    assert proc.returncode == 2 and "unknown part 'kernels'" in proc.stderr and calls == []
    proc, calls = _run_checks(tmp_path, "--e2e")
    assert proc.returncode == 2 and "unknown argument: --e2e" in proc.stderr and calls == []


def test_gpu_stage_without_the_bundle_says_how_to_build_it(tmp_path):
    if Path("/tmp/site/sglang").exists():  # a machine with a staged SGLang skips the bundle check by design
        pytest.skip("/tmp/site/sglang exists here: gpu_stage.sh would use it instead of the bundle")
    work = tmp_path / "checkout"
    work.mkdir()
    shutil.copy(ROOT / "scripts" / "gpu_stage.sh", work / "gpu_stage.sh")
    proc = subprocess.run(["bash", "-c", f"source {shlex.quote(str(work / 'gpu_stage.sh'))}; echo rc=$?"],
                          capture_output=True, text=True, timeout=60, cwd=work)
    assert proc.stdout.strip() == "rc=3", proc.stdout + proc.stderr
    assert "../shared/gpu/build_bundle.sh .gpu-bundle" in proc.stderr and "carry .gpu-bundle" in proc.stderr
