"""``sglang.launch_server`` arguments for serving the embedded tiny pairs: each pair's own flags
(:func:`server_flags`, which ``sglang-detspec serve`` uses too) and the end-to-end tests' and GPU scripts' whole
command lines (``tests/e2e/``, ``scripts/lossless_check.py``, ``scripts/run_sglang_harness.py``): one definition, so
the scripts need not import the tests' files. Standard library only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import List

from sglang_detspec.models.family_config import FAMILY_PAIRS
from sglang_detspec.models.tiny_config import MAX_POS, TINY_PAIRS

__all__ = ["SERVABLE_PAIRS", "TINY_SERVER_FLAGS", "server_flags", "SPEC_SHAPE", "CUDA_GRAPH_MAX_BS", "CONTEXT_LENGTH", "GRAPHS_OFF",
           "tiny_pair", "common_args", "eagle_args"]

# ``sglang.launch_server`` flags for serving the tiny pair, shared by ``sglang-detspec serve`` and the end-to-end
# tests. This exact set served DETSPEC_EAGLE / DETSPEC_EAGLE3 on the H200 (sglang 0.5.17). (A "hang" once blamed
# on SGLang's default sizes was a probe racing SGLang's greedy warm-up request into one batch, which made 0.5.17
# JIT-compile flashinfer's top-k renorm kernel; ``check --wait`` now waits for /health. See docs/upstream.md.)
_DUMMY_LOAD_FLAGS = (
    ("--load-format", ("dummy",)),  # weights from a fixed seed: identical every launch, nothing to download
    ("--speculative-draft-load-format", ("dummy",)),
)
_COMMON_SERVER_FLAGS = (
    ("--dtype", ("bfloat16",)),
    ("--mem-fraction-static", ("0.25",)),
    ("--max-total-tokens", ("65536",)),  # a capped KV pool keeps each server small
    ("--max-running-requests", ("32",)),
    # Prefill graphs only up to 256 tokens: the default 58 sizes up to 8192 take ~40-70 s to capture on an
    # H200, and the tiny pair's prompts are short.
    ("--cuda-graph-max-bs-prefill", ("256",)),
    ("--context-length", (str(MAX_POS),)),
)
# The dummy pair's flags (kept under this name for existing callers; new code uses server_flags(pair)).
TINY_SERVER_FLAGS = _DUMMY_LOAD_FLAGS + _COMMON_SERVER_FLAGS


#: Every pair ``serve --tiny-pair`` builds and serves: the Llama-shaped tiny pairs, then the model-family pairs
#: (:mod:`.family_config`).
SERVABLE_PAIRS = TINY_PAIRS + FAMILY_PAIRS


def server_flags(pair: str) -> tuple:
    """``sglang.launch_server`` flags for serving ``pair`` (one of :data:`SERVABLE_PAIRS`): ``((flag, (value, ...)),
    ...)``.

    The dummy pair's include ``--load-format dummy`` (and the draft's); the weighted pair's and the model-family
    pairs' load the generated safetensors with SGLang's default load format, so they carry no load-format flag.
    (DeepSeek-V3's deterministic mode allows only the fa3 / fa4 / triton attention backends; ``serve`` and the E2E
    servers pass triton, which SGLang checks at start-up, so no flag here repeats it.)
    """
    if pair not in SERVABLE_PAIRS:
        raise ValueError(f"unknown tiny model pair {pair!r}; choose one of {', '.join(map(repr, SERVABLE_PAIRS))}")
    return TINY_SERVER_FLAGS if pair == "dummy" else _COMMON_SERVER_FLAGS


SPEC_SHAPE = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
# Decode batches 1..8 replay CUDA graphs, 9..16 run eagerly: the 16 trials cover both paths.
CUDA_GRAPH_MAX_BS = 8
#: Context length of every E2E server: the long traffic profile sends prompts up to 10,000 tokens. The tiny
#: models' configs declare exactly these positions.
CONTEXT_LENGTH = MAX_POS
GRAPHS_OFF = ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]


def tiny_pair() -> str:
    """The tiny pair the E2E servers serve: ``weighted`` (real seeded weights; drafts are partly rejected, so a wrong
    accept/reject decision or residual sample shows) unless DETSPEC_E2E_PAIR says ``dummy``."""
    return os.environ.get("DETSPEC_E2E_PAIR", "weighted")


def common_args(target: Path, pair: str) -> List[str]:
    """Every E2E server's arguments before its speculative ones: the tiny pair's flags, a small capped KV pool each
    (so several servers start side by side), the triton attention and pytorch sampling backends."""
    tiny_flags = []
    for flag, values in server_flags(pair):
        tiny_flags += [flag, *((str(CONTEXT_LENGTH),) if flag == "--context-length" else values)]
    return [
        "--model-path", str(target),
        *tiny_flags,
        "--mem-fraction-static", "0.1",
        "--attention-backend", "triton",
        "--sampling-backend", "pytorch",
        "--cuda-graph-max-bs-decode", str(CUDA_GRAPH_MAX_BS),
        "--host", "127.0.0.1",
        "--log-level", "info",
    ]


def eagle_args(draft: Path, algorithm: str, *, rejection_sampling: bool = False,
               deterministic: bool = False) -> List[str]:
    """The speculative part of a configuration: ``draft`` proposing 3 tokens per verify (topk 1) under ``algorithm``
    (``EAGLE``, ``DETSPEC_EAGLE``, ...), built-in rejection sampling and deterministic inference as asked."""
    return [
        "--speculative-draft-model-path", str(draft), *SPEC_SHAPE, "--speculative-algorithm", algorithm,
        *(["--speculative-use-rejection-sampling"] if rejection_sampling else []),
        *(["--enable-deterministic-inference"] if deterministic else []),
    ]
