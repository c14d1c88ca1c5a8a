"""DETSPEC verify (integration/sampling/verify.py) on SGLang's real ``eagle_sample``: each row is verified by its own params.

Upstream renormalises the target probabilities batch-wide (one top-k / top-p / greedy neighbour sends every row
through FlashInfer's renorm) and ignores min-p. DETSPEC runs the same upstream body with the renorm names deferred
and the project's row-local truncation applied right before SGLang's chain rejection kernel (Triton, interpreted
here). Checked: a mixed batch gives every row the accept length and tokens it gets alone and in a uniform batch;
upstream's renorm kernels are never reached; top-k and min-p hold per row (upstream ignores min-p: the control);
pure-temperature batches run exactly upstream's code; the name checks refuse an eagle_sample DETSPEC would not
intercept.
"""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from sglang_detspec.integration.sampling import verify

import sglang_verify_harness as harness
from sglang_verify_harness import Params

N = 4
PROBE = Params(seed=1234)
# One request of every kind the issue names beside the probe.
NEIGHBOURS = [
    Params(seed=5, temperature=0.0),  # greedy
    Params(seed=6, top_k=1),
    Params(seed=7, top_k=5),
    Params(seed=8, top_k=50),
    Params(seed=9, top_p=0.9),
    Params(seed=10, min_p=0.1),
    Params(seed=11, temperature=0.3),
    Params(seed=12, temperature=1.7),
    Params(seed=13, top_k=5, top_p=0.8, min_p=0.05),
]


@pytest.fixture
def verify_on_cpu(monkeypatch):
    """Yield the recorded upstream renorm calls; the rebound eagle_sample is rebuilt on the patched module."""
    with harness.eagle_sample_on_cpu(monkeypatch) as calls:
        verify._rebound_eagle_sample.cache_clear()
        yield calls
    verify._rebound_eagle_sample.cache_clear()


def _greedy(params: Params) -> bool:
    return params.temperature == 0.0 or params.top_k == 1


def _outcome(result, row):
    predict, accept = result
    k = int(accept[row])
    return k, predict[row, :k].tolist()


def _run(eagle_sample, rows, params, seq_lens):
    with harness.deterministic_rs(N):
        return harness.run_eagle_sample(eagle_sample, rows, params, seq_lens, N)


def test_mixed_batch_gives_each_row_its_alone_and_uniform_outcome(verify_on_cpu):
    params = [PROBE, *NEIGHBOURS]
    rows = harness.verify_rows(len(params), N, seed=3)
    seq_lens = [17 + 5 * i for i in range(len(params))]
    mixed = _run(verify.detspec_eagle_sample, rows, params, seq_lens)
    assert verify_on_cpu.names == [], "DETSPEC verify reached an upstream renorm kernel"
    permutation = list(range(len(params)))[::-1]
    permuted = _run(
        verify.detspec_eagle_sample,
        [rows[i] for i in permutation],
        [params[i] for i in permutation],
        [seq_lens[i] for i in permutation],
    )
    accepted = []
    for r in range(len(params)):
        expected = _outcome(mixed, r)
        accepted.append(expected[0])
        others = harness.verify_rows(2, N, seed=100 + r)
        if _greedy(params[r]):
            # An all-greedy batch takes upstream's argmax branch, whose CPU kernel is not runnable here; beside
            # plain sampled rows the greedy row must commit exactly the target argmax.
            around = [Params(seed=91), params[r], Params(seed=92)]
            argmax = rows[r].target_logits.argmax(-1)[: expected[0]].tolist()
            assert expected[1] == argmax, f"greedy row {r} commits the target argmax"
        else:
            alone = _run(verify.detspec_eagle_sample, [rows[r]], [params[r]], [seq_lens[r]])
            assert _outcome(alone, 0) == expected, f"row {r} ({params[r]}) alone"
            # A uniform batch: the same params, other seeds and rows around it.
            around = [dataclasses.replace(params[r], seed=91), params[r], dataclasses.replace(params[r], seed=92)]
        beside = _run(verify.detspec_eagle_sample, [others[0], rows[r], others[1]], around, [9, seq_lens[r], 11])
        assert _outcome(beside, 1) == expected, f"row {r} ({params[r]}) beside {around[0]}"
        assert _outcome(permuted, permutation.index(r)) == expected, f"row {r} permuted"
    # Not vacuous: some drafts were rejected and some accepted.
    assert min(accepted) < N and max(accepted) > 1


def test_upstream_control_reaches_the_batch_wide_renorm(verify_on_cpu):
    """The same mixed batch through upstream's eagle_sample calls its renorm kernels for every row."""
    from sglang.srt.speculative.eagle_utils import eagle_sample

    params = [PROBE, *NEIGHBOURS]
    rows = harness.verify_rows(len(params), N, seed=3)
    _run(eagle_sample, rows, params, [17] * len(params))
    assert "top_k_renorm_prob" in verify_on_cpu.names and "top_p_renorm_prob" in verify_on_cpu.names


def _committed(result, rows, params):
    """(row, slot, token, target probs of that slot) for every token a verify step committed."""
    predict, accept = result
    out = []
    for r, p in enumerate(params):
        for slot in range(int(accept[r])):
            probs = torch.softmax(rows[r].target_logits[slot] / (p.temperature or 1.0), -1)
            out.append((r, slot, int(predict[r, slot]), probs))
    return out


def test_top_k_and_min_p_hold_per_row_and_upstream_ignores_min_p(verify_on_cpu):
    from sglang.srt.speculative.eagle_utils import eagle_sample

    count = 12
    params = [Params(seed=40 + i, min_p=0.5) if i % 2 else Params(seed=40 + i, top_k=3) for i in range(count)]
    # Flat targets: many tokens are below half the maximum, so a min-p-blind verify commits some of them.
    rows = harness.verify_rows(count, N, seed=8, sharp=0.7)
    seq_lens = list(range(30, 30 + count))
    detspec = _committed(_run(verify.detspec_eagle_sample, rows, params, seq_lens), rows, params)
    upstream = _committed(_run(eagle_sample, rows, params, seq_lens), rows, params)

    def violations(committed):
        bad = 0
        for r, _slot, token, probs in committed:
            if params[r].min_p:
                bad += bool(probs[token] < params[r].min_p * probs.max())
            else:
                bad += token not in probs.topk(params[r].top_k).indices.tolist()
        return bad

    assert violations(detspec) == 0
    assert len(detspec) >= count
    assert violations(upstream) > 0, "control: upstream's verify ignores min-p"


def test_pure_temperature_batch_runs_upstream_unchanged(verify_on_cpu, monkeypatch):
    from sglang.srt.speculative.eagle_utils import eagle_sample

    launched = []
    monkeypatch.setattr(verify, "truncate_request_rows", lambda *a, **k: launched.append(1))
    params = [Params(seed=s, temperature=t) for s, t in ((1, 1.0), (2, 0.7), (3, 1.3))]
    rows = harness.verify_rows(3, N, seed=4)
    ours = _run(verify.detspec_eagle_sample, rows, params, [5, 6, 7])
    theirs = _run(eagle_sample, rows, params, [5, 6, 7])
    assert launched == []
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])


def test_installed_eagle_sample_passes_the_name_checks():
    from sglang.srt.speculative import eagle_utils

    verify.check_verify_rebinding(eagle_utils.eagle_sample)
    verify._rebound_eagle_sample.cache_clear()
    assert callable(verify._rebound_eagle_sample())


def _fake(source):
    mod = types.ModuleType("fake_eagle_utils")
    exec(source, mod.__dict__)
    return mod.eagle_sample


def test_name_checks_refuse_an_unknown_renorm_or_a_missing_chain_kernel():
    unknown_renorm = _fake(
        "def eagle_sample(v, b, l):\n"
        "    from newlib import top_k_renorm_v2, chain_speculative_sampling_triton\n"
        "    return top_k_renorm_v2, chain_speculative_sampling_triton\n"
    )
    with pytest.raises(RuntimeError, match="top_k_renorm_v2"):
        verify.check_verify_rebinding(unknown_renorm)
    no_chain = _fake("def eagle_sample(v, b, l):\n    from newlib import top_k_renorm_prob\n    return 1\n")
    with pytest.raises(RuntimeError, match="chain_speculative_sampling_triton"):
        verify.check_verify_rebinding(no_chain)


def test_a_sampled_verify_that_skips_the_chain_kernel_raises(monkeypatch):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    monkeypatch.setattr(verify, "_rebound_eagle_sample", lambda: (lambda *a, **k: "committed"))
    batch = types.SimpleNamespace(
        forward_mode=ForwardMode.DECODE, sampling_info=types.SimpleNamespace(is_all_greedy=False)
    )
    with pytest.raises(RuntimeError, match="without the rejection-sampling kernel"):
        verify.detspec_eagle_sample(types.SimpleNamespace(draft_token_num=N), batch, None)
    batch.sampling_info.is_all_greedy = True  # the greedy branch needs no chain kernel
    assert verify.detspec_eagle_sample(types.SimpleNamespace(draft_token_num=N), batch, None) == "committed"
