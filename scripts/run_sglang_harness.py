#!/usr/bin/env python3
"""SGLang's own determinism harness (``python -m sglang.test.test_deterministic``) against DETSPEC_EAGLE.

Usage: python scripts/run_sglang_harness.py [--out DIR] [--n-trials 16] [--prefix-trials 12] [--sampling-seed 1234]

On a CUDA machine with sglang and this package installed (``pip install -e .``), starts two servers side by side
on the weighted tiny pair (the E2E tests' configurations of the same names, built by ``sglang_detspec.models.tiny_servers``):

* ``detspec_eagle_graph`` -- ``DETSPEC_EAGLE --enable-deterministic-inference``: must give one output per prompt;
* ``builtin_eagle_rs``    -- built-in ``EAGLE --speculative-use-rejection-sampling``, not deterministic: the
                             control, which must vary in at least one mode (proof that the harness can fail here).

Then runs the harness against each, at ``--temperature`` 1.0 with ``--sampling-seed``, in three modes:

* ``single`` -- the harness's: ``PROMPT_1`` in one batched request of size 1, 2, ..., ``--n-trials``;
* ``mixed``  -- ``scripts/sglang_harness_mixed.py`` (sglang 0.5.17 - 0.5.23 ship no ``mixed`` mode; that module
               drives the two short prompts and a long one in one batch through the harness's own request code);
* ``prefix`` -- the harness's: four prefixes of ``LONG_PROMPT`` (1, 511, 2048 and 4097 characters: 1 - 2,432 tiny
               tokenizer tokens) drawn at random into batches of size 1 ... ``--prefix-trials``, cache flushed
               before each.

Each run's summary lines ("Unique samples: N" per prompt) are parsed into unique-output counts; a run whose output
has not exactly the expected summary lines, or whose sample totals do not add up, is an error that shows the raw
text. Prints a progress line per run and a table (server x mode: unique outputs / samples, verdict); writes
``harness_results.json``, every run's raw output (``harness-SERVER-MODE.log``) and the server logs under ``--out``.

Exit status: 0 if DETSPEC gave 1 unique output for every prompt of every mode and the control gave more than one
in at least one mode; 1 if not; 2 if something could not run (no GPU or sglang, a server that did not start, a
harness run that failed, timed out or printed no parsable summary). About 3-4 minutes on an H200, start-up
(60-100 s, both servers at once) included.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

# Both import the standard library only, so --help and the parser tests stay GPU-free.
from sglang_detspec import server_process
from sglang_detspec.models import tiny_servers

ROOT = Path(__file__).resolve().parent.parent
MIXED_SCRIPT = ROOT / "scripts" / "sglang_harness_mixed.py"

HARNESS_MODULE = "sglang.test.test_deterministic"
MODES = ("single", "mixed", "prefix")
DETSPEC_SERVER = "detspec_eagle_graph"
CONTROL_SERVER = "builtin_eagle_rs"
SERVER_ROLES = {DETSPEC_SERVER: "DETSPEC_EAGLE, deterministic", CONTROL_SERVER: "EAGLE + rejection sampling (control)"}

# ---------------------------------------------------------------------------------------------------------------
# Parsing the harness's output. Each pattern is matched against whole lines of stdout (split on "\n" only: the
# single mode prints each trial's generated text on its line, with "\n" replaced by " ", so no generated text can
# start a line; str.splitlines would also split on the \r, \x1c or \u2028 a generated text may hold).

# sglang/test/test_deterministic.py:470 (0.5.17 and 0.5.23), single mode:
#     print(f"Total samples: {len(texts)}, Unique samples: {len(set(texts))}")
SINGLE_SUMMARY = re.compile(r"Total samples: (?P<samples>\d+), Unique samples: (?P<unique>\d+)")
# sglang/test/test_deterministic.py:503-505 (0.5.17 and 0.5.23), prefix mode, one line per prefix length:
#     f"Prompt {i} with prefix length {len_prefix[i]}: total samples: {len(outputs[i])}, Unique samples: {len(set(outputs[i]))}"
PREFIX_SUMMARY = re.compile(
    r"Prompt (?P<index>\d+) with prefix length (?P<length>\d+): total samples: (?P<samples>\d+), "
    r"Unique samples: (?P<unique>\d+)"
)
# scripts/sglang_harness_mixed.py, one line per prompt kind (the old upstream mixed mode's wording):
#     print(f"{label}: total samples: {len(texts)}, Unique samples: {len(set(texts))}")
MIXED_SUMMARY = re.compile(r"(?P<label>Prompt 1|Prompt 2|Long prompt): total samples: (?P<samples>\d+), "
                           r"Unique samples: (?P<unique>\d+)")
MIXED_LABELS = ("Prompt 1", "Prompt 2", "Long prompt")


class HarnessParseError(RuntimeError):
    """The harness's output does not hold the summary lines expected of its mode; the message shows the raw text."""

    def __init__(self, mode: str, problem: str, raw: str, tail_lines: int = 60):
        lines = raw.split("\n")
        shown = "\n".join(lines[-tail_lines:])
        cut = f" (last {tail_lines} of {len(lines)} lines)" if len(lines) > tail_lines else ""
        super().__init__(f"{mode} mode: {problem}; the harness printed{cut}:\n{shown}")
        self.mode = mode
        self.problem = problem


@dataclass
class Group:
    """One prompt of one run: how many outputs the harness collected for it and how many distinct ones."""

    label: str
    samples: int
    unique: int


def expected_samples(mode: str, n_trials: int, n_start: int = 1) -> int:
    """Outputs a run collects over all its prompts: single mode keeps one output per trial; mixed and prefix
    keep every row of batches of size n_start, ..., n_start + n_trials - 1."""
    if mode == "single":
        return n_trials
    return sum(range(n_start, n_start + n_trials))


def parse_unique_counts(mode: str, stdout: str, *, n_trials: int, n_start: int = 1) -> List[Group]:
    """The per-prompt (samples, unique outputs) of one harness run, from its stdout; raises HarnessParseError."""
    lines = [line.rstrip("\r") for line in stdout.split("\n")]
    if mode == "single":
        found = [m for m in map(SINGLE_SUMMARY.fullmatch, lines) if m]
        if len(found) != 1:
            raise HarnessParseError(
                mode, f"expected one 'Total samples: N, Unique samples: U' line, found {len(found)}", stdout)
        groups = [Group("PROMPT_1", int(found[0]["samples"]), int(found[0]["unique"]))]
    elif mode == "prefix":
        found = [m for m in map(PREFIX_SUMMARY.fullmatch, lines) if m]
        indices = [int(m["index"]) for m in found]
        if not found or indices != list(range(len(found))):
            raise HarnessParseError(
                mode, "expected 'Prompt I with prefix length L: total samples: N, Unique samples: U' lines for "
                f"I = 0, 1, ... in order, found indices {indices}", stdout)
        groups = [Group(f"prefix {m['length']} chars", int(m["samples"]), int(m["unique"])) for m in found]
    elif mode == "mixed":
        found = [m for m in map(MIXED_SUMMARY.fullmatch, lines) if m]
        labels = [m["label"] for m in found]
        if labels != list(MIXED_LABELS):
            raise HarnessParseError(mode, f"expected one summary line each for {', '.join(MIXED_LABELS)} in that "
                                    f"order, found {labels}", stdout)
        groups = [Group(m["label"], int(m["samples"]), int(m["unique"])) for m in found]
    else:
        raise ValueError(f"unknown harness mode {mode!r}; expected one of {', '.join(MODES)}")
    for g in groups:
        if g.unique > g.samples or (g.samples > 0 and g.unique == 0):
            raise HarnessParseError(mode, f"{g.label}: {g.unique} unique outputs of {g.samples} samples is impossible",
                                    stdout)
    total, want = sum(g.samples for g in groups), expected_samples(mode, n_trials, n_start)
    if total != want:
        raise HarnessParseError(mode, f"the summary lines count {total} samples, {n_trials} trials give {want}", stdout)
    return groups


def harness_modes(help_text: str) -> List[str]:
    """The ``--test-mode`` choices in the harness's ``--help`` output (argparse prints ``{a,b,c}``)."""
    m = re.search(r"--test-mode \{([^}]*)\}", help_text)
    if not m:
        raise HarnessParseError("--help", "no '--test-mode {...}' choices in the harness's usage", help_text)
    return m.group(1).split(",")


# ---------------------------------------------------------------------------------------------------------------
# Verdicts

COMPARABLE = 2  # a prompt with fewer outputs than this compares nothing


def is_deterministic(groups: List[Group]) -> bool:
    """One output for every prompt that was sampled at least twice, and at least one such prompt."""
    compared = [g for g in groups if g.samples >= COMPARABLE]
    return bool(compared) and all(g.unique == 1 for g in compared)


def varies(groups: List[Group]) -> bool:
    return any(g.unique > 1 for g in groups)


@dataclass
class Run:
    server: str
    mode: str
    command: List[str]
    log: str
    rc: Optional[int] = None
    wall_s: Optional[float] = None
    groups: List[Group] = field(default_factory=list)
    error: Optional[str] = None
    retractions: int = 0  # "#retracted_reqs:" warnings in the server log during this run

    @property
    def verdict(self) -> str:
        if self.error:
            return "ERROR"
        if self.server == DETSPEC_SERVER:
            return "PASS: 1 output" if is_deterministic(self.groups) else "FAIL: outputs differ"
        return "varies (the harness can fail)" if varies(self.groups) else "no variation seen"


def overall_exit(runs: List[Run]) -> int:
    if any(r.error for r in runs):
        return 2
    detspec_ok = all(is_deterministic(r.groups) for r in runs if r.server == DETSPEC_SERVER)
    control_varies = any(varies(r.groups) for r in runs if r.server == CONTROL_SERVER)
    return 0 if detspec_ok and control_varies else 1


def format_groups(groups: List[Group]) -> str:
    return ", ".join(f"{g.unique}/{g.samples}" for g in groups)


def format_table(runs: List[Run]) -> str:
    rows = [("server", "mode", "unique outputs / samples, per prompt", "verdict")]
    for r in runs:
        rows.append((r.server, r.mode, r.error.split("\n")[0][:60] if r.error else format_groups(r.groups), r.verdict))
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    out = ["  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths)) + "  " + row[3] for row in rows]
    out.insert(1, "-" * len(out[0]))
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------------------------
# Running (GPU machine)


def harness_command(mode: str, port: int, args: argparse.Namespace) -> List[str]:
    common = ["--host", "127.0.0.1", "--port", str(port), "--temperature", str(args.temperature),
              "--sampling-seed", str(args.sampling_seed), "--max-new-tokens", str(args.max_new_tokens)]
    if mode == "mixed":
        return [sys.executable, str(MIXED_SCRIPT), *common, "--n-trials", str(args.n_trials)]
    trials = args.prefix_trials if mode == "prefix" else args.n_trials
    return [sys.executable, "-m", HARNESS_MODULE, "--test-mode", mode, *common, "--n-trials", str(trials),
            "--n-start", "1"]


def child_env() -> Dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    # The harness talks to 127.0.0.1 through requests, which would honour a proxy from the environment.
    env["NO_PROXY"] = env["no_proxy"] = ",".join(filter(None, ["127.0.0.1", "localhost", env.get("NO_PROXY")]))
    env.pop("TRITON_INTERPRET", None)
    return env


def count_retractions(server: server_process.Server, start: int) -> int:
    return server.log_text()[start:].count("#retracted_reqs:")


def run_one(server: server_process.Server, mode: str, args: argparse.Namespace, out: Path) -> Run:
    cmd = harness_command(mode, server.port, args)
    run = Run(server.name, mode, cmd, str(out / f"harness-{server.name}-{mode}.log"))
    log_start = len(server.log_text())
    t0 = time.time()
    # --budget: what is left of the whole script's time caps every run.
    timeout = max(1.0, min(args.run_timeout, getattr(args, "deadline_at", float("inf")) - t0))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout,
                              env=child_env(), cwd=str(ROOT))
        stdout, stderr, run.rc = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        as_text = lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or "")  # noqa: E731
        stdout, stderr = as_text(e.stdout), as_text(e.stderr)
        run.error = f"timed out after {timeout:.0f} s (--run-timeout, --budget)"
    run.wall_s = round(time.time() - t0, 1)
    run.retractions = count_retractions(server, log_start)
    Path(run.log).write_text(f"$ {' '.join(cmd)}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}")
    if run.error is None and run.rc != 0:
        tail = stderr.rstrip().split("\n")[-30:]
        run.error = f"exit code {run.rc}: {tail[-1][:200]}\nstderr tail:\n" + "\n".join(tail)
    if run.error is None:
        trials = args.prefix_trials if mode == "prefix" else args.n_trials
        try:
            run.groups = parse_unique_counts(mode, stdout, n_trials=trials)
        except HarnessParseError as e:
            run.error = str(e)
    return run


def accept_length(server: server_process.Server) -> Optional[float]:
    try:
        states = server_process.get_json(server.base_url, "/server_info").get("internal_states") or [{}]
        value = states[0].get("avg_spec_accept_length")
        return round(float(value), 3) if value is not None else None
    except Exception:  # informational only: the verdict never depends on it
        return None


def server_specs(models, pair: str) -> Dict[str, server_process.ServerSpec]:
    """The two servers, as the E2E tests define ``detspec_eagle_graph`` and ``builtin_eagle_rs``."""
    base = tiny_servers.common_args(models.target, pair)
    args = {
        DETSPEC_SERVER: base + tiny_servers.eagle_args(models.eagle_draft, "DETSPEC_EAGLE", deterministic=True),
        CONTROL_SERVER: base + tiny_servers.eagle_args(models.eagle_draft, "EAGLE", rejection_sampling=True),
    }
    return {name: server_process.ServerSpec(name, argv) for name, argv in args.items()}


def preflight() -> None:
    """Fail in seconds, naming the fix, rather than after a server start-up."""
    import importlib.util
    from importlib.metadata import entry_points

    reason = server_process.launch_skip_reason()
    if reason:
        sys.exit(f"run_sglang_harness: {reason}")
    if "detspec" not in [e.name for e in entry_points(group="sglang.srt.plugins")]:
        sys.exit("run_sglang_harness: the sglang-detspec plugin is not registered with this python; "
                 "run `pip install -e .` (add --no-deps --no-build-isolation --no-index on an offline machine)")
    if importlib.util.find_spec(HARNESS_MODULE) is None:
        sys.exit(f"run_sglang_harness: this sglang has no {HARNESS_MODULE}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.split("\n")[2:]))
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "detspec-harness",
                    help="directory for harness_results.json, the raw harness logs and the server logs")
    ap.add_argument("--n-trials", type=int, default=16,
                    help="single and mixed modes: batch sizes 1..N (default 16: CUDA graphs up to 8, eager above)")
    ap.add_argument("--prefix-trials", type=int, default=12, help="prefix mode: batch sizes 1..N (default 12)")
    ap.add_argument("--sampling-seed", type=int, default=1234, help="the harness's --sampling-seed (default 1234)")
    ap.add_argument("--temperature", type=float, default=1.0, help="the harness's --temperature (default 1.0)")
    ap.add_argument("--max-new-tokens", type=int, default=100, help="the harness's --max-new-tokens (default 100)")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {','.join(MODES)}")
    ap.add_argument("--start-timeout", type=float, default=400, help="seconds to wait for a server (default 400)")
    ap.add_argument("--run-timeout", type=float, default=180, help="seconds one harness run may take (default 180)")
    ap.add_argument("--budget", type=float, default=540,
                    help="seconds the whole script may take, start-up included; later runs are cut short and count "
                         "as errors (default 540: inside a 10-minute command limit, with time to stop the servers)")
    args = ap.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        ap.error(f"--modes {args.modes!r}: choose from {', '.join(MODES)}")
    if min(args.n_trials, args.prefix_trials, args.max_new_tokens) < 1:
        ap.error("--n-trials, --prefix-trials and --max-new-tokens must be at least 1")
    if args.temperature <= 0:
        ap.error("--temperature must be positive: at 0 every server is greedy and the control cannot vary")

    preflight()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    args.deadline_at = t0 + args.budget
    help_run = subprocess.run([sys.executable, "-m", HARNESS_MODULE, "--help"], capture_output=True, text=True,
                              env=child_env(), timeout=120)
    try:
        available = harness_modes(help_run.stdout)
    except HarnessParseError as e:
        sys.exit(f"run_sglang_harness: `python -m {HARNESS_MODULE} --help` exited {help_run.returncode}: {e}\n"
                 f"stderr:\n{help_run.stderr[-3000:]}")
    missing = [m for m in modes if m != "mixed" and m not in available]
    if missing:
        sys.exit(f"run_sglang_harness: this sglang's harness has no --test-mode {', '.join(missing)} "
                 f"(it offers {', '.join(available)})")
    if "mixed" in modes:
        native = " (it lists a native mixed mode, whose whole LONG_PROMPT exceeds the 16,384-token context)" \
            if "mixed" in available else ""
        print(f"[harness] mixed mode: scripts/sglang_harness_mixed.py through the harness's send_single{native}")

    from sglang_detspec.models.tiny_models import ensure_tiny_models

    root = os.environ.get("DETSPEC_TINY_MODELS_ROOT")
    pair = tiny_servers.tiny_pair()
    models = ensure_tiny_models(Path(root) if root else None, pair=pair)
    pool = server_process.ServerPool(
        server_specs(models, pair), log_dir=out, base_port=int(os.environ.get("DETSPEC_E2E_BASE_PORT", "31000")),
        # server_pids.txt: a wrapper killed by a time limit can still end exactly these servers (kill -- -PID).
        make_server=lambda spec, port, log: server_process.Server(spec, port, log, pid_file=out / "server_pids.txt"))
    pool.prelaunch = list(SERVER_ROLES)
    version = server_process.sglang_version()
    print(f"[harness] sglang {version}, {pair} tiny pair; starting {', '.join(SERVER_ROLES)} side by side", flush=True)

    runs: List[Run] = []
    info: Dict[str, dict] = {}
    lock = threading.Lock()

    def serve(name: str) -> None:
        srv = pool.servers[name]
        try:
            srv.wait_ready(min(args.start_timeout, args.deadline_at - time.time()))
        except server_process.ServerStartError as e:
            with lock:
                info[name] = {"startup_error": str(e)}
                first_line = str(e).splitlines()[0]
                runs.extend(Run(name, m, [], "", error=f"server did not start: {first_line}") for m in modes)
            print(f"[harness] {name}: {e}", flush=True)
            return
        for mode in modes:
            run = run_one(srv, mode, args, out)
            with lock:
                runs.append(run)
                line = run.error.split("\n")[0] if run.error else format_groups(run.groups)
                print(f"[harness] {name} {mode}: {line} -> {run.verdict} ({run.wall_s} s)", flush=True)
                if run.error and "\n" in run.error:
                    print(run.error, flush=True)
        acc = accept_length(srv)
        with lock:
            info[name] = {"startup_s": srv.startup_s, "port": srv.port, "accept_length": acc, "log": str(srv.log_path)}

    # A time limit's SIGTERM must still run the finally below: the servers live in sessions of their own.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        for name in SERVER_ROLES:
            pool.get(name)  # the first call starts every server of pool.prelaunch at once
        threads = [threading.Thread(target=serve, args=(n,)) for n in SERVER_ROLES]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        pool.close()
    order = {(s, m): i for i, (s, m) in enumerate((s, m) for s in SERVER_ROLES for m in modes)}
    runs.sort(key=lambda r: order[(r.server, r.mode)])
    rc = overall_exit(runs)

    print()
    print(f"SGLang's determinism harness ({HARNESS_MODULE}, sglang {version}), {pair} tiny pair, "
          f"temperature {args.temperature}, sampling seed {args.sampling_seed}, {args.max_new_tokens} new tokens")
    print(format_table(runs))
    for mode in modes:  # which prompt each "unique/samples" entry is
        labels = next(([g.label for g in r.groups] for r in runs if r.mode == mode and r.groups), None)
        if labels:
            print(f"  {mode}: {', '.join(labels)}")
    for name, role in SERVER_ROLES.items():
        acc = info.get(name, {}).get("accept_length")
        print(f"{name}: {role}; accept length (server average) {acc if acc is not None else 'n/a'}")
    if any(r.retractions for r in runs):
        print("note: the KV pool filled during " + ", ".join(f"{r.server} {r.mode} ({r.retractions})"
                                                           for r in runs if r.retractions)
              + "; a retracted request is re-prefilled (DETSPEC replays it and aborts it if a token differs; "
                 "README, 'Allowed, and how it behaves')")
    verdict = {0: "PASS: DETSPEC_EAGLE gave one output per prompt in every mode, and the control varied",
               1: "FAIL: " + ("DETSPEC_EAGLE's outputs differed" if not all(
                   is_deterministic(r.groups) for r in runs if r.server == DETSPEC_SERVER)
                   else "the control never varied, so this run could not have failed"),
               2: "ERROR: a run could not complete (see above and the logs)"}[rc]
    print(verdict)
    result = {
        "sglang": version, "pair": pair, "harness": HARNESS_MODULE, "harness_modes_available": available,
        "settings": {k: getattr(args, k) for k in ("n_trials", "prefix_trials", "sampling_seed", "temperature",
                                                   "max_new_tokens")},
        "modes": modes, "servers": {n: {"role": SERVER_ROLES[n], **info.get(n, {})} for n in SERVER_ROLES},
        "runs": [{**asdict(r), "verdict": r.verdict} for r in runs],
        "wall_s": round(time.time() - t0, 1), "exit_code": rc, "verdict": verdict,
    }
    (out / "harness_results.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"results: {out / 'harness_results.json'}; raw harness output: {out}/harness-*.log")
    return rc


if __name__ == "__main__":
    sys.exit(main())
