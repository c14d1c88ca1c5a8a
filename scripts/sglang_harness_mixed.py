#!/usr/bin/env python3
"""A ``mixed`` mode for SGLang's determinism harness, which the supported releases no longer ship.

``python -m sglang.test.test_deterministic`` in sglang 0.5.17 and 0.5.23 offers ``--test-mode`` single, prefix,
radix_cache and p_vs_d only; the ``mixed`` mode (two short prompts and a long one in one batch) existed in earlier
upstream revisions. This module restores that experiment *through the installed harness itself*: the requests go
through its ``send_single`` with its ``PROMPT_1``, ``PROMPT_2`` and ``LONG_PROMPT`` and its command-line flags
(``BenchArgs.add_cli_args``), so the sampling parameters, the seed handling and the text comparison are the
harness's own; only the batch composition is ours.

Two deliberate differences from the old upstream mode, both for the tiny model pair of the E2E servers:

* the long prompt is ``LONG_PROMPT[:--long-prompt-chars]`` (16,000 characters: 9,379 tokens of the tiny BPE
  tokenizer, above the 8,192-token chunked-prefill size SGLang picks on an H200, so the long prompt is chunked).
  The whole ``LONG_PROMPT`` is 18,262 tiny-tokenizer tokens, more than the E2E servers' 16,384-token context;
* at most ``--max-long-per-batch`` (3) long prompts per batch, so a batch never fills the E2E servers' 65,536-token
  KV pool: a full pool makes SGLang retract and re-prefill requests, which changes a seeded continuation even
  on a deterministic server (a documented limit, not what this experiment probes).

The composition of each batch comes from ``random.Random(--mix-seed)``, so every server gets the same batches.
Prints, as the harness's other modes do, one line per trial and one summary line per prompt kind::

    Prompt 1: total samples: 40, Unique samples: 1
    Prompt 2: total samples: 61, Unique samples: 1
    Long prompt: total samples: 35, Unique samples: 1

Usage: python scripts/sglang_harness_mixed.py --host 127.0.0.1 --port 30000 --n-trials 16 --temperature 1.0
                                              --sampling-seed 1234 [--long-prompt-chars 16000]
"""

from __future__ import annotations

import argparse
import inspect
import random
import sys

LONG_PROMPT_CHARS = 16000
MAX_LONG_PER_BATCH = 3
#: The summary labels, one per prompt kind, in the order they are printed.
KIND_LABELS = ("Prompt 1", "Prompt 2", "Long prompt")


def batch_composition(rng: random.Random, batch_size: int, max_long: int) -> tuple:
    """(number of PROMPT_1, of PROMPT_2, of long prompts) for one batch: at least one PROMPT_1 in every batch,
    the long prompts from the second batch size on."""
    n_long = rng.randint(0, min(max_long, batch_size - 1))
    n_prompt_1 = rng.randint(1, batch_size - n_long)
    return n_prompt_1, batch_size - n_long - n_prompt_1, n_long


def _load_harness():
    try:
        import sglang.test.test_deterministic as harness
    except ImportError as e:
        sys.exit(f"sglang_harness_mixed: cannot import sglang.test.test_deterministic ({e}); install sglang")
    params = inspect.signature(harness.send_single).parameters
    if not {"prompt", "return_full_response", "pick_first_result"} <= set(params):
        sys.exit("sglang_harness_mixed: this sglang's test_deterministic.send_single takes no prompt list "
                 f"(its parameters: {', '.join(params)}); the adaptation was written against 0.5.17 - 0.5.23")
    return harness


def main(argv=None) -> int:
    harness = _load_harness()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.BenchArgs.add_cli_args(parser)  # --host, --port, --n-trials, --temperature, --sampling-seed, ...
    parser.add_argument("--long-prompt-chars", type=int, default=LONG_PROMPT_CHARS,
                        help="characters of the harness's LONG_PROMPT used as the long prompt "
                        f"(default {LONG_PROMPT_CHARS})")
    parser.add_argument("--max-long-per-batch", type=int, default=MAX_LONG_PER_BATCH,
                        help=f"most long prompts in one batch (default {MAX_LONG_PER_BATCH})")
    parser.add_argument("--mix-seed", type=int, default=0, help="seed of the batch compositions (default 0)")
    args = parser.parse_args(argv)
    if args.n_trials < 1 or args.long_prompt_chars < 1 or args.max_long_per_batch < 0:
        parser.error("--n-trials and --long-prompt-chars must be at least 1, --max-long-per-batch at least 0")

    prompts = (harness.PROMPT_1, harness.PROMPT_2, harness.LONG_PROMPT[: args.long_prompt_chars])
    rng = random.Random(args.mix_seed)
    outputs = {label: [] for label in KIND_LABELS}
    for batch_size in range(1, args.n_trials + 1):
        counts = batch_composition(rng, batch_size, args.max_long_per_batch)
        kinds = [k for k, n in enumerate(counts) for _ in range(n)]
        rng.shuffle(kinds)  # the rows of one kind sit at different batch positions from trial to trial
        responses = harness.send_single(args, prompt=[prompts[k] for k in kinds], return_full_response=True,
                                        pick_first_result=False)
        if not isinstance(responses, list) or len(responses) != batch_size:
            # send_single has already printed the server's error body.
            print(f"Trial {batch_size}: expected {batch_size} responses, got {type(responses).__name__}",
                  file=sys.stderr)
            return 1
        for k, resp in zip(kinds, responses):
            outputs[KIND_LABELS[k]].append(resp["text"])
        print(f"Testing Trial {batch_size} with batch size {batch_size}, number of prompt 1: {counts[0]}, "
              f"number of prompt 2: {counts[1]}, number of long prompt: {counts[2]}")
    for label in KIND_LABELS:
        texts = outputs[label]
        print(f"{label}: total samples: {len(texts)}, Unique samples: {len(set(texts))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
