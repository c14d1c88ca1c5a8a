"""DETSPEC verify of a reduced-vocabulary ("hot token") draft, through SGLang's real ``eagle_sample`` (CPU).

The wired path (the spec worker's :func:`verify.reduced_draft_vocab` around ``eagle_sample``, the reduced q
``[B, S, Vd]`` on ``verify_input.draft_probs``) must commit exactly what the full-vocabulary path commits on the
scattered q ``[B, S, V]`` (SGLang's own chain kernel, interpreted): the equivalence the stream layer guarantees
(``stream/hot_chain_verify.py``), here end to end with the row-local truncation of top-k / top-p / min-p rows in
front of it. Controls: a map that reads q at the target id instead of the draft index must differ, and without the
map upstream's own width check refuses the reduced q.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_detspec.integration.sampling import verify
from sglang_detspec.stream.hot_vocab import NOT_HOT, HotVocab, scatter_to_target

import sglang_verify_harness as harness
from sglang_verify_harness import Params, VerifyRow

N = 4  # draft tokens per request: the root + 3 drafts
V = harness.VOCAB
VD = 12
PARAMS = [
    Params(seed=1234),
    Params(seed=5, top_k=5),
    Params(seed=6, top_p=0.8),
    Params(seed=7, min_p=0.1),
    Params(seed=8, temperature=0.6),
    Params(seed=9, temperature=1.5, top_k=8, top_p=0.9),
]


@pytest.fixture
def verify_on_cpu(monkeypatch):
    with harness.eagle_sample_on_cpu(monkeypatch) as calls:
        verify._rebound_eagle_sample.cache_clear()
        yield calls
    verify._rebound_eagle_sample.cache_clear()


def _hot_map():
    return torch.randperm(V, generator=torch.Generator().manual_seed(11))[:VD]


def _reduced_rows(hot, count, seed):
    """Rows whose draft q covers the hot set only (``[N - 1, VD]``), drafts drawn from it as TARGET ids."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(count):
        target_logits = torch.randn(N, V, generator=g) * 2.0
        q = torch.softmax(target_logits[: N - 1, hot] * 0.7 + torch.randn(N - 1, VD, generator=g), dim=-1)
        drafts = hot[torch.multinomial(q, 1, generator=g).view(-1)]
        rows.append(VerifyRow(target_logits, q, torch.cat([torch.zeros(1, dtype=torch.int64), drafts])))
    return rows


def _scattered(rows, hot):
    return [VerifyRow(r.target_logits, scatter_to_target(r.draft_probs, hot, V), r.draft_tokens) for r in rows]


def _run(rows, seq_lens, hot_vocab=None):
    with harness.deterministic_rs(N), verify.reduced_draft_vocab(hot_vocab):
        return harness.run_eagle_sample_with_index(verify.detspec_eagle_sample, rows, PARAMS, seq_lens, N)


def _same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("seed", [3, 4])
def test_wired_reduced_verify_equals_the_full_vocab_verify_on_scattered_q(verify_on_cpu, seed):
    hot = _hot_map()
    rows = _reduced_rows(hot, len(PARAMS), seed)
    seq_lens = [17 + 5 * i for i in range(len(PARAMS))]
    wired = _run(rows, seq_lens, HotVocab.from_hot_token_id(hot, V))
    full = _run(_scattered(rows, hot), seq_lens)
    assert verify_on_cpu.names == [], "the DETSPEC verify reached an upstream renorm kernel"
    assert _same(wired, full)
    # Not vacuous: drafts were accepted and rejected across the batch.
    assert int(full[1].max()) > 0 and int(full[1].min()) < N - 1


def test_control_q_read_at_the_target_id_differs(verify_on_cpu):
    """A map whose inverse is the identity reads q at the target id instead of the draft index: must not agree."""
    hot = _hot_map()
    broken_inverse = torch.where(torch.arange(V) < VD, torch.arange(V), torch.tensor(NOT_HOT)).to(torch.int32)
    broken = HotVocab(hot, broken_inverse, V)
    outcomes = []
    for seed in (3, 4):
        rows = _reduced_rows(hot, len(PARAMS), seed)
        seq_lens = [17 + 5 * i for i in range(len(PARAMS))]
        outcomes.append(_same(_run(rows, seq_lens, broken), _run(_scattered(rows, hot), seq_lens)))
    assert not all(outcomes)


def test_without_the_map_upstream_refuses_the_reduced_q(verify_on_cpu):
    rows = _reduced_rows(_hot_map(), len(PARAMS), 5)
    with pytest.raises(ValueError, match="vocab-mismatched"):
        _run(rows, list(range(9, 9 + len(PARAMS))))


def test_stand_in_is_restored_and_a_wrong_width_refuses(verify_on_cpu):
    hot = HotVocab.from_hot_token_id(_hot_map(), V)
    q = torch.rand(2, N - 1, VD)
    verify_input = SimpleNamespace(draft_probs=q)
    site = verify.VerifySite(sampling_info=None, draft_token_num=N)
    with verify._hot_draft_probs_stand_in(site, verify_input, hot, q):  # noqa: SLF001
        stand_in = verify_input.draft_probs
        assert stand_in.shape == (2, N - 1, V) and stand_in.stride(-1) == 0  # no [B, S, V] allocation
        assert stand_in.untyped_storage().data_ptr() == q.untyped_storage().data_ptr()
    assert verify_input.draft_probs is q
    with pytest.raises(RuntimeError, match="expected \\[batch, steps, 12\\]"):
        with verify._hot_draft_probs_stand_in(site, verify_input, hot, torch.rand(2, N - 1, V)):  # noqa: SLF001
            pass
