"""Triton kernels (torch + triton imports only; no SGLang), one op per file, each beside its pure-torch twin in
:mod:`sglang_detspec.stream`:

* ``seeded_draft_sample`` (:mod:`.seeded_draft_sample`): the fused seeded draft sampler (SGLang 0.5.23's draft
  stream, one pass). Benchmarks choose its launch with ``seeded_draft_sample(..., config=LaunchConfig(...))``;
  ``launch_options`` is the tuned default (``LAUNCH_TABLE``).
* ``truncate_probs_triton`` (:mod:`.row_truncation`): the deterministic row-local top-k / top-p / min-p truncation.
* ``coupled_race`` (:mod:`.coupled_race`): SGLang's non-speculative seeded race on log-probabilities, keyed by
  token id.
* ``coupled_race_probs`` / ``coupled_verify`` (:mod:`.coupled_race_probs`): the same race on probabilities (the
  log taken in the kernel), and the speculation-invariant verify built on it.
* ``coupled_hot_race_probs`` (:mod:`.coupled_hot_race_probs`): that race for a reduced-vocabulary ("hot token")
  draft, each column keyed and tie-broken by its TARGET id (the invariant mode's proposal of such a draft).

* ``batch_invariant_matmul`` (:mod:`.batch_invariant_gemm`): the GEMM SGLang's deterministic mode runs on DETSPEC
  servers; its tile follows M, its reduction over K does not. :mod:`.row_invariance` holds its self-check
  (``find_row_variance``, ``check_weight_rows``).
* ``fused_add_rms_norm`` (:mod:`.rms_norm`): residual add + RMSNorm, one program per row.
* :mod:`.seeded_verify_coins`: SGLang's seeded verify coins in one launch (imported from its module).
* :mod:`.split_kv_verify_attention`: a verify's causal chain attention in fixed key tiles merged in order
  (batch-invariant; imported from its module).
* :mod:`.seeded_hot_draft_sample` and :mod:`.hot_chain_verify`: the draft draw and the chain rejection verify of a
  reduced-vocabulary ("hot token") draft, keyed by target id (imported from their modules).

Shared pieces: :mod:`.hashing` (the key hash), :mod:`.draft_scoring` (the draft kernels' float32 race score, exact
float64 score and the bound between them), :mod:`.coupled_scoring` (the coupled kernels' exact float64 score),
:mod:`.launch_checks` (the launch preconditions every wrapper checks).
Set ``TRITON_INTERPRET=1`` before importing this package to run it on CPU tensors.
"""

from .batch_invariant_gemm import matmul as batch_invariant_matmul
from .coupled_hot_race_probs import coupled_hot_race_probs
from .coupled_race import coupled_race
from .coupled_race_probs import coupled_race_probs, coupled_verify
from .rms_norm import fused_add_rms_norm
from .row_truncation import truncate_probs_triton
from .seeded_draft_sample import INTERPRETED, LAUNCH_TABLE, LaunchConfig, launch_options, seeded_draft_sample

__all__ = [
    "seeded_draft_sample", "LaunchConfig", "LAUNCH_TABLE", "launch_options", "INTERPRETED", "truncate_probs_triton",
    "coupled_race", "coupled_race_probs", "coupled_verify", "coupled_hot_race_probs", "batch_invariant_matmul",
    "fused_add_rms_norm",
]
