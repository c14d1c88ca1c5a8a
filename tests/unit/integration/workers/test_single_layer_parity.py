"""Token parity with sglang 0.5.23's own seeded draft path (0.5.23 venv only).

The same fake draft model and batches go through the builtin
``EagleDraftWorker`` (upstream ``fast_sample(sampling_seed=...)``) and through
``DetspecEagleDraftWorker`` (seeded_draft_proposal -> reference on CPU). Draft
tokens and the q handed to verify must be identical, except where DETSPEC
deliberately differs: the prefill draft-extend proposes the argmax for greedy
rows (0.5.23's ``EagleDraftWorker._draft_extend_for_prefill`` calls
``fast_sample`` on the temperature-scaled softmax without ``top_ks``, so a
greedy row draws at random there).

0.5.17 has no seeded draft path to compare with (its keys are pinned by
test_single_layer_keys.py instead). Upstream's hash needs an ``sgl_kernel`` op on
CPU tensors; SGLang's own Triton hash kernel is launched under the interpreter
instead (same kernel it uses on GPUs).
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
import torch

from sglang.srt.speculative import spec_utils

if "sampling_seed" not in __import__("inspect").signature(spec_utils.fast_sample).parameters:
    pytest.skip(
        "this SGLang (0.5.17) has no seeded fast_sample to compare with; "
        "key parity is covered by test_single_layer_keys.py",
        allow_module_level=True,
    )

from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker  # noqa: E402

from sglang_detspec.integration.workers import single_layer as sl  # noqa: E402

import single_layer_fakes as H  # noqa: E402

V, HIDDEN, TOP_K_ALL = H.V, H.HIDDEN, H.TOP_K_ALL
SEEDS = [5, 123456789012, -77, 2**62 + 11]
TOP_KS = [TOP_K_ALL, 1, 20, TOP_K_ALL]
SEQ_LENS = [10, 33, 1000, 2**31 + 9]  # the last is truncated to 32 bits in the key
TEMPS = [0.7, 1.0, 1.3, 2.5]


@pytest.fixture(autouse=True)
def _setup(monkeypatch):
    import torch._dynamo

    mh = importlib.import_module("sglang.kernels.ops.sampling.murmur_hash")

    def triton_on_cpu(seed, positions, col_indices):
        import triton

        n, m = seed.shape[0], col_indices.shape[0]
        out = torch.empty((n, m), dtype=torch.uint32)
        mh.murmur_hash32_kernel[(n, triton.cdiv(m, 1024))](
            seed, positions, col_indices, out, n, m, BLOCK_SIZE=1024
        )
        return out

    monkeypatch.setattr(mh, "murmur_hash32", triton_on_cpu)
    with torch._dynamo.config.patch(disable=True):
        yield


def _pair():
    ours = H.make_worker(4)
    theirs = H.make_worker(4)
    theirs.__class__ = EagleDraftWorker
    return ours, theirs


def test_draft_decode_tokens_equal_upstream():
    with H.published():
        ours, theirs = _pair()
        out = [
            w.draft_forward(
                H.decode_forward_batch(H.sampling_info(SEEDS, TOP_KS, TEMPS), SEQ_LENS, [3, 4, 5, 6])
            )
            for w in (ours, theirs)
        ]
    (_, _, our_tokens, our_q), (_, _, up_tokens, up_q) = out
    assert torch.equal(our_tokens, up_tokens)
    assert torch.equal(our_q, up_q)
    # Not vacuous: the sampled rows moved away from pure argmax at some step.
    assert (our_tokens[:, 1:] != our_q[:, 1:].argmax(-1)).any()


def test_decode_draft_extend_tokens_equal_upstream(monkeypatch):
    from sglang.srt.speculative import eagle_worker_v2

    n = 5
    accept_lens = torch.tensor([1, 5, 2, 3], dtype=torch.int32)
    seq_lens = torch.tensor(SEQ_LENS, dtype=torch.int64)
    verified = torch.arange(4 * n, dtype=torch.int64) * 7 % V

    monkeypatch.setattr(
        eagle_worker_v2,
        "prepare_for_draft_extend",
        lambda dei, batch, next_ids, *a, **k: SimpleNamespace(input_ids=verified.clone(), spec_info=dei),
    )
    sl._upstream.cache_clear()
    results = []
    try:
        with H.published():
            for w in _pair():
                result = SimpleNamespace(
                    prepared_draft_extend_inputs=None,
                    accept_lens=accept_lens,
                    next_token_ids=verified.clone(),
                    logits_output=SimpleNamespace(hidden_states=torch.zeros(4 * n, HIDDEN)),
                    new_seq_lens=seq_lens + accept_lens,
                    next_draft_input=SimpleNamespace(),
                )
                batch = SimpleNamespace(seq_lens=seq_lens, sampling_info=H.sampling_info(SEEDS, TOP_KS, TEMPS))
                w._draft_extend_for_decode(batch, result)
                results.append(result.next_draft_input)
    finally:
        sl._upstream.cache_clear()
    ours, theirs = results
    assert torch.equal(ours.topk_index, theirs.topk_index)
    assert torch.equal(ours.topk_p, theirs.topk_p)
    assert torch.equal(ours.draft_probs, theirs.draft_probs)


def test_prefill_draft_extend_equals_upstream_except_greedy_rows(monkeypatch):
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    prompt_lens = [4, 2, 3, 1]
    ends = torch.tensor(prompt_lens).cumsum(0) - 1

    monkeypatch.setattr(
        ForwardBatch,
        "init_new",
        staticmethod(
            lambda batch, runner, *a, **k: SimpleNamespace(
                input_ids=batch.input_ids[ends],
                forward_mode=ForwardMode.EXTEND,
                batch_size=len(prompt_lens),
                spec_info=batch.spec_info,
                return_logprob=False,
            )
        ),
    )
    outs = []
    with H.published():
        for w in _pair():
            batch = SimpleNamespace(
                forward_mode=ForwardMode.EXTEND,
                input_ids=torch.arange(sum(prompt_lens), dtype=torch.int64) * 5 % V,
                extend_lens=prompt_lens,
                seq_lens=torch.tensor(prompt_lens, dtype=torch.int64),
                sampling_info=H.sampling_info(SEEDS, TOP_KS, TEMPS),
                chunked_req_next_prompt_token=None,
                reqs=[None] * 4,
                chunked_req=None,
                spec_info=None,
            )
            outs.append(w._draft_extend_for_prefill(batch, torch.zeros(10, HIDDEN), torch.tensor([7, 8, 9, 10])))
    ours, theirs = outs
    assert torch.equal(ours.draft_probs, theirs.draft_probs)
    sampled = torch.tensor([k > 1 for k in TOP_KS])
    assert torch.equal(ours.topk_index[sampled], theirs.topk_index[sampled])
    assert ours.topk_index[1, 0].item() == ours.draft_probs[1].argmax().item()
