#!/usr/bin/env python3
"""Lossless check on a CUDA GPU: DETSPEC_EAGLE's tokens have the target model's distribution (issue 12, item 4).

    python scripts/lossless_check.py --out DIR [--n 10000 | --quick] [--concurrency 64]
                                     [--pair weighted | qwen3_eagle3 | weighted_token_map]

Starts three ``sglang.launch_server`` processes side by side on the weighted tiny pair, CUDA graphs on (captured up
to ``--cuda-graph-max-bs``, default the concurrency, so the measured batches replay graphs; ``--max-running-requests``
is the concurrency too):

* ``detspec``  -- DETSPEC_EAGLE, ``--enable-deterministic-inference`` (the product);
* ``baseline`` -- the same target, no speculative flags, ``--enable-deterministic-inference`` (the reference);
* ``control``  -- DETSPEC_EAGLE with ``tests/e2e/controls/accept_all_drafts/sitecustomize.py`` on its PYTHONPATH:
  verify accepts every draft, so its drafted tokens come from the draft model (the power control).

Each gets ``--n`` requests (default 10,000): one fixed prompt (``--prompt``), temperature 1.0, ``--max-new-tokens``
(24) with ``ignore_eos``, one ``sampling_seed`` per request, sent as ``/generate`` batches (a list of texts with a
list of sampling params; ``--batch`` per POST, ``--concurrency`` in flight per server). Seeds: detspec and control
1..N; the baseline N+1..2N (``--baseline-seeds disjoint``, the default), so the two samples of every comparison are
independent, as a two-sample test assumes. With equal seeds (``--baseline-seeds same``, the issue's first protocol)
each pair of sequences shares its prefill token, the samples are paired, and the test is conservative.

Statistics (``sglang_detspec.checker.two_sample``): per position 1..L-1, a chi-square homogeneity test (sparse tokens
pooled), Bonferroni-combined; the pooled (previous, next) pair counts with a cluster-permutation null; combined
p = min(1, 2 min(both)). Position 0 is the prefill sample, drawn by the same target sampler in every server: it is
reported, never counted. Verdict: detspec vs baseline must give combined p > 1e-3 (lossless), control vs baseline
p < 1e-6 (the test can see a broken verify). Exit 0 only if both hold; 1 if a verdict fails; 2 if a server or a
request failed.

``--pair qwen3_eagle3`` (issue 33, item 1) runs the same three roles on the Qwen3 target with its reduced-vocabulary
EAGLE3 draft (256 hot tokens of 1024, a ``d2t`` map; ``models.family_pairs``): ``detspec`` and ``control`` are
DETSPEC_EAGLE3 as users serve it (no environment variable: this check passed on an H100 at N = 10,000, docs/results.md), so the
verify under test reads the reduced q through the hot map; the control's accept-all sitecustomize wraps that same
verify.

``--pair weighted_token_map`` (issue 33, item 1) runs them on the weighted tiny pair with a reduced draft vocabulary
given by ``--speculative-token-map`` (``models.token_map``: the target's 512 most frequent tokens of 1024, most
frequent first; SGLang keeps those rows of the EAGLE draft's LM head): ``detspec`` and ``control`` are DETSPEC_EAGLE
with the token map as users serve it (no environment variable: this check passed on an H100 at N = 10,000,
docs/results.md), the baseline the same non-speculative target as for ``weighted``.

Writes to ``--out``: ``lossless.json`` (settings, per-position and transition tests, accept lengths, timings),
``lossless.md`` (the table), ``tokens.npz`` (every sequence and seed), ``server-<name>.log``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

# Both standard library only, so --help needs neither torch nor SGLang.
from sglang_detspec import server_process
from sglang_detspec.models import tiny_servers

REPO = Path(__file__).resolve().parent.parent
# The control's sitecustomize is test-only code: it stays under tests/, on the control server's PYTHONPATH alone.
CONTROL_DIR = REPO / "tests" / "e2e" / "controls" / "accept_all_drafts"

DEFAULT_N = 10_000
QUICK_N = 1_000
DEFAULT_PROMPT = "The river ran past the old mill, where the miller kept a ledger of"
DEFAULT_MAX_NEW_TOKENS = 24
DEFAULT_CONCURRENCY = 64
DEFAULT_BATCH = 16
TEMPERATURE = 1.0
ROLES = ("detspec", "baseline", "control")
LABELS = {
    "detspec": "DETSPEC_EAGLE vs non-speculative",
    "control": "accept-all-drafts control vs non-speculative",
}
#: The pairs this check serves: the weighted tiny pair (DETSPEC_EAGLE), the reduced-vocabulary EAGLE3 pair, and the
#: weighted pair's EAGLE draft reduced by a token map.
PAIRS = ("weighted", "qwen3_eagle3", "weighted_token_map")
TOKEN_MAP_PAIR = "weighted_token_map"


def pair_algorithm(pair: str) -> str:
    return "DETSPEC_EAGLE3" if pair == "qwen3_eagle3" else "DETSPEC_EAGLE"


def served_pair(pair: str) -> str:
    """The model pair ``pair`` serves (``tiny_servers.common_args``' name): the token map reduces the weighted pair."""
    return "weighted" if pair == TOKEN_MAP_PAIR else pair


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="lossless_check.py",
        description="Two-sample chi-square lossless check of DETSPEC_EAGLE against a non-speculative server "
        "(and an accept-all-drafts control that must fail), on a tiny pair (--pair). Needs a CUDA GPU and sglang.",
        epilog="example: python scripts/lossless_check.py --out /tmp/lossless   (about 4 minutes on an H200)",
    )
    ap.add_argument("--out", type=Path, required=True, help="directory for lossless.json, lossless.md, tokens.npz, logs")
    ap.add_argument("--n", type=int, default=None, help=f"sequences per server (default {DEFAULT_N:,})")
    ap.add_argument("--quick", action="store_true", help=f"smoke run: --n {QUICK_N:,}")
    ap.add_argument("--prompt", default=DEFAULT_PROMPT, help="the one prompt every request sends")
    ap.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS, help="tokens per sequence (default 24)")
    ap.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY,
                    help="requests in flight per server (default 64)")
    ap.add_argument("--batch", type=int, default=DEFAULT_BATCH, help="requests per /generate POST (default 16)")
    ap.add_argument("--cuda-graph-max-bs", type=int, default=None,
                    help="decode CUDA-graph batch sizes up to this (default: --concurrency)")
    ap.add_argument("--baseline-seeds", choices=("disjoint", "same"), default="disjoint",
                    help="baseline seeds N+1..2N (independent samples, default) or 1..N like detspec (paired)")
    ap.add_argument("--pair", choices=PAIRS, default="weighted",
                    help="weighted: the tiny pair with DETSPEC_EAGLE (default); qwen3_eagle3: a Qwen3 target with a "
                    "reduced-vocabulary EAGLE3 draft under DETSPEC_EAGLE3; weighted_token_map: the weighted pair's "
                    "EAGLE draft reduced to 512 hot tokens by --speculative-token-map under DETSPEC_EAGLE")
    ap.add_argument("--models-root", type=Path, default=None,
                    help="tiny-model cache root (default $DETSPEC_TINY_MODELS_ROOT, else the user cache)")
    ap.add_argument("--start-timeout", type=float, default=420.0, help="seconds to wait for each server (default 420)")
    ap.add_argument("--request-timeout", type=float, default=300.0, help="seconds per /generate POST (default 300)")
    args = ap.parse_args(argv)
    if args.n is not None and args.quick:
        ap.error("--quick sets --n 1000; give one of them")
    args.n = QUICK_N if args.quick else (DEFAULT_N if args.n is None else args.n)
    for name, low in (("n", 2), ("max_new_tokens", 2), ("concurrency", 1), ("batch", 1)):
        if getattr(args, name) < low:
            ap.error(f"--{name.replace('_', '-')} must be at least {low}")
    if args.batch > args.concurrency:
        ap.error(f"--batch ({args.batch}) cannot exceed --concurrency ({args.concurrency}): "
                 "one POST is one batch in flight")
    if args.cuda_graph_max_bs is None:
        args.cuda_graph_max_bs = args.concurrency
    if args.cuda_graph_max_bs < 1:
        ap.error("--cuda-graph-max-bs must be at least 1")
    if not args.prompt.strip():
        ap.error("--prompt must not be empty")
    return args


def role_seeds(role: str, n: int, baseline_seeds: str) -> List[int]:
    """Seeds of a server's ``n`` requests: 1..n, except a disjoint baseline's n+1..2n."""
    first = n + 1 if role == "baseline" and baseline_seeds == "disjoint" else 1
    return list(range(first, first + n))


def batch_payload(prompt: str, seeds: Sequence[int], max_new_tokens: int) -> dict:
    """One ``/generate`` batch: a list of texts and a list of sampling params, one per seed."""
    params = [
        {"temperature": TEMPERATURE, "max_new_tokens": max_new_tokens, "ignore_eos": True, "sampling_seed": int(s)}
        for s in seeds
    ]
    return {"text": [prompt] * len(seeds), "sampling_params": params}


@dataclass
class Collected:
    """A server's answers, in seed order."""

    tokens: List[List[int]] = field(default_factory=list)
    completion_tokens: int = 0
    verify_steps: int = 0

    @property
    def accept_length(self) -> Optional[float]:
        """Tokens per verify step over every request (SGLang's accept length); None without speculative decoding."""
        return self.completion_tokens / self.verify_steps if self.verify_steps else None


def parse_batch_response(resp, seeds: Sequence[int], max_new_tokens: int) -> Collected:
    """The token ids and counters of one batch's answers; refuses anything but ``len(seeds)`` answers of exactly
    ``max_new_tokens`` ids each (``ignore_eos`` makes every sequence full length)."""
    if not isinstance(resp, list) or len(resp) != len(seeds):
        got = f"{len(resp)} answers" if isinstance(resp, list) else type(resp).__name__
        raise ValueError(f"/generate batch of {len(seeds)} requests returned {got}")
    out = Collected()
    for seed, answer in zip(seeds, resp):
        ids = answer.get("output_ids") if isinstance(answer, dict) else None
        if ids is None:
            shown = sorted(answer)[:8] if isinstance(answer, dict) else answer
            raise ValueError(f"seed {seed}: the answer has no output_ids ({shown!r})")
        if len(ids) != max_new_tokens:
            raise ValueError(f"seed {seed}: {len(ids)} output ids, expected {max_new_tokens} (ignore_eos was set)")
        meta = answer.get("meta_info", {})
        out.tokens.append([int(t) for t in ids])
        out.completion_tokens += int(meta.get("completion_tokens") or len(ids))
        out.verify_steps += int(meta.get("spec_verify_ct") or 0)
    return out


def merge(parts: Sequence[Collected]) -> Collected:
    merged = Collected()
    for p in parts:
        merged.tokens += p.tokens
        merged.completion_tokens += p.completion_tokens
        merged.verify_steps += p.verify_steps
    return merged


def all_drafts_accept_length(max_new_tokens: int, steps_plus_one: int) -> float:
    """The accept length (completion tokens / verify steps) when every draft is accepted: the first token comes
    from the prefill, each verify step commits ``steps + 1`` and the last one is cut at ``max_new_tokens``."""
    return max_new_tokens / math.ceil((max_new_tokens - 1) / steps_plus_one)


def _fmt_p(p: float) -> str:
    if p == 0:
        return "< 1e-300"  # below the smallest double scipy's survival function returns
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def _fmt_accept(a: Optional[float]) -> str:
    return "n/a" if a is None else f"{a:.2f}"


def verdict(role: str, combined_p: float, pass_p: float, reject_p: float) -> tuple:
    """``(ok, text)``: the product must pass (p > pass_p), the control must be rejected (p < reject_p)."""
    if role == "control":
        ok = combined_p < reject_p
        return ok, f"rejected (p < {reject_p:g}), as it must be" if ok else f"NOT rejected (p >= {reject_p:g}): no power"
    ok = combined_p > pass_p
    return ok, f"PASS (p > {pass_p:g})" if ok else f"FAIL (p <= {pass_p:g})"


def format_table(rows: Sequence[dict]) -> str:
    """The markdown table; each row: label, n, positions_p, transitions_p, combined_p, accept_length, verdict."""
    lines = [
        "| comparison | N | per-position min p (Bonferroni) | pooled-transition p | combined p | accept length | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['label']} | {r['n']:,} | {_fmt_p(r['positions_p'])} | {_fmt_p(r['transitions_p'])} | "
            f"{_fmt_p(r['combined_p'])} | {_fmt_accept(r['accept_length'])} | {r['verdict']} |"
        )
    return "\n".join(lines)


def position_zero_note(first_tokens_equal: Optional[bool], baseline_seeds: str, p_value: float) -> str:
    if baseline_seeds == "same":
        state = "identical in every pair" if first_tokens_equal else "NOT identical in every pair (unexpected)"
        return (f"position 0 (the prefill sample, same target sampler and seed in both servers): {state}; "
                "not counted as evidence")
    return (f"position 0 (the prefill sample, drawn by the same target sampler in both servers): chi-square p = "
            f"{_fmt_p(p_value)}; not counted as evidence")


# ---------------------------------------------------------------------------------------------------------------
# GPU part (imports SGLang-side helpers lazily, so --help and the tests above run anywhere)


GRAPH_BS_FLAG = "--cuda-graph-max-bs-decode"
# The tiny pair's flags cap running requests at 32 (tiny_servers); the check keeps --concurrency running.
RUNNING_FLAG = "--max-running-requests"


def with_flag(argv: List[str], flag: str, value: str) -> List[str]:
    """``argv`` with every value of ``flag`` replaced by ``value`` (appended if absent)."""
    argv = list(argv)
    at = [i for i, a in enumerate(argv) if a == flag]
    for i in at:
        argv[i + 1] = value
    return argv if at else argv + [flag, value]


def server_specs(target, draft, args, token_map: Optional[Path] = None) -> Dict[str, server_process.ServerSpec]:
    """The three configurations (module docstring) of ``args.pair``, built from the E2E servers' common arguments;
    ``token_map``: the ``--speculative-token-map`` file, given exactly for ``--pair weighted_token_map``."""
    pair = getattr(args, "pair", "weighted")
    if (pair == TOKEN_MAP_PAIR) != (token_map is not None):
        raise ValueError(f"--pair {pair}: a token map is given for --pair {TOKEN_MAP_PAIR} and only for it "
                         f"(got {token_map!r})")
    base = with_flag(tiny_servers.common_args(target, served_pair(pair)), GRAPH_BS_FLAG, str(args.cuda_graph_max_bs))
    base = with_flag(base, RUNNING_FLAG, str(args.concurrency))
    det = ["--enable-deterministic-inference"]
    detspec = base + tiny_servers.eagle_args(draft, pair_algorithm(pair), deterministic=True)
    if token_map is not None:
        detspec += ["--speculative-token-map", str(token_map)]
    control_path = os.pathsep.join([str(CONTROL_DIR), *filter(None, [os.environ.get("PYTHONPATH")])])
    spec = server_process.ServerSpec
    return {
        "detspec": spec("detspec", detspec),
        "baseline": spec("baseline", base + det),
        "control": spec("control", detspec, env={"PYTHONPATH": control_path}),
    }


def pair_models(pair: str, root: Optional[Path]) -> tuple:
    """``(target, draft, token map or None)`` of ``pair``, built once and cached."""
    if pair == "qwen3_eagle3":
        from sglang_detspec.models.family_pairs import ensure_family_pair

        built = ensure_family_pair(root, pair)
        return built.target, built.draft, None
    from sglang_detspec.models.tiny_models import ensure_tiny_models

    models = ensure_tiny_models(root, pair="weighted")
    token_map = None
    if pair == TOKEN_MAP_PAIR:
        from sglang_detspec.models.token_map import ensure_weighted_token_map

        token_map = ensure_weighted_token_map(root)
    return models.target, models.eagle_draft, token_map


class Progress:
    """A plain line every few seconds (it goes to log files, so no carriage returns)."""

    def __init__(self, totals: Dict[str, int], every: float = 5.0):
        self.totals, self.done, self.every = totals, {k: 0 for k in totals}, every
        self.t0 = time.time()
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def add(self, role: str, count: int) -> None:
        with self._lock:
            self.done[role] += count

    def line(self) -> str:
        with self._lock:
            parts = [f"{r} {self.done[r]:,}/{self.totals[r]:,}" for r in self.totals]
        return f"[lossless] {time.time() - self.t0:5.0f} s  " + ", ".join(parts)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            print(self.line(), file=sys.stderr, flush=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        print(self.line(), file=sys.stderr, flush=True)


def collect(server, role: str, seeds: List[int], args, progress: Progress) -> Collected:
    chunks = [seeds[i : i + args.batch] for i in range(0, len(seeds), args.batch)]

    def send(chunk):
        resp = server_process.post_json(server.base_url, "/generate", batch_payload(args.prompt, chunk, args.max_new_tokens),
                                 timeout=args.request_timeout)
        part = parse_batch_response(resp, chunk, args.max_new_tokens)
        progress.add(role, len(chunk))
        return part

    with ThreadPoolExecutor(max_workers=max(1, args.concurrency // args.batch)) as pool:
        return merge(list(pool.map(send, chunks)))  # map keeps seed order


def run(args) -> int:
    import numpy as np

    from sglang_detspec.checker import two_sample

    reason = server_process.launch_skip_reason()
    if reason:
        print(f"lossless_check: {reason}", file=sys.stderr)
        return 2
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    env_root = os.environ.get("DETSPEC_TINY_MODELS_ROOT")
    root = args.models_root or (Path(env_root) if env_root else None)
    target, draft, token_map = pair_models(args.pair, root)
    specs = server_specs(target, draft, args, token_map=token_map)
    servers, port = {}, 32000  # apart from the E2E tests' 31000+
    t_start = time.time()
    try:
        for role in ROLES:
            port = server_process.free_port(port)
            # server_pids.txt: a wrapper killed by a time limit can still end exactly these servers (kill -- -PID).
            servers[role] = server_process.Server(specs[role], port, out / f"server-{role}.log",
                                                  pid_file=out / "server_pids.txt")
            servers[role].start()
            port += 200
        for role in ROLES:
            servers[role].wait_ready(args.start_timeout)
        startup_s = round(time.time() - t_start, 1)
        print(f"[lossless] 3 servers ready after {startup_s} s; sending {args.n:,} requests to each",
              file=sys.stderr, flush=True)
        seeds = {role: role_seeds(role, args.n, args.baseline_seeds) for role in ROLES}
        t_gen = time.time()
        with Progress({r: args.n for r in ROLES}) as progress, ThreadPoolExecutor(max_workers=len(ROLES)) as pool:
            futures = {r: pool.submit(collect, servers[r], r, seeds[r], args, progress) for r in ROLES}
            got = {r: f.result() for r, f in futures.items()}
        generate_s = round(time.time() - t_gen, 1)
    except (server_process.ServerStartError, server_process.HTTPStatusError, OSError, ValueError) as e:
        print(f"lossless_check: {type(e).__name__}: {e}", file=sys.stderr)
        error = {"error": f"{type(e).__name__}: {e}", "pass": False}
        (out / "lossless.json").write_text(json.dumps(error, indent=2) + "\n")
        return 2
    finally:
        for srv in servers.values():
            srv.stop()

    tokens = {r: np.asarray(got[r].tokens, dtype=np.int64) for r in ROLES}
    np.savez_compressed(out / "tokens.npz", **tokens, **{f"{r}_seeds": np.asarray(seeds[r]) for r in ROLES})
    rows, comparisons, ok_all = [], {}, True
    labels = LABELS if args.pair == "weighted" else dict(
        LABELS, detspec=f"{pair_algorithm(args.pair)} ({args.pair}, reduced vocabulary) vs non-speculative")
    for role in ("detspec", "control"):
        cmp = two_sample.compare_token_sequences(tokens[role], tokens["baseline"])
        p0 = two_sample.chi2_homogeneity(tokens[role][:, 0], tokens["baseline"][:, 0]).p_value
        ok, text = verdict(role, cmp.combined_p, two_sample.LOSSLESS_P, two_sample.REJECT_P)
        ok_all &= ok
        note = position_zero_note(cmp.excluded_positions_identical[0], args.baseline_seeds, p0)
        comparisons[role] = dict(cmp.to_dict(), position0_p=p0, position0_note=note, verdict=text, ok=ok)
        rows.append({"label": labels[role], "n": args.n, "positions_p": cmp.positions_p, "transitions_p": cmp.transitions_p,
                     "combined_p": cmp.combined_p, "accept_length": got[role].accept_length, "verdict": text})
    table = format_table(rows)
    steps_plus_one = int(tiny_servers.SPEC_SHAPE[tiny_servers.SPEC_SHAPE.index("--speculative-num-steps") + 1]) + 1
    control_accept = got["control"].accept_length
    all_accepted = all_drafts_accept_length(args.max_new_tokens, steps_plus_one)
    notes = [comparisons["detspec"]["position0_note"],
             f"positions 1-{args.max_new_tokens - 1} tested; seeds: detspec and control 1..{args.n}, baseline "
             f"{seeds['baseline'][0]}..{seeds['baseline'][-1]}; prompt {args.prompt!r}, temperature {TEMPERATURE}, "
             f"{args.max_new_tokens} new tokens, concurrency {args.concurrency}"]
    if control_accept is None or control_accept < all_accepted - 0.01:
        notes.append(f"WARNING: the control's accept length is {_fmt_accept(control_accept)}, not {all_accepted:.2f} "
                     "(every draft accepted): the accept-all sitecustomize did not take effect (see server-control.log)")
    report = {
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "sglang": server_process.sglang_version(),
        "servers": {r: {"command": servers[r].command(), "startup_s": servers[r].startup_s,
                        "accept_length": got[r].accept_length, "completion_tokens": got[r].completion_tokens,
                        "verify_steps": got[r].verify_steps, "seeds": [seeds[r][0], seeds[r][-1]]} for r in ROLES},
        "timings_s": {"startup_all": startup_s, "generate_all": generate_s, "total": round(time.time() - t_start, 1)},
        "comparisons": comparisons,
        "table": table,
        "notes": notes,
        "pass": ok_all,
    }
    (out / "lossless.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "lossless.md").write_text(table + "\n\n" + "\n".join(f"* {n}" for n in notes) + "\n")
    print(table)
    print()
    for n in notes:
        print(f"* {n}")
    print(f"\nservers ready in {startup_s} s, {3 * args.n:,} sequences in {generate_s} s; JSON: {out / 'lossless.json'}")
    print(f"PASS: {pair_algorithm(args.pair)} matches the non-speculative server and the broken control is rejected"
          if ok_all
          else "FAIL: see the verdict column")
    return 0 if ok_all else 1


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)

    def terminate(signum, _frame):
        raise SystemExit(128 + signum)  # unwinds through run()'s finally, which stops the servers

    signal.signal(signal.SIGTERM, terminate)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
