"""Reading ``bench_serving``'s results, the ratios to the built-in configurations, and the CSV / JSON / PNG outputs.

``python -m sglang.bench_serving --output-file F`` (SGLang 0.5.17 ``sglang/benchmark/serving.py``) *appends* one
JSON object per run to ``F``: the run's arguments (``backend``, ``dataset_name``, ``max_concurrency``,
``random_input_len``, ...), ``server_info``, and the metrics ``completed``, ``duration``, ``total_output_tokens``,
``output_throughput`` (tokens/s), ``{mean,median,std,p90,p95,p99}_{ttft,tpot,itl,e2e_latency}_ms``,
``concurrency`` and ``accept_length`` (``/server_info``'s ``avg_spec_accept_length`` after the run, None without
speculation). Standard library only, except :func:`write_plot` (matplotlib).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

__all__ = ["RunResult", "parse_bench_serving_line", "read_bench_serving_file", "read_repetitions", "compute_ratios",
           "ratio_spread", "read_rounds", "paired_ratios", "format_paired_table", "write_paired_csv",
           "paired_medians_and_spread", "PAIRED_CSV_FIELDS",
           "write_csv", "write_json", "write_plot", "format_table", "format_ratios", "GOALS",
           "SUBJECT_GOALS", "SUBJECTS", "CSV_FIELDS"]

#: Throughput goals, reported and never enforced: subject -> built-in configuration -> (lowest ratio of the
#: subject's output tokens/s to the built-in's, the concurrencies the goal is for or None for every one).
SUBJECT_GOALS = {
    "detspec": {"eagle_rs": (0.97, None), "eagle_det": (1.5, None), "no_spec_fast": (1.2, (1, 8))},
    "no_spec_plugin_ops": {"no_spec_fast": (0.90, None)},
}
#: DETSPEC_EAGLE's goals over each built-in configuration (at every concurrency they apply to).
GOALS = {b: goal for b, (goal, _) in SUBJECT_GOALS["detspec"].items()}
#: Subjects whose ratios to the built-in configurations a run reports, when measured.
SUBJECTS = ("detspec", "detspec_invariant", "detspec_sglang_ops", "no_spec_plugin_ops", "detspec_no_attn_cache",
            "detspec_no_split_k", "detspec_invariant_fast_draft", "detspec_one_stage_verify", "detspec_decode_verify",
            "detspec_split_kv_draft_extend")

_FIELDS = {  # our name: bench_serving's key
    "output_tok_s": "output_throughput",
    "ttft_p50_ms": "median_ttft_ms",
    "ttft_p99_ms": "p99_ttft_ms",
    "itl_p50_ms": "median_itl_ms",
    "itl_p99_ms": "p99_itl_ms",
    "accept_length": "accept_length",
    "completed": "completed",
    "duration_s": "duration",
    "total_output_tokens": "total_output_tokens",
}
CSV_FIELDS = ["config", "concurrency", "num_prompts", *_FIELDS, "repetitions", "output_tok_s_min",
              "output_tok_s_max", "error"]
#: Fields whose median over a point's repetitions is the point's value.
_MEDIAN_FIELDS = ("output_tok_s", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "accept_length")


class RunResult(dict):
    """One (configuration, concurrency) run: the fields of :data:`CSV_FIELDS`."""


def parse_bench_serving_line(line: str, *, config: str, concurrency: int, num_prompts: int) -> RunResult:
    """One ``bench_serving`` JSON line -> a :class:`RunResult`; ``error`` says what is wrong (a run whose
    concurrency is not the one asked for, or that completed fewer requests than it sent)."""
    data = json.loads(line)
    missing = [k for k in _FIELDS.values() if k not in data]
    if missing:
        raise ValueError(f"bench_serving result lacks {', '.join(missing)}")
    row = RunResult(config=config, concurrency=concurrency, num_prompts=num_prompts, error="")
    for ours, theirs in _FIELDS.items():
        value = data[theirs]
        row[ours] = None if value is None else (int(value) if ours in ("completed", "total_output_tokens") else float(value))
    if data.get("max_concurrency") not in (None, concurrency):
        row["error"] = f"result is for concurrency {data.get('max_concurrency')}, not {concurrency}"
    elif row["completed"] != num_prompts:
        row["error"] = f"{row['completed']} of {num_prompts} requests completed"
    return row


def read_bench_serving_file(path: Path, **kw) -> RunResult:
    """The last line of ``path`` (bench_serving appends; the caller gives each run its own file)."""
    lines = [ln for ln in Path(path).read_text().splitlines() if ln.strip()]
    if not lines:
        raise ValueError(f"{path} holds no bench_serving result")
    return parse_bench_serving_line(lines[-1], **kw)


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def read_repetitions(path: Path, repetitions: int, *, config: str, concurrency: int,
                     calibration_prompts: int) -> RunResult:
    """A measured point written by the client's calibrated mode: ``path`` holds the calibration run then
    ``repetitions`` runs of equal size. Returns one row: the median of each of :data:`_MEDIAN_FIELDS` over the
    repetitions, the min and max output tokens/s, the summed duration and output tokens. ``error`` is set when a
    run is missing, failed, or completed fewer requests than the others."""
    lines = [ln for ln in Path(path).read_text().splitlines() if ln.strip()]
    if len(lines) < 1 + repetitions:
        raise ValueError(f"{path} holds {max(len(lines) - 1, 0)} measured runs of {repetitions} (after the "
                         f"calibration run)")
    return _summarize(lines[-repetitions:], config=config, concurrency=concurrency,
                      calibration_prompts=calibration_prompts)


def _summarize(lines: Sequence[str], *, config: str, concurrency: int, calibration_prompts: int) -> RunResult:
    """One row from a point's measured bench_serving lines (:func:`read_repetitions`)."""
    completed = [json.loads(ln).get("completed") or 0 for ln in lines]
    size = max(max(completed), calibration_prompts)
    reps = [parse_bench_serving_line(ln, config=config, concurrency=concurrency, num_prompts=size) for ln in lines]
    row = RunResult(config=config, concurrency=concurrency, num_prompts=size, repetitions=len(lines),
                    error="; ".join(dict.fromkeys(r["error"] for r in reps if r["error"])))
    for f in _MEDIAN_FIELDS:
        values = [r[f] for r in reps if r[f] is not None]
        row[f] = _median(values) if values else None
    row["output_tok_s_min"] = min(r["output_tok_s"] for r in reps)
    row["output_tok_s_max"] = max(r["output_tok_s"] for r in reps)
    row["duration_s"] = sum(r["duration_s"] for r in reps)
    row["completed"] = sum(r["completed"] for r in reps)
    row["total_output_tokens"] = sum(r["total_output_tokens"] for r in reps)
    return row


def read_rounds(files: Sequence[Path], *, config: str, concurrency: int, calibration_prompts: int,
                require_all: bool = True) -> RunResult:
    """A point measured by ``--order interleaved``: ``files[r]`` holds round r's repetition (its last line). The row
    of :func:`read_repetitions` over the rounds present, plus ``output_tok_s_rounds``: each round's output tokens/s
    (None where missing), which :func:`paired_ratios` pairs by round. A missing round is an ``error`` unless
    ``require_all`` is off (an interrupted run: rounds never reached); no round at all raises ValueError."""
    lines: List[Optional[str]] = []
    for path in files:
        found = [ln for ln in Path(path).read_text().splitlines() if ln.strip()] if Path(path).is_file() else []
        lines.append(found[-1] if found else None)
    present = [ln for ln in lines if ln is not None]
    if not present:
        raise ValueError(f"no round of {len(files)} has a result ({', '.join(str(f) for f in files[:1])} ...)")
    row = _summarize(present, config=config, concurrency=concurrency, calibration_prompts=calibration_prompts)
    row["output_tok_s_rounds"] = [None if ln is None else float(json.loads(ln)["output_throughput"]) for ln in lines]
    missing = [r + 1 for r, ln in enumerate(lines) if ln is None]
    if missing and require_all:
        row["error"] = "; ".join(filter(None, [row["error"], f"round {', '.join(map(str, missing))} of {len(files)} "
                                                            f"has no result"]))
    return row


def _usable(row: Optional[Mapping]) -> bool:
    return bool(row) and not row.get("error") and bool(row.get("output_tok_s"))


def compute_ratios(rows: Sequence[Mapping], *, subject: str = "detspec",
                   builtins: Sequence[str] = ("no_spec", "eagle_rs", "eagle_det", "no_spec_fast"),
                   field: str = "output_tok_s", over: str = "output_tok_s") -> Dict[str, Dict[int, Optional[float]]]:
    """``{builtin: {concurrency: subject's output tokens/s / builtin's}}`` for every built-in measured in the same
    run; None where either run failed. ``field`` / ``over`` pick other columns (the spread uses the min / max)."""
    by = {(r["config"], r["concurrency"]): r for r in rows}
    present = {r["config"] for r in rows}
    out: Dict[str, Dict[int, Optional[float]]] = {}
    if subject not in present:
        return out
    concurrencies = sorted({r["concurrency"] for r in rows if r["config"] == subject})
    for b in builtins:
        if b not in present:
            continue
        out[b] = {}
        for c in concurrencies:
            s, d = by.get((subject, c)), by.get((b, c))
            usable = _usable(s) and _usable(d) and s.get(field) and d.get(over)
            out[b][c] = s[field] / d[over] if usable else None
    return out


def ratio_spread(rows: Sequence[Mapping], *, subject: str = "detspec") -> Dict[str, Dict[int, Optional[tuple]]]:
    """``{builtin: {concurrency: (lowest, highest)}}``: the subject's slowest repetition over the built-in's fastest,
    and its fastest over the built-in's slowest -- the range the medians' ratio could move within."""
    low = compute_ratios(rows, subject=subject, field="output_tok_s_min", over="output_tok_s_max")
    high = compute_ratios(rows, subject=subject, field="output_tok_s_max", over="output_tok_s_min")
    return {b: {c: (low[b][c], high[b][c]) if low[b][c] is not None else None for c in low[b]} for b in low}


def paired_ratios(rows: Sequence[Mapping], *, subject: str = "detspec",
                  builtins: Sequence[str] = ("no_spec", "eagle_rs", "eagle_det", "no_spec_fast")) -> Dict[str, Dict]:
    """``{builtin: {concurrency: {"median", "min", "max", "rounds"}}}`` from ``--order interleaved`` rows: in each
    round r the subject's output tokens/s over the built-in's of the same round (``rounds``: one per round, None
    where either run is missing), then their median and min - max. A slow drift of the machine across rounds scales
    both runs of a round alike and cancels in these ratios, not in the ratio of medians (whose medians can come from
    different rounds). None where either point failed or no round has both runs."""
    by = {(r["config"], r["concurrency"]): r for r in rows}
    out: Dict[str, Dict] = {}
    for b, per_c in compute_ratios(rows, subject=subject, builtins=builtins).items():
        out[b] = {}
        for c, of_medians in per_c.items():
            s, d = (by[(subject, c)], by[(b, c)]) if of_medians is not None else ({}, {})
            pairs = list(zip(s.get("output_tok_s_rounds") or [], d.get("output_tok_s_rounds") or []))
            per_round = [x / y if x and y else None for x, y in pairs]
            measured = [v for v in per_round if v is not None]
            out[b][c] = None if not measured else {
                "median": _median(measured), "min": min(measured), "max": max(measured), "rounds": per_round}
    return out


def paired_medians_and_spread(paired: Mapping[str, Mapping]):
    """:func:`paired_ratios` as the (medians, spread) pair :func:`format_ratios` takes."""
    medians = {b: {c: v and v["median"] for c, v in per_c.items()} for b, per_c in paired.items()}
    spread = {b: {c: v and (v["min"], v["max"]) for c, v in per_c.items()} for b, per_c in paired.items()}
    return medians, spread


PAIRED_CSV_FIELDS = ["subject", "over", "concurrency", "ratio_of_medians", "paired_median", "paired_min",
                     "paired_max", "rounds_paired", "per_round"]


def _paired_rows(ratios: Mapping[str, Mapping], paired: Mapping[str, Mapping]):
    """(subject, builtin, concurrency, ratio of medians, paired dict or None) for every pair of every subject."""
    for subject, per_b in paired.items():
        for b, per_c in per_b.items():
            for c, v in per_c.items():
                yield subject, b, c, ratios.get(subject, {}).get(b, {}).get(c), v


def write_paired_csv(path: Path, ratios: Mapping[str, Mapping], paired: Mapping[str, Mapping]) -> None:
    """``{subject: compute_ratios}`` and ``{subject: paired_ratios}`` side by side, one line per pair and
    concurrency; ``per_round`` holds each round's ratio ("-" where the round lacks a run)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(PAIRED_CSV_FIELDS)
        for subject, b, c, of_medians, v in _paired_rows(ratios, paired):
            w.writerow([subject, b, c, "" if of_medians is None else of_medians] + (
                ["", "", "", 0, ""] if v is None else
                [v["median"], v["min"], v["max"], sum(x is not None for x in v["rounds"]),
                 " ".join(_fmt(x, ".4f") for x in v["rounds"])]))


def format_paired_table(ratios: Mapping[str, Mapping], paired: Mapping[str, Mapping]) -> str:
    """The paired ratios beside the ratios of medians, one line per pair and concurrency."""
    head = f"{'ratio':<34} {'conc':>5} {'of medians':>10} {'paired':>7} {'min':>7} {'max':>7}  per round"
    lines = ["paired ratios: per round, the subject's output tok/s over the other's of the same round; their median "
             "and min - max", head, "-" * len(head)]
    for subject, b, c, of_medians, v in _paired_rows(ratios, paired):
        v = v or {}
        lines.append(f"{subject + ' / ' + b:<34} {c:>5} {_fmt(of_medians, '10.3f')} {_fmt(v.get('median'), '7.3f')} "
                     f"{_fmt(v.get('min'), '7.3f')} {_fmt(v.get('max'), '7.3f')}  "
                     + " ".join(_fmt(x, ".3f") for x in v.get("rounds", [])))
    return "\n".join(lines)


def write_csv(path: Path, rows: Sequence[Mapping]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in CSV_FIELDS})


def write_json(path: Path, document: Mapping) -> None:
    def ratio_keys(obj):  # JSON object keys must be strings: concurrencies become "1", "8", ...
        if isinstance(obj, dict):
            return {str(k): ratio_keys(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [ratio_keys(v) for v in obj]
        return obj

    Path(path).write_text(json.dumps(ratio_keys(document), indent=2, sort_keys=True) + "\n")


def write_plot(path: Path, rows: Sequence[Mapping], labels: Mapping[str, str], title: str = "") -> None:
    """Output tokens/s (left) and median inter-token latency (right) against concurrency, one line per configuration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_tp, ax_itl) = plt.subplots(1, 2, figsize=(11, 4.2))
    configs = list(dict.fromkeys(r["config"] for r in rows))
    for name in configs:
        pts = sorted((r["concurrency"], r) for r in rows if r["config"] == name and _usable(r))
        if not pts:
            continue
        xs = [c for c, _ in pts]
        ax_tp.plot(xs, [r["output_tok_s"] for _, r in pts], marker="o", label=labels.get(name, name))
        ax_itl.plot(xs, [r["itl_p50_ms"] for _, r in pts], marker="o", label=labels.get(name, name))
    for ax, ylabel in ((ax_tp, "output tokens/s"), (ax_itl, "inter-token latency p50 (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    ax_tp.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def format_table(rows: Sequence[Mapping]) -> str:
    head = f"{'config':<12} {'conc':>5} {'out tok/s':>10} {'TTFT p50':>9} {'TTFT p99':>9} {'ITL p50':>8} " \
           f"{'ITL p99':>8} {'accept':>6}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['config']:<12} {r['concurrency']:>5} {_fmt(r.get('output_tok_s'), '10.1f')} "
                     f"{_fmt(r.get('ttft_p50_ms'), '9.1f')} {_fmt(r.get('ttft_p99_ms'), '9.1f')} "
                     f"{_fmt(r.get('itl_p50_ms'), '8.2f')} {_fmt(r.get('itl_p99_ms'), '8.2f')} "
                     f"{_fmt(r.get('accept_length'), '6.2f')}" + (f"  ERROR: {r['error']}" if r.get("error") else ""))
    return "\n".join(lines)


def format_ratios(ratios: Mapping[str, Mapping[int, Optional[float]]], subject: str = "detspec",
                  spread: Optional[Mapping[str, Mapping[int, Optional[tuple]]]] = None,
                  kind: Optional[str] = None) -> str:
    """One goal line per built-in; ``kind`` (e.g. "ratio of medians", "paired") names the kind of ratio after the
    goal when a report shows more than one."""
    lines = []
    goals = SUBJECT_GOALS.get(subject, {})
    for b, per_c in ratios.items():
        goal, applies = goals.get(b, (None, None))
        cells = []
        for c, v in per_c.items():
            judged = goal is not None and v is not None and (applies is None or c in applies)
            mark = (" ok" if v >= goal else " BELOW GOAL") if judged else ""
            rng = (spread or {}).get(b, {}).get(c)
            rng_text = f" [{rng[0]:.3f}-{rng[1]:.3f}]" if rng else ""
            cells.append(f"c={c}: {_fmt(v, '.3f')}{rng_text}{mark}")
        where = "" if applies is None else " at c = " + ", ".join(map(str, applies))
        goal_text = f" (goal >= {goal}{where})" if goal is not None else ""
        lines.append(f"{subject} / {b}{goal_text}{', ' + kind if kind else ''}: " + ", ".join(cells))
    return "\n".join(lines)
