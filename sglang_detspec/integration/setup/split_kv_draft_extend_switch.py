"""``SGLANG_DETSPEC_SPLIT_KV_DRAFT_EXTEND``: whether a DETSPEC draft runs its extend of each verified chain in the
plugin's split-KV verify kernel (``1``; installed by :mod:`..sampling.split_kv_verify`, refused where the kernel cannot
serve the draft) or in SGLang's one-stage extend kernel (``0`` or unset, the default).

Opt-in until it has run on a GPU: the kernel and its wrapper are the verify's, which runs by default, but the draft
extend's servers have not yet passed the E2E determinism tests (tests/e2e/test_e2e_split_kv_draft_extend.py). Both
kernels are batch-invariant, so either gives one output per seed; the draft's numbers differ between them, so
``DETSPEC_EAGLE``'s tokens for a seed differ (the invariant mode's do not: they never depend on the draft). Anything
but ``1``, ``0`` or unset is refused when the plugin loads. Standard library only."""

from __future__ import annotations

from typing import Mapping, Optional

from sglang_detspec.integration.setup.env_switch import env_switch

__all__ = ["SPLIT_KV_DRAFT_EXTEND_ENV", "split_kv_draft_extend_wanted"]

SPLIT_KV_DRAFT_EXTEND_ENV = "SGLANG_DETSPEC_SPLIT_KV_DRAFT_EXTEND"


def split_kv_draft_extend_wanted(environ: Optional[Mapping[str, str]] = None) -> bool:
    """True for ``1``, False for ``0`` or unset; anything else raises the ``split_kv_draft_extend`` refusal."""
    return env_switch(SPLIT_KV_DRAFT_EXTEND_ENV, "split_kv_draft_extend", environ, default=False)
