"""SGLang's real rejection-sampling verify (``eagle_sample``) on CPU, for the verify tests.

``eagle_sample`` takes its sampling branch only on GPU platforms, so :func:`eagle_sample_on_cpu` flips
``eagle_utils._is_cpu``; the chain rejection kernel is SGLang's Triton kernel (interpreted). Stood in for: SGLang's
hash op where it only loads with a GPU (0.5.23 routes CPU tensors to ``sgl_kernel``), the TP group (one rank), and
the sgl-kernel renorm ops 0.5.17 - 0.5.22 import inside the branch -- those stand-ins are recorded, so a DETSPEC
test can assert they were never reached, and a control run can use them as upstream would.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from dataclasses import dataclass
from types import SimpleNamespace
from typing import List, Optional, Sequence

import torch

from sglang.srt.runtime_context import get_context

VOCAB = 32


def sglang_hash_on_cpu(monkeypatch) -> str:
    """Make ``sglang.kernels.ops.sampling.murmur_hash.murmur_hash32`` run on CPU tensors; return what runs."""
    mh = importlib.import_module("sglang.kernels.ops.sampling.murmur_hash")
    probe = (torch.zeros(1, dtype=torch.int64).to(torch.uint64),) * 2 + (torch.zeros(1, dtype=torch.int64),)
    try:
        mh.murmur_hash32(*probe)
        return "sglang murmur_hash32"
    except (ImportError, OSError, RuntimeError, AttributeError):
        pass

    def triton_on_cpu(seed, positions, col_indices):
        # The launch SGLang does for device tensors, on CPU via TRITON_INTERPRET.
        import triton

        n, m = seed.shape[0], col_indices.shape[0]
        out = torch.empty((n, m), dtype=torch.uint32)
        mh.murmur_hash32_kernel[(n, triton.cdiv(m, 1024))](seed, positions, col_indices, out, n, m, BLOCK_SIZE=1024)
        return out

    monkeypatch.setattr(mh, "murmur_hash32", triton_on_cpu)
    return "sglang murmur_hash32_kernel"


def sglang_seeded_sampler(monkeypatch):
    """SGLang's ``sampler`` module with its seeded path (``multinomial_with_seed``) runnable eagerly on CPU tensors.

    Its hash runs on CPU (:func:`sglang_hash_on_cpu`) and ``@torch.compile`` is bypassed (it would build a C++
    extension). Returns ``(sampler_module, what_hash_runs)``.
    """
    from sglang.srt.layers import sampler as sampler_module

    what = sglang_hash_on_cpu(monkeypatch)
    murmur = importlib.import_module("sglang.kernels.ops.sampling.murmur_hash").murmur_hash32
    monkeypatch.setattr(sampler_module, "murmur_hash32", murmur, raising=False)  # imported by name there
    compiled = sampler_module.multinomial_with_seed
    monkeypatch.setattr(sampler_module, "multinomial_with_seed", getattr(compiled, "_torchdynamo_orig_callable", compiled))
    return sampler_module, what


def _top_k_renorm_torch(probs, top_ks):
    """What sgl-kernel's op computes (first-index tie order), in torch."""
    out = torch.zeros_like(probs)
    for r in range(probs.shape[0]):
        k = min(int(top_ks[r]), probs.shape[1])
        vals, idx = probs[r].topk(k)
        out[r, idx] = vals / vals.sum()
    return out


def _top_p_renorm_torch(probs, top_ps):
    out = torch.zeros_like(probs)
    for r in range(probs.shape[0]):
        vals, idx = probs[r].sort(descending=True)
        keep = (vals.cumsum(0) - vals) <= float(top_ps[r])
        out[r, idx[keep]] = vals[keep] / vals[keep].sum()
    return out


@dataclass
class RenormCalls:
    """Which upstream renorm stand-ins ran (a DETSPEC verify must reach none)."""

    names: List[str]


@contextlib.contextmanager
def eagle_sample_on_cpu(monkeypatch):
    """Yield a :class:`RenormCalls`; inside, ``eagle_sample`` takes its GPU sampling branch on CPU."""
    from sglang.srt.speculative import eagle_utils

    sglang_hash_on_cpu(monkeypatch)
    calls = RenormCalls([])

    def recorded(name, fn):
        def stand_in(*args, **kwargs):
            calls.names.append(name)
            return fn(*args, **kwargs)

        return stand_in

    monkeypatch.setattr(eagle_utils, "_is_cpu", False)
    fake_sgl_kernel = SimpleNamespace(
        top_k_renorm_prob=recorded("top_k_renorm_prob", _top_k_renorm_torch),
        top_p_renorm_prob=recorded("top_p_renorm_prob", _top_p_renorm_torch),
        tree_speculative_sampling_target_only=None,
    )
    monkeypatch.setitem(sys.modules, "sgl_kernel", fake_sgl_kernel)  # <= 0.5.22 import it inside the branch
    for name, fn in (("top_k_renorm_prob", _top_k_renorm_torch), ("top_p_renorm_prob", _top_p_renorm_torch)):
        if hasattr(eagle_utils, name):  # 0.5.23 imports them at module level
            monkeypatch.setattr(eagle_utils, name, recorded(name, fn))
    import sglang.srt.distributed as dist

    monkeypatch.setattr(dist, "get_tp_group", lambda: SimpleNamespace(world_size=1), raising=False)
    from sglang.srt.runtime_context import get_parallel

    # 0.5.23 reads the TP group from the runtime context (0.5.17 from the distributed module, patched above).
    with get_parallel().override(tp_group=SimpleNamespace(world_size=1)):
        yield calls


def bare_sampler():
    """A real SGLang ``Sampler`` instance built without its constructor (which needs a TP group)."""
    from sglang.srt.layers.sampler import Sampler

    sampler = Sampler.__new__(Sampler)
    torch.nn.Module.__init__(sampler)
    return sampler


def bare_target_worker():
    """What a DETSPEC spec worker reads of its target worker at construction: ``model_runner.sampler``."""
    return SimpleNamespace(model_runner=SimpleNamespace(sampler=bare_sampler()))


class _FakeScheduleBatch:  # a class, not SimpleNamespace: penalizers keep a weakref
    pass


@dataclass(frozen=True)
class Params:
    """One request's sampling parameters (SGLang's meaning: temperature 0 = greedy, top_k -1 = all)."""

    seed: Optional[int]
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0


def schedule_batch(params: Sequence[Params], vocab: int = VOCAB):
    from sglang.srt.sampling.sampling_params import SamplingParams

    reqs = []
    for p in params:
        sp = SamplingParams(
            temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, min_p=p.min_p, sampling_seed=p.seed
        )
        sp.normalize(None)
        sp.verify(vocab_size=vocab)
        reqs.append(
            SimpleNamespace(
                sampling_params=sp,
                custom_logit_processor=None,
                return_sampling_mask=False,
                sampling_logprobs_mode=None,
                from_str=None,
            )
        )
    batch = _FakeScheduleBatch()
    batch.reqs = reqs
    batch.device = "cpu"
    return batch


def sampling_info(params: Sequence[Params], vocab: int = VOCAB):
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    return SamplingBatchInfo.from_schedule_batch(schedule_batch(params, vocab), vocab_size=vocab)


@contextlib.contextmanager
def deterministic_rs(n: int):
    with get_context().override_server_args(
        enable_deterministic_inference=True,
        speculative_use_rejection_sampling=True,
        speculative_eagle_topk=1,
        speculative_num_steps=n - 1,
        speculative_num_draft_tokens=n,
    ):
        yield


@dataclass(frozen=True)
class VerifyRow:
    """One request's verify inputs: target logits ``[n, V]``, draft q ``[n, V]``, draft tokens ``[n]``."""

    target_logits: torch.Tensor
    draft_probs: torch.Tensor
    draft_tokens: torch.Tensor


def verify_rows(count: int, n: int, vocab: int = VOCAB, seed: int = 1, sharp: float = 2.0) -> List[VerifyRow]:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(count):
        target_logits = torch.randn(n, vocab, generator=g) * sharp
        q = torch.softmax(torch.randn(n, vocab, generator=g) + target_logits * 0.5, dim=-1)
        draft = torch.multinomial(q, 1, generator=g).view(-1)
        draft[0] = 0  # the root/bonus slot
        rows.append(VerifyRow(target_logits, q, draft))
    return rows


def run_eagle_sample(eagle_sample, rows: Sequence[VerifyRow], params: Sequence[Params], seq_lens, n: int):
    """``(predict [bs, n], accept lengths [bs])`` from one ``eagle_sample`` call on the given rows."""
    predict, accept_lens, _ = run_eagle_sample_with_index(eagle_sample, rows, params, seq_lens, n)
    return predict, accept_lens


def run_eagle_sample_with_index(eagle_sample, rows: Sequence[VerifyRow], params: Sequence[Params], seq_lens, n: int):
    """``(predict [bs, n], accept lengths [bs], accept_index [bs, n])``: :func:`run_eagle_sample` with the index.

    ``retrieve_index`` is ``arange(bs * n)``, so the committed tokens of request ``b`` are
    ``predict.view(-1)[accept_index[b, :accept_lens[b]]]``.
    """
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    bs = len(rows)
    verify_input = SimpleNamespace(
        draft_token=torch.cat([r.draft_tokens for r in rows]),
        draft_token_num=n,
        retrieve_index=torch.arange(bs * n, dtype=torch.int64).view(bs, n),
        retrieve_next_token=torch.tensor([list(range(1, n)) + [-1]] * bs, dtype=torch.int64),
        retrieve_next_sibling=torch.full((bs, n), -1, dtype=torch.int64),
        max_tree_depth=n,
        tree_topk=1,
        draft_probs=torch.stack([r.draft_probs for r in rows]),
        custom_mask=None,
        positions=None,
    )
    batch = SimpleNamespace(
        device="cpu",
        forward_mode=ForwardMode.DECODE,
        seq_lens=torch.tensor(list(seq_lens), dtype=torch.int64),
        sampling_info=sampling_info(params, rows[0].target_logits.shape[-1]),
        return_logprob=False,
        req_pool_indices=torch.arange(bs),
    )
    logits = SimpleNamespace(next_token_logits=torch.cat([r.target_logits for r in rows]).clone())
    predict, accept_lens, accept_index = eagle_sample(verify_input, batch, logits)
    return predict.view(bs, n), accept_lens, accept_index
