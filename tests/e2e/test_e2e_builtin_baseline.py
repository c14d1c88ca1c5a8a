"""Baseline: what stock SGLang gives on the same trials (no plugin algorithm involved).

* builtin ``EAGLE --speculative-use-rejection-sampling`` (no deterministic flag) is the failing control
  of test_e2e_real_traffic.py (``check`` must report several outputs);
* builtin ``EAGLE --speculative-use-rejection-sampling --enable-deterministic-inference``: SGLang
  0.5.17-0.5.22 refuse it at start-up (asserted, message recorded); 0.5.23 seeds the draft in-tree
  and serves it (its unique count is recorded).
"""


import pytest

import e2e_harness as h
from e2e_harness import register_cuda_ci

register_cuda_ci(est_time=300, suite="detspec-e2e")

pytestmark = h.module_marks()

SEED = 1234


@pytest.mark.e2e_server("builtin_eagle_rs_det")
def test_builtin_eagle_rejection_sampling_with_deterministic_flag(e2e_pool):
    srv = e2e_pool.get("builtin_eagle_rs_det")
    if srv.spec.expect_exit:
        rc = srv.wait_exit(e2e_pool.timeout)
        log = srv.log_text()
        lines = [ln.strip() for ln in log.splitlines() if "incompatible" in ln and "deterministic" in ln]
        h.record("builtin_eagle_rs_det", {"refused": rc not in (None, 0), "exit_code": rc,
                                          "message": lines[-1] if lines else srv.log_tail(5)})
        assert rc is not None, "expected sglang < 0.5.23 to refuse RS + deterministic at start-up, but it kept running"
        assert rc != 0
        assert lines, f"no 'incompatible ... deterministic' message in the log:\n{srv.log_tail(40)}"
    else:
        srv.wait_ready(e2e_pool.timeout)
        probes = h.changing_batch_trials(srv.base_url, seed=SEED, n_trials=16)
        s = h.summarize_trials(probes)
        s["refused"] = False
        h.record("builtin_eagle_rs_det", s)
        assert s["trials"] == 16
    e2e_pool.release("builtin_eagle_rs_det")


if __name__ == "__main__":
    h.run_module(__file__)
