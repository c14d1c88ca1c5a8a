"""Where built model directories are cached, and how a directory is built so that no reader ever sees half of it.

Every builder here (the tiny pairs, their extra drafts, the mid-size pair) writes into a temporary sibling and renames
it into place (:func:`build_atomically`): a concurrent or interrupted build never leaves a half-written cache entry.
:func:`tree_digest` is the determinism check (the same bytes on every build). Standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

__all__ = ["build_atomically", "default_cache_root", "tree_digest", "write_json"]


def default_cache_root() -> Path:
    """``$XDG_CACHE_HOME/sglang-detspec`` (``~/.cache/sglang-detspec`` when unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "sglang-detspec"


def write_json(path: Path, obj: dict) -> None:
    """Write ``obj`` as sorted, indented JSON: the same bytes whatever the installed ``transformers``."""
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def build_atomically(final: Path, build: Callable[[Path], object], complete: Callable[[], bool], *,
                     what: str, tmp_prefix: str) -> None:
    """Make ``final`` a complete directory: unless ``complete()`` already holds, ``build(dest)`` into a
    temporary sibling of ``final`` and ``os.rename`` it into place.

    A rename onto an existing non-empty directory fails: if ``complete()`` holds then, another process won
    the race and its (byte-identical) copy is kept; otherwise a stale, incomplete directory (a killed build)
    is removed and ours takes its place. The temporary directory never outlives the call.
    """
    if complete():
        return
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=tmp_prefix, dir=final.parent))
    try:
        build(tmp / "build")
        try:
            os.rename(tmp / "build", final)
        except OSError:  # lost a race, or a stale incomplete directory is in the way
            if not complete():
                shutil.rmtree(final, ignore_errors=True)
                os.rename(tmp / "build", final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not complete():
        raise RuntimeError(f"{what} at {final}: incomplete after building")


def tree_digest(root: Path) -> str:
    """sha256 over (relative path, bytes) of every file under ``root``: the determinism check."""
    h = hashlib.sha256()
    root = Path(root)
    for p in sorted(q for q in root.rglob("*") if q.is_file()):
        h.update(p.relative_to(root).as_posix().encode() + b"\0")
        h.update(p.read_bytes() + b"\0")
    return h.hexdigest()
