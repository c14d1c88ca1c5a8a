"""Session-wide test setup.

Triton reads ``TRITON_INTERPRET`` when a module that defines a kernel is imported, so it has to be set here,
before any test module (or SGLang, whose speculative modules define Triton kernels) is imported.  On a
machine without a CUDA GPU the interpreter runs the project's kernels on CPU tensors; on a GPU machine the
real compiler is used and the ``gpu``-marked tests run too (``scripts/run_gpu_checks.sh``).
"""

import os

import torch

HAS_CUDA = torch.cuda.is_available()

if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

GPU_SKIP_REASON = "needs a CUDA GPU; run scripts/run_gpu_checks.sh on a GPU machine"


def pytest_collection_modifyitems(config, items):
    import pytest

    if HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(reason=GPU_SKIP_REASON)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
