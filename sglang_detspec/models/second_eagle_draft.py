"""A second EAGLE draft for the weighted target.

A speculation-invariant server (DETSPEC_*_INVARIANT) must emit the same tokens whatever its draft proposes; the
end-to-end test (tests/e2e/test_e2e_invariant.py) serves the weighted target with this draft next to the pair's
own. It is the pair's EAGLE recipe (``tiny_weights.eagle_weights``) drawn from another recipe seed, so it is as
good a draft as the pair's, but proposes differently; with the recipe's own seed it is byte-identical to the
pair's ``eagle_draft`` (which pins "the same recipe").
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from sglang_detspec.models.model_cache import build_atomically, default_cache_root, write_json
from sglang_detspec.models.tiny_config import llama_config
from sglang_detspec.models.tiny_models import TINY_MODELS_VERSION

__all__ = ["SECOND_EAGLE_DRAFT_SEED", "build_second_eagle_draft", "ensure_second_eagle_draft",
           "second_eagle_draft_dir_name"]

#: The recipe seed of the second draft (the pair's is ``tiny_weights.DEFAULT_RECIPE.seed``).
SECOND_EAGLE_DRAFT_SEED = 20261205


def build_second_eagle_draft(dest: Path, *, seed: int = SECOND_EAGLE_DRAFT_SEED) -> Path:
    """Write an EAGLE draft for the weighted target into ``dest`` (which must not exist yet): the pair's config and
    EAGLE recipe, every tensor drawn under recipe seed ``seed`` instead of the pair's."""
    import dataclasses

    from sglang_detspec.models.tiny_weights import (
        DEFAULT_RECIPE,
        WEIGHTS_FILE,
        Draw,
        bf16_round,
        eagle_weights,
        write_safetensors,
    )

    dest = Path(dest)
    dest.mkdir(parents=True)
    cfg = llama_config(1, "LlamaForCausalLMEagle")
    write_json(dest / "config.json", cfg)
    recipe = dataclasses.replace(DEFAULT_RECIPE, seed=int(seed))
    # The directory name in the draw keys stays the pair's, so only the seed differs from the pair's draft.
    weights = eagle_weights(cfg, recipe, Draw(recipe, "eagle_draft"))
    write_safetensors(dest / WEIGHTS_FILE, {name: bf16_round(a) for name, a in sorted(weights.items())})
    return dest


def second_eagle_draft_dir_name(seed: int = SECOND_EAGLE_DRAFT_SEED) -> str:
    """The versioned directory name of the second draft (of recipe seed ``seed``) under the cache root."""
    from sglang_detspec.models.tiny_weights import TINY_WEIGHTS_VERSION

    return f"tiny-eagle-draft-seed{int(seed)}-v{TINY_MODELS_VERSION}-weighted-v{TINY_WEIGHTS_VERSION}"


def ensure_second_eagle_draft(root: Optional[Path] = None, *, seed: int = SECOND_EAGLE_DRAFT_SEED) -> Path:
    """The cached second EAGLE draft directory (:func:`build_second_eagle_draft`), built once (atomically) if
    missing. Serve it as ``--speculative-draft-model-path`` beside ``ensure_tiny_models(root, pair="weighted")``."""
    from sglang_detspec.models.tiny_weights import WEIGHTS_FILE

    root = Path(root) if root is not None else default_cache_root()
    final = root / second_eagle_draft_dir_name(seed)
    build_atomically(final, lambda dest: build_second_eagle_draft(dest, seed=seed),
                     lambda: (final / "config.json").is_file() and (final / WEIGHTS_FILE).is_file(),
                     what="second tiny EAGLE draft", tmp_prefix=".tiny-eagle-draft-")
    return final
