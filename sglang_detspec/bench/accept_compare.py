"""Accept length of two or more speculative servers over many seeds, compared with a paired test (issue 32).

bench-serve reports each server's accept length from one run of ten or so prompts; the DETSPEC_EAGLE server's was
lower than built-in EAGLE + rejection sampling's on both synthetic pairs (docs/results.md), but one set of prompts
cannot say whether that is noise: on random-weight pairs a sequence's acceptance depends mostly on where its sampled
trajectory wanders. This measures it: ``--prompts`` random token-id prompts, each sent ``--seeds-per-prompt`` times
with distinct ``sampling_seed`` values (temperature ``--temperature``, ``ignore_eos``) to every server. Per prompt,
a server's accept length is its tokens per verify step summed over the prompt's seeds (SGLang's
``completion_tokens / spec_verify_ct``); the comparison is paired by prompt: the mean of the per-prompt differences,
its standard error and a two-sided normal-approximation p (many prompts), and the ratio of the pooled accept lengths.

Servers are the bench-serve configurations (:mod:`.serving_bench.configs`), with their flags, on the same generated
pair. Standard library only here; the GPU parts (pair generation, servers) are imported when run.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

__all__ = ["PromptTally", "paired_difference", "pooled_accept_length", "make_prompts", "request_payloads",
           "tally_responses", "format_report", "parse_args", "main"]

#: The sampling seed of (prompt p, repeat r) is ``base + p * SEED_STRIDE + r``: distinct while r < SEED_STRIDE.
SEED_STRIDE = 1_000_003


class PromptTally(dict):
    """``{prompt index: [tokens, verify steps]}`` summed over the prompt's seeds, for one server."""


def _accept(tokens: int, steps: int) -> Optional[float]:
    return tokens / steps if steps > 0 else None


def pooled_accept_length(tally: Mapping[int, Sequence[int]]) -> Optional[float]:
    """Tokens per verify step over every request of one server (SGLang's accept length)."""
    return _accept(sum(t for t, _ in tally.values()), sum(s for _, s in tally.values()))


def paired_difference(subject: Mapping[int, Sequence[int]], baseline: Mapping[int, Sequence[int]]) -> dict:
    """Per-prompt accept-length difference ``subject - baseline`` over the prompts both measured.

    Returns ``n`` (prompts), ``mean``, ``se`` (standard error of the mean; None below 2 prompts), ``z`` and the
    two-sided normal-approximation ``p`` (None when ``se`` is None or 0)."""
    diffs = []
    for p in sorted(set(subject) & set(baseline)):
        a, b = _accept(*subject[p]), _accept(*baseline[p])
        if a is not None and b is not None:
            diffs.append(a - b)
    n = len(diffs)
    if n == 0:
        return {"n": 0, "mean": None, "se": None, "z": None, "p": None}
    mean = sum(diffs) / n
    if n < 2:
        return {"n": n, "mean": mean, "se": None, "z": None, "p": None}
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1)
    se = math.sqrt(var / n)
    if se == 0:
        return {"n": n, "mean": mean, "se": 0.0, "z": None, "p": None}
    z = mean / se
    return {"n": n, "mean": mean, "se": se, "z": z, "p": math.erfc(abs(z) / math.sqrt(2))}


def make_prompts(count: int, length: int, vocab: int, seed: int) -> List[List[int]]:
    """``count`` prompts of ``length`` token ids drawn uniformly from ``[16, vocab)`` (the low ids hold the
    generated tokenizer's special tokens), the same for every server and every run with the same ``seed``."""
    if count < 2 or length < 1:
        raise ValueError(f"need at least 2 prompts of at least 1 token, got {count} x {length}")
    if vocab <= 16:
        raise ValueError(f"vocabulary {vocab} is too small for token-id prompts")
    rng = random.Random(seed)
    return [[rng.randrange(16, vocab) for _ in range(length)] for _ in range(count)]


def request_payloads(prompts: Sequence[Sequence[int]], seeds_per_prompt: int, *, output_len: int,
                     temperature: float, seed_base: int) -> List[Tuple[Tuple[int, int], dict]]:
    """One ``/generate`` payload per (prompt, repeat), keyed by ``(prompt index, seed)``."""
    if not 1 <= seeds_per_prompt < SEED_STRIDE:
        raise ValueError(f"--seeds-per-prompt must be in 1..{SEED_STRIDE - 1}, got {seeds_per_prompt}")
    out = []
    for p, ids in enumerate(prompts):
        for r in range(seeds_per_prompt):
            seed = seed_base + p * SEED_STRIDE + r
            out.append(((p, seed), {"input_ids": list(ids), "sampling_params": {
                "temperature": temperature, "max_new_tokens": output_len, "ignore_eos": True,
                "sampling_seed": seed}}))
    return out


def tally_responses(responses: Mapping[Tuple[int, int], Mapping]) -> PromptTally:
    """Sum each prompt's ``completion_tokens`` and ``spec_verify_ct`` (from ``meta_info``) over its seeds.

    A response without ``spec_verify_ct`` is an error (the server is not speculating): ValueError names it."""
    tally = PromptTally()
    for (p, seed), resp in sorted(responses.items()):
        meta = resp.get("meta_info") or {}
        steps, tokens = meta.get("spec_verify_ct"), meta.get("completion_tokens")
        if steps is None or tokens is None:
            raise ValueError(f"prompt {p} seed {seed}: the response has no spec_verify_ct / completion_tokens "
                             f"(meta_info keys: {sorted(meta)}); is the server speculating?")
        t = tally.setdefault(p, [0, 0])
        t[0] += int(tokens)
        t[1] += int(steps)
    return tally


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def format_report(tallies: Mapping[str, Mapping[int, Sequence[int]]], baseline: str, settings: Mapping) -> str:
    """The markdown table: each server's pooled accept length, and against ``baseline`` the paired difference."""
    lines = [f"Accept length over {settings['prompts']} prompts x {settings['seeds_per_prompt']} seeds, "
             f"{settings['output_len']} new tokens, T = {settings['temperature']:g}, pair {settings['pair']}",
             "", f"| server | accept length | ratio to {baseline} | paired difference (mean +- SE over prompts) | z | p |",
             "|---|---|---|---|---|---|"]
    base = pooled_accept_length(tallies[baseline])
    for name, tally in tallies.items():
        acc = pooled_accept_length(tally)
        if name == baseline:
            lines.append(f"| {name} | {_fmt(acc, '.3f')} | 1 | - | - | - |")
            continue
        d = paired_difference(tally, tallies[baseline])
        ratio = acc / base if acc is not None and base else None
        lines.append(f"| {name} | {_fmt(acc, '.3f')} | {_fmt(ratio, '.3f')} | {_fmt(d['mean'], '+.3f')} +- "
                     f"{_fmt(d['se'], '.3f')} ({d['n']} prompts) | {_fmt(d['z'], '.2f')} | {_fmt(d['p'], '.2g')} |")
    return "\n".join(lines) + "\n"


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    from sglang_detspec.bench.serving_bench import PAIRS
    from sglang_detspec.bench.serving_bench import configs as cfgs

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], prog="compare_accept_length.py")
    p.add_argument("--out", type=Path, required=True, help="directory for accept_compare.json / .md and server logs")
    p.add_argument("--configs", default="eagle_rs,detspec",
                   help="comma-separated bench-serve configurations, all speculative; the first is the baseline of "
                        "the paired differences (default: %(default)s)")
    p.add_argument("--pair", choices=tuple(PAIRS), default="midsize", help="the synthetic pair (default: %(default)s)")
    p.add_argument("--models-dir", type=Path, default=None, help="where the pair is generated and cached")
    p.add_argument("--prompts", type=int, default=32, help="distinct random prompts (default: %(default)s)")
    p.add_argument("--seeds-per-prompt", type=int, default=16, help="requests per prompt (default: %(default)s)")
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens (default: %(default)s)")
    p.add_argument("--output-len", type=int, default=128, help="new tokens per request (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=1.0, help="(default: %(default)s)")
    p.add_argument("--concurrency", type=int, default=32, help="requests in flight per server (default: %(default)s)")
    p.add_argument("--seed", type=int, default=7, help="prompt and sampling-seed base (default: %(default)s)")
    p.add_argument("--start", choices=("parallel", "sequential"), default="parallel",
                   help="all servers side by side (0.4 of the card each at most), or each alone in turn (0.5; the "
                        "8B-shaped pair needs this on an 80 GB card) (default: %(default)s)")
    p.add_argument("--start-timeout", type=float, default=420.0, help="seconds to wait for one server")
    args = p.parse_args(argv)
    try:
        cfgs.parse_configs(args.configs)  # known, available, not repeated
    except ValueError as e:
        p.error(f"--configs: {e}")
    args.configs = tuple(x.strip() for x in args.configs.split(",") if x.strip())  # the user's order: first = baseline
    for name in args.configs:
        if cfgs.config_by_name(name).algorithm is None:
            p.error(f"--configs: {name!r} does not speculate, so it has no accept length; give speculative ones "
                    f"(e.g. eagle_rs,detspec)")
    if len(args.configs) < 2:
        p.error("--configs: give at least two configurations to compare, e.g. eagle_rs,detspec")
    for flag in ("prompts", "seeds_per_prompt", "input_len", "output_len", "concurrency"):
        if getattr(args, flag) < (2 if flag == "prompts" else 1):
            p.error(f"--{flag.replace('_', '-')} must be at least {2 if flag == 'prompts' else 1}")
    if args.temperature <= 0:
        p.error("--temperature must be positive: at 0 every draft test is greedy, with no rejection sampling")
    return args


def _log(msg: str) -> None:
    print(f"[accept-compare] {msg}", file=sys.stderr, flush=True)


def _send_all(server, payloads, concurrency: int, label: str) -> Dict[Tuple[int, int], dict]:
    """Every payload to ``server``, ``concurrency`` in flight, with a progress line every 10%."""
    from sglang_detspec import server_process

    done: Dict[Tuple[int, int], dict] = {}
    step = max(1, len(payloads) // 10)
    t0 = time.time()

    def one(item):
        key, payload = item
        return key, server_process.post_json(server.base_url, "/generate", payload, timeout=600)

    with ThreadPoolExecutor(concurrency) as pool:
        for i, (key, resp) in enumerate(pool.map(one, payloads), 1):
            done[key] = resp
            if i % step == 0 or i == len(payloads):
                _log(f"{label}: {i}/{len(payloads)} requests in {time.time() - t0:.0f} s")
    return done


def run(args: argparse.Namespace) -> int:
    """Start the servers, send every request to each, write accept_compare.json / .md; 0 on success, 2 if a server
    or a request failed."""
    from sglang_detspec import server_process
    from sglang_detspec.bench.serving_bench import configs as cfgs
    from sglang_detspec.bench.serving_bench import shape_from_args
    from sglang_detspec.models import midsize_models

    reason = server_process.launch_skip_reason()
    if reason:
        _log(reason)
        return 2
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    args.hidden = args.layers = args.vocab = None
    shape = shape_from_args(args)
    pair = midsize_models.ensure_midsize_pair(args.models_dir or Path(tempfile.gettempdir()) / "sglang-detspec-models",
                                              shape)
    settings = cfgs.BenchSettings(configs=args.configs, concurrencies=(args.concurrency,), input_len=args.input_len,
                                  output_len=args.output_len, temperature=args.temperature).validate()
    parallel = args.start == "parallel"
    mem = cfgs.mem_fraction(len(args.configs), parallel)
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    specs = {n: server_process.ServerSpec(n, cfgs.server_args(cfgs.config_by_name(n), pair.target, pair.eagle_draft,
                                                              settings, mem_fraction=mem),
                                          env=dict(env, **dict(cfgs.config_by_name(n).env))) for n in args.configs}
    prompts = make_prompts(args.prompts, args.input_len, shape.vocab, args.seed)
    payloads = request_payloads(prompts, args.seeds_per_prompt, output_len=args.output_len,
                                temperature=args.temperature, seed_base=args.seed)
    pool = server_process.ServerPool(specs, log_dir=out, base_port=35000, parallel=parallel,
                                     timeout=args.start_timeout)
    pool.prelaunch = list(specs) if parallel else []
    tallies: Dict[str, PromptTally] = {}
    try:
        for name in args.configs:
            server = pool.get(name)
            server.wait_ready(args.start_timeout)
            tallies[name] = tally_responses(_send_all(server, payloads, args.concurrency, name))
            _log(f"{name}: accept length {pooled_accept_length(tallies[name]):.3f}")
            pool.release(name)
    except (server_process.ServerStartError, server_process.HTTPStatusError, OSError, ValueError) as e:
        _log(f"failed: {e}")
        return 2
    finally:
        pool.close()
    settings_doc = {"pair": args.pair, "shape": shape.tag(), "prompts": args.prompts,
                    "seeds_per_prompt": args.seeds_per_prompt, "input_len": args.input_len,
                    "output_len": args.output_len, "temperature": args.temperature,
                    "concurrency": args.concurrency, "seed": args.seed, "start": args.start,
                    "sglang": server_process.sglang_version()}
    report = format_report(tallies, args.configs[0], settings_doc)
    doc = {"settings": settings_doc, "baseline": args.configs[0],
           "accept_length": {n: pooled_accept_length(t) for n, t in tallies.items()},
           "paired_difference": {n: paired_difference(t, tallies[args.configs[0]]) for n, t in tallies.items()
                                 if n != args.configs[0]},
           "per_prompt": {n: {str(p): v for p, v in sorted(t.items())} for n, t in tallies.items()},
           "wall_s": round(time.time() - t_start, 1)}
    (out / "accept_compare.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out / "accept_compare.md").write_text(report)
    print(report)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run(parse_args(argv))
