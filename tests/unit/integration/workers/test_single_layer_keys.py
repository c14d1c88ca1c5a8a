"""DETSPEC single-layer draft sites call seeded_draft_proposal with 0.5.23's keys.

Each test drives the *real* upstream method body of the installed SGLang
(0.5.17 or 0.5.23; ``DetspecEagleDraftWorker`` runs it with DETSPEC sampling
names) on CPU, eagerly; only what needs a GPU model is faked
(single_layer_fakes.py) and, for the extend sites, ForwardBatch construction.

``seeded_draft_proposal`` is replaced by a recorder whose draw is a simple
function of the key, ``(seed + position + 7 * step) % V`` (argmax of q for
greedy rows), so the returned token chain also reveals a wrong key.
Expectations are written from the keys sglang 0.5.23's own seeded calls pass
(``speculative/eagle_worker_v2.py``: ``_draft_extend_for_prefill``,
``draft_forward``, ``_draft_extend_for_decode``), not from the code under test:
    prefill draft-extend : (seed, L, 0)
    draft-decode step i  : (seed, seq_lens + i + 1, i + 1)
    decode draft-extend  : (seed, new_seq_lens, 0)
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_detspec.integration.workers import single_layer as sl

from single_layer_fakes import (  # noqa: F401  (recorder, eager_torch_compile: pytest fixtures)
    HIDDEN,
    SEEDS,
    SEQ_LENS,
    TOP_KS,
    V,
    decode_forward_batch,
    eager_torch_compile,
    key_token,
    make_worker,
    published,
    recorder,
    sampling_info,
)

# ---------------------------------------------------------------------------
# Site 2: draft-decode (draft_forward), eager
# ---------------------------------------------------------------------------


def test_draft_forward_keys_every_step_and_hands_q_to_verify(recorder):
    num_steps = 4
    with published(speculative_num_steps=num_steps, speculative_num_draft_tokens=num_steps + 1):
        w = make_worker(num_steps)
        si = sampling_info(SEEDS, TOP_KS, temperatures=[0.7, 1.0, 1.3])
        fb = decode_forward_batch(si, SEQ_LENS, first_tokens=[3, 4, 5])
        _, _, draft_tokens, draft_probs = w.draft_forward(fb)

    assert [c["step"] for c in recorder.calls] == [1, 2, 3]
    for i, call in enumerate(recorder.calls):
        assert call["seed"].tolist() == SEEDS
        assert call["positions"].tolist() == [s + i + 1 for s in SEQ_LENS]
        assert call["top_ks"].tolist() == TOP_KS

    # The chain is what the keyed draws returned: token i+1 is call i's index.
    assert draft_tokens.shape == (3, num_steps)
    assert draft_tokens[:, 0].tolist() == [3, 4, 5]
    for i in range(num_steps - 1):
        for b in (0, 2):
            assert draft_tokens[b, i + 1].item() == key_token(SEEDS[b], SEQ_LENS[b] + i + 1, i + 1)

    # Greedy row proposes argmax of the very q handed to verify.
    # draft_probs[:, i + 1] must be the q step i drew from (verify contract).
    assert draft_probs.shape == (3, num_steps, V)
    for i, call in enumerate(recorder.calls):
        assert torch.equal(draft_probs[:, i + 1], call["probs"])
        assert draft_tokens[1, i + 1].item() == call["probs"][1].argmax().item()
        # q = softmax(logits / T) of the token the step consumed.
        logits = w.draft_runner.table[draft_tokens[:, i]]
        expect_q = torch.softmax(logits / si.temperatures, dim=-1)
        torch.testing.assert_close(call["probs"], expect_q, rtol=1e-5, atol=1e-6)


# A DETSPEC site never falls back to upstream's global-RNG sampler, even where the mode says seeds are optional.
@pytest.mark.parametrize("deterministic", [True, False])
def test_draft_forward_without_seed_refuses_in_any_mode(recorder, deterministic):
    with published(enable_deterministic_inference=deterministic):
        w = make_worker(4)
        si = sampling_info(SEEDS, TOP_KS)
        si.sampling_seed = None
        fb = decode_forward_batch(si, SEQ_LENS, first_tokens=[3, 4, 5])
        with pytest.raises(RuntimeError, match="sampling_seed"):
            w.draft_forward(fb)
    assert recorder.calls == []


def test_fast_sample_refuses_more_than_one_draft_per_row(recorder):
    site = sl.DraftSite(sl.PREFILL_EXTEND, SimpleNamespace(sampling_seed=torch.tensor([1]), top_ks=None), lambda: None)
    with published(), sl._DRAFT_SITE.entered(site), pytest.raises(RuntimeError, match="2 drafts per row"):
        sl._detspec_fast_sample(torch.full((1, V), 1.0 / V), 2)
    assert recorder.calls == []



# ---------------------------------------------------------------------------
# Site 1: prefill draft-extend
# ---------------------------------------------------------------------------


def test_prefill_draft_extend_keys_prompt_length_step0(recorder, monkeypatch):
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    prompt_lens = [4, 2, 3]
    created = []

    def fake_init_new(batch, model_runner, *args, **kwargs):
        # One logits row per request (LAST capture): the last rotated input id.
        ends = torch.tensor(prompt_lens).cumsum(0) - 1
        fb = SimpleNamespace(
            input_ids=batch.input_ids[ends],
            forward_mode=ForwardMode.EXTEND,
            batch_size=len(prompt_lens),
            spec_info=batch.spec_info,
            return_logprob=False,
        )
        created.append(fb)
        return fb

    monkeypatch.setattr(ForwardBatch, "init_new", staticmethod(fake_init_new))
    si = sampling_info(SEEDS, TOP_KS, temperatures=[0.5, 1.0, 2.0])
    batch = SimpleNamespace(
        forward_mode=ForwardMode.EXTEND,
        input_ids=torch.arange(sum(prompt_lens), dtype=torch.int64) % V,
        extend_lens=prompt_lens,
        seq_lens=torch.tensor(prompt_lens, dtype=torch.int64),
        sampling_info=si,
        chunked_req_next_prompt_token=None,
        reqs=[None] * 3,
        chunked_req=None,
        spec_info=None,
    )
    next_token_ids = torch.tensor([7, 8, 9])
    with published():
        w = make_worker(4)
        out = w._draft_extend_for_prefill(batch, torch.zeros(9, HIDDEN), next_token_ids)

    assert len(recorder.calls) == 1
    call = recorder.calls[0]
    assert call["seed"].tolist() == SEEDS
    assert call["positions"].tolist() == prompt_lens
    assert call["step"] == 0
    assert call["top_ks"].tolist() == TOP_KS
    # Tokens: keyed draw for sampled rows, argmax for the greedy row.
    assert out.topk_index[0, 0].item() == key_token(SEEDS[0], prompt_lens[0], 0)
    assert out.topk_index[2, 0].item() == key_token(SEEDS[2], prompt_lens[2], 0)
    assert out.topk_index[1, 0].item() == call["probs"][1].argmax().item()
    # Verify receives exactly the q the proposal was drawn from.
    assert out.draft_probs is call["probs"]
    assert torch.equal(out.topk_p, call["probs"].gather(1, out.topk_index))
    # q tracks the request temperature (the bonus token is each row's last input).
    expect_q = torch.softmax(w.draft_runner.table[next_token_ids] / si.temperatures, dim=-1)
    torch.testing.assert_close(call["probs"], expect_q, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# Site 3: decode draft-extend
# ---------------------------------------------------------------------------


def test_decode_draft_extend_keys_new_seq_lens_step0(recorder, monkeypatch):
    from sglang.srt.speculative import eagle_worker_v2

    num_steps = 3
    n = num_steps + 1
    accept_lens = torch.tensor([1, 4, 2], dtype=torch.int32)
    seq_lens = torch.tensor(SEQ_LENS, dtype=torch.int64)
    new_seq_lens = seq_lens + accept_lens
    verified = torch.arange(3 * n, dtype=torch.int64) % V  # target tokens per slot

    def fake_prepare_for_draft_extend(draft_extend_input, batch, next_token_ids, *a, **k):
        # The draft extend forward sees every verified slot of every request.
        return SimpleNamespace(input_ids=verified.clone(), spec_info=draft_extend_input)

    monkeypatch.setattr(eagle_worker_v2, "prepare_for_draft_extend", fake_prepare_for_draft_extend)
    sl._upstream.cache_clear()  # re-snapshot module globals with the fake
    try:
        si = sampling_info(SEEDS, TOP_KS, temperatures=[0.9, 1.0, 1.1])
        batch = SimpleNamespace(seq_lens=seq_lens, sampling_info=si)
        batch_result = SimpleNamespace(
            prepared_draft_extend_inputs=None,
            accept_lens=accept_lens,
            next_token_ids=verified.clone(),
            logits_output=SimpleNamespace(hidden_states=torch.zeros(3 * n, HIDDEN)),
            new_seq_lens=new_seq_lens,
            next_draft_input=SimpleNamespace(),
        )
        with published(speculative_num_steps=num_steps, speculative_num_draft_tokens=n):
            w = make_worker(num_steps)
            w._draft_extend_for_decode(batch, batch_result)
    finally:
        sl._upstream.cache_clear()

    assert len(recorder.calls) == 1
    call = recorder.calls[0]
    assert call["seed"].tolist() == SEEDS
    assert call["positions"].tolist() == new_seq_lens.tolist()
    assert call["step"] == 0
    assert call["top_ks"].tolist() == TOP_KS
    nd = batch_result.next_draft_input
    for b in (0, 2):
        assert nd.topk_index[b, 0].item() == key_token(SEEDS[b], new_seq_lens[b].item(), 0)
    assert nd.topk_index[1, 0].item() == call["probs"][1].argmax().item()
    assert nd.draft_probs is call["probs"]
    # q is the draft distribution at each request's last accepted slot.
    last_slot = torch.arange(3) * n + accept_lens.to(torch.int64) - 1
    expect_q = torch.softmax(w.draft_runner.table[verified[last_slot]] / si.temperatures, dim=-1)
    torch.testing.assert_close(call["probs"], expect_q, rtol=1e-5, atol=1e-6)


def test_empty_batch_draws_nothing_and_needs_no_seed(recorder):
    """Idle DP-attention batches reach the sites with zero rows and maybe no seed."""
    site = sl.DraftSite(sl.DECODE_EXTEND, SimpleNamespace(sampling_seed=None, top_ks=None), lambda: None)
    with published(), sl._DRAFT_SITE.entered(site):
        probs, p, idx = sl._detspec_sample_draft_proposal(torch.zeros(0, V), torch.ones(0, 1))
        p2, idx2 = sl._detspec_fast_sample(torch.zeros(0, V), 1)
    assert probs.shape == (0, V) and idx.shape == (0, 1) and idx2.shape == (0, 1)
    assert recorder.calls == []


def test_stand_in_outside_a_known_site_refuses():
    with pytest.raises(RuntimeError, match="outside a known draft site"):
        sl._detspec_sample_draft_proposal(torch.zeros(1, V), torch.ones(1, 1))
