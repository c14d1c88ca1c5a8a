"""A reduced-vocabulary ("hot token") EAGLE3 draft in the single-layer DETSPEC worker: the map, built at start.

SGLang's ``EagleDraftWorker.alloc_memory_pool`` (0.5.17 - 0.5.23, the same body) loads the draft's hot-token map
(``init_token_map`` / ``init_lm_head``: ``hot_token_id = d2t + arange`` from the EAGLE3 checkpoint), then refuses
rejection sampling when the draft's vocabulary differs from the target's ("FIXME: support reduced (hot) draft vocab by
scattering draft probs into the target vocab"). DETSPEC serves that draft without the scatter, so the DETSPEC draft
worker runs the same body with ``get_spec`` answering ``speculative_use_rejection_sampling = False`` to that one check
(:func:`spec_without_vocab_check`; ``get_spec`` is read nowhere else in the body), and then makes its own decision
(:func:`build_hot_vocab`):

* no hot map: nothing to do (the draft scores the target's vocabulary);
* a hot map: the start-up gate :func:`~sglang_detspec.integration.setup.server_args.check_draft_vocab` (an EAGLE3
  ``d2t`` map is served under DETSPEC_EAGLE3 and DETSPEC_EAGLE3_INVARIANT, a ``--speculative-token-map`` under
  DETSPEC_EAGLE; both verified on an H100; multi-layer EAGLE and a token map in the invariant mode refuse), then
  :meth:`HotVocab.from_hot_token_id <sglang_detspec.stream.hot_vocab.HotVocab.from_hot_token_id>` on the map's device
  (it validates the ids once; a host synchronisation at start-up only). The draft worker keeps it as
  ``detspec_hot_vocab``; every draft site (eager and the draft-decode CUDA graphs, which capture the same persistent
  tensors) proposes through it, and the spec worker's verify reads q through its ``target_to_draft``.

A full-size map (``Vd == V``, a permutation) is a hot map too: its draft indices are not target ids, so it takes the
same path (upstream would read its q at the wrong ids).
"""

from __future__ import annotations

from typing import Any, Optional

from sglang_detspec.integration.sampling import scheme
from sglang_detspec.stream.hot_vocab import HotVocab

__all__ = ["build_hot_vocab", "detspec_algorithm_name", "fit_graph_draft_probs", "spec_without_vocab_check"]


class _SpecWithoutRejectionCheck:
    """``get_spec()``'s bag as one upstream check sees it: rejection sampling reads False, the rest passes through."""

    def __init__(self, spec: Any):
        self._spec = spec

    speculative_use_rejection_sampling = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._spec, name)


def spec_without_vocab_check() -> Any:
    """Stand-in for ``get_spec`` inside ``alloc_memory_pool``: its only use there is the draft/target vocabulary
    check under rejection sampling, which :func:`build_hot_vocab` replaces."""
    from sglang.srt.runtime_context import get_spec

    return _SpecWithoutRejectionCheck(get_spec())


def detspec_algorithm_name(speculative_algorithm: Any) -> str:
    """The DETSPEC name this worker serves (for messages): EAGLE or EAGLE3, with the invariant suffix if coupled."""
    base = "DETSPEC_EAGLE3" if speculative_algorithm.is_eagle3() else "DETSPEC_EAGLE"
    return base + ("_INVARIANT" if scheme.current() == scheme.COUPLED else "")


def build_hot_vocab(draft_worker: Any) -> Optional[HotVocab]:
    """The draft worker's :class:`HotVocab` (None without a hot map), after the reduced-vocabulary gate.

    Reads what upstream's ``alloc_memory_pool`` just set: ``draft_worker.hot_token_id`` (on the draft's device) and
    the target's ``model_config.vocab_size``. Raises the ``draft_vocab*`` refusal when the draft may not be served.
    """
    from sglang_detspec.integration.setup.server_args import check_draft_vocab

    hot = getattr(draft_worker, "hot_token_id", None)
    if hot is None:
        return None
    target_vocab = int(draft_worker.target_worker.model_config.vocab_size)
    # Upstream's init_token_map: an EAGLE-twin worker's hot map is always the --speculative-token-map (EAGLE3
    # ignores a token map and takes the checkpoint's d2t).
    is_eagle3 = bool(draft_worker.speculative_algorithm.is_eagle3())
    check_draft_vocab(
        detspec_algorithm_name(draft_worker.speculative_algorithm), int(hot.shape[0]), target_vocab, reduced=True,
        token_map=not is_eagle3,
    )
    return HotVocab.from_hot_token_id(hot, target_vocab)


def fit_graph_draft_probs(buffers: Any, hot_vocab: Optional[HotVocab]) -> None:
    """Give the draft-decode CUDA graphs' persistent q rows the hot draft's width, before the first capture.

    Upstream's ``EAGLEDraftCudaGraphRunner`` sizes ``buffers.draft_probs`` ``[max_bs, V]`` by the draft model's
    ``vocab_size``, which an EAGLE3 draft's config sets to the target's. A hot draft's q rows have ``Vd`` columns, so
    capture would stack a ``[bs, V]`` first row with ``[bs, Vd]`` proposals (H100, 0.5.17: "stack expects each tensor
    to be equal size") and a replay would copy ``Vd``-wide rows into ``V``-wide ones. No hot map, or no buffer (no
    rejection sampling): nothing changes.
    """
    probs = getattr(buffers, "draft_probs", None)
    if hot_vocab is None or probs is None or probs.shape[-1] == hot_vocab.draft_vocab_size:
        return
    buffers.draft_probs = probs.new_zeros((probs.shape[0], hot_vocab.draft_vocab_size))
