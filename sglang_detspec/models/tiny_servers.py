"""``sglang.launch_server`` arguments for serving the embedded tiny pairs to the end-to-end tests and the GPU scripts
(``tests/e2e/``, ``scripts/lossless_check.py``, ``scripts/run_sglang_harness.py``): one definition, so the scripts
need not import the tests' files. Standard library only at import (the tiny pair's own flags come from
:func:`sglang_detspec.models.tiny_models.server_flags`, imported when the arguments are built).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import List

__all__ = ["SPEC_SHAPE", "CUDA_GRAPH_MAX_BS", "CONTEXT_LENGTH", "LONG_CONTEXT_ENV", "GRAPHS_OFF", "tiny_pair",
           "common_args", "eagle_args"]

SPEC_SHAPE = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
# Decode batches 1..8 replay CUDA graphs, 9..16 run eagerly: the 16 trials cover both paths.
CUDA_GRAPH_MAX_BS = 8
#: Context length of every E2E server: the long traffic profile sends prompts up to 10,000 tokens. The tiny
#: models' config says 8192 positions (RoPE has no hard limit), hence SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN.
CONTEXT_LENGTH = 16384
LONG_CONTEXT_ENV = {"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}
GRAPHS_OFF = ["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]


def tiny_pair() -> str:
    """The tiny pair the E2E servers serve: ``weighted`` (real seeded weights; drafts are partly rejected, so a wrong
    accept/reject decision or residual sample shows) unless DETSPEC_E2E_PAIR says ``dummy``."""
    return os.environ.get("DETSPEC_E2E_PAIR", "weighted")


def common_args(target: Path, pair: str) -> List[str]:
    """Every E2E server's arguments before its speculative ones: the tiny pair's flags, a small capped KV pool each
    (so several servers start side by side), the triton attention and pytorch sampling backends."""
    from sglang_detspec.models.tiny_models import server_flags

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
