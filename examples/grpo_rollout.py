"""A GRPO-style rollout loop on ``sglang.Engine`` with a DETSPEC algorithm, on the embedded tiny weighted pair.

For each of ``--steps`` steps: ``--prompts`` prompts x ``--group-size`` samples (one request per prompt, ``n = G``,
``sampling_seed = group_seed(base, step, prompt)``; sample ``g`` is then drawn with ``rollout_seed(base, step,
prompt, g)``, see :mod:`sglang_detspec.rollouts`), tokens and logprobs collected; between steps a fake training
update (``update_weights_from_tensor``: a seeded perturbation of a few target tensors, ``original + delta(step)``).
At the end the weights of ``--rerun-step`` are restored and that step is generated again: it must reproduce the
recorded rollouts bit for bit (token ids and logprobs), else the exit code is 1.

    python examples/grpo_rollout.py                       # DETSPEC_EAGLE, 3 steps x 4 prompts x 4 samples
    python examples/grpo_rollout.py --algorithm DETSPEC_EAGLE_INVARIANT --out invariant.json
    python examples/grpo_rollout.py --dry-run             # the plan and every seed; no GPU, no SGLang import

Needs a CUDA GPU, SGLang 0.5.17 - 0.5.23 and the plugin installed (``pip install -e .``). The JSON written to
``--out`` holds the plan, every sample's token ids and logprob bit patterns, and the re-run's verdict.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import List, Optional

from sglang_detspec.rollouts import (
    MAX_BASE_SEED,
    TARGET_UPDATE_TENSORS,
    compare_records,
    group_requests,
    group_seed,
    rollout_record,
    rollout_seed,
    step_seed,
)
from sglang_detspec.rollouts import ROLLOUT_PROMPTS as PROMPTS  # the example sends the first --prompts

ALGORITHMS = ("DETSPEC_EAGLE", "DETSPEC_EAGLE_INVARIANT")
MAX_STEPS = 100
MAX_GROUP_SIZE = 32  # the tiny pair's servers run at most 32 requests at once
MAX_NEW_TOKENS = 1024


def _int_in(flag: str, low: int, high: int, example: int):
    def parse(text: str) -> int:
        try:
            value = int(text, 0)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} takes an integer, got {text!r}; e.g. {flag} {example}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{flag} must be in [{low}, {high}], got {value}; e.g. {flag} {example}")
        return value
    return parse


def _scale(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--update-scale takes a number, got {text!r}; e.g. --update-scale 0.05") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"--update-scale must be a finite number >= 0, got {text}; "
                                         "e.g. --update-scale 0.05 (0 keeps the weights)")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="grpo_rollout.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algorithm", default="DETSPEC_EAGLE", type=str.upper, choices=ALGORITHMS,
                   help="the speculative algorithm (default DETSPEC_EAGLE)")
    p.add_argument("--steps", type=_int_in("--steps", 1, MAX_STEPS, 3), default=3, help="training steps (default 3)")
    p.add_argument("--prompts", type=_int_in("--prompts", 1, len(PROMPTS), 4), default=4,
                   help=f"prompts per step, 1-{len(PROMPTS)} (default 4)")
    p.add_argument("--group-size", type=_int_in("--group-size", 1, MAX_GROUP_SIZE, 4), default=4,
                   help=f"samples per prompt (n), 1-{MAX_GROUP_SIZE} (default 4)")
    p.add_argument("--max-new-tokens", type=_int_in("--max-new-tokens", 1, MAX_NEW_TOKENS, 32), default=32,
                   help="tokens per sample (default 32)")
    p.add_argument("--base-seed", type=_int_in("--base-seed", 0, MAX_BASE_SEED, 1234), default=1234,
                   help="the seed every step, group and sample seed derives from (default 1234)")
    p.add_argument("--update-scale", type=_scale, default=0.05,
                   help="size of the fake update, in units of each tensor's standard deviation (default 0.05)")
    p.add_argument("--rerun-step", type=_int_in("--rerun-step", 0, MAX_STEPS - 1, 1), default=None,
                   help="the step re-generated at the end (default: 1, or 0 with --steps 1)")
    p.add_argument("--no-cuda-graph", action="store_true", help="run the engine without CUDA graphs")
    p.add_argument("--models-root", type=Path, default=None,
                   help="cache root of the tiny models (default ~/.cache/sglang-detspec)")
    p.add_argument("--out", type=Path, default=Path("grpo_rollout.json"), help="JSON results (default ./grpo_rollout.json)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and its seeds, start nothing")
    return p


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.rerun_step is None:
        args.rerun_step = min(1, args.steps - 1)
    elif args.rerun_step >= args.steps:
        parser.error(f"--rerun-step must name one of the {args.steps} steps (0 - {args.steps - 1}), got "
                     f"{args.rerun_step}; lower it or raise --steps")
    if args.out.exists() and args.out.is_dir():
        parser.error(f"--out {args.out} is a directory; give a file path, e.g. --out {args.out / 'grpo_rollout.json'}")
    return args


def plan(args: argparse.Namespace) -> dict:
    """Everything the run will do, seeds included: what ``--dry-run`` prints and the JSON's ``plan``."""
    prompts = list(PROMPTS[:args.prompts])
    steps = []
    for s in range(args.steps):
        steps.append({
            "step": s,
            "update_seed": None if s == 0 else step_seed(args.base_seed, s),
            "groups": [{"prompt": p, "group_seed": group_seed(args.base_seed, s, p),
                        "sample_seeds": [rollout_seed(args.base_seed, s, p, g) for g in range(args.group_size)]}
                       for p in range(len(prompts))],
        })
    return {"algorithm": args.algorithm, "steps": args.steps, "prompts": prompts, "group_size": args.group_size,
            "max_new_tokens": args.max_new_tokens, "base_seed": args.base_seed, "update_scale": args.update_scale,
            "update_tensors": list(TARGET_UPDATE_TENSORS), "rerun_step": args.rerun_step,
            "cuda_graph": not args.no_cuda_graph, "schedule": steps}


def print_plan(p: dict) -> None:
    print(f"GRPO rollout plan: {p['algorithm']}, {p['steps']} steps x {len(p['prompts'])} prompts x "
          f"{p['group_size']} samples, {p['max_new_tokens']} tokens each, base seed {p['base_seed']}, "
          f"CUDA graphs {'on' if p['cuda_graph'] else 'off'}")
    print(f"fake update between steps: {', '.join(p['update_tensors'])} += {p['update_scale']} * std * N(0, 1)")
    for step in p["schedule"]:
        upd = "original weights" if step["update_seed"] is None else f"weights seeded {step['update_seed']}"
        print(f"  step {step['step']} ({upd}):")
        for g in step["groups"]:
            print(f"    prompt {g['prompt']}: sampling_seed {g['group_seed']}, n {len(g['sample_seeds'])} -> samples "
                  f"seeded {', '.join(str(x) for x in g['sample_seeds'])}")
    print(f"  then: restore step {p['rerun_step']}'s weights and generate it again; it must match bit for bit")


def _weights_for(step: int, original: dict, args: argparse.Namespace) -> list:
    from sglang_detspec.rollouts import perturbed_tensors

    if step == 0:
        return list(original.items())
    return list(perturbed_tensors(original, TARGET_UPDATE_TENSORS, step_seed(args.base_seed, step),
                                  args.update_scale).items())


def _generate_step(engine, prompts: List[str], step: int, args: argparse.Namespace) -> list:
    texts, params = group_requests(prompts, args.base_seed, step, args.group_size, args.max_new_tokens)
    outs = engine.generate(prompt=texts, sampling_params=params, return_logprob=True)
    # SGLang answers n > 1 batches prompt-major: output p * G + g is sample g of prompt p.
    return [rollout_record(o) for o in outs]


def run(args: argparse.Namespace) -> dict:
    import torch

    import sglang

    from sglang_detspec.models.tiny_models import ensure_tiny_models
    from sglang_detspec.models.tiny_servers import GRAPHS_OFF, common_args, eagle_args
    from sglang_detspec.rollouts import engine_kwargs, tensors_of

    p = plan(args)
    timings = {}
    t0 = time.monotonic()
    models = ensure_tiny_models(args.models_root, pair="weighted")
    argv = (common_args(models.target, "weighted") + eagle_args(models.eagle_draft, args.algorithm, deterministic=True)
            + (GRAPHS_OFF if args.no_cuda_graph else []))
    kwargs = engine_kwargs(argv)
    kwargs["log_level"] = "warning"
    engine = sglang.Engine(**kwargs)
    timings["engine_start_s"] = time.monotonic() - t0
    device = "cuda" if torch.cuda.is_available() else None
    original = tensors_of(models.target, TARGET_UPDATE_TENSORS, device=device)
    steps = []
    try:
        t1 = time.monotonic()
        for s in range(args.steps):
            if s > 0:
                result = engine.update_weights_from_tensor(_weights_for(s, original, args))
                _check_update(result, f"step {s}")
            steps.append(_generate_step(engine, p["prompts"], s, args))
        timings["rollouts_s"] = time.monotonic() - t1
        t2 = time.monotonic()
        _check_update(engine.update_weights_from_tensor(_weights_for(args.rerun_step, original, args)),
                      f"restoring step {args.rerun_step}")
        rerun = _generate_step(engine, p["prompts"], args.rerun_step, args)
        timings["rerun_s"] = time.monotonic() - t2
    finally:
        engine.shutdown()
    timings["total_s"] = time.monotonic() - t0
    diffs = compare_records(steps[args.rerun_step], rerun)
    g = args.group_size
    summary = {
        "distinct_samples_per_group": [[len({tuple(r["output_ids"]) for r in recs[i * g:(i + 1) * g]})
                                        for i in range(len(p["prompts"]))] for recs in steps],
        "samples_changed_from_previous_step": [None] + [
            len(compare_records(a, b)["tokens"]) for a, b in zip(steps, steps[1:])],
        "rerun_step": args.rerun_step,
        "rerun_identical_tokens": not diffs["tokens"],
        "rerun_identical_logprobs": not diffs["logprobs"],
        "rerun_diffs": diffs,
    }
    return {"plan": p, "summary": summary, "timings_s": {k: round(v, 2) for k, v in timings.items()},
            "steps": steps, "rerun": rerun}


def _check_update(result, what: str) -> None:
    """``update_weights_from_tensor`` returns ``(success, message)`` on 0.5.17 - 0.5.23."""
    success, message = (result[0], result[1]) if isinstance(result, (tuple, list)) else (bool(result), str(result))
    if not success:
        raise RuntimeError(f"update_weights_from_tensor failed ({what}): {message}")


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    p = plan(args)
    if args.dry_run:
        print_plan(p)
        return 0
    results = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    s, t = results["summary"], results["timings_s"]
    print(f"{args.algorithm}: {args.steps} steps x {args.prompts} prompts x {args.group_size} samples; distinct "
          f"samples per group {s['distinct_samples_per_group']}; samples changed by each update "
          f"{s['samples_changed_from_previous_step'][1:]}")
    ok = s["rerun_identical_tokens"] and s["rerun_identical_logprobs"]
    print(f"re-run of step {args.rerun_step}: tokens {'identical' if s['rerun_identical_tokens'] else 'DIFFER'}, "
          f"logprobs {'bit-identical' if s['rerun_identical_logprobs'] else 'DIFFER'}")
    print(f"time: engine start {t['engine_start_s']} s, rollouts {t['rollouts_s']} s, re-run {t['rerun_s']} s, "
          f"total {t['total_s']} s; results in {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
