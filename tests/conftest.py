"""Session-wide test setup.

Triton reads ``TRITON_INTERPRET`` when a module that defines a kernel is imported, so it has to be set here,
before any test module (or SGLang, whose speculative modules define Triton kernels) is imported.  On a
machine without a CUDA GPU the interpreter runs the project's kernels on CPU tensors; on a GPU machine the
real compiler is used and the ``gpu``-marked tests run too (``scripts/run_gpu_checks.sh``).
"""

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()

if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

GPU_SKIP_REASON = "needs a CUDA GPU; run scripts/run_gpu_checks.sh on a GPU machine"


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(reason=GPU_SKIP_REASON)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _restore_process_environment():
    """Give every test the environment it started with, whatever the test before it resolved.

    ``ServerArgs.__post_init__`` writes process environment variables as a side effect: for a CP-v2 default
    architecture (MiMo-V2-Flash, the multi-layer tests' model) it sets ``SGLANG_ENABLE_CP_V2=True``, after which
    SGLang's ``PrefillAdder`` asks for a context-parallel group that a CPU test never initialises. With pytest-xdist
    the test that resolved such arguments and the scheduler tests can share a worker in any order.
    """
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)
