"""``sglang-detspec bench-serve``: an end-to-end serving benchmark on a mid-size synthetic pair.

Configurations (:data:`configs.CONFIGS`): no speculation (deterministic), built-in EAGLE + rejection sampling (not
deterministic), built-in deterministic EAGLE (no rejection sampling), DETSPEC_EAGLE; each driven by SGLang's own
``python -m sglang.bench_serving`` at every concurrency; output tokens/s, TTFT and inter-token latency p50 / p99,
accept length; CSV + JSON + PNG and DETSPEC's throughput ratios to each built-in configuration of the same run.

Modules: :mod:`.configs` (the table, the server and client command lines), :mod:`.results` (bench_serving's JSON,
ratios, outputs), :mod:`.runner` (the GPU run), :mod:`.step_timing` (the ``--breakdown`` hook). This module holds
the command's arguments; it and :mod:`.configs` / :mod:`.results` import neither torch nor SGLang.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Optional, Sequence

from sglang_detspec.bench.serving_bench import configs as _configs

__all__ = ["add_arguments", "settings_from_args", "shape_from_args", "run", "dry_run_text"]


def _type(parse):
    def convert(text: str):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return convert


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = _configs.BenchSettings()
    p.add_argument("--out", type=Path, required=True, help="directory for bench_serve.csv/.json/.png and the logs")
    p.add_argument("--configs", type=_type(_configs.parse_configs), default=None, metavar="NAMES",
                   help=f"comma-separated configurations (default: {','.join(d.configs)}; table: "
                        f"{', '.join(c.name for c in _configs.CONFIGS)})")
    p.add_argument("--concurrencies", type=_type(_configs.parse_concurrencies), default=None, metavar="C1,C2,...",
                   help=f"bench_serving --max-concurrency values, increasing (default: "
                        f"{','.join(map(str, d.concurrencies))})")
    p.add_argument("--num-prompts-per-concurrency", dest="prompts_per_concurrency", type=int, default=None,
                   help=f"requests per run = this x the concurrency, at least {_configs.MIN_PROMPTS} "
                        f"(default: {d.prompts_per_concurrency})")
    p.add_argument("--input-len", type=int, default=None, help=f"prompt tokens (default: {d.input_len})")
    p.add_argument("--output-len", type=int, default=None, help=f"generated tokens (default: {d.output_len})")
    p.add_argument("--temperature", type=float, default=None, help=f"sampling temperature (default: {d.temperature})")
    p.add_argument("--seed", type=int, default=None, help=f"bench_serving --seed, the same for every configuration "
                                                          f"(default: {d.seed})")
    p.add_argument("--quick", action="store_true",
                   help="concurrencies 1,32, 2 prompts per concurrency, 128 output tokens (explicit options win)")
    p.add_argument("--start", choices=("parallel", "sequential"), default="sequential",
                   help="start each server when its turn comes, alone on the GPU, or all side by side first (then "
                        "measure each alone; faster, but neighbours loading beside a server can change its KV sizing) "
                        "(default: %(default)s)")
    p.add_argument("--order", choices=_configs.ORDERS, default="sequential",
                   help="sequential: each configuration's calibration and repetitions in one block, its server "
                        "released before the next; interleaved (needs --start parallel): every configuration "
                        "calibrated, then --repetitions rounds of one repetition per configuration at every "
                        "concurrency, the round's first configuration rotating, and the ratios also paired "
                        "per round (a slow drift of the machine cancels in them) (default: %(default)s)")
    p.add_argument("--repetitions", type=int, default=None,
                   help=f"measured runs per configuration and concurrency, after one calibration run; the table "
                        f"gives the median and the min - max (default: {d.repetitions})")
    p.add_argument("--min-seconds", type=float, default=None,
                   help=f"measured traffic per point, summed over its repetitions: the calibration run's rate sizes "
                        f"each repetition (default: {d.min_seconds:g})")
    p.add_argument("--pair", choices=tuple(PAIRS), default="midsize",
                   help="the synthetic pair: midsize (hidden 2048, 16 layers, vocab 32,000, 0.9 B) or llama8b "
                        "(Llama-3-8B's shapes: hidden 4096, 32 layers, 32/8 heads, MLP 14336, vocab 128,256); "
                        "--hidden/--layers/--vocab change it (default: %(default)s)")
    p.add_argument("--breakdown", action="store_true",
                   help="one more DETSPEC_EAGLE server with a timing hook (graphs off, synchronised): mean ms per "
                        "decode step in draft forward, draft sampling, verify forward, verify sampling, bookkeeping")
    p.add_argument("--breakdown-concurrency", type=int, default=None,
                   help=f"concurrency of the breakdown run (default: {d.breakdown_concurrency})")
    p.add_argument("--hidden", type=int, default=None,
                   help=f"mid-size pair: hidden size, a multiple of {HIDDEN_STEP} (default 2048)")
    p.add_argument("--layers", type=int, default=None, help="mid-size pair: target layers, >= 1 (default 16)")
    from sglang_detspec.models.midsize_models import MAX_VOCAB, MIN_VOCAB  # no torch: cheap

    p.add_argument("--vocab", type=int, default=None,
                   help=f"mid-size pair: vocabulary, {MIN_VOCAB}..{MAX_VOCAB} (default 32000)")
    p.add_argument("--models-dir", type=Path, default=None,
                   help="where the mid-size pair is generated and cached (default: $TMPDIR/sglang-detspec-models)")
    p.add_argument("--start-timeout", type=float, default=420.0, help="seconds to wait for one server (default 420)")
    p.add_argument("--profile-steps", type=int, default=0, metavar="N",
                   help="instead of throughput: profile N decode steps of each configuration at each concurrency "
                        "(CUDA graphs off unless --profile-graphs, SGLang's profiler) and write op_profile.md / .json, the GPU time per step "
                        "by op category and by GEMM weight shape; --output-len defaults to "
                        f"max(2048, T + {PROFILE_TOKENS_PER_STEP} x N) there, T = --profile-after-tokens (default: 0, "
                        "off)")
    p.add_argument("--profile-after-tokens", type=int, default=None, metavar="T",
                   help="with --profile-steps: arm the profiler once every request has generated T tokens, so every "
                        "configuration is profiled at the same context (attention time grows with it; default: "
                        "PROFILE_AFTER_TOKENS, 512)")
    p.add_argument("--profile-graphs", action="store_true",
                   help="with --profile-steps: keep CUDA graphs on, to see the host's ms per step in each annotated "
                        "phase and the GPU's idle time of replayed steps (no GEMM-by-weight table then: no op "
                        "launches a replayed kernel)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the settings, every server and bench_serving command and the estimate; run nothing")


#: Profile mode's requests generate this many tokens per profiled step at least (``profile_runner`` checks it).
PROFILE_TOKENS_PER_STEP = 32
#: ``--profile-after-tokens``' default: a point is profiled once each request has generated this many tokens, so
#: every configuration is profiled at the same context.
PROFILE_AFTER_TOKENS = 512


def settings_from_args(args: argparse.Namespace) -> _configs.BenchSettings:
    values = dict(_configs.QUICK) if args.quick else {}
    steps = getattr(args, "profile_steps", 0) or 0
    if steps < 0:
        raise ValueError(f"--profile-steps must be >= 0 (0: measure throughput), got {steps}")
    if steps and getattr(args, "order", None) == "interleaved":
        raise ValueError("--order interleaved orders throughput repetitions; --profile-steps measures no throughput. "
                         "Drop one of them")
    if getattr(args, "profile_graphs", False) and not steps:
        raise ValueError("--profile-graphs changes how --profile-steps profiles; give --profile-steps N too")
    after = getattr(args, "profile_after_tokens", None)
    if after is not None and not steps:
        raise ValueError("--profile-after-tokens changes when --profile-steps profiles; give --profile-steps N too")
    if steps and args.output_len is None:
        values["output_len"] = max(2048, (PROFILE_AFTER_TOKENS if after is None else after)
                                   + PROFILE_TOKENS_PER_STEP * steps)
    for name in ("configs", "concurrencies", "prompts_per_concurrency", "input_len", "output_len", "temperature",
                 "seed", "breakdown_concurrency", "repetitions", "min_seconds"):
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    values["parallel_start"] = args.start == "parallel"
    values["order"] = getattr(args, "order", None) or "sequential"
    values["breakdown"] = bool(args.breakdown)
    return _configs.BenchSettings(**values).validate()


#: The benchmark's pairs: (hidden, layers, query heads, kv heads, MLP, vocab) of the target.
PAIRS = {"midsize": (2048, 16, 16, 8, 5632, 32000), "llama8b": (4096, 32, 32, 8, 14336, 128256)}
#: Attention heads of a resized pair are 128 wide, with half as many key-value heads: --hidden must give an
#: even number of whole heads.
HEAD_DIM = 128
HIDDEN_STEP = 2 * HEAD_DIM


def shape_from_args(args: argparse.Namespace):
    """The pair's shape from --pair, resized by --hidden / --layers / --vocab (None: the pair's own); a size no pair
    can have raises ValueError naming the flag and its valid range (never a silent default, never a one-head model)."""
    from sglang_detspec.models.midsize_models import MAX_VOCAB, MIN_VOCAB, MidsizeShape

    hidden, layers, heads, kv_heads, intermediate, vocab = PAIRS[getattr(args, "pair", None) or "midsize"]
    base = MidsizeShape(hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads, intermediate=intermediate,
                        vocab=vocab)
    if args.hidden is None and args.layers is None and args.vocab is None:
        return base
    hidden = base.hidden if args.hidden is None else args.hidden
    layers = base.layers if args.layers is None else args.layers
    vocab = base.vocab if args.vocab is None else args.vocab
    if hidden < HIDDEN_STEP or hidden % HIDDEN_STEP:
        raise ValueError(f"--hidden {hidden}: must be a positive multiple of {HIDDEN_STEP} (heads of {HEAD_DIM}, half "
                         f"as many key-value heads), e.g. {base.hidden}")
    if layers < 1:
        raise ValueError(f"--layers {layers}: the target needs at least 1 layer (default {base.layers})")
    if not MIN_VOCAB <= vocab <= MAX_VOCAB:
        raise ValueError(f"--vocab {vocab}: must be in {MIN_VOCAB}..{MAX_VOCAB} (the generated tokenizer's range; "
                         f"default {base.vocab})")
    heads = hidden // HEAD_DIM
    # The MLP keeps the default's 2.75 x hidden (rounded to 256).
    return MidsizeShape(hidden=hidden, layers=layers, heads=heads, kv_heads=heads // 2,
                        intermediate=(hidden * 11 // 4 + 255) // 256 * 256, vocab=vocab)


def dry_run_text(settings: _configs.BenchSettings, shape, out: Path, profile_steps: int = 0,
                 profile_graphs: bool = False, profile_after_tokens: Optional[int] = None) -> str:
    import shlex

    from sglang_detspec.models.midsize_models import cache_dir_name

    pair_dir = Path("MODELS_DIR") / cache_dir_name(shape)
    target, draft = pair_dir / "target", pair_dir / "eagle_draft"
    lines = [f"settings: {dataclasses.asdict(settings)}", f"mid-size pair: {shape}"]
    for name in settings.configs:
        c = _configs.config_by_name(name)
        argv = _configs.server_args(c, target, draft, settings, mem_fraction=0.5 if profile_steps else 0.2)
        if profile_steps and not profile_graphs:
            from sglang_detspec.bench.serving_bench.profile_runner import GRAPHS_OFF

            argv += GRAPHS_OFF
        lines.append(f"server {name} ({c.label}): python -m sglang.launch_server {shlex.join(argv)} --port PORT")
    if profile_steps:
        lines.append(f"profile: at each concurrency {','.join(map(str, settings.concurrencies))}, that many "
                     f"/generate requests of {settings.input_len} random ids and {settings.output_len} new tokens, "
                     f"then, once each has generated "
                     f"{PROFILE_AFTER_TOKENS if profile_after_tokens is None else profile_after_tokens} tokens, "
                     f"/start_profile for {profile_steps} decode batches (CPU + GPU, record_shapes; CUDA graphs "
                     f"{'on' if profile_graphs else 'off'})")
        return "\n".join(lines)
    for conc in settings.concurrencies:
        cmd = _configs.bench_serving_command("python", 0, target, settings, conc, out / f"NAME-c{conc}.jsonl")
        lines.append(f"client c={conc}: {shlex.join(cmd)}")
    if settings.order != "sequential":
        lines.append(_configs.order_description(settings))
    lines.append(f"estimated duration: ~{_configs.estimate_seconds(settings):.0f} s")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    settings, shape = settings_from_args(args), shape_from_args(args)
    if args.dry_run:
        print(dry_run_text(settings, shape, args.out, args.profile_steps, args.profile_graphs,
                           args.profile_after_tokens))
        return 0
    if args.profile_steps:
        from sglang_detspec.bench.serving_bench.profile_runner import run_profile

        return run_profile(settings, args.out, models_dir=args.models_dir, shape=shape, steps=args.profile_steps,
                           start_timeout=args.start_timeout, graphs=args.profile_graphs,
                           after_tokens=args.profile_after_tokens)
    from sglang_detspec.bench.serving_bench.runner import run_benchmark

    return run_benchmark(settings, args.out, models_dir=args.models_dir, shape=shape,
                         start_timeout=args.start_timeout)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="sglang-detspec bench-serve", description=__doc__.splitlines()[0])
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        return run(args)
    except ValueError as e:
        p.error(str(e))
    return 2  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
