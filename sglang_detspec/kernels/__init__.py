"""Triton kernels (torch + triton imports only; no SGLang).

``seeded_draft_sample`` is the fused seeded draft sampler (SGLang 0.5.23's draft stream, one pass);
``truncate_probs_triton`` the deterministic row-local top-k / top-p / min-p truncation.  Benchmarks choose
the sampler's launch with ``seeded_draft_sample(..., config=LaunchConfig(...))``; ``launch_options`` is the
tuned default (``LAUNCH_TABLE``).
Set ``TRITON_INTERPRET=1`` before importing this package to run it on CPU tensors.
"""

from .row_truncation import truncate_probs_triton
from .seeded_draft_sample import INTERPRETED, LAUNCH_TABLE, LaunchConfig, launch_options, seeded_draft_sample

__all__ = ["seeded_draft_sample", "LaunchConfig", "LAUNCH_TABLE", "launch_options", "INTERPRETED", "truncate_probs_triton"]
