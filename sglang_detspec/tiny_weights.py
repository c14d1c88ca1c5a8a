"""Synthetic, seeded bf16 weights for the "weighted" tiny model pair (see ``sglang_detspec.tiny_models``)."""

from __future__ import annotations

TINY_WEIGHTS_VERSION = "1"


def write_weights(models) -> None:
    """Write ``model.safetensors`` into each of ``models``' three directories (configs already written)."""
    raise NotImplementedError(
        "the weighted tiny pair's weight generator is not committed yet; use pair='dummy' until it lands"
    )
