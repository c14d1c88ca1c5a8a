"""scripts/compile_kernels.py: every launch of the draft samplers, the GEMM and the verify attention compiled for
sm_90a on this GPU-less machine.

The interpreter runs a kernel's Python, not Triton's compiler, so a kernel can pass every interpreter test and still
fail to build on the GPU. The control is such a kernel: a ``tl.dot`` of 8 x 8 tiles runs under the interpreter but
the compiler refuses it (tile dimensions below 16), and the script's compile step must say so.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "compile_kernels.py"


def _env(**changes):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env.update(changes)
    return env


def test_every_launch_compiles_for_hopper(tmp_path):
    out = tmp_path / "compile.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--json", str(out)], capture_output=True, text=True,
                          timeout=1200, cwd=REPO, env=_env())
    if proc.returncode != 0 and "ships no CUDA tools" in proc.stderr:
        pytest.skip(proc.stderr.strip())
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["failed"] == []
    names = [r["kernel"] for r in result["rows"]]
    assert any(n.startswith("seeded_draft_sample stage1") for n in names)
    assert any(n.startswith("seeded_hot_draft_sample stage2") for n in names)
    assert sum(n.startswith("coupled_hot_race_probs stage1") for n in names) >= 4  # both clamps x both screens
    assert any(n.startswith("coupled_hot_race_probs stage2") for n in names)
    assert sum(n.startswith("batch_invariant_gemm") for n in names) >= 4 * 6  # masked/unmasked x bias, every tile
    assert sum(n.startswith("split_kv_verify_attention tile") for n in names) >= 8  # every row block, cap or not
    assert any(n.startswith("split_kv_verify_attention merge") for n in names)
    assert all(r["registers"] for r in result["rows"])


_CONTROL = textwrap.dedent("""
    import importlib.util, sys
    from pathlib import Path
    import triton
    import triton.language as tl

    spec = importlib.util.spec_from_file_location("compile_kernels", sys.argv[1])
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)

    @triton.jit
    def square(a_ptr, c_ptr, B: tl.constexpr):
        offs = tl.arange(0, B)
        a = tl.load(a_ptr + offs[:, None] * B + offs[None, :])
        tl.store(c_ptr + offs[:, None] * B + offs[None, :], tl.dot(a, a))

    for block in (16, 8):
        try:
            script._compile(square, {"a_ptr": "*fp16", "c_ptr": "*fp32"}, {"B": block}, 4, Path(sys.argv[2]),
                            f"square{block}")
            print(f"B={block}: compiled")
        except Exception as e:
            print(f"B={block}: refused {type(e).__name__}")
""")


def test_control_a_kernel_the_interpreter_runs_but_the_compiler_refuses_is_caught(tmp_path):
    control = tmp_path / "control.py"
    control.write_text(_CONTROL)
    proc = subprocess.run([sys.executable, str(control), str(SCRIPT), str(tmp_path)], capture_output=True, text=True,
                          timeout=600, cwd=tmp_path, env=_env())
    if "ships no CUDA tools" in proc.stderr:
        pytest.skip(proc.stderr.strip())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "B=16: compiled" in proc.stdout and "B=8: refused" in proc.stdout, proc.stdout + proc.stderr[-2000:]


def test_refuses_the_interpreter_with_the_fix():
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300, cwd=REPO,
                          env=_env(TRITON_INTERPRET="1"))
    assert proc.returncode == 2 and "run it with TRITON_INTERPRET unset" in proc.stderr, proc.stderr
