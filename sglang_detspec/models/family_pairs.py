"""Build and cache the model-family pairs (:mod:`.family_config`): a Qwen3 target with a reduced-vocabulary EAGLE3
draft, a Qwen3-MoE target with an EAGLE draft, a DeepSeek-V3-shaped target carrying its own NEXTN/MTP layer.

``ensure_family_pair(root, pair)`` returns a :class:`FamilyPair`: the ``target`` directory (config, the tiny pairs'
byte-level tokenizer, seeded bf16 ``model.safetensors`` from :mod:`.family_weights`) and the ``draft`` directory to
pass as ``--speculative-draft-model-path`` -- the target's own for ``deepseek_mtp``, whose checkpoint holds the MTP
layer (SGLang also fills that path in itself for DeepSeek-V3 targets). Served with
``tiny_servers.server_flags(pair)`` and one of ``family_config.FAMILY_ALGORITHMS[pair]``.

Like the tiny pairs: plain-dict configs written with sorted keys, weights by this package's own safetensors writer,
the whole tree built into a temporary sibling and renamed into place (:func:`~.model_cache.build_atomically`) under
a directory named after the pair's version, so a stale or half-written cache entry is never served. Standard library
only at import; numpy and tokenizers when something is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple, Optional

from sglang_detspec.models.family_config import FAMILY_VERSIONS, check_family_pair, family_configs
from sglang_detspec.models.model_cache import build_atomically, default_cache_root, write_json
from sglang_detspec.models.tiny_models import write_tokenizer_files

__all__ = ["FamilyPair", "build_family_pair", "ensure_family_pair", "family_cache_dir_name", "WEIGHTS_FILE"]

WEIGHTS_FILE = "model.safetensors"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")


class FamilyPair(NamedTuple):
    target: Path
    draft: Path  # the target directory itself where the checkpoint carries its MTP layer


def _draft_dir_name(pair: str) -> Optional[str]:
    names = [d for d in family_configs(pair) if d != "target"]
    return names[0] if names else None


def _layout(root: Path, pair: str) -> FamilyPair:
    draft = _draft_dir_name(pair)
    return FamilyPair(root / "target", root / draft if draft else root / "target")


def build_family_pair(dest: Path, pair: str) -> FamilyPair:
    """Write ``pair``'s directories under ``dest`` (which must not exist yet). No network, no cache."""
    from sglang_detspec.models.family_weights import generate_family_weights
    from sglang_detspec.models.tiny_weights import write_safetensors

    pair = check_family_pair(pair)
    dest = Path(dest)
    dest.mkdir(parents=True)
    configs = family_configs(pair)
    for d, cfg in configs.items():
        (dest / d).mkdir()
        write_json(dest / d / "config.json", cfg)
    write_tokenizer_files(dest / "target")
    weights, dtypes = generate_family_weights(pair, configs)
    for d, tensors in weights.items():
        write_safetensors(dest / d / WEIGHTS_FILE, tensors, dtypes[d])
    return _layout(dest, pair)


def family_cache_dir_name(pair: str) -> str:
    """The versioned directory name of ``pair`` under the cache root."""
    return f"family-{check_family_pair(pair)}-v{FAMILY_VERSIONS[pair]}"


def ensure_family_pair(root: Optional[Path] = None, pair: str = "qwen3_eagle3") -> FamilyPair:
    """The cached directories of model-family ``pair``, built once (atomically) if missing.

    ``root`` defaults to :func:`~.model_cache.default_cache_root`; the pair lives in
    ``root / family_cache_dir_name(pair)``.
    """
    check_family_pair(pair)
    root = Path(root) if root is not None else default_cache_root()
    final = root / family_cache_dir_name(pair)
    build_atomically(final, lambda dest: build_family_pair(dest, pair), lambda: _complete(final, pair),
                     what=f"model-family pair {pair}", tmp_prefix=".family-")
    return _layout(final, pair)


def _complete(final: Path, pair: str) -> bool:
    dirs = [final / d for d in family_configs(pair)]
    return (all((d / "config.json").is_file() and (d / WEIGHTS_FILE).is_file() for d in dirs)
            and all((final / "target" / f).is_file() for f in _TOKENIZER_FILES))
