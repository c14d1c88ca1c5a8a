"""CPU check that SGLang's CI tooling registers the E2E modules (its AST reader, not ours): each
carries a constant ``register_cuda_ci(...)`` marker and an executable ``__main__`` block, as
``sglang.test.ci.ci_register.collect_tests`` demands."""

from pathlib import Path

import pytest

ci_register = pytest.importorskip("sglang.test.ci.ci_register", reason="needs sglang installed")

HERE = Path(__file__).resolve().parent
E2E_FILES = sorted(str(p) for p in HERE.glob("test_e2e_*.py") if p.name != Path(__file__).name)


def test_e2e_modules_exist():
    names = {Path(f).name for f in E2E_FILES}
    assert {"test_e2e_detspec.py", "test_e2e_builtin_baseline.py", "test_e2e_real_traffic.py",
            "test_e2e_multi_layer.py"} <= names


def test_sglang_ci_tooling_registers_every_e2e_module():
    regs = ci_register.collect_tests(E2E_FILES, sanity_check=True)
    by_file = {Path(r.filename).name: r for r in regs}
    assert set(by_file) == {Path(f).name for f in E2E_FILES}
    for r in regs:
        assert r.backend == ci_register.HWBackend.CUDA
        assert r.effective_suite == "detspec-e2e"
        assert r.disabled is None and not r.nightly
        assert 0 < r.est_time <= 900


def test_registration_is_partitionable():
    regs = ci_register.collect_tests(E2E_FILES, sanity_check=True)
    parts = [ci_register.auto_partition(regs, rank, 2) for rank in range(2)]
    assert sorted(r.filename for p in parts for r in p) == sorted(r.filename for r in regs)
