"""scripts/sass_counts.py: the coupled race's stage 1 compiled for sm_90a on this (GPU-less) machine.

What the Triton interpreter cannot show: that ``fast_screen`` reaches the compiled kernel (``lg2.approx`` in the PTX
instead of libdevice's ``logf`` polynomial, whose FFMAs go away), and that stage 1 keeps the register budget
``LAUNCH_TABLE``'s comment gives as its reason (45 - 57 registers across Triton 3.6 - 3.8, no spills; the per-chunk
kernel it replaced used 141).  Static facts of the compiled code, not times.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "sass_counts.py"


def _run(tmp_path, **env_changes):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # the checkout's package, whichever one this Python has installed (scripts import the installed package)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env.update(env_changes)
    out = tmp_path / "sass.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--json", str(out)], capture_output=True, text=True,
                          timeout=600, cwd=REPO, env=env)
    return proc, out


def test_fast_screen_compiles_to_lg2_approx_within_the_register_budget(tmp_path):
    proc, out = _run(tmp_path)
    if proc.returncode != 0 and "ships no CUDA tools" in proc.stderr:
        pytest.skip(proc.stderr.strip())
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    from sglang_detspec.kernels.coupled_race_probs import LAUNCH_TABLE

    assert {(r["block"], r["warps"], r["screen"]) for r in rows} == {
        (block, warps, screen) for _, (block, warps) in LAUNCH_TABLE for screen in ("lg2.approx", "logf")}
    by = {(r["block"], r["warps"], r["screen"]): r for r in rows}
    for _, (block, warps) in LAUNCH_TABLE:
        fast, precise = by[(block, warps, "lg2.approx")], by[(block, warps, "logf")]
        assert fast["ptx_lg2_approx"] > 0 and precise["ptx_lg2_approx"] == 0
        assert fast["ffma"] < precise["ffma"], (fast, precise)  # libdevice's logf polynomial is gone
        # 8 registers per column a thread holds: 64 at 8 columns, 128 at 16 (four resident programs of four warps
        # per SM, LAUNCH_TABLE's comment); no spills at either
        budget = 8 * (block // (32 * warps))
        for r in (fast, precise):
            assert r["spill_store_bytes"] == 0 and r["registers"] <= budget, (budget, r)


def test_refuses_the_interpreter_with_the_fix(tmp_path):
    proc, _ = _run(tmp_path, TRITON_INTERPRET="1")
    assert proc.returncode == 2 and "run it with TRITON_INTERPRET unset" in proc.stderr, proc.stderr
