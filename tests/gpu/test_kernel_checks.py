"""GPU: the compiled kernels at scale -- the float32 screens over all 2**32 hashes, parity with upstream's float64
stream and with SGLang's own seeded sampler on 10**5 rows, the draft stream's statistics.

Each test runs one check of ``sglang_detspec.bench.draft_sampler_checks`` / ``coupled_race_checks`` at the size of
``scripts/gpu_kernel_checks.py --quick`` (the script runs them all at full size, 10**6+ rows, and writes the JSON the
docs cite) and fails with the check's measurements when it does not pass. CPU-only machines skip them
(tests/conftest.py's GPU_SKIP_REASON).
"""

import pytest

from sglang_detspec.bench import coupled_race_checks as cc
from sglang_detspec.bench import draft_sampler_checks as dc

pytestmark = [pytest.mark.gpu]

ROWS = 105_000  # gpu_kernel_checks.py --quick: a tenth of its 1,050,000 parity rows
DRAWS = 500_000  # and of its draws per statistical test (at least 500,000)


def _passed(result: dict) -> None:
    assert result["passed"], {k: v for k, v in result.items() if k != "detail"}


def _log(msg: str) -> None:
    print(msg, flush=True)


def test_draft_filter_bound_over_all_hashes():
    _passed(dc.check_e2_bound())


def test_draft_float32_score_bound():
    _passed(dc.check_score_bound())


def test_draft_degenerate_rows_match_upstream():
    _passed(dc.check_degenerate())


def test_upstream_float64_stream_matches_the_cpu_reference():
    _passed(dc.check_cpu_reference(64))


def test_draft_near_ties_match_upstream():
    _passed(dc.check_near_ties(max(2048, ROWS // 50), _log))


def test_draft_parity_with_upstream_on_random_rows():
    _passed(dc.check_parity(ROWS, _log))


def test_draft_stream_statistics():
    """Three chi-square fits, two tail masses (18 and 20 nats below the top), independence of draft steps k, k+1."""
    results = dc.check_statistics(DRAWS)
    assert len(results) == 6
    failed = [r for r in results if not r["passed"]]
    assert not failed, failed


def test_coupled_gumbel_screen_over_all_hashes():
    _passed(cc.check_gumbel_screen())


@pytest.mark.parametrize("fast", [True, False], ids=["lg2_approx", "logf"])
def test_coupled_exponential_screen_over_all_hashes(fast):
    _passed(cc.check_exponential_screen(fast))


@pytest.mark.parametrize("fast", [True, False], ids=["rcp_approx", "div_full"])
def test_coupled_ratio_screen(fast):
    _passed(cc.check_ratio_screen(fast))


def test_in_kernel_log_equals_torch_log_on_every_float32():
    _passed(cc.check_kernel_log())


def test_coupled_race_parity_with_sglang():
    _passed(cc.check_coupled_parity(ROWS, _log))
