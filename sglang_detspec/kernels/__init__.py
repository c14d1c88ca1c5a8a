"""Triton kernels (torch + triton imports only; no SGLang).

``seeded_draft_sample`` is the fused seeded draft sampler (SGLang 0.5.23's draft stream, one pass);
``truncate_probs_triton`` the deterministic row-local top-k / top-p / min-p truncation.  The batch-invariant
ops for SGLang's deterministic mode live in their modules (imported from there, not re-exported here):
``batch_invariant_gemm.matmul`` (a GEMM whose tile follows M but whose reduction does not; its self-check is
``row_invariance.find_row_variance`` / ``check_weight_rows``) and ``rms_norm.fused_add_rms_norm`` (residual add +
RMSNorm, one program per row).  Benchmarks choose
the sampler's launch with ``seeded_draft_sample(..., config=LaunchConfig(...))``; ``launch_options`` is the
tuned default (``LAUNCH_TABLE``).
Set ``TRITON_INTERPRET=1`` before importing this package to run it on CPU tensors.
"""

from .row_truncation import truncate_probs_triton
from .seeded_draft_sample import INTERPRETED, LAUNCH_TABLE, LaunchConfig, launch_options, seeded_draft_sample

__all__ = ["seeded_draft_sample", "LaunchConfig", "LAUNCH_TABLE", "launch_options", "INTERPRETED", "truncate_probs_triton"]
