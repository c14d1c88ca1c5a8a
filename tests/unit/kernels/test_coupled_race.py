"""The fused coupled race (kernels/coupled_race.py) vs its pure-torch reference (coupled_reference.py).

On CPU the kernel runs under TRITON_INTERPRET=1 (tests/conftest.py): the interpreter executes every program in
NumPy, so shapes stay small and blocks narrow (several chunks per row).  The reference itself is checked
against SGLang's ``multinomial_with_seed`` in test_coupled_reference.py; this file needs torch and Triton only.
Every case runs both release variants (``cap_unit_uniform``) and both float64 uniform forms.
"""

import numpy as np
import pytest
import torch

from sglang_detspec.kernels.coupled_race import coupled_race
from sglang_detspec.kernels.coupled_race_probs import coupled_race_probs, coupled_verify
from sglang_detspec.stream.coupled_reference import (
    EMIT_PAD,
    accept_and_emit,
    coupled_gumbel_reference,
    coupled_race_reference,
    coupled_verify_reference,
    position_with_hash,
)
from sglang_detspec.stream.reference import murmur3_unsalted_hash

DEV = "cuda" if torch.cuda.is_available() else "cpu"
VARIANTS = [(True, "divide"), (False, "reciprocal"), (True, "reciprocal"), (False, "divide")]


def _rows(R, V, kind, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(R, V, generator=g) * 3.0
    if kind == "peaked":
        logits = logits * 4.0
    if kind == "truncated":  # top-k 5: the rest are zero probabilities (log = -inf), whole chunks of them
        thr = logits.topk(min(5, V), -1).values[:, -1:]
        logits = logits.masked_fill(logits < thr, float("-inf"))
    logprobs = torch.log(torch.softmax(logits, -1))
    if kind == "flat":
        logprobs = torch.full((R, V), -float(torch.log(torch.tensor(float(V)))))
    seeds = torch.randint(-(2**63), 2**63 - 1, (R,), generator=g)
    positions = torch.randint(0, 2**40, (R,), generator=g)
    return logprobs, seeds, positions


def _kernel_log(probs):
    """The float32 ``log`` ``coupled_race_probs`` takes inside the kernel, on this device: ``tl.log``. On a GPU that
    is torch's own (equal on every float32, scripts/gpu_kernel_checks.py); the interpreter runs it as numpy's, which
    differs from CPU torch's in the last bit on a few percent of inputs."""
    if DEV == "cuda":
        return torch.log(probs)
    return torch.from_numpy(np.log(probs.numpy()))


def _check(logprobs, seeds, positions, cap, uniform, block=None):
    """The race on ``logprobs`` and, with the log taken in the kernel, on ``exp(logprobs)``, vs the reference."""
    got = coupled_race(logprobs.to(DEV), seeds.to(DEV), positions.to(DEV), cap_unit_uniform=cap, uniform=uniform,
                       block_size=block)
    want = coupled_race_reference(logprobs, seeds, positions, cap_unit_uniform=cap, uniform=uniform)
    assert got.dtype == torch.int64 and got.shape == (logprobs.shape[0],)
    assert torch.equal(got.cpu(), want), (got.tolist(), want.tolist())
    probs = torch.exp(logprobs)  # -inf -> 0, +inf -> +inf, NaN -> NaN: the same special entries
    got_p = coupled_race_probs(probs.to(DEV), seeds.to(DEV), positions.to(DEV), cap_unit_uniform=cap,
                               uniform=uniform, block_size=block)
    want_p = coupled_race_reference(_kernel_log(probs), seeds, positions, cap_unit_uniform=cap, uniform=uniform)
    assert torch.equal(got_p.cpu(), want_p), (got_p.tolist(), want_p.tolist())
    return want


@pytest.mark.parametrize(
    "R,V,kind,block",
    [
        (5, 300, "dense", 64),  # partial last chunk
        (3, 1000, "peaked", None),  # one chunk per row (the interpreter's default block)
        (4, 777, "truncated", 128),  # all -inf chunks beside a few live tokens
        (3, 513, "flat", 32),  # every logprob equal: only the noise decides
        (2, 1, "dense", None),  # V = 1
        (3, 17, "dense", 16),  # the smallest block, two chunks
        (4, 256, "dense", 64),  # V a multiple of the block: no chunk masks its loads
        (3, 512, "truncated", 128),
    ],
)
def test_kernel_matches_reference_over_shapes(R, V, kind, block):
    logprobs, seeds, positions = _rows(R, V, kind, seed=R * 1000 + V)
    for cap, uniform in VARIANTS[:2] if V > 100 else VARIANTS:
        _check(logprobs, seeds, positions, cap, uniform, block)


def test_constructed_near_ties_same_and_other_chunk():
    """Two tokens whose float64 scores are within 0 .. 1e-2 of each other (inside and outside the screen's
    margin), in the same chunk or in different chunks; every other token far below."""
    R, V, block = 24, 384, 128
    g = torch.Generator().manual_seed(3)
    seeds = torch.randint(-(2**63), 2**63 - 1, (R,), generator=g)
    positions = torch.randint(0, 2**40, (R,), generator=g)
    deltas = [0.0, 1e-9, -1e-9, 1e-7, -1e-7, 1e-5, -1e-5, 1e-3, -1e-3, 3e-3, -6e-3, 1e-2]
    for cap, uniform in VARIANTS[:2]:
        gumbel = coupled_gumbel_reference(seeds, positions, V, cap_unit_uniform=cap, uniform=uniform)
        logprobs = torch.full((R, V), -40.0)
        for r in range(R):
            i = int(torch.randint(0, V - 260, (1,), generator=g))
            j = i + (1 if r % 2 == 0 else 257)  # same chunk / two chunks later
            logprobs[r, i] = 0.0
            logprobs[r, j] = float(gumbel[r, i] - gumbel[r, j] + deltas[r % len(deltas)])
        scores = gumbel + logprobs.double()
        top2 = scores.topk(2, dim=1).values
        # the construction does make near ties: most rows' top two are inside the screen's 2**-8 margin
        assert int(((top2[:, 0] - top2[:, 1]) < 2.0**-8).sum()) >= R * 2 // 3
        _check(logprobs, seeds, positions, cap, uniform, block)


def _row_hitting(seed, token, target_hash):
    p = position_with_hash(seed, token, target_hash)
    h = murmur3_unsalted_hash(torch.tensor([seed]), torch.tensor([p]), torch.tensor([token]))
    assert int(h) == target_hash  # the construction, checked with the forward hash
    return p


def test_hash_extremes_zero_probabilities_and_degenerate_rows():
    """h = 2**32 - 1 on a live and on a zero-probability token (0.5.17: Gumbel +inf, and +inf + -inf = NaN),
    h = 0 (the -DBL_MAX clamp: a finite score), all -inf rows, NaN and +inf entries (first NaN; exact ties of
    +inf scores: first index)."""
    V, block = 200, 64
    R = 10
    seeds = torch.tensor([11, -5, 2**40 + 1, 7, 8, 9, 10, 12, 13, 14], dtype=torch.int64)
    positions = torch.randint(0, 2**32, (R,), generator=torch.Generator().manual_seed(1))
    logprobs, _, _ = _rows(R, V, "dense", seed=9)
    positions[0] = _row_hitting(11, 150, 0xFFFFFFFF)  # a live token at u = 1
    positions[1] = _row_hitting(-5, 70, 0xFFFFFFFF)
    logprobs[1, 70] = float("-inf")  # a zero-probability token at u = 1
    positions[2] = _row_hitting(2**40 + 1, 3, 0)
    logprobs[2, 3] = 0.0  # h = 0: score -709.78, far below its float32-screen neighbours' -3.1 floor ...
    logprobs[2, 10] = -30.0  # ... so this one (score -30 + g >= -33.1) wins; an unclamped screen would hide it
    logprobs[2, 11:] = float("-inf")
    logprobs[2, :3] = float("-inf")
    logprobs[2, 4:10] = float("-inf")
    positions[9] = _row_hitting(14, 3, 0)
    logprobs[9] = float("-inf")
    logprobs[9, 3] = -1.0  # the only live token has h = 0: finite, so it beats the -inf rest
    logprobs[3] = float("-inf")  # every token truncated: token 0
    logprobs[4, 120] = float("nan")
    logprobs[4, 20] = float("nan")
    logprobs[5, 40] = float("inf")
    logprobs[5, 170] = float("inf")  # +inf in two chunks
    logprobs[6, 199] = float("inf")  # in the partial last chunk
    logprobs[7, 5] = float("inf")
    logprobs[7, 6] = float("inf")  # +inf twice in one chunk
    logprobs[8, :100] = float("-inf")
    for cap, uniform in VARIANTS:
        want = _check(logprobs, seeds, positions, cap, uniform, block).tolist()
        # what the definition implies on these rows, independently of either implementation
        assert want[2:8] == [10, 0, 20, 40, 199, 5] and want[9] == 3
        if cap:
            assert want[1] != 70  # capped: the zero-probability token scores -inf
        else:
            assert want[0] == 150 and want[1] == 70  # +inf wins; NaN wins


def test_strided_rows_and_int32_positions():
    B, S1, V = 3, 3, 300
    logprobs, seeds, positions = _rows(B * S1, V, "dense", seed=4)
    buf = torch.full((B, S1 + 1, V), float("nan"))
    buf[:, 1:] = logprobs.view(B, S1, V)
    view = buf[:, 2]  # row stride (S1 + 1) * V, read in place
    got = coupled_race(view.to(DEV), seeds[:B].to(DEV), positions[:B].to(torch.int32).to(DEV), block_size=128)
    want = coupled_race_reference(view.contiguous(), seeds[:B], positions[:B].to(torch.int32))
    assert torch.equal(got.cpu(), want)
    assert torch.equal(want, coupled_race_reference(view.contiguous(), seeds[:B], positions[:B] & 0xFFFFFFFF))


def test_verify_wrapper_matches_reference():
    B, S, V = 4, 3, 160
    g = torch.Generator().manual_seed(8)
    probs = torch.softmax(torch.randn(B, S + 1, V, generator=g) * 2, -1)
    probs[0, 1, 100:] = 0.0  # a truncated verify row
    seeds = torch.randint(-(2**63), 2**63 - 1, (B,), generator=g)
    positions = torch.randint(0, 2**31, (B, 1), generator=g) + torch.arange(S + 1)
    target = coupled_race_reference(  # the verify takes the log inside the kernel
        _kernel_log(probs.reshape(-1, V)), seeds.repeat_interleave(S + 1), positions.reshape(-1)
    ).view(B, S + 1)
    drafts = target[:, :S].clone()
    drafts[1, 0] = (drafts[1, 0] + 1) % V  # rejected at once
    drafts[2, 2] = (drafts[2, 2] + 1) % V  # rejected at the last draft
    acc_k, emit_k = coupled_verify(probs.to(DEV), drafts.to(DEV), seeds.to(DEV), positions.to(DEV), block_size=64)
    acc_r, emit_r = accept_and_emit(target, drafts)
    assert torch.equal(acc_k.cpu(), acc_r) and torch.equal(emit_k.cpu(), emit_r)
    if torch.equal(_kernel_log(probs), torch.log(probs)):  # on a GPU: also the reference verify end to end
        assert torch.equal(acc_r, coupled_verify_reference(probs, drafts, seeds, positions)[0])
    assert acc_r.tolist() == [S, 0, 2, S]
    assert emit_r[1].tolist() == [int(target[1, 0])] + [EMIT_PAD] * S


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda a: dict(a, logprobs=a["logprobs"].double()), "float32"),
        (lambda a: dict(a, logprobs=a["logprobs"][0]), "2-D"),
        (lambda a: dict(a, logprobs=torch.zeros(3, 128, device=DEV)[:, ::2]), "contiguous in its last"),
        (lambda a: dict(a, seeds=a["seeds"].to(torch.int32)), "int64"),
        (lambda a: dict(a, positions=a["positions"].float()), "int32 or int64"),
        (lambda a: dict(a, positions=a["positions"][:1]), "one entry per logprobs row"),
        (lambda a: dict(a, uniform="half"), "uniform must be"),
        (lambda a: dict(a, block_size=100), "power of two"),
    ],
)
def test_invalid_inputs_are_refused_with_the_fix(change, match):
    logprobs, seeds, positions = _rows(3, 64, "dense", seed=0)
    args = dict(logprobs=logprobs.to(DEV), seeds=seeds.to(DEV), positions=positions.to(DEV))
    bad = change(args)
    with pytest.raises(ValueError, match=match):
        coupled_race(bad.pop("logprobs"), bad.pop("seeds"), bad.pop("positions"), **bad)


def test_probs_screen_subnormal_large_negative_and_signed_zero():
    """The ratio screen of ``coupled_race_probs`` (kernels/coupled_race.py): rows of subnormal probabilities only
    (the 2**64 scaling), a subnormal token that outscores a normal one by its noise, values above the screen's
    2**16 limit and +inf (exact chunks), a negative value (log NaN), -0.0 (log -inf), and a row whose only positive
    probability sits on a hash of 0 (every ratio 0: the exact fallback)."""
    V, block = 96, 32
    R = 7
    g = torch.Generator().manual_seed(21)
    seeds = torch.randint(-(2**63), 2**63 - 1, (R,), generator=g)
    positions = torch.randint(0, 2**40, (R,), generator=g)
    probs = torch.softmax(torch.randn(R, V, generator=g) * 2, -1)
    tiny = torch.finfo(torch.float32).tiny
    probs[0] = torch.rand(V, generator=g) * tiny  # every probability subnormal
    probs[1, :] = 0.0
    probs[1, 5] = 2.0**-126
    probs[1, 40] = 3e-45  # subnormal, far below token 5 unless the noise lifts it
    probs[1, 70] = 7e-39
    probs[2, 33] = 2.0**20  # above the screen limit: that chunk is scored exactly
    probs[3, 50] = float("inf")
    probs[4, 12] = -0.5  # log NaN: the first NaN wins
    probs[5, :] = 0.0
    probs[5, 60] = -0.0
    probs[5, 61] = 1.0
    positions[6] = position_with_hash(int(seeds[6]), 17, 0)
    probs[6, :] = 0.0
    probs[6, 17] = 0.25  # the only live token has h = 0: finite score, ratio 0
    for cap, uniform in VARIANTS[:2]:
        got = coupled_race_probs(probs.to(DEV), seeds.to(DEV), positions.to(DEV), cap_unit_uniform=cap,
                                 uniform=uniform, block_size=block).cpu()
        want = coupled_race_reference(_kernel_log(probs), seeds, positions, cap_unit_uniform=cap, uniform=uniform)
        assert torch.equal(got, want), (got.tolist(), want.tolist())
        assert want[3] == 50 and want[4] == 12 and want[5] == 61 and want[6] == 17


def test_probs_screen_on_rows_of_tiny_subnormals():
    """Rows whose every probability is a small multiple of 2**-149 (the 2**64 scaling keeps their ratios normal).
    Unscaled ratios round to a coarse subnormal grid; that rounding is monotone, so these random rows pass even
    without the scaling (checked), which is needed only where two near-tied ratios straddle a grid point."""
    R, V = 192, 48
    g = torch.Generator().manual_seed(5)
    probs = torch.randint(1, 9, (R, V), generator=g).to(torch.float32) * 2.0**-149
    seeds = torch.randint(-(2**63), 2**63 - 1, (R,), generator=g)
    positions = torch.randint(0, 2**40, (R,), generator=g)
    got = coupled_race_probs(probs.to(DEV), seeds.to(DEV), positions.to(DEV), block_size=16).cpu()
    want = coupled_race_reference(_kernel_log(probs), seeds, positions)
    assert torch.equal(got, want), int((got != want).sum())


def test_probs_rescans_in_chunk_order_beside_lone_candidates():
    """coupled_race_probs' stage 2 (kernels/coupled_race_probs.py): rows mixing lone-candidate chunks with chunks
    it rescans exactly -- +inf before a later NaN (the NaN wins), a negative probability after a +inf (log NaN:
    it wins), +inf in two chunks (the first), a value above the screen's 2**16 limit beside ordinary chunks, and
    a hash-0 token alone in its chunk beside live chunks (its ratio 0 never wins)."""
    V, block, R = 256, 32, 6
    g = torch.Generator().manual_seed(77)
    seeds = torch.randint(-(2**63), 2**63 - 1, (R,), generator=g)
    positions = torch.randint(0, 2**40, (R,), generator=g)
    probs = torch.softmax(torch.randn(R, V, generator=g) * 2, -1)
    probs[0, 10], probs[0, 150] = float("inf"), float("nan")
    probs[1, 40], probs[1, 200] = float("inf"), -0.25
    probs[2, 70], probs[2, 230] = float("inf"), float("inf")
    probs[3, 100] = 2.0**20
    positions[4] = position_with_hash(int(seeds[4]), 129, 0)
    probs[4, 128:160] = 0.0
    probs[4, 129] = 0.5  # chunk 4 holds only a hash-0 token: every ratio there is 0
    probs[5, 64:] = 0.0  # chunks 2..7 all zero: (-inf, first index) partials beside two live chunks
    for cap, uniform in VARIANTS[:2]:
        got = coupled_race_probs(probs.to(DEV), seeds.to(DEV), positions.to(DEV), cap_unit_uniform=cap,
                                 uniform=uniform, block_size=block).cpu()
        want = coupled_race_reference(_kernel_log(probs), seeds, positions, cap_unit_uniform=cap, uniform=uniform)
        assert torch.equal(got, want), (got.tolist(), want.tolist())
        assert want[:3].tolist() == [150, 200, 70] and want[3] == 100 and want[4] != 129 and want[5] < 64


@pytest.mark.parametrize("launch,match,vocab", [(dict(block_size=48), "power of two >= 16", 64),
                                                (dict(num_warps=3), "num_warps must be a power of two", 64),
                                                (dict(block_size=16), "pass block_size >= 32", 4096 * 16 + 1)])
def test_probs_race_refuses_a_bad_launch(launch, match, vocab):
    probs = torch.softmax(torch.randn(2, vocab), -1)
    with pytest.raises(ValueError, match=match):
        coupled_race_probs(probs.to(DEV), torch.tensor([1, 2], device=DEV), torch.tensor([3, 4], device=DEV), **launch)


def test_probs_launch_table_covers_every_size_with_8_or_16_columns_per_thread():
    """The launch table (its comment: timed on an H100): sorted bounds ending at infinity, so every size has a launch,
    and 8 or 16 columns per thread, the widths whose registers scripts/sass_counts.py keeps within budget."""
    from sglang_detspec.kernels.coupled_race_probs import LAUNCH_TABLE, race_launch

    bounds = [bound for bound, _ in LAUNCH_TABLE]
    assert bounds == sorted(bounds) and bounds[-1] == float("inf")
    assert all(block // (32 * warps) in (8, 16) and block % (32 * warps) == 0 for _, (block, warps) in LAUNCH_TABLE)
    # warps only: the interpreter widens the block (race_launch's docstring); the two launches differ in warps
    assert race_launch(1, 163840)[1] == LAUNCH_TABLE[0][1][1] and race_launch(1024, 163840)[1] == LAUNCH_TABLE[-1][1][1]


def test_probs_fast_screen_is_refused_where_ptx_cannot_run_and_changes_no_token_where_it_can():
    """The lg2.approx screen (exponential_f32's FAST form) is inline PTX: the interpreter cannot run it, so asking for
    it there is refused with the fix and the default there is the libdevice form; on a GPU both forms are the same
    exact race (the screen's bound allows lg2.approx), checked on random and peaked rows."""
    from sglang_detspec.kernels.coupled_race_probs import resolve_fast_screen

    g = torch.Generator().manual_seed(11)
    probs = torch.softmax(torch.randn(64, 5000, generator=g) * torch.tensor([1.0, 8.0]).repeat(32)[:, None], -1)
    seeds = torch.randint(-(2**62), 2**62, (64,), generator=g)
    positions = torch.randint(0, 2**31, (64,), generator=g)
    args = (probs.to(DEV), seeds.to(DEV), positions.to(DEV))
    if DEV == "cpu":
        assert resolve_fast_screen(None) is False
        with pytest.raises(ValueError, match="fast_screen=True needs a CUDA GPU.*fast_screen=None or False"):
            coupled_race_probs(*args, fast_screen=True)
    else:
        assert resolve_fast_screen(None) is True
        assert torch.equal(coupled_race_probs(*args, fast_screen=True), coupled_race_probs(*args, fast_screen=False))
    want = coupled_race_reference(_kernel_log(probs), seeds, positions, cap_unit_uniform=True)
    assert torch.equal(coupled_race_probs(*args, fast_screen=False).cpu(), want)
