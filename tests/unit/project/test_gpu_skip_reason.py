"""Every GPU-only test skips on CPU with tests/conftest.py's one wording, GPU_SKIP_REASON: the reasons pytest
reports when it runs all ``gpu``-marked tests here (unit, gpu and e2e directories) are read back."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

TESTS = str(Path(__file__).resolve().parents[2])  # tests/


def _conftest_reason() -> str:
    spec = importlib.util.spec_from_file_location("tests_conftest", os.path.join(TESTS, "conftest.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.GPU_SKIP_REASON


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine the gpu tests run instead of skipping")
def test_gpu_tests_skip_with_one_reason():
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider", "-rs", "-m", "gpu", TESTS],
        capture_output=True, text=True, timeout=600, cwd=os.path.dirname(TESTS),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    reasons = re.findall(r"^SKIPPED \[\d+\] [^:]+(?::\d+)?: (.*)$", proc.stdout, flags=re.M)
    assert len(reasons) >= 5, proc.stdout[-3000:]
    gpu_reasons = {r for r in reasons if "GPU" in r or "CUDA" in r}
    assert gpu_reasons == {_conftest_reason()}, gpu_reasons
