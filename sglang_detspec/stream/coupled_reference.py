"""Pure-torch reference of the speculation-invariant ("coupled") race and verify (issue 18).

The race is SGLang's own non-speculative seeded sampler, ``sglang/srt/layers/sampler.py::multinomial_with_seed``,
keyed the way the plugin keys every target row (by token id: ``integration/sampling/target_sampler.py``).  For row ``r``
with request seed ``s``, key position ``p`` and float32 log-probabilities ``l`` (``torch.log`` of the
probabilities the sampler races: softmax of ``logits / temperature``, then the row's token-id-keyed top-k /
top-p / min-p truncation, not renormalised -- what ``sampling_from_probs_torch`` hands to
``multinomial_with_seed``), token ``t`` scores, in float64 and in exactly this operation order::

    h = murmur3(seed words, p & 0xFFFFFFFF, t)          # the UNSALTED key space (sglang_detspec.stream.keys)
    u = h / (2**32 - 1)          # CPU: IEEE division;  CUDA: h * fl(1 / (2**32 - 1))  (see "uniform")
    a = max(log(u), -DBL_MAX)    # log(0) = -inf clamped
    a = min(a, -2**-32)          # SGLang >= 0.5.18 only ("cap_unit_uniform"); 0.5.17 lets h = 2**32-1 reach u = 1
    g = -log(-a)                 # the Gumbel noise; +inf at u = 1 without the cap
    score = g + float64(l)

and the drawn token is ``torch.argmax`` of the scores: the first NaN if any (0.5.17: a zero-probability token
whose hash is ``2**32 - 1`` scores ``+inf + -inf = NaN`` and wins), else the first index of the maximum.

Two release / device differences, both parameters here (the integration maps them; the release one belongs
in ``integration/compat.py``):

* ``cap_unit_uniform`` -- 0.5.17 clamps ``log(u)`` from below only; 0.5.18 - 0.5.23 also from above at
  ``-2**-32`` (checked in the installed 0.5.17 and 0.5.18 - 0.5.21 sources), so ``h = 2**32 - 1`` draws the
  Gumbel value of its neighbour instead of ``+inf``.
* ``uniform`` -- SGLang writes ``hashed.to(float64) / torch.iinfo(torch.uint32).max``.  Divided by a
  Python scalar, torch's CUDA kernel multiplies by the scalar's reciprocal (``div_true_kernel_cuda``:
  "compute a * reciprocal(b)"), and Inductor (the function is ``@torch.compile``) lowers a division by a
  constant the same way on CUDA, not on CPU (pytorch#157959); the CPU kernel divides.  The two differ in
  the last bit of ``u`` for about one hash in eight, so ``"divide"`` and ``"reciprocal"`` name them and
  ``None`` means "what torch does on this tensor's device" (the torch expression itself is used).

The verify (Daliri, Musco, Suresh, arXiv 2408.07978): the target token at every verified position ``j`` is
the race above on the target's probabilities at ``positions[:, j]``; a draft that raced its own
probabilities with the SAME keys proposed ``y_j``; ``y_j`` is accepted while it equals the target's token,
the first mismatch emits the target's token, and a fully accepted chain emits the target's token at the
last position as the bonus.  Every emitted token is therefore the non-speculative server's token, whatever
the draft proposed; the draft only decides how many come out per step.

Layering: keys -> reference -> this module -> kernels.  Slow and memory-hungry (``[R, V]`` int64 and float64),
meant for CPU tests, audits and the Triton kernel's parity checks (``kernels/coupled_race.py``).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from .reference import murmur3_unsalted_hash

__all__ = [
    "UMAX",
    "UNIFORMS",
    "LOG_U_CAP",
    "EMIT_PAD",
    "check_coupled_race_inputs",
    "check_hot_to_target",
    "check_verify_inputs",
    "accept_and_emit",
    "position_with_hash",
    "resolve_uniform",
    "coupled_gumbel_reference",
    "coupled_hot_race_reference",
    "coupled_race_reference",
    "coupled_race_reference_probs",
    "coupled_verify_reference",
]

#: ``torch.iinfo(torch.uint32).max``: SGLang's divisor of the hash.
UMAX = (1 << 32) - 1
#: The two float64 forms of ``u = h / UMAX`` (module docstring): IEEE division, or the product with fl(1/UMAX).
UNIFORMS = ("divide", "reciprocal")
#: 0.5.18+'s upper clamp of ``log(u)``.
LOG_U_CAP = -(2.0**-32)
#: Entries of the emitted-token matrix past the accepted prefix and its one correction/bonus token.
EMIT_PAD = -1


def resolve_uniform(uniform: Optional[str], device: torch.device) -> str:
    """``uniform`` validated; ``None`` becomes what torch's ``tensor / python_scalar`` does on ``device``."""
    if uniform is None:
        return "reciprocal" if torch.device(device).type == "cuda" else "divide"
    if uniform not in UNIFORMS:
        raise ValueError(
            f"uniform must be None (torch's own division on the tensor's device), 'divide' (CPU torch) or "
            f"'reciprocal' (CUDA torch and Inductor), got {uniform!r}"
        )
    return uniform


def check_coupled_race_inputs(logprobs, seeds, positions, uniform=None, *, float32_only: bool = False) -> None:
    """Shapes and dtypes of a coupled race (no tensor values are read: capture-safe, no host sync).

    ``logprobs`` ``[R, V]`` floating (float32 only for the kernel), ``seeds`` int64 ``[R]``, ``positions``
    int32/int64 ``[R]``, all on one device; ``uniform`` one of None / :data:`UNIFORMS`.
    """
    if not isinstance(logprobs, torch.Tensor) or logprobs.dim() != 2:
        raise ValueError(
            f"logprobs must be a 2-D [rows, vocab] tensor (flatten [B, S+1, V] verify logits with "
            f".flatten(0, 1)), got {getattr(logprobs, 'shape', type(logprobs))}"
        )
    if not logprobs.dtype.is_floating_point:
        raise ValueError(f"logprobs must be a floating tensor, got {logprobs.dtype}")
    if float32_only and logprobs.dtype != torch.float32:
        raise ValueError(
            f"logprobs must be float32 (torch.log of the float32 probabilities SGLang's sampler races), got "
            f"{logprobs.dtype}; pass torch.log(probs.float())"
        )
    rows, vocab = logprobs.shape
    if vocab < 1 or vocab > 2**31 - 1:
        raise ValueError(f"the vocabulary (last) dimension must be in [1, 2**31), got {vocab}")
    if not isinstance(seeds, torch.Tensor) or seeds.dtype != torch.int64 or seeds.dim() != 1:
        raise ValueError(
            f"seeds must be a 1-D int64 tensor (SamplingBatchInfo.sampling_seed, one per row), got "
            f"{getattr(seeds, 'dtype', type(seeds))} of shape {tuple(getattr(seeds, 'shape', ()))}"
        )
    if not isinstance(positions, torch.Tensor) or positions.dtype not in (torch.int32, torch.int64) \
            or positions.dim() != 1:
        raise ValueError(
            f"positions must be a 1-D int32 or int64 tensor (one key position per row), got "
            f"{getattr(positions, 'dtype', type(positions))} of shape {tuple(getattr(positions, 'shape', ()))}"
        )
    if seeds.numel() != rows or positions.numel() != rows:
        raise ValueError(
            f"seeds and positions need one entry per logprobs row: {seeds.numel()} seeds and {positions.numel()} "
            f"positions for {rows} rows (repeat each request's seed over its S+1 verify rows: "
            f"seeds.repeat_interleave(S + 1))"
        )
    if seeds.device != logprobs.device or positions.device != logprobs.device:
        raise ValueError(
            f"logprobs, seeds and positions must be on one device, got {logprobs.device}, {seeds.device}, "
            f"{positions.device}"
        )
    resolve_uniform(uniform, logprobs.device)


def check_hot_to_target(hot_to_target, draft_columns: int, device: torch.device) -> None:
    """``hot_to_target`` int64 ``[draft_columns]`` on ``device``: one target id per draft column
    (``HotVocab.hot_to_target``).  Its values (unique ids in the target vocabulary, below ``2**31``) are not read
    here, which would synchronise: ``HotVocab`` checks them once, when it is built."""
    if not isinstance(hot_to_target, torch.Tensor) or hot_to_target.dtype != torch.int64 \
            or tuple(hot_to_target.shape) != (draft_columns,):
        raise ValueError(f"hot_to_target must be int64 [{draft_columns}] (one target id per draft column: "
                         f"HotVocab.hot_to_target), got {getattr(hot_to_target, 'dtype', None)} "
                         f"{tuple(getattr(hot_to_target, 'shape', ()))}")
    if hot_to_target.device != torch.device(device):
        raise ValueError(f"hot_to_target is on {hot_to_target.device} but the draft distribution is on {device}; "
                         f"move the map once with HotVocab.to(device)")


def coupled_gumbel_reference(
    seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int, *, cap_unit_uniform: bool = True,
    uniform: Optional[str] = None, token_ids: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """SGLang's float64 Gumbel noise ``[R, V]`` for token ids ``0..V-1`` (the module docstring's ``g``), or
    ``[R, len(token_ids)]`` for the given (target) token ids."""
    cols = torch.arange(vocab_size, dtype=torch.int64, device=seeds.device) if token_ids is None else token_ids
    hashed = murmur3_unsalted_hash(seeds, positions, cols)
    x = hashed.to(torch.float64)
    if uniform is None:
        x = x / UMAX  # the torch expression SGLang uses: torch picks division or reciprocal per device
    elif resolve_uniform(uniform, seeds.device) == "divide":
        x = x / torch.tensor(float(UMAX), dtype=torch.float64, device=x.device)  # tensor divisor: a true division
    else:
        x = x * (1.0 / UMAX)
    if cap_unit_uniform:
        x.log_().clamp_(min=torch.finfo(x.dtype).min, max=LOG_U_CAP).neg_()
    else:
        x.log_().clamp_(min=torch.finfo(x.dtype).min).neg_()
    return x.log_().neg_()


def coupled_race_reference(
    logprobs: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor, *, cap_unit_uniform: bool = True,
    uniform: Optional[str] = None,
) -> torch.Tensor:
    """SGLang's ``multinomial_with_seed(logprobs, seeds, positions)`` keyed by token id: int64 tokens ``[R]``.

    ``logprobs`` is what ``multinomial_with_seed`` receives (the plugin's target path: ``torch.log`` of the
    float32 probabilities, so ``-inf`` for a truncated token); any float dtype, promoted to float64 as there.
    """
    check_coupled_race_inputs(logprobs, seeds, positions, uniform)
    gumbel = coupled_gumbel_reference(
        seeds, positions, logprobs.shape[1], cap_unit_uniform=cap_unit_uniform, uniform=uniform
    )
    return gumbel.add_(logprobs.to(torch.float64)).argmax(dim=1)


def coupled_hot_race_reference(
    logprobs: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor, hot_to_target: torch.Tensor, *,
    cap_unit_uniform: bool = True, uniform: Optional[str] = None,
) -> torch.Tensor:
    """The race of a reduced-vocabulary draft: ``logprobs`` ``[R, Vd]`` over the hot tokens, each raced with the
    Gumbel noise of its TARGET id ``hot_to_target[j]``; returns the winning target ids (int64 ``[R]``), the first
    NaN or the first maximum by target id.  Equal to the full race on the scattered log q (``-inf`` off the hot set)
    wherever that race's winner is finite; only 0.5.17's uncapped ``+inf`` noise can make an off-set token win there
    (``+inf + -inf = NaN``), which a reduced draft, having no such token, cannot propose."""
    check_coupled_race_inputs(logprobs, seeds, positions, uniform)
    check_hot_to_target(hot_to_target, logprobs.shape[1], logprobs.device)
    gumbel = coupled_gumbel_reference(seeds, positions, 0, cap_unit_uniform=cap_unit_uniform, uniform=uniform,
                                      token_ids=hot_to_target)
    by_target = torch.argsort(hot_to_target)
    pick = gumbel.add_(logprobs.to(torch.float64))[:, by_target].argmax(dim=1)
    return hot_to_target[by_target[pick]]


def coupled_race_reference_probs(probs: torch.Tensor, seeds, positions, **variant) -> torch.Tensor:
    """The race on probabilities, as ``sampling_from_probs_torch`` runs it: ``torch.log(probs)`` first."""
    if not isinstance(probs, torch.Tensor) or probs.dim() != 2:
        raise ValueError(f"probs must be a 2-D [rows, vocab] tensor, got {getattr(probs, 'shape', type(probs))}")
    return coupled_race_reference(torch.log(probs), seeds, positions, **variant)


def check_verify_inputs(target_probs, draft_tokens, seeds, positions) -> None:
    """Shapes of a coupled verify: ``[B, S+1, V]`` probabilities, ``[B, S]`` drafts, ``[B]`` seeds, ``[B, S+1]`` positions."""
    if not isinstance(target_probs, torch.Tensor) or target_probs.dim() != 3:
        raise ValueError(
            f"target_probs must be [batch, draft_len + 1, vocab], got {getattr(target_probs, 'shape', type(target_probs))}"
        )
    B, S1, _ = target_probs.shape
    if S1 < 1:
        raise ValueError("target_probs needs at least one verified position (the bonus), got 0")
    if not isinstance(draft_tokens, torch.Tensor) or draft_tokens.dtype not in (torch.int32, torch.int64) \
            or tuple(draft_tokens.shape) != (B, S1 - 1):
        raise ValueError(
            f"draft_tokens must be an int32/int64 [batch, draft_len] = [{B}, {S1 - 1}] tensor, got "
            f"{getattr(draft_tokens, 'dtype', type(draft_tokens))} {tuple(getattr(draft_tokens, 'shape', ()))}"
        )
    if not isinstance(positions, torch.Tensor) or tuple(positions.shape) != (B, S1):
        raise ValueError(
            f"positions must be [batch, draft_len + 1] = [{B}, {S1}] (position j keys the token verified at "
            f"step j: the pre-verify seq_len - 1 + j), got {tuple(getattr(positions, 'shape', ()))}"
        )
    if not isinstance(seeds, torch.Tensor) or tuple(seeds.shape) != (B,):
        raise ValueError(f"seeds must be [batch] = [{B}], got {tuple(getattr(seeds, 'shape', ()))}")


def accept_and_emit(target_tokens: torch.Tensor, draft_tokens: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(accepted_len [B], emitted [B, S+1])`` from the target's raced tokens ``[B, S+1]`` and the drafts ``[B, S]``.

    ``accepted_len`` counts the leading drafts equal to the target's token; ``emitted[:, :accepted_len + 1]`` are
    the target's tokens (the accepted drafts, then the correction or the bonus), the rest :data:`EMIT_PAD`.
    Torch ops only, no host sync (shared by the reference and the kernel's wrapper).
    """
    S = draft_tokens.shape[1]
    matches = draft_tokens.to(torch.int64) == target_tokens[:, :S]
    accepted = matches.to(torch.int64).cumprod(dim=1).sum(dim=1)
    steps = torch.arange(S + 1, device=target_tokens.device).view(1, -1)
    emitted = torch.where(steps <= accepted.view(-1, 1), target_tokens, torch.full_like(target_tokens, EMIT_PAD))
    return accepted, emitted


def coupled_verify_reference(
    target_probs: torch.Tensor, draft_tokens: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor,
    *, cap_unit_uniform: bool = True, uniform: Optional[str] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The coupled verify: ``(accepted_len int64 [B], emitted int64 [B, S+1])`` (module docstring).

    ``target_probs[b, j]`` are the probabilities SGLang's non-speculative sampler would race for the token at
    verified step ``j`` (after temperature and the token-id-keyed truncation), ``positions[b, j]`` its key
    position (``seq_len - 1 + j``, ``seq_len`` before the verify), ``draft_tokens[b, j]`` the draft's
    proposal for step ``j`` (raced by the draft with the same ``(seed, positions[b, j])`` key).
    """
    check_verify_inputs(target_probs, draft_tokens, seeds, positions)
    B, S1, V = target_probs.shape
    target = coupled_race_reference_probs(
        target_probs.reshape(B * S1, V), seeds.repeat_interleave(S1), positions.reshape(-1),
        cap_unit_uniform=cap_unit_uniform, uniform=uniform,
    ).view(B, S1)
    return accept_and_emit(target, draft_tokens)


def position_with_hash(seed: int, token: int, target_hash: int) -> int:
    """The uint32 key position ``p`` at which ``murmur3(seed, p, token) == target_hash`` (Python ints).

    MurmurHash3's block mix and finalizer are bijections of the 32-bit state, so the position word can be
    solved for: tests and GPU checks use it to build rows where a chosen token hits the hash extremes
    (``0`` and ``2**32 - 1``, where SGLang's clamps act) -- a random search would need ~2**32 hashes.
    Callers check the forward hash of the result; nothing here is used to draw tokens.
    """
    from . import keys

    m32 = 0xFFFFFFFF

    def inv(c):
        return pow(c, -1, 1 << 32)

    def rotl(x, r):
        return ((x << r) | (x >> (32 - r))) & m32

    def mix_k(w):
        return (rotl((w * keys.MURMUR_C1) & m32, 15) * keys.MURMUR_C2) & m32

    def mix(h, w):
        return ((rotl(h ^ mix_k(w), 13) * 5) + keys.MURMUR_N) & m32

    def unmix_state(h_after, h_before):
        # h_after = rotl(h_before ^ k, 13) * 5 + n  ->  k
        return rotl(((h_after - keys.MURMUR_N) * inv(5)) & m32, 19) ^ h_before

    def unshift_xor(y, s):
        x = y
        for _ in range(32 // s + 1):
            x = y ^ (x >> s)
        return x & m32

    lo, hi = keys.seed_words(seed)
    h2 = mix(mix(0, lo), hi)
    # undo the finalizer's steps in reverse order (xor-shift 16, times F2, xor-shift 13, times F1, xor-shift 16,
    # xor the key length), then the column word's block mix
    h = unshift_xor(target_hash & m32, 16)
    h = (h * inv(keys.MURMUR_F2)) & m32
    h = unshift_xor(h, 13)
    h = (h * inv(keys.MURMUR_F1)) & m32
    h = unshift_xor(h, 16) ^ keys.KEY_LENGTH_BYTES
    h3 = unmix_state(h, 0) ^ mix_k(token)  # the state after the position word
    k2 = unmix_state(h3, h2)  # = mix_k(position)
    w = (rotl((k2 * inv(keys.MURMUR_C2)) & m32, 17) * inv(keys.MURMUR_C1)) & m32
    return w
