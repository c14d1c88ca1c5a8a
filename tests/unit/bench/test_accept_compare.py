"""The accept-length comparison's statistics, requests and argument checks (CPU; the servers run on the GPU)."""

import math

import pytest

from sglang_detspec.bench import accept_compare as ac


def test_paired_difference_by_hand():
    # Subject 3.0 and 4.0 tokens per step, baseline 2.0 on both prompts: differences 1 and 2.
    subject = {0: [30, 10], 1: [40, 10]}
    baseline = {0: [20, 10], 1: [20, 10]}
    d = ac.paired_difference(subject, baseline)
    assert d["n"] == 2
    assert d["mean"] == pytest.approx(1.5)
    assert d["se"] == pytest.approx(0.5)  # sample variance 0.5 over 2 prompts
    assert d["z"] == pytest.approx(3.0)
    assert d["p"] == pytest.approx(0.0026998, rel=1e-4)  # two-sided normal tail at 3 sigma


def test_paired_difference_only_prompts_both_measured():
    d = ac.paired_difference({0: [30, 10], 5: [99, 1]}, {0: [20, 10], 1: [20, 10]})
    assert d["n"] == 1 and d["mean"] == pytest.approx(1.0) and d["se"] is None and d["p"] is None


def test_paired_difference_equal_servers_gives_no_p():
    same = {0: [30, 10], 1: [40, 10]}
    d = ac.paired_difference(same, dict(same))
    assert d["mean"] == 0 and d["se"] == 0 and d["p"] is None


def test_pooled_accept_length_is_tokens_over_steps():
    assert ac.pooled_accept_length({0: [30, 10], 1: [10, 10]}) == pytest.approx(2.0)
    assert ac.pooled_accept_length({0: [0, 0]}) is None


def test_requests_have_distinct_seeds_and_the_prompt():
    prompts = ac.make_prompts(3, 5, 1000, seed=1)
    payloads = ac.request_payloads(prompts, 4, output_len=16, temperature=0.7, seed_base=9)
    seeds = [key[1] for key, _ in payloads]
    assert len(payloads) == 12 and len(set(seeds)) == 12
    (p, seed), body = payloads[5]
    assert p == 1 and body["input_ids"] == prompts[1] and body["sampling_params"]["sampling_seed"] == seed
    assert body["sampling_params"]["ignore_eos"] is True and body["sampling_params"]["max_new_tokens"] == 16


def test_prompts_reproducible_and_in_range():
    a, b = ac.make_prompts(4, 50, 300, seed=3), ac.make_prompts(4, 50, 300, seed=3)
    assert a == b and a != ac.make_prompts(4, 50, 300, seed=4)
    assert all(16 <= t < 300 for ids in a for t in ids)
    with pytest.raises(ValueError, match="at least 2 prompts"):
        ac.make_prompts(1, 5, 300, seed=0)


def test_tally_sums_per_prompt_and_refuses_a_non_speculative_answer():
    resp = lambda t, s: {"meta_info": {"completion_tokens": t, "spec_verify_ct": s}}  # noqa: E731
    tally = ac.tally_responses({(0, 1): resp(10, 4), (0, 2): resp(10, 6), (1, 3): resp(8, 2)})
    assert tally == {0: [20, 10], 1: [8, 2]}
    with pytest.raises(ValueError, match="prompt 1 seed 3: .*spec_verify_ct"):
        ac.tally_responses({(1, 3): {"meta_info": {"completion_tokens": 8}}})


def test_report_names_baseline_and_difference():
    text = ac.format_report({"eagle_rs": {0: [20, 10], 1: [20, 10]}, "detspec": {0: [30, 10], 1: [40, 10]}},
                            "eagle_rs", {"prompts": 2, "seeds_per_prompt": 1, "output_len": 8, "temperature": 1.0,
                                         "pair": "midsize"})
    assert "| eagle_rs | 2.000 | 1 |" in text
    assert "| detspec | 3.500 | 1.750 | +1.500 +- 0.500 (2 prompts) | 3.00 |" in text


@pytest.mark.parametrize("argv, message", [
    (["--configs", "eagle_rs"], "at least two"),
    (["--configs", "eagle_rs,no_spec"], "does not speculate"),
    (["--configs", "eagle_rs,nonsense"], "unknown configuration"),
    (["--temperature", "0"], "must be positive"),
    (["--prompts", "1"], "--prompts must be at least 2"),
    (["--seeds-per-prompt", "0"], "--seeds-per-prompt must be at least 1"),
])
def test_bad_arguments_name_the_flag(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        ac.parse_args(["--out", str(tmp_path), *argv])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_configs_keep_the_users_order(tmp_path):
    args = ac.parse_args(["--out", str(tmp_path), "--configs", "detspec,eagle_rs"])
    assert args.configs == ("detspec", "eagle_rs")
    assert math.isclose(args.temperature, 1.0)


def test_servers_side_by_side_share_the_card_and_alone_take_half():
    from sglang_detspec.bench.serving_bench import configs as cfgs

    assert cfgs.mem_fraction(2, parallel=True) == 0.4  # capped: two mid-size servers side by side
    assert cfgs.mem_fraction(6, parallel=True) == 0.133  # an equal share of 0.8
    assert cfgs.mem_fraction(2, parallel=False) == 0.5
