"""``sglang-detspec bench-serve``: generate the mid-size pair, launch each configuration's server, drive it with
SGLang's ``bench_serving`` at each concurrency, and write the table, ratios and plot.

Order of work: the pair is generated on the GPU (:mod:`sglang_detspec.models.midsize_models`, cached under ``--models-dir``);
the servers start side by side (``--start parallel``, the default: start-up is mostly compilation and graph capture)
or one at a time; then each configuration is measured *alone*, in turn, at every concurrency, and its server is
stopped before the next one is measured (``--order interleaved`` instead measures them in rounds, every server up
until the end: :mod:`.interleaved`). Idle servers wait with ``--sleep-on-idle``. Each configuration's runs go
through one client process (:mod:`.client`: bench_serving's own ``cli_main`` once per concurrency), which resets the
server's speculation counters before each run, so ``accept_length`` is the run's own (bench_serving's single
32-token warm-up request included).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional

from sglang_detspec import server_process
from sglang_detspec.bench.serving_bench import configs as cfgs
from sglang_detspec.bench.serving_bench import interleaved, results

__all__ = ["run_benchmark"]

BREAKDOWN = "detspec_breakdown"
GRAPHS_OFF = ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]


class _Progress:
    """tqdm over the configurations when it is installed (it is, with SGLang), else a line per step."""

    def __init__(self, total: int):
        try:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="configurations", unit="config", file=sys.stderr)
        except ImportError:
            self.bar, self.done, self.total = None, 0, total

    def step(self, label: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(label)
            self.bar.update(1)
        else:
            self.done += 1
            print(f"[bench-serve] configurations {self.done}/{self.total}: {label} done", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _log(msg: str) -> None:
    print(f"[bench-serve] {msg}", file=sys.stderr, flush=True)


def _specs(settings: cfgs.BenchSettings, pair, out: Path) -> Dict[str, server_process.ServerSpec]:
    mem = cfgs.mem_fraction(len(settings.configs) + (1 if settings.breakdown else 0), settings.parallel_start)
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    specs = {}
    for name in settings.configs:
        c = cfgs.config_by_name(name)
        specs[name] = server_process.ServerSpec(name, cfgs.server_args(c, pair.target, pair.eagle_draft, settings,
                                                                       mem_fraction=mem), env=dict(env, **dict(c.env)))
    if settings.breakdown:
        hook_dir = out / "step_timing_hook"
        hook_dir.mkdir(parents=True, exist_ok=True)
        from sglang_detspec.bench.serving_bench import step_timing

        (hook_dir / "sitecustomize.py").write_text(step_timing.SITECUSTOMIZE)
        path = os.pathsep.join([str(hook_dir), *filter(None, [os.environ.get("PYTHONPATH")])])
        args = cfgs.server_args(cfgs.config_by_name(cfgs.DETSPEC), pair.target, pair.eagle_draft, settings,
                                mem_fraction=mem) + GRAPHS_OFF
        specs[BREAKDOWN] = server_process.ServerSpec(BREAKDOWN, args, env=dict(
            env, PYTHONPATH=path, **{step_timing.ENV_VAR: str(out / "step_timing.json")}))
    return specs


def _run_clients(server, settings, pair, concurrencies, out: Path, name: str) -> List[results.RunResult]:
    """bench_serving at each concurrency against ``server``, in one client process (:mod:`.client`); one row each."""
    work = out / "bench_serving"
    work.mkdir(parents=True, exist_ok=True)
    files, runs = {}, []
    for c in concurrencies:
        files[c] = work / f"{name}-c{c}.jsonl"
        files[c].unlink(missing_ok=True)
        argv = cfgs.bench_serving_command(sys.executable, server.port, pair.target, settings, c, files[c])[3:]
        runs.append({"argv": argv, "reset_url": server.base_url, "repetitions": settings.repetitions,
                     "min_seconds": settings.min_seconds, "concurrency": c, "output_file": str(files[c])})
    log = work / f"{name}.log"
    # Generous: 60 s per calibration run of client start and warm-up plus 50 ms per generated token of every wave,
    # then the repetitions' measured time three times over (a repetition is sized to last min_seconds / repetitions).
    timeout = sum(60 + -(-cfgs.num_prompts(settings, c) // c) * settings.output_len * 0.05
                  + 3 * settings.min_seconds + 30 * settings.repetitions for c in concurrencies)
    t0 = time.time()
    why = _client_process(runs, work / f"{name}-runs.json", log, timeout)
    resets = log.read_text(errors="replace").count("counters reset: True")
    expected_resets = len(concurrencies) * (1 + settings.repetitions)
    rows = []
    for c in concurrencies:
        n = cfgs.num_prompts(settings, c)
        try:
            row = results.read_repetitions(files[c], settings.repetitions, config=name, concurrency=c,
                                           calibration_prompts=n)
        except (OSError, ValueError) as e:
            tail = " | ".join(log.read_text(errors="replace").splitlines()[-3:])
            row = results.RunResult(config=name, concurrency=c, num_prompts=n, error=f"{why}: {e}; {tail[-300:]}")
        if resets < expected_resets and row.get("accept_length") is not None:
            row["accept_length_cumulative"] = True  # a reset failed: some accept lengths are server averages
        _log(f"{name} c={c}: {row.get('output_tok_s') or 0:.1f} tok/s (median of {settings.repetitions}), accept "
             f"{row.get('accept_length') or '-'}"
             f"{'  ERROR ' + row['error'] if row['error'] else ''}")
        rows.append(row)
    _log(f"{name}: {len(concurrencies)} runs in {time.time() - t0:.0f} s (log {log})")
    return rows


def _client_process(runs: List[dict], runs_file: Path, log: Path, timeout: float) -> str:
    """One client process (:mod:`.client`) over ``runs``, its output in ``log``; says how it ended."""
    runs_file.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    try:
        with open(log, "w") as f:
            proc = subprocess.run([sys.executable, "-m", "sglang_detspec.bench.serving_bench.client", str(runs_file)],
                                  stdout=f, stderr=subprocess.STDOUT, timeout=timeout,
                                  env=dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1"))
        return f"bench_serving client exited {proc.returncode}"
    except subprocess.TimeoutExpired:
        return f"bench_serving client timed out after {timeout:.0f} s"


def _run_interleaved(servers, settings, pair, out: Path):
    """``--order interleaved`` over ``servers`` (``{name: Server}``, all up): calibrations then rounds, in one client
    process (:mod:`.interleaved`). Returns ``({(name, c): row}, interrupted)``; a Ctrl-C stops the client and the
    rounds measured so far are read."""
    work = out / "bench_serving"
    work.mkdir(parents=True, exist_ok=True)
    names = [n for n in settings.configs if n in servers]
    runs = interleaved.client_runs({n: (servers[n].port, servers[n].base_url) for n in names}, settings, pair.target,
                                   work, sys.executable)
    log, timeout, t0 = work / "interleaved.log", interleaved.client_timeout(names, settings), time.time()
    _log(f"interleaved: {len(runs)} runs of {len(names)} configurations in one client process (log {log})")
    try:
        why, interrupted = _client_process(runs, work / "interleaved-runs.json", log, timeout), False
    except KeyboardInterrupt:
        why, interrupted = "not measured: the benchmark was interrupted", True
    text = log.read_text(errors="replace") if log.is_file() else ""
    rows = interleaved.read_points(names, settings, work, why=f"{why}; {' | '.join(text.splitlines()[-3:])[-300:]}"
                                   if not interrupted else why, interrupted=interrupted)
    cumulative = text.count("counters reset: True") < interleaved.expected_resets(names, settings)
    for (name, c), row in rows.items():
        if cumulative and not interrupted and row.get("accept_length") is not None:
            row["accept_length_cumulative"] = True  # a reset failed: some accept lengths are server averages
        rounds = " ".join(f"{v:.1f}" if v else "-" for v in row.get("output_tok_s_rounds") or [])
        _log(f"{name} c={c}: {row.get('output_tok_s') or 0:.1f} tok/s (median; rounds {rounds or '-'}), accept "
             f"{row.get('accept_length') or '-'}{'  ERROR ' + row['error'] if row['error'] else ''}")
    _log(f"interleaved: {len(names)} configurations x {settings.repetitions} rounds in {time.time() - t0:.0f} s")
    return rows, interrupted


def _breakdown(server, settings, pair, out: Path) -> dict:
    from sglang_detspec.bench.serving_bench import step_timing

    timing = out / "step_timing.json"

    def snapshot() -> Optional[dict]:
        return json.loads(timing.read_text()) if timing.is_file() else None

    before = snapshot()
    (row,) = _run_clients(server, settings, pair, [settings.breakdown_concurrency], out, BREAKDOWN)
    time.sleep(1.0)
    after = snapshot()
    if after is None:
        return {"error": f"the timing hook wrote no {timing} (was the hook imported? see the server log)", "run": row}
    summary = step_timing.summarize(before, after)
    summary.update({"concurrency": settings.breakdown_concurrency, "run": row,
                    "note": "CUDA graphs off and a device synchronisation around every timed region: the overlap "
                            "of scheduling with GPU work is gone, so these steps are slower than the throughput "
                            "run's; the breakdown shows where a step's time goes, not the throughput run's cost"})
    return summary


def format_breakdown(b: dict) -> str:
    if "error" in b:
        return f"breakdown: {b['error']}"
    lines = [f"DETSPEC_EAGLE per decode step at concurrency {b['concurrency']} (mean batch {b['mean_batch']:.1f}, "
             f"{b['steps']} steps): {b['step_ms']:.3f} ms"]
    for k, v in b["phases_ms"].items():
        lines.append(f"  {k:<16} {v:8.3f} ms  {100 * v / b['step_ms']:5.1f} %")
    lines.append(f"  note: {b['note']}")
    return "\n".join(lines)


def run_benchmark(settings: cfgs.BenchSettings, out: Path, *, models_dir: Optional[Path], shape,
                  start_timeout: float = 420.0) -> int:
    """The whole benchmark (module docstring); returns the exit code (0 every run completed, 1 some run failed,
    2 the benchmark could not run)."""
    reason = server_process.launch_skip_reason()
    if reason:
        _log(reason)
        return 2
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    _log(f"estimated duration ~{cfgs.estimate_seconds(settings):.0f} s (a guess from start-up times measured on an "
         f"H200; decode rates unmeasured until the first run)")
    if settings.order != "sequential":
        _log(cfgs.order_description(settings))
    from sglang_detspec.models import midsize_models

    # bench_serving imports aiohttp, orjson, tqdm, ... that a server does not need: check them while the pair is
    # generated, so a missing one fails the benchmark in seconds instead of after every server's start-up.
    client_check = subprocess.Popen(
        [sys.executable, "-m", "sglang_detspec.bench.serving_bench.client", "--check"], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)
    pair = midsize_models.ensure_midsize_pair(models_dir or Path(tempfile.gettempdir()) / "sglang-detspec-models", shape)
    gen_s = round(time.time() - t_start, 1)
    _log(f"mid-size pair {shape.tag()} ready in {gen_s} s: {pair.target.parent}")
    client_out, _ = client_check.communicate(timeout=300)
    if client_check.returncode != 0:
        _log(f"sglang.bench_serving does not import here, so no run could be measured:\n{client_out[-2000:]}")
        return 2
    _log(client_out.strip().splitlines()[-1] if client_out.strip() else "bench_serving client checked")
    specs = _specs(settings, pair, out)
    pool = server_process.ServerPool(specs, log_dir=out, base_port=33000, parallel=settings.parallel_start,
                                     timeout=start_timeout,
                                     make_server=lambda s, p, log: server_process.Server(
                                         s, p, log, pid_file=out / "server_pids.txt"))
    pool.prelaunch = list(specs)
    order = list(settings.configs) + ([BREAKDOWN] if settings.breakdown else [])
    rows: List[results.RunResult] = []
    startup, breakdown = {}, None
    progress = _Progress(len(order))
    failed: Dict[str, str] = {}
    interrupted = False

    def ready(name: str) -> None:
        try:
            pool.get(name).wait_ready(start_timeout)
            startup[name] = pool.servers[name].startup_s
        except server_process.ServerStartError as e:
            _log(str(e))
            startup[name], failed[name] = None, f"server did not start: {str(e).splitlines()[0]}"

    try:
        if settings.parallel_start:
            # Every server up before the first measurement: one still compiling would share the GPU with it.
            for name in order:
                ready(name)
            # A server can fail only because it loaded beside the others: SGLang sizes the KV pool from the memory
            # that disappeared while it loaded, which includes its neighbours' weights (measured on the H200:
            # eagle_det refused --mem-fraction-static 0.133 with six servers loading at once). Start each failed
            # one again, alone now, once.
            for name in [n for n in order if n in failed]:
                _log(f"{name}: retrying its start alone ({failed[name]})")
                pool.servers.pop(name, None)
                del failed[name], startup[name]
                ready(name)
                if name in failed:  # the others' pools stay allocated, so a large pair cannot start beside them
                    failed[name] += (" (also alone beside the other servers' pools: if its log asks for a larger "
                                     "--mem-fraction-static, run with --start sequential, where each server gets 0.5)")
                    _log(f"{name}: {failed[name]}")
        if settings.order == "interleaved":
            # Rounds across every configuration whose server is up; all released together at the end, the
            # breakdown server (if any) then measured alone below.
            up = {n: pool.servers[n] for n in settings.configs if n not in failed}
            measured, interrupted = _run_interleaved(up, settings, pair, out)
            for name in settings.configs:
                rows += [measured.get((name, c)) or results.RunResult(
                    config=name, concurrency=c, num_prompts=cfgs.num_prompts(settings, c), error=failed[name])
                    for c in settings.concurrencies]
                pool.release(name)
                progress.step(name)
            order = [BREAKDOWN] if settings.breakdown and not interrupted else []
            if interrupted:
                _log("interrupted: reporting the rounds measured so far")
        for name in order:
            if name not in startup:
                ready(name)
            if name in failed:
                if name == BREAKDOWN:
                    breakdown = {"error": failed[name]}
                else:
                    rows += [results.RunResult(config=name, concurrency=c, num_prompts=cfgs.num_prompts(settings, c),
                                               error=failed[name]) for c in settings.concurrencies]
            elif name == BREAKDOWN:
                breakdown = _breakdown(pool.servers[name], settings, pair, out)
            else:
                rows += _run_clients(pool.servers[name], settings, pair, settings.concurrencies, out, name)
            pool.release(name)  # its memory and threads are gone before the next one is measured
            progress.step(name)
    except KeyboardInterrupt:
        # Ctrl-C (or `timeout -s INT`) keeps what was measured: the report below marks the runs never reached,
        # so a time-limited run on a lent GPU still returns its table instead of nothing.
        interrupted = True
        _log("interrupted: reporting the runs measured so far")
    finally:
        progress.close()
        pool.close()
    if interrupted:
        measured = {(r["config"], r["concurrency"]) for r in rows}
        rows += [results.RunResult(config=n, concurrency=c, num_prompts=cfgs.num_prompts(settings, c),
                                   error="not measured: the benchmark was interrupted")
                 for n in settings.configs for c in settings.concurrencies if (n, c) not in measured]
    code = _report(settings, out, shape, rows, startup, breakdown, gen_s, time.time() - t_start)
    return 1 if interrupted else code


def _report(settings, out: Path, shape, rows, startup, breakdown, gen_s: float, wall_s: float) -> int:
    subjects = [x for x in results.SUBJECTS if x in settings.configs]
    ratios = {x: results.compute_ratios(rows, subject=x) for x in subjects}
    spreads = {x: results.ratio_spread(rows, subject=x) for x in subjects}
    labels = {c.name: c.label for c in cfgs.CONFIGS}
    version = server_process.sglang_version()
    results.write_csv(out / "bench_serve.csv", rows)
    document = {
        "sglang": version, "shape": dataclasses.asdict(shape), "settings": dataclasses.asdict(settings),
        "configs": {n: labels[n] for n in settings.configs}, "rows": rows, "ratios_detspec_over": ratios.get("detspec", {}),
        "ratios": ratios, "ratio_spreads": spreads, "goals": results.SUBJECT_GOALS, "startup_s": startup, "pair_generation_s": gen_s, "breakdown": breakdown,
        "wall_s": round(wall_s, 1),
    }
    paired = {x: results.paired_ratios(rows, subject=x) for x in subjects} if settings.order == "interleaved" else {}
    if paired:
        document.update(order=settings.order, paired_ratios=paired)
        results.write_paired_csv(out / "bench_serve_paired.csv", ratios, paired)
    results.write_json(out / "bench_serve.json", document)
    title = (f"sglang {version}, mid-size pair {shape.tag()}, input {settings.input_len} / output "
             f"{settings.output_len} tokens, T={settings.temperature:g}")
    try:
        results.write_plot(out / "bench_serve.png", rows, labels, title)
        plot = str(out / "bench_serve.png")
    except ImportError as e:
        plot = f"not written ({e}; pip install matplotlib)"
    print(title)
    print(results.format_table(rows))
    if paired:
        print(results.format_paired_table(ratios, paired))
    for x in subjects:
        if not paired:
            print(results.format_ratios(ratios[x], subject=x, spread=spreads[x]))
            continue
        print(results.format_ratios(ratios[x], subject=x, spread=spreads[x], kind="ratio of medians"))
        medians, spread = results.paired_medians_and_spread(paired[x])
        print(results.format_ratios(medians, subject=x, spread=spread, kind=f"paired: median [min - max] of the "
                                    f"{settings.repetitions} per-round ratios"))
    if breakdown is not None:
        print(format_breakdown(breakdown))
    paired_csv = f", {out / 'bench_serve_paired.csv'}" if paired else ""
    print(f"results: {out / 'bench_serve.csv'}, {out / 'bench_serve.json'}{paired_csv}, plot {plot}; wall {wall_s:.0f} s")
    return 1 if any(r.get("error") for r in rows) else 0
