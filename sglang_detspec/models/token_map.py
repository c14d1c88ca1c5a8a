"""A ``--speculative-token-map`` file for the weighted tiny pair: the EAGLE draft served with a reduced vocabulary.

SGLang 0.5.17 - 0.5.23 read the flag in ``EAGLEWorkerV2.init_token_map`` through
``sglang.srt.speculative.spec_utils.load_token_map`` (the same function body in 0.5.17, 0.5.21 and 0.5.23):
``torch.tensor(torch.load(path, weights_only=True), dtype=torch.int64)`` -- any ``torch.save`` of a 1-D sequence of
target token ids (a path that does not exist is taken as ``<hub repo>/<file>`` and downloaded). The ids become the
draft's ``hot_token_id`` (draft index ``i`` proposes target id ``ids[i]``) and ``init_lm_head`` keeps only those rows
of the shared LM head. :func:`write_token_map` saves a plain list of ints, what that ``torch.tensor`` call is written
for (a saved tensor loads as well, with torch's copy-construct warning in the server log).

Which ids: the :data:`HOT_TOKENS` (512 of 1,024) tokens the weighted target emits most often, *most frequent first*
(``family_weights.tokens_by_frequency``: the stationary distribution of the target's bigram chain, from its seeded
weights, in float64 -- the same measurement that picks the ``qwen3_eagle3`` draft's hot tokens). Why these:

* they cover about 68 % of what the target emits, so drafts are accepted often (an accept length well above 1
  shows that the verify reads q through the map) but not always: about a third of the target's tokens lie outside
  the map, so the verify regularly rejects and samples a residual token the draft could never propose;
* frequency order, not ascending ids: an EAGLE3 ``d2t`` map is always ascending (``hot = d2t + arange``), which is
  the only kind of map the reduced-vocabulary path has run with on a GPU; a ranked map checks that nothing assumes
  the hot ids ascend. No id sits at its own index, so reading a draft index as a target id cannot go unnoticed.

The file is built once per cache root into its own versioned directory beside the tiny pair's
(:func:`~sglang_detspec.models.model_cache.build_atomically`): a concurrent or interrupted build never leaves half a
file. numpy and torch are imported only when the map is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from sglang_detspec.models.model_cache import build_atomically, default_cache_root

__all__ = ["HOT_TOKENS", "TOKEN_MAP_FILE", "TOKEN_MAP_VERSION", "ensure_weighted_token_map", "token_map_dir_name",
           "weighted_hot_token_ids", "write_token_map"]

# Bump whenever the ids or the file format change (the cache directory name carries it).
TOKEN_MAP_VERSION = "1"
#: Hot tokens of the weighted target's 1,024 in the default map.
HOT_TOKENS = 512
TOKEN_MAP_FILE = "token_map.pt"


def weighted_hot_token_ids(size: int = HOT_TOKENS):
    """The weighted target's ``size`` most frequent token ids, most frequent first (int64 numpy array).

    Computed from the target's seeded weights as ``tiny_weights`` writes them (each tensor rounded to bf16), not read
    back from a built checkpoint: the same arrays, without building the pair.
    """
    from sglang_detspec.models.family_weights import tokens_by_frequency
    from sglang_detspec.models.tiny_config import TARGET_LAYERS, VOCAB_SIZE, llama_config
    from sglang_detspec.models.tiny_weights import DEFAULT_RECIPE, Draw, bf16_round, target_weights

    if not 0 < int(size) <= VOCAB_SIZE:
        raise ValueError(f"a token map of {size} ids: choose 1 .. {VOCAB_SIZE} (the weighted target's vocabulary)")
    cfg = llama_config(TARGET_LAYERS, "LlamaForCausalLM")
    weights = {name: bf16_round(a) for name, a in target_weights(cfg, DEFAULT_RECIPE, Draw(DEFAULT_RECIPE, "target")).items()}
    return tokens_by_frequency(cfg, weights)[: int(size)]


def write_token_map(path: Path, ids: Sequence[int]) -> None:
    """Save ``ids`` (target token ids, draft index order) as ``--speculative-token-map`` reads them: a list of ints
    through ``torch.save``."""
    import torch

    torch.save([int(i) for i in ids], str(path))


def token_map_dir_name(size: int = HOT_TOKENS) -> str:
    """The versioned cache directory of the weighted pair's ``size``-token map (it names the pair's weights)."""
    from sglang_detspec.models.tiny_models import cache_dir_name

    return f"{cache_dir_name('weighted')}-token-map-v{TOKEN_MAP_VERSION}-hot{int(size)}"


def ensure_weighted_token_map(root: Optional[Path] = None, *, size: int = HOT_TOKENS) -> Path:
    """The path of the weighted pair's token-map file (``--speculative-token-map PATH``), built once if missing.

    ``root`` defaults to :func:`~sglang_detspec.models.model_cache.default_cache_root`. Serve it with the weighted
    pair's EAGLE draft (``ensure_tiny_models(root, pair="weighted").eagle_draft``) under DETSPEC_EAGLE or EAGLE.
    """
    root = Path(root) if root is not None else default_cache_root()
    final = root / token_map_dir_name(size)

    def build(dest: Path) -> None:
        dest.mkdir(parents=True)
        write_token_map(dest / TOKEN_MAP_FILE, weighted_hot_token_ids(size))

    build_atomically(final, build, lambda: (final / TOKEN_MAP_FILE).is_file(), what="token map",
                     tmp_prefix=".token-map-")
    return final / TOKEN_MAP_FILE
