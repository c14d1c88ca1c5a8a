#!/usr/bin/env python3
"""Offline (CPU) rejection-sampling accept length of the weighted tiny pair's EAGLE and EAGLE3 drafts, or of a
model-family pair's draft (``--pair qwen3_eagle3|qwen3_moe|deepseek_mtp``).

Usage: python scripts/estimate_tiny_acceptance.py [--pair weighted] [--root DIR] [--prompts 16] [--new-tokens 64]
                                                  [--steps 3] [--temperature 1.0] [--seed 0] [--json]
Builds the pair once (``ensure_tiny_models(pair="weighted")`` or ``ensure_family_pair``), then simulates speculative
decoding with ``--steps`` chained drafts per verify from ``--prompts`` random prompts (8 tokens each,
drawn from the seed) on the float32 CPU reference (``sglang_detspec.models.tiny_reference``, ``family_reference``). The accept length
is tokens per verify step (accepted drafts + 1), at most steps + 1, as SGLang reports it.

``--served-prompt TEXT --served-sequences N`` (weighted pair, EAGLE draft) instead simulates what a server reports
for N samples of ``--new-tokens`` (24 here unless given) from that one prompt, tokenized by the pair's tokenizer:
completion tokens over verify steps, the prefill's token included (``simulate_served_accept_length``). With the
prompt of ``scripts/lossless_check.py`` it is that GPU check's CPU expectation, e.g.
``--served-prompt "The river ran past the old mill, where the miller kept a ledger of" --served-sequences 3000``.
"""
import argparse
import json
import sys
from pathlib import Path

import torch

from sglang_detspec.models.family_config import FAMILY_PAIRS
from sglang_detspec.models.model_cache import tree_digest
from sglang_detspec.models.tiny_models import ensure_tiny_models
from sglang_detspec.models.tiny_reference import estimate_accept_length, load_reference, simulate_served_accept_length

PROMPT_TOKENS = 8
FIRST_ORDINARY_TOKEN = 3  # ids 0-2 are <s>, </s>, <unk>


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default="weighted", choices=("weighted",) + FAMILY_PAIRS,
                    help="the weighted tiny pair (EAGLE and EAGLE3) or a model-family pair (default: weighted)")
    ap.add_argument("--root", type=Path, default=None, help="cache root (default: user cache dir)")
    ap.add_argument("--prompts", type=int, default=16, help="number of random prompts (default 16)")
    ap.add_argument("--new-tokens", type=int, default=None,
                    help="tokens generated per prompt (default 64; 24 with --served-prompt)")
    ap.add_argument("--steps", type=int, default=3, help="draft steps per verify (default 3, as the e2e servers)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0, help="seed of the prompts and of the simulation")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--served-prompt", default=None, metavar="TEXT",
                    help="simulate a server's accept length for --served-sequences samples of this one prompt")
    ap.add_argument("--served-sequences", type=int, default=None, metavar="N",
                    help="samples of --served-prompt (needs it)")
    args = ap.parse_args(argv)
    if (args.served_prompt is None) != (args.served_sequences is None):
        ap.error("--served-prompt and --served-sequences go together (the prompt and how many samples of it)")
    if args.served_prompt is not None and args.pair != "weighted":
        ap.error(f"--served-prompt simulates the weighted pair's EAGLE draft (the lossless check's), not --pair {args.pair}")
    if args.served_sequences is not None and args.served_sequences < 1:
        ap.error("--served-sequences must be at least 1")
    if args.new_tokens is None:
        args.new_tokens = 64 if args.served_prompt is None else 24
    for name in ("prompts", "new_tokens", "steps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.temperature <= 0:
        ap.error("--temperature must be positive (greedy decoding needs no estimate: it accepts by argmax)")

    if args.pair == "weighted":
        models, kinds = ensure_tiny_models(args.root, pair="weighted"), ("eagle", "eagle3")
        ref = load_reference(models)
    else:
        from sglang_detspec.models.family_pairs import ensure_family_pair
        from sglang_detspec.models.family_reference import DRAFT_KIND, load_family_reference

        models, kinds = ensure_family_pair(args.root, args.pair), (DRAFT_KIND[args.pair],)
        ref = load_family_reference(models, args.pair)
    if args.served_prompt is not None:
        return _served(args, models, ref)
    gen = torch.Generator().manual_seed(args.seed)
    vocab = ref.cfg["vocab_size"]
    prompts = [torch.randint(FIRST_ORDINARY_TOKEN, vocab, (PROMPT_TOKENS,), generator=gen).tolist() for _ in range(args.prompts)]
    result = {"pair": args.pair, "models": str(models.target.parent), "digest": tree_digest(models.target.parent), "steps": args.steps,
              "temperature": args.temperature, "prompts": args.prompts, "new_tokens": args.new_tokens}
    for kind in kinds:
        est = estimate_accept_length(ref, kind, prompts=prompts, new_tokens=args.new_tokens, steps=args.steps,
                                     temperature=args.temperature, seed=args.seed)
        result[kind] = est._asdict()
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{args.pair} pair: {result['models']} (sha256 of the tree {result['digest'][:16]}...)")
        for kind in kinds:
            e = result[kind]
            print(f"{kind:7s} accept length {e['accept_length']:.3f} +- {e['accept_length_stderr']:.3f} of "
                  f"{args.steps + 1} over {e['verify_steps']} verify steps; "
                  f"first-draft acceptance sum min(p, q) = {e['first_draft_acceptance']:.3f}")
    return 0


def _served(args, models, ref) -> int:
    """``--served-prompt``: the accept length a server reports for the prompt's samples (module docstring)."""
    from transformers import AutoTokenizer

    prompt = AutoTokenizer.from_pretrained(str(models.target)).encode(args.served_prompt)
    est = simulate_served_accept_length(ref, "eagle", prompt=prompt, sequences=args.served_sequences,
                                        new_tokens=args.new_tokens, steps=args.steps,
                                        temperature=args.temperature, seed=args.seed)
    result = {"pair": args.pair, "models": str(models.target.parent), "digest": tree_digest(models.target.parent),
              "steps": args.steps, "temperature": args.temperature, "prompt": args.served_prompt,
              "prompt_tokens": len(prompt), "new_tokens": args.new_tokens, "eagle": est._asdict()}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"eagle served accept length {est.accept_length:.3f} (per sequence {est.per_sequence_mean:.3f} +- "
              f"{est.per_sequence_stderr:.3f}) over {est.sequences} samples of {args.new_tokens} tokens from a "
              f"{len(prompt)}-token prompt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
