"""Triton kernels (torch + triton imports only; no SGLang).

``seeded_draft_sample`` is the fused seeded draft sampler (SGLang 0.5.23's draft stream, one pass);
``truncate_probs_triton`` the deterministic row-local top-k / top-p / min-p truncation.
Set ``TRITON_INTERPRET=1`` before importing this package to run it on CPU tensors.
"""

from .row_truncation import truncate_probs_triton
from .seeded_draft_sample import INTERPRETED, launch_config, seeded_draft_sample

__all__ = ["seeded_draft_sample", "launch_config", "INTERPRETED", "truncate_probs_triton"]
