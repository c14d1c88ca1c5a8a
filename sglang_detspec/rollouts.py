"""GRPO-style rollouts on a DETSPEC server or ``sglang.Engine``: prompts, seeds per group, seeded weight updates, and
bit-exact comparison of rollouts. Used by ``examples/grpo_rollout.py`` and ``tests/e2e/test_e2e_engine.py`` (the
prompts also by ``tests/e2e/test_e2e_rollouts.py``).

Seeds (the one contract of :mod:`sglang_detspec.stream.choice_seeds`, applied twice more):

    step_seed(base, step)                   = choice_seed(base, step + 1)
    group_seed(base, step, prompt)          = choice_seed(step_seed(base, step), prompt + 1)
    rollout_seed(base, step, prompt, sample) = choice_seed(group_seed(base, step, prompt), sample)

A GRPO group (one prompt, G samples) is ONE request with ``sampling_seed = group_seed(...)`` and ``n = G``: a DETSPEC
server gives choice ``g`` the seed ``choice_seed(group_seed, g)`` (``integration/setup/parallel_sampling.py``), which
is :func:`rollout_seed` -- so sample ``g`` can be re-drawn alone as an ``n = 1`` request with that seed. The ``+ 1``
offsets keep a step's and a group's seed distinct from their parent's (``choice_seed(s, 0) = s``). Every derived seed
lies in ``[0, 2**63)``, inside the int64 range ``sampling_seed`` accepts.

Weights: :func:`perturbed_tensors` adds a seeded Gaussian perturbation (scaled by each tensor's own standard
deviation, drawn on the CPU in fp32 with a ``torch.Generator`` seeded by ``step_seed``, cast back to the tensor's
dtype) to a few named tensors. Each step's weights are ``original + delta(step)`` (step 0: the original), never
cumulative, so a step's weights can be restored exactly by one ``update_weights_from_tensor``.

Standard library at import; torch, safetensors and SGLang are imported by the functions that need them.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from sglang_detspec.stream.choice_seeds import SEED_MASK, choice_seed

__all__ = [
    "ROLLOUT_PROMPTS",
    "MAX_BASE_SEED",
    "TARGET_UPDATE_TENSORS",
    "DRAFT_UPDATE_TENSORS",
    "step_seed",
    "group_seed",
    "rollout_seed",
    "group_requests",
    "engine_kwargs",
    "perturbed_tensors",
    "write_updated_model",
    "rollout_record",
    "compare_records",
    "tensors_of",
]

#: The prompts of a rollout run, one GRPO group each: examples/grpo_rollout.py and the E2E rollout tests take a prefix.
ROLLOUT_PROMPTS = (
    "Question: what is the sum of the first ten odd numbers? Answer:",
    "Write one sentence about a lighthouse keeper:",
    "The recipe for bread begins with",
    "In the year 2087, the colony ship",
    "List three uses of a paperclip:",
    "The old mill by the river",
    "Explain why the sky is blue in simple words:",
    "A haiku about winter mornings:",
)

#: The largest base seed: ``sampling_seed`` is packed into an int64 and the derived seeds are masked to 63 bits.
MAX_BASE_SEED = SEED_MASK

#: Target tensors a fake training step changes (the tiny Llama target's checkpoint names; unstacked in SGLang, so
#: ``load_weights`` copies each in place). SGLang's EAGLE worker offers the same names to the draft first, whose
#: loader prefixes ``model.`` and finds no such parameter, so the draft is untouched.
TARGET_UPDATE_TENSORS = ("model.layers.7.mlp.down_proj.weight", "model.layers.7.self_attn.o_proj.weight",
                         "model.norm.weight")
#: Draft tensors (the EAGLE draft's checkpoint names, which the target's loader does not have).
DRAFT_UPDATE_TENSORS = ("layers.0.mlp.down_proj.weight",)


def _check_index(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return value


def _check_base(base_seed: object) -> int:
    if isinstance(base_seed, bool) or not isinstance(base_seed, int) or not 0 <= base_seed <= MAX_BASE_SEED:
        raise ValueError(f"base seed must be an integer in [0, 2**63 - 1], got {base_seed!r}")
    return base_seed


def step_seed(base_seed: int, step: int) -> int:
    """The seed of training step ``step`` (0-based): ``choice_seed(base_seed, step + 1)``."""
    return choice_seed(_check_base(base_seed), _check_index("step", step) + 1)


def group_seed(base_seed: int, step: int, prompt: int) -> int:
    """The ``sampling_seed`` of prompt ``prompt``'s group at ``step`` (sent with ``n = G``)."""
    return choice_seed(step_seed(base_seed, step), _check_index("prompt", prompt) + 1)


def rollout_seed(base_seed: int, step: int, prompt: int, sample: int) -> int:
    """The seed sample ``sample`` of that group is drawn with (what the server derives for choice ``sample``)."""
    return choice_seed(group_seed(base_seed, step, prompt), _check_index("sample", sample))


def group_requests(prompts: Sequence[str], base_seed: int, step: int, group_size: int, max_new_tokens: int,
                   temperature: float = 1.0) -> Tuple[List[str], List[dict]]:
    """``(prompts, sampling_params)`` of one step: one request per prompt, ``n = group_size``, its group seed."""
    params = [{"n": group_size, "temperature": temperature, "max_new_tokens": max_new_tokens, "ignore_eos": True,
               "sampling_seed": group_seed(base_seed, step, p)} for p in range(len(prompts))]
    return list(prompts), params


def engine_kwargs(argv: Sequence[str]) -> Dict[str, object]:
    """``sglang.Engine`` keyword arguments equal to ``launch_server`` command-line ``argv``: SGLang's own parser
    (``ServerArgs.add_cli_args``), then every ``ServerArgs`` field the namespace has, as ``ServerArgs.from_cli_args``
    does -- so an Engine and a server started from one ``argv`` get the same ``ServerArgs``."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    from sglang_detspec.integration.compat import server_args_field_names

    parser = argparse.ArgumentParser(prog="sglang.Engine")
    ServerArgs.add_cli_args(parser)
    namespace = parser.parse_args(list(argv))
    return {name: getattr(namespace, name) for name in server_args_field_names() if hasattr(namespace, name)}


def perturbed_tensors(original: Mapping[str, "object"], names: Iterable[str], seed: int, scale: float) -> Dict[str, object]:
    """``{name: original[name] + scale * std(original[name]) * N(0, 1)}`` for ``names``, drawn in fp32 on the CPU
    from a generator seeded with ``seed``, in ``names``' order, cast to each tensor's dtype. ``scale == 0`` returns
    exact copies. Raises ``KeyError`` naming a missing tensor and ``ValueError`` for a bad scale."""
    import torch

    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not 0 <= scale < float("inf"):
        raise ValueError(f"scale must be a finite number >= 0, got {scale!r}")
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    out = {}
    for name in names:
        if name not in original:
            raise KeyError(f"tensor {name!r} is not in the checkpoint (it has {len(original)} tensors, e.g. "
                           f"{sorted(original)[:3]})")
        base = original[name].detach().to("cpu", torch.float32)
        noise = torch.randn(base.shape, generator=gen, dtype=torch.float32)
        std = base.std() if base.numel() > 1 else base.abs()
        out[name] = (base + float(scale) * std * noise).to(original[name].dtype).contiguous()
    return out


def write_updated_model(src: Path, dest: Path, updates: Mapping[str, object]) -> Path:
    """Copy model directory ``src`` to ``dest`` (which must not exist) with ``updates`` replacing those tensors of its
    ``model.safetensors``: the checkpoint a freshly started engine loads to compare with an in-place update."""
    from safetensors.torch import load_file, save_file

    src, dest = Path(src), Path(dest)
    tensors = load_file(str(src / "model.safetensors"))
    missing = sorted(set(updates) - set(tensors))
    if missing:
        raise KeyError(f"{src / 'model.safetensors'} has no tensor {missing[0]!r}")
    shutil.copytree(src, dest)
    tensors.update({k: v.contiguous() for k, v in updates.items()})
    save_file(tensors, str(dest / "model.safetensors"))
    return dest


def rollout_record(output: Mapping[str, object]) -> Dict[str, object]:
    """What "the same rollout" means, JSON-ready: the generated token ids and each token's logprob as an exact float
    bit pattern (``float.hex``; ``-0.0`` and ``0.0`` differ). ``output`` is one ``/generate`` or ``Engine.generate``
    result dict (with ``return_logprob``)."""
    meta = output.get("meta_info") or {}
    rows = meta.get("output_token_logprobs") or []
    return {"output_ids": list(output.get("output_ids") or []),
            "logprobs": [float(row[0]).hex() if row[0] is not None else None for row in rows]}


def compare_records(a: Sequence[Mapping[str, object]], b: Sequence[Mapping[str, object]]) -> Dict[str, List[int]]:
    """Indices where two lists of :func:`rollout_record` differ: ``{"tokens": [...], "logprobs": [...]}`` (a length
    difference counts as every missing index differing)."""
    n = max(len(a), len(b))
    tokens, logprobs = [], []
    for i in range(n):
        if i >= len(a) or i >= len(b):
            tokens.append(i)
            logprobs.append(i)
            continue
        if a[i].get("output_ids") != b[i].get("output_ids"):
            tokens.append(i)
        if a[i].get("logprobs") != b[i].get("logprobs"):
            logprobs.append(i)
    return {"tokens": tokens, "logprobs": logprobs}


def tensors_of(path: Path, names: Iterable[str], device: Optional[str] = None) -> Dict[str, object]:
    """The named tensors of ``path/model.safetensors`` (only those), on ``device`` if given."""
    from safetensors import safe_open

    out = {}
    with safe_open(str(Path(path) / "model.safetensors"), framework="pt") as f:
        keys = set(f.keys())
        for name in names:
            if name not in keys:
                raise KeyError(f"{Path(path) / 'model.safetensors'} has no tensor {name!r}")
            t = f.get_tensor(name)
            out[name] = t.to(device) if device else t
    return out
