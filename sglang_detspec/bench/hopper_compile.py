"""Compile one Triton kernel for an H100 / H200 (sm_90a) on any machine and read ptxas' report: no GPU needed.

Triton compiles for a CUDA target without a driver, and its wheel ships ``ptxas`` and ``cuobjdump``. Used by
``scripts/compile_kernels.py`` (every launch builds) and ``scripts/sass_counts.py`` (registers and SASS counts of the
coupled race). The kernels must be compiled functions: under ``TRITON_INTERPRET=1`` they are interpreted ones, so
callers check :func:`interpreted_refusal` first.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import NamedTuple, Optional

ARCH = (90, "sm_90a")  # the H100's and the H200's

__all__ = ["ARCH", "CompiledKernel", "compile_for_hopper", "cuda_tool", "interpreted_refusal"]


class CompiledKernel(NamedTuple):
    ptx: str
    cubin: Path
    registers: Optional[int]
    spill_store_bytes: int


def interpreted_refusal(script: str) -> Optional[str]:
    """The message a script prints (exit 2) when ``TRITON_INTERPRET=1`` would make its kernels uncompilable."""
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return (f"{script}: TRITON_INTERPRET=1 makes every kernel an interpreted function, which cannot be "
                "compiled; run it with TRITON_INTERPRET unset")
    return None


def cuda_tool(name: str) -> str:
    """The path of a CUDA tool (``ptxas``, ``cuobjdump``) shipped in Triton's wheel; SystemExit naming the fix if
    this wheel has none."""
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if not path.exists():
        raise SystemExit(f"{path} is missing; this Triton wheel ships no CUDA tools (install the triton that "
                         "torch's CUDA wheel pins, e.g. pip install torch --index-url "
                         "https://download.pytorch.org/whl/cu130)")
    return str(path)


def compile_for_hopper(fn, signature: dict, constexprs: dict, num_warps: int, workdir: Path,
                       label: str) -> CompiledKernel:
    """Compile the jit function ``fn`` with ``signature`` (argument -> Triton type, e.g. ``*fp32``, ``i32``) and
    ``constexprs`` for sm_90a, then assemble its PTX with ptxas -v into ``workdir/<label>.cubin``."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = dict(signature, **dict.fromkeys(constexprs, "constexpr"))
    src = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
    kernel = triton.compile(src, target=GPUTarget("cuda", ARCH[0], 32), options={"num_warps": num_warps})
    stem = Path(workdir) / re.sub(r"[^A-Za-z0-9_.-]", "_", label)
    ptx = kernel.asm["ptx"]
    stem.with_suffix(".ptx").write_text(ptx)
    cubin = stem.with_suffix(".cubin")
    report = subprocess.run([cuda_tool("ptxas"), f"-arch={ARCH[1]}", "-v", str(stem.with_suffix(".ptx")), "-o",
                             str(cubin)], capture_output=True, text=True, check=True).stderr
    registers = re.search(r"Used (\d+) registers", report)
    spills = re.search(r"(\d+) bytes spill stores", report)
    return CompiledKernel(ptx, cubin, int(registers.group(1)) if registers else None,
                          int(spills.group(1)) if spills else 0)
