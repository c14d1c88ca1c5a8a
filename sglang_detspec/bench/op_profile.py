"""Where a decode step's GPU time goes: attribute the kernels of a PyTorch profiler trace to op categories and the
GEMMs to the weight shapes they multiply.

Input: the Chrome trace (``*.trace.json`` or ``.json.gz``) that SGLang's ``/start_profile`` writes with
``activities = ["CPU", "GPU"]`` and ``record_shapes = true`` (CUDA graphs off, so every kernel is launched by an op the
trace records).  Each ``kernel`` event is put in the first category of :data:`KERNEL_CATEGORIES` whose pattern matches
its name (``memcpy`` / ``memset`` events are ``copy``).  A GEMM kernel is tied to the ``cpu_op`` that launched it by
the profiler's ``External id``; that op's ``Input Dims`` give ``M``, ``K`` and ``N`` (``aten::mm``, ``addmm``,
``linear``, ``matmul``, ``bmm``), and ``(K, N)`` names the weight (``shape_names``, e.g. the pair's qkv / o / gate_up
/ down / lm_head).  A GEMM whose op carries no shape is counted under ``unattributed``.

With CUDA graphs on the trace still names every kernel (so the categories hold) but no op launches them, so the GEMM
shape table is empty there.

Everything is per step: the summed kernel time over the profiled steps divided by their number (kernels of one step
may overlap only across streams; SGLang decodes on one).  ``window_ms`` is the span from the first kernel's start to
the last kernel's end over the steps: with graphs off it includes the CPU's launch gaps, so it is an upper bound of a
step, not the graph-replay step time.

Where the host spends a step: SGLang marks its phases with ``record_function`` annotations (``draft``,
``step[TARGET_VERIFY bs=N]``, ``draft_extend``, ``scheduler.process_batch_result``, ...).  :func:`host_phases` gives
each phase's CPU milliseconds per step (batch sizes dropped from the names), and :func:`attribute` the GPU's busy
time per step (the union of kernel intervals) beside ``window_ms``; with CUDA graphs on, ``window - busy`` is the time
the GPU waited for the host.

Standard library only, so the attribution is tested on CPU with hand-built traces.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

__all__ = ["KERNEL_CATEGORIES", "CATEGORY_ORDER", "GEMM_OPS", "categorize", "read_trace", "gemm_shape",
           "attribute", "host_phases", "busy_us", "format_category_table", "format_gemm_table", "format_phase_table"]

#: ``(category, pattern)`` in the order they are tried on a kernel's lower-cased name; the first match wins.  GEMM
#: first (cuBLAS ``nvjet`` / ``sm90_xmma`` / CUTLASS names, SGLang's ``matmul_kernel_persistent`` and
#: ``bmm_kernel_persistent``, the plugin's ``_batch_invariant_matmul_kernel``); norm, activation and rotary before
#: attention (FlashInfer names all its kernels ``flashinfer::...``; SGLang's deterministic ``mean_kernel`` is the
#: native RMSNorm's mean); sampling covers SGLang's and the plugin's samplers, log-softmax and the verify kernels;
#: PyTorch's elementwise templates last (their names also carry the functor, e.g. ``silu_kernel``).
KERNEL_CATEGORIES: Tuple[Tuple[str, str], ...] = (
    ("gemm", r"gemm|matmul|nvjet|xmma|cutlass|cublas|splitk|bmm_kernel|wgmma"),
    ("norm", r"rms|norm|mean_kernel"),
    ("activation", r"silu|gelu|act_and_mul|swiglu"),
    ("rotary", r"rotary|rope|pos_encoding"),
    ("attention", r"batchdecode|batchprefill|attention|attn|_fwd_kernel|_fwd_grouped_kernel|flash_fwd"
                  r"|decode_kernel|extend_kernel|merge_state"),
    ("sampling", r"sampl|softmax|topk|top_k|top_p|min_p|argmax|race|seeded|verify|tree|multinomial|exponential"
                 r"|hash|renorm|uniform|accept|residual|truncat|penalt"),
    ("kv_cache", r"kv_buffer|store_kv|set_kv|kv_indices|req_to_token|assign_req|assign_draft|cache_loc"),
    ("embedding", r"embedding|embed"),
    ("elementwise", r"elementwise|reduce_kernel|index|gather|scatter|cat_|catarray|copy|fill|where|compare|arange"),
)
#: Every category the tables show, in this order; ``copy`` is CUDA memcpy / memset, ``other`` is the rest.
CATEGORY_ORDER: Tuple[str, ...] = tuple(c for c, _ in KERNEL_CATEGORIES) + ("copy", "other")
_COMPILED = tuple((c, re.compile(p)) for c, p in KERNEL_CATEGORIES)
#: The ``cpu_op`` names whose ``Input Dims`` give a GEMM's shape.
GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::linear", "aten::matmul", "aten::bmm", "aten::baddbmm"})
_COPY_CATEGORIES = frozenset({"gpu_memcpy", "gpu_memset"})


def categorize(kernel_name: str) -> str:
    """The category of a kernel by its name (:data:`KERNEL_CATEGORIES`), ``other`` if no pattern matches."""
    low = kernel_name.lower()
    for category, pattern in _COMPILED:
        if pattern.search(low):
            return category
    return "other"


def read_trace(path: Path) -> dict:
    """A Chrome trace file (``.json`` or ``.json.gz``) as a dict with ``traceEvents``."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    if isinstance(trace, list):
        trace = {"traceEvents": trace}
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError(f"{path} is not a Chrome trace (no traceEvents list)")
    return trace


def _dims(value) -> Optional[List[int]]:
    return list(value) if isinstance(value, list) and all(isinstance(x, int) for x in value) else None


def gemm_shape(op_name: str, input_dims: Sequence) -> Optional[Tuple[int, int, int]]:
    """``(M, K, N)`` of a GEMM op from its ``Input Dims`` (M: every row of the activation, leading dimensions
    flattened; a ``bmm`` counts its batch into M), or None when the dims do not describe a 2-operand product."""
    dims = [_dims(d) for d in input_dims or ()]
    if op_name in ("aten::mm", "aten::matmul") and len(dims) >= 2:
        a, b = dims[0], dims[1]
    elif op_name == "aten::addmm" and len(dims) >= 3:
        a, b = dims[1], dims[2]
    elif op_name == "aten::linear" and len(dims) >= 2 and dims[1] is not None and len(dims[1]) == 2:
        a, b = dims[0], [dims[1][1], dims[1][0]]  # weight [N, K]
    elif op_name in ("aten::bmm", "aten::baddbmm") and len(dims) >= 2:
        a, b = (dims[1], dims[2]) if op_name == "aten::baddbmm" and len(dims) >= 3 else (dims[0], dims[1])
        if a is None or b is None or len(a) != 3 or len(b) != 3:
            return None
        return a[0] * a[1], a[2], b[2]
    else:
        return None
    if a is None or b is None or len(a) < 1 or len(b) != 2 or a[-1] != b[0]:
        return None
    rows = 1
    for d in a[:-1]:
        rows *= d
    return rows, a[-1], b[1]


def _shape_label(k: int, n: int, shape_names: Mapping[Tuple[int, int], str]) -> str:
    return shape_names.get((k, n), f"{k}x{n}")


def attribute(trace: Mapping, steps: int, shape_names: Optional[Mapping[Tuple[int, int], str]] = None,
              top: int = 15) -> dict:
    """Per-step milliseconds by category, by GEMM weight shape and by kernel name for a trace of ``steps`` steps.

    Returns ``{"steps", "kernel_ms", "window_ms", "gpu_busy_ms", "kernels_per_step", "phases": {phase: ms} (see
    :func:`host_phases`), "categories": {category: ms}, "gemm_shapes":
    {label: {"ms", "calls", "m": [distinct M]}}, "top_kernels": [{"name", "category", "ms", "calls"}]}``, every
    ``ms`` and ``calls`` per step.  Raises ValueError when the trace holds no kernel (profiled on the CPU only?)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    shape_names = dict(shape_names or {})
    events = trace.get("traceEvents", [])
    ops_by_id: Dict[int, Tuple[str, Sequence]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op" and e.get("name") in GEMM_OPS:
            ext = (e.get("args") or {}).get("External id")
            if ext is not None:
                ops_by_id[ext] = (e["name"], (e.get("args") or {}).get("Input Dims"))
    categories: Dict[str, float] = defaultdict(float)
    shapes: Dict[str, Dict] = {}
    by_name: Dict[str, List[float]] = {}
    first, last, kernels, intervals = None, None, 0, []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in ("kernel", *_COPY_CATEGORIES):
            continue
        dur, ts = float(e.get("dur", 0.0)), float(e.get("ts", 0.0))
        intervals.append((ts, ts + dur))
        first = ts if first is None else min(first, ts)
        last = ts + dur if last is None else max(last, ts + dur)
        kernels += 1
        name = e.get("name", "?")
        category = "copy" if e["cat"] in _COPY_CATEGORIES else categorize(name)
        categories[category] += dur
        entry = by_name.setdefault(name, [0.0, 0])
        entry[0] += dur
        entry[1] += 1
        if category != "gemm":
            continue
        op = ops_by_id.get((e.get("args") or {}).get("External id"))
        shape = gemm_shape(*op) if op is not None else None
        label = "unattributed" if shape is None else _shape_label(shape[1], shape[2], shape_names)
        row = shapes.setdefault(label, {"ms": 0.0, "calls": 0, "m": set()})
        row["ms"] += dur
        row["calls"] += 1
        if shape is not None:
            row["m"].add(shape[0])
    if kernels == 0:
        raise ValueError("the trace holds no GPU kernel: was it recorded with the GPU activity on a CUDA device?")
    per = 1000.0 * steps  # microseconds over all steps -> milliseconds per step
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "steps": steps,
        "kernel_ms": sum(categories.values()) / per,
        "window_ms": (last - first) / per,
        "gpu_busy_ms": busy_us(intervals) / per,
        "kernels_per_step": kernels / steps,
        "phases": host_phases(trace, steps),
        "categories": {c: categories.get(c, 0.0) / per for c in CATEGORY_ORDER},
        "gemm_shapes": {label: {"ms": row["ms"] / per, "calls": row["calls"] / steps, "m": sorted(row["m"])}
                        for label, row in sorted(shapes.items(), key=lambda kv: -kv[1]["ms"])},
        "top_kernels": [{"name": n, "category": categorize(n), "ms": v[0] / per, "calls": v[1] / steps}
                        for n, v in ranked],
    }


def busy_us(intervals: Iterable[Tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals: the time at least one of them runs."""
    total, end = 0.0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


_BATCH_SIZE = re.compile(r" bs=\d+")
_COMPILED_GRAPH = re.compile(r"^## Call CompiledFxGraph .*##$")


def phase_name(annotation: str) -> str:
    """An annotation's phase: the batch size dropped (``step[TARGET_VERIFY bs=8]`` -> ``step[TARGET_VERIFY]``), every
    torch.compile graph call one name."""
    if _COMPILED_GRAPH.match(annotation):
        return "torch.compile graph call"
    return _BATCH_SIZE.sub("", annotation)


def host_phases(trace: Mapping, steps: int) -> Dict[str, float]:
    """CPU milliseconds per step of each annotated phase (``user_annotation`` events on the host), largest first.

    Nested phases are each counted in full (``draft`` holds its ``step[DECODE]`` calls), so the values do not add
    up to a step; profiler-internal annotations (``ProfilerStep``) are left out."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    totals: Dict[str, float] = defaultdict(float)
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "X" and e.get("cat") == "user_annotation" and not str(e.get("name", "")).startswith(
                "ProfilerStep"):
            totals[phase_name(str(e.get("name", "?")))] += float(e.get("dur", 0.0))
    return {name: us / (1000.0 * steps) for name, us in sorted(totals.items(), key=lambda kv: -kv[1])}


def format_phase_table(profiles: Mapping[str, Mapping], title: str = "", top: int = 12) -> str:
    """A markdown table: the host's ms per step in each annotated phase, per configuration (the ``top`` phases of
    the first configuration, then any other's), and the GPU's busy and idle time per step."""
    cols = _columns(profiles)
    if not cols:
        return f"{title}\n(no profile)" if title else "(no profile)"
    names: List[str] = []
    for c in cols:
        names += [n for n in list(profiles[c].get("phases", {}))[:top] if n not in names]
    lines = [title] if title else []
    lines += ["| host ms per step | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for n in names:
        cells = [profiles[c].get("phases", {}).get(n) for c in cols]
        lines.append(f"| {n} | " + " | ".join("-" if v is None else f"{v:.3f}" for v in cells) + " |")
    busy = [profiles[c].get("gpu_busy_ms") for c in cols]
    lines.append("| GPU busy (union of kernels) | " + " | ".join("-" if v is None else f"{v:.3f}" for v in busy) + " |")
    lines.append("| GPU idle (window - busy) | " + " | ".join(
        "-" if v is None else f"{profiles[c]['window_ms'] - v:.3f}" for c, v in zip(cols, busy)) + " |")
    return "\n".join(lines)


def _columns(profiles: Mapping[str, Mapping]) -> List[str]:
    return [name for name, p in profiles.items() if p and "error" not in p]


def format_category_table(profiles: Mapping[str, Mapping], title: str = "") -> str:
    """A markdown table: one column per configuration, ms per step by category, the kernel sum and the window."""
    cols = _columns(profiles)
    if not cols:
        return f"{title}\n(no profile)" if title else "(no profile)"
    lines = [title] if title else []
    lines += ["| ms per step | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for category in CATEGORY_ORDER:
        values = [profiles[c]["categories"].get(category, 0.0) for c in cols]
        if any(v > 0 for v in values):
            lines.append(f"| {category} | " + " | ".join(f"{v:.3f}" for v in values) + " |")
    lines.append("| **all kernels** | " + " | ".join(f"**{profiles[c]['kernel_ms']:.3f}**" for c in cols) + " |")
    lines.append("| window (first kernel start to last end) | " + " | ".join(f"{profiles[c]['window_ms']:.3f}" for c in cols) + " |")
    return "\n".join(lines)


def format_gemm_table(profiles: Mapping[str, Mapping], title: str = "") -> str:
    """A markdown table: ms per step of the GEMMs of each weight shape, per configuration (calls per step beside)."""
    cols = _columns(profiles)
    labels: List[str] = []
    for c in cols:
        labels += [label for label in profiles[c]["gemm_shapes"] if label not in labels]
    if not labels:
        return f"{title}\n(no GEMM shapes: CUDA graphs on, or no record_shapes)" if title else "(no GEMM shapes)"
    lines = [title] if title else []
    lines += ["| GEMM weight, ms per step (calls) | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for label in labels:
        cells = []
        for c in cols:
            row = profiles[c]["gemm_shapes"].get(label)
            cells.append("-" if row is None else f"{row['ms']:.3f} ({row['calls']:.0f})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def shape_names_for(shapes: Iterable) -> Dict[Tuple[int, int], str]:
    """``{(K, N): name}`` from objects with ``name``, ``k`` and ``n`` (:class:`~sglang_detspec.bench.gemm_bench.GemmShape`);
    two names of one ``(K, N)`` are joined with ``/``."""
    out: Dict[Tuple[int, int], str] = {}
    for s in shapes:
        key = (s.k, s.n)
        out[key] = s.name if key not in out else f"{out[key]}/{s.name}"
    return out
