"""GPU: the DETSPEC draft-decode runner's CUDA graphs replay the eager proposals.

Captures ``DetspecEAGLEDraftCudaGraphRunner`` (the real ``capture_one_shape`` /
``execute`` of the installed SGLang) into real CUDA graphs for two batch sizes,
then replays batches of every size up to the largest (padded ones included)
and checks the draft chain and the q handed to verify equal an eager
``draft_forward`` of the same batch, with the Triton kernel doing the draws.

The draft *model* is the CPU tests' fake (a logits-table lookup; no weights):
see tests/unit/single_layer_fakes.py, which this module reuses. Needs
SGLang and a CUDA GPU: ``scripts/run_gpu_checks.sh`` runs it on a GPU machine
(with SGLang 0.5.17 from the bundle).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu]  # tests/conftest.py skips these without a GPU, with its GPU_SKIP_REASON

pytest.importorskip(
    "sglang.srt.speculative.eagle_worker_v2",
    reason="needs SGLang; scripts/run_gpu_checks.sh installs it from the GPU bundle",
)


def _harness():
    path = Path(__file__).resolve().parents[1] / "unit" / "single_layer_fakes.py"
    spec = importlib.util.spec_from_file_location("_detspec_single_layer_harness", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


H = _harness() if torch.cuda.is_available() else None


class CudaGraphBackend:
    """Minimal stand-in for SGLang's decode graph backend: real torch.cuda graphs."""

    def __init__(self):
        self.graphs = {}
        self.pool = None

    def capture_one(self, shape_key, run_once, capture_inputs=None, post_warmup_hook=None):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            run_once()  # warm-up: compiles the Triton kernels outside the capture
            run_once()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            out = run_once()
        self.pool = graph.pool()
        self.graphs[shape_key] = (graph, out)

    def replay(self, shape_key, forward_batch):
        graph, out = self.graphs[shape_key]
        graph.replay()
        return out

    def can_run(self, forward_batch, shape_key):
        return shape_key in self.graphs


@pytest.fixture(autouse=True)
def _eager_torch_compile():
    import torch._dynamo

    with torch._dynamo.config.patch(disable=True):
        yield


def test_replayed_proposals_equal_eager_for_two_captured_sizes():
    device = "cuda"
    num_steps = 4
    top_all = H.TOP_K_ALL
    with H.published(speculative_num_steps=num_steps, speculative_num_draft_tokens=num_steps + 1):
        worker = H.make_worker(num_steps, device=device)
        runner = H.make_runner(
            worker, capture_bs=[2, 8], num_steps=num_steps, device=device, backend=CudaGraphBackend()
        )
        assert len(runner.backend.graphs) >= 2
        g = torch.Generator().manual_seed(0)
        for round_ in range(3):
            for raw_bs in range(1, 9):
                seeds = torch.randint(-(2**62), 2**62, (raw_bs,), generator=g).tolist()
                seq_lens = torch.randint(1, 5000, (raw_bs,), generator=g).tolist()
                first = torch.randint(0, H.V, (raw_bs,), generator=g).tolist()
                temps = (torch.rand(raw_bs, generator=g) * 1.5 + 0.3).tolist()
                top_ks = [1 if (i + round_) % 3 == 0 else top_all for i in range(raw_bs)]

                eager = worker.draft_forward(
                    H.decode_forward_batch(
                        H.sampling_info(seeds, top_ks, temps, device=device), seq_lens, first, num_steps, device
                    )
                )
                # Poison what padded rows see; real rows must not notice.
                runner.buffers.positions.fill_(2**31 - 1)
                graph = runner.execute(
                    H.replay_batch(
                        H.sampling_info(seeds, top_ks, temps, device=device), seq_lens, first, num_steps, device
                    )
                )
                _, _, eager_tokens, eager_probs = eager
                _, _, graph_tokens, graph_probs = graph
                assert torch.equal(graph_tokens, eager_tokens), (round_, raw_bs)
                if eager_probs is None:
                    # 0.5.23 all-greedy batch: the "greedy" graph variant skips q.
                    assert graph_probs is None and all(k <= 1 for k in top_ks)
                    continue
                torch.testing.assert_close(graph_probs, eager_probs, rtol=0, atol=1e-6)
                # Greedy requests proposed the argmax of their q at every step.
                for b in range(raw_bs):
                    if top_ks[b] == 1:
                        for i in range(1, num_steps):
                            assert graph_tokens[b, i].item() == graph_probs[b, i].argmax().item()
