"""Reproducible across cards (issue 34, item 6): record seeded answers on one GPU, compare them on another.

    python scripts/cross_card.py record --out h100.json [--algorithms DETSPEC_EAGLE,DETSPEC_EAGLE_INVARIANT]
                                        [--graphs on|off] [--compare-with h200.json]
    python scripts/cross_card.py compare h100.json h200.json
    python scripts/cross_card.py logprob-gap gap.json      # a file recorded with NONE among --algorithms

``record`` starts, one at a time, an ``sglang.launch_server`` per algorithm on the embedded weighted tiny pair
(``--enable-deterministic-inference``, the E2E servers' arguments from ``models.tiny_servers``, decode CUDA graphs up
to batch 32 unless ``--graphs off``), sends the fixed request set (:func:`request_set`: prompts x sampling variants x
seeds x n in {1, 4}, ``return_logprob``, 48 new tokens, ``ignore_eos``) first one request at a time, then all at
once, and writes the results file (:mod:`.cross_card_results`) with the device name and the software versions.
``NONE`` (the target alone, no speculation, the plugin's token-id sampler: the invariant mode's reference) may be
added to ``--algorithms``: when the speculative algorithms differ across cards, it tells whether the target's forward
already does, and ``logprob-gap FILE`` (:mod:`.logprob_gap`) measures each algorithm's logprobs against it.

Exit codes: 0 same (``compare``) / recorded with one output per request in both sending modes (``record``); 1
answers differ (between the files, or between the sending modes on this card: the file is still written); 2 bad
input, a malformed or incomparable file, a server that did not start or a request that failed or timed out.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from sglang_detspec import server_process
from sglang_detspec.checker import cross_card_results as results_file
from sglang_detspec.checker import logprob_gap
from sglang_detspec.checker.cross_card_results import EXIT_DIFFER, EXIT_REFUSED, EXIT_SAME, MODES, ResultsFileError
from sglang_detspec.models import tiny_servers

ALGORITHMS = ("DETSPEC_EAGLE", "DETSPEC_EAGLE_INVARIANT", "NONE")
DEFAULT_ALGORITHMS = "DETSPEC_EAGLE,DETSPEC_EAGLE_INVARIANT"
MAX_NEW_TOKENS = 48
PROMPTS = (
    "The river ran past the old mill, where the miller kept a ledger of",
    "Once the committee had read the report, its chair asked whether",
    "In the third chapter the author turns from the harbour to",
)
SEEDS = (7, 123456789)
#: Sampling variants: plain sampling at two temperatures and the truncated paths (top-p, top-k, both).
VARIANTS = (
    {"temperature": 1.0},
    {"temperature": 0.7},
    {"temperature": 1.0, "top_p": 0.9},
    {"temperature": 0.7, "top_k": 20},
    {"temperature": 1.0, "top_p": 0.8, "top_k": 50},
)
SAMPLES = (1, 4)
#: Decode batches up to the tiny pair's running-request cap (32) replay CUDA graphs, as the invariant E2E servers do.
GRAPH_MAX_BS = ["--cuda-graph-max-bs-decode", "32"]
LOG = "[cross-card]"


def request_set() -> List[Dict[str, Any]]:
    """The fixed requests: every prompt x variant x seed x n, each with a readable unique id."""
    out = []
    for p, prompt in enumerate(PROMPTS):
        for v, variant in enumerate(VARIANTS):
            for seed in SEEDS:
                for n in SAMPLES:
                    params = dict(variant, max_new_tokens=MAX_NEW_TOKENS, ignore_eos=True, sampling_seed=seed, n=n)
                    out.append({"id": f"p{p}-v{v}-s{seed}-n{n}", "text": prompt, "sampling_params": params, "n": n})
    return out


def payload(request: Dict[str, Any]) -> Dict[str, Any]:
    return {"text": request["text"], "sampling_params": request["sampling_params"], "return_logprob": True}


def parse_answer(request: Dict[str, Any], resp: Any) -> List[Dict[str, Any]]:
    """One request's samples (n = 1: a JSON object; n > 1: a list of n objects) as result records."""
    answers = resp if isinstance(resp, list) else [resp]
    if len(answers) != request["n"]:
        raise ValueError(f"request {request['id']}: {len(answers)} answers, expected n = {request['n']}")
    try:
        return [results_file.sample_record(a, MAX_NEW_TOKENS) for a in answers]
    except ValueError as e:
        raise ValueError(f"request {request['id']}: {e}") from None


def parse_algorithms(text: str) -> List[str]:
    names = [a.strip() for a in text.split(",") if a.strip()]
    if not names:
        raise ValueError("--algorithms is empty; give a comma-separated list, e.g. " + DEFAULT_ALGORITHMS)
    unknown = [a for a in names if a not in ALGORITHMS]
    if unknown:
        raise ValueError(f"--algorithms: unknown {unknown[0]!r}; choose from {', '.join(ALGORITHMS)}")
    if len(set(names)) != len(names):
        raise ValueError("--algorithms names an algorithm twice")
    return names


#: The plugin's token-id sampler opt-in (integration/setup/token_id_sampler_opt_in.py), set for ``NONE``'s server.
TOKEN_ID_SAMPLER_ENV = "SGLANG_DETSPEC_TOKEN_ID_SAMPLER"


def server_env(algorithm: str) -> Dict[str, str]:
    """Environment changes of one algorithm's server: ``NONE`` samples with the token-id sampler."""
    return {TOKEN_ID_SAMPLER_ENV: "1"} if algorithm == "NONE" else {}


def server_args(target: Path, draft: Path, algorithm: str, graphs: str) -> List[str]:
    """``launch_server`` arguments (without ``--port``) for one algorithm on the tiny pair."""
    args = tiny_servers.common_args(target, "weighted") + GRAPH_MAX_BS
    if algorithm == "NONE":
        args += ["--enable-deterministic-inference"]
    else:
        args += tiny_servers.eagle_args(draft, algorithm, deterministic=True)
    return args + (tiny_servers.GRAPHS_OFF if graphs == "off" else [])


def _dir_digest(path: Path) -> str:
    """sha256 over a model directory's file names and bytes: the two cards must serve the same weights."""
    h = hashlib.sha256()
    for f in sorted(p for p in Path(path).rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode() + b"\0")
        h.update(f.read_bytes())
    return h.hexdigest()


def _version(dist: str) -> Optional[str]:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def plugin_commit() -> Optional[str]:
    """The plugin checkout's ``git`` commit (``+dirty`` with local changes), or None outside a checkout."""
    repo = Path(__file__).resolve().parents[2]
    if not (repo / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def environment() -> Dict[str, Any]:
    import torch

    return {
        "device": torch.cuda.get_device_name(0),
        "capability": list(torch.cuda.get_device_capability(0)),
        "cuda": torch.version.cuda,
        "sglang": server_process.sglang_version(),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "flashinfer": _version("flashinfer-python"),
        "sglang_detspec": _version("sglang-detspec"),
        "plugin_commit": plugin_commit(),
        "python": platform.python_version(),
    }


def _send(server, request, timeout: float) -> List[Dict[str, Any]]:
    return parse_answer(request, server_process.post_json(server.base_url, "/generate", payload(request), timeout=timeout))


def collect(server, requests: List[Dict[str, Any]], algorithm: str, timeout: float) -> Dict[str, list]:
    """Every request one at a time, then all of them in flight at once (answers kept in request order)."""
    out = {}
    t0 = time.time()
    sequential = []
    for i, req in enumerate(requests, 1):
        sequential.append(_send(server, req, timeout))
        if i % 10 == 0 or i == len(requests):
            print(f"{LOG} {algorithm}: {i}/{len(requests)} one at a time ({time.time() - t0:.0f} s)", flush=True)
    out["sequential"] = sequential
    t0 = time.time()
    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        out["concurrent"] = list(pool.map(lambda r: _send(server, r, timeout), requests))
    print(f"{LOG} {algorithm}: {len(requests)} at once ({time.time() - t0:.0f} s)", flush=True)
    return out


def modes_differ(requests, per_alg: Dict[str, list], algorithm: str) -> List[results_file.Difference]:
    """Requests whose answers differ between the two sending modes on this card (batch invariance)."""
    diffs = []
    for req, a, b in zip(requests, per_alg["sequential"], per_alg["concurrent"]):
        d = results_file.first_difference(algorithm, "sequential vs concurrent", req["id"], a, b)
        if d is not None:
            diffs.append(d)
    return diffs


def record(args) -> int:
    reason = server_process.launch_skip_reason()
    if reason:
        print(f"cross_card record: {reason}", file=sys.stderr)
        return EXIT_REFUSED
    from sglang_detspec.models.tiny_models import ensure_tiny_models

    env_root = os.environ.get("DETSPEC_TINY_MODELS_ROOT")
    models = ensure_tiny_models(args.models_root or (Path(env_root) if env_root else None), pair="weighted")
    requests = request_set()
    data = {
        "format": results_file.FORMAT, "version": results_file.FORMAT_VERSION,
        "environment": dict(environment(), note=args.note),
        "settings": {"algorithms": args.algorithms, "graphs": args.graphs, "max_new_tokens": MAX_NEW_TOKENS,
                     "models": {"target": _dir_digest(models.target), "draft": _dir_digest(models.eagle_draft)}},
        "requests": requests, "servers": {}, "results": {}, "batch_invariance": {},
    }
    print(f"{LOG} {data['environment']['device']}: {len(args.algorithms)} server(s), {len(requests)} requests "
          f"each, sent one at a time and then at once", flush=True)
    log_dir = args.out.resolve().parent / (args.out.stem + "-logs")
    port = 33000  # apart from the E2E tests' 31000+ and lossless_check's 32000+
    for alg in args.algorithms:
        port = server_process.free_port(port)
        spec = server_process.ServerSpec(alg.lower(), server_args(models.target, models.eagle_draft, alg, args.graphs),
                                         env=server_env(alg))
        server = server_process.Server(spec, port, log_dir / f"server-{alg.lower()}.log")
        port += 200
        try:
            server.start()
            server.wait_ready(args.start_timeout)
            data["results"][alg] = collect(server, requests, alg, args.request_timeout)
            data["servers"][alg] = {"command": server.command(), "startup_s": server.startup_s}
        except (server_process.ServerStartError, server_process.HTTPStatusError, OSError, ValueError) as e:
            print(f"cross_card record: {alg}: {type(e).__name__}: {e}", file=sys.stderr)
            return EXIT_REFUSED
        finally:
            server.stop()
        diffs = modes_differ(requests, data["results"][alg], alg)
        data["batch_invariance"][alg] = {"differing_requests": [d.request for d in diffs]}
        print(f"{LOG} {alg}: " + ("one output per request in both sending modes" if not diffs else
              f"{len(diffs)} request(s) differ between sending modes; first: {diffs[0].describe()}"), flush=True)
    results_file.validate(data, "the recorded results")  # what compare will demand of this file
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(args.out)
    print(f"{LOG} wrote {args.out}", flush=True)
    code = EXIT_DIFFER if any(v["differing_requests"] for v in data["batch_invariance"].values()) else EXIT_SAME
    if args.compare_with is not None:
        code = max(code, compare(args.out, args.compare_with))
    return code


def compare(path_a: Path, path_b: Path) -> int:
    try:
        code, text = results_file.compare_files(path_a, path_b)
    except ResultsFileError as e:
        print(f"cross_card compare: {e}", file=sys.stderr)
        return EXIT_REFUSED
    print(text)
    print("SAME: bit-identical tokens and logprobs" if code == EXIT_SAME else "DIFFERENT: see above")
    return code


def logprob_gap_report(path: Path) -> int:
    try:
        data = results_file.load(path)
        gaps = logprob_gap.logprob_gaps(data)
    except ResultsFileError as e:
        print(f"cross_card logprob-gap: {e}", file=sys.stderr)
        return EXIT_REFUSED
    print(logprob_gap.format_gaps(gaps, data["environment"].get("device", "an unnamed device")))
    return EXIT_SAME


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="cross_card.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="run the request set on this GPU and write a results file",
                         description="Needs a CUDA GPU and sglang; about a minute per algorithm plus server starts.")
    rec.add_argument("--out", type=Path, required=True, help="results file to write (JSON)")
    rec.add_argument("--algorithms", default=DEFAULT_ALGORITHMS,
                     help=f"comma-separated, from {', '.join(ALGORITHMS)} (default {DEFAULT_ALGORITHMS})")
    rec.add_argument("--graphs", choices=("on", "off"), default="on", help="CUDA graphs (default on)")
    rec.add_argument("--compare-with", type=Path, default=None, help="a results file from another card to compare with")
    rec.add_argument("--note", default=None,
                     help="free text kept in the file and shown by compare, e.g. the plugin's commit where the "
                     "checkout has no .git")
    rec.add_argument("--models-root", type=Path, default=None,
                     help="tiny-model cache root (default $DETSPEC_TINY_MODELS_ROOT, else the user cache)")
    rec.add_argument("--start-timeout", type=float, default=600.0, help="seconds to wait for each server (default 600)")
    rec.add_argument("--request-timeout", type=float, default=300.0, help="seconds per request (default 300)")
    cmp = sub.add_parser("compare", help="compare two results files bit for bit")
    cmp.add_argument("a", type=Path, help="results file A")
    cmp.add_argument("b", type=Path, help="results file B")
    gap = sub.add_parser("logprob-gap", help="each algorithm's token logprobs against NONE's in one results file",
                         description="Needs a file recorded with NONE among --algorithms; no GPU.")
    gap.add_argument("file", type=Path, help="results file")
    args = ap.parse_args(argv)
    if args.command == "record":
        try:
            args.algorithms = parse_algorithms(args.algorithms)
        except ValueError as e:
            rec.error(str(e))
        for flag in ("start_timeout", "request_timeout"):
            if not getattr(args, flag) > 0:
                rec.error(f"--{flag.replace('_', '-')} must be a positive number of seconds")
        if args.out.is_dir():
            rec.error(f"--out {args.out} is a directory; give a file name, e.g. {args.out / 'h100.json'}")
        if args.compare_with is not None:
            _check_compare_with(rec, args)
    return args


def _check_compare_with(parser: argparse.ArgumentParser, args) -> None:
    """Refuse a --compare-with file that is malformed or sent other requests before any GPU time is spent."""
    try:
        other = results_file.load(args.compare_with)
    except ResultsFileError as e:
        parser.error(f"--compare-with: {e}")
    if other["requests"] != request_set() or other["settings"]["algorithms"] != args.algorithms \
            or other["settings"]["graphs"] != args.graphs:
        parser.error(f"--compare-with {args.compare_with}: it was recorded with other requests, --algorithms or "
                     f"--graphs ({','.join(other['settings']['algorithms'])}, graphs {other['settings']['graphs']}); "
                     "record with the same ones")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.command == "compare":
        return compare(args.a, args.b)
    if args.command == "logprob-gap":
        return logprob_gap_report(args.file)

    def terminate(signum, _frame):
        raise SystemExit(128 + signum)  # unwinds through record()'s finally, which stops the server

    signal.signal(signal.SIGTERM, terminate)
    return record(args)


__all__ = ["main", "parse_args", "record", "compare", "logprob_gap_report", "request_set", "server_args", "server_env",
           "parse_answer", "MODES"]
