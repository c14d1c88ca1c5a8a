"""E2E control only (never installed, never on a user's path): DETSPEC with SGLang's rank-keyed target sampler.

Put on PYTHONPATH by tests/e2e/e2e_harness.py for the ``detspec_upstream_sampler_control`` server alone. Python runs
``sitecustomize`` at start-up in every process of that server (launcher, scheduler, detokenizer), and this one makes
the DETSPEC target sampler hand every seeded top-k / top-p / min-p batch back to SGLang's own
``top_k_top_p_min_p_sampling_from_probs_torch`` (noise hashed by rank). Everything else is the product. The E2E test
expects this server to give *several* probe outputs under mixed traffic: it shows that the traffic the token-id
keying makes harmless really does change a seeded request without it, i.e. that the test can fail.
"""

from sglang_detspec.integration.sampling import target_sampler


def _upstream_rank_keyed(sorted_sampler, probs, top_ks, top_ps, min_ps, need_min_p_sampling, *args, **kwargs):
    # min-p dropped: SGLang's seeded sorted path asserts on it (upstream #33695) -- measured on the H200, a min-p
    # filler crashed this control's scheduler -- so the control keeps only what that path can take.
    return sorted_sampler(probs, top_ks, top_ps, min_ps, False, *args, **kwargs)


target_sampler.sample_by_token_id = _upstream_rank_keyed
