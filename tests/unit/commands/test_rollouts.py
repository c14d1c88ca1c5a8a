"""sglang_detspec.rollouts: GRPO seeds, seeded weight perturbations, rollout records and Engine arguments (CPU)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sglang_detspec import rollouts
from sglang_detspec.stream.choice_seeds import choice_seed

INT63 = 1 << 63
REPO = Path(__file__).resolve().parents[3]


def _splitmix64_outputs(state: int, count: int) -> list:
    """An independent, stateful SplitMix64 (Steele, Lea & Flood / Vigna's splitmix64.c): its first ``count`` outputs."""
    out = []
    for _ in range(count):
        state = (state + 0x9E3779B97F4A7C15) % 2**64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
        out.append(z ^ (z >> 31))
    return out


def test_step_and_group_seeds_are_splitmix64_outputs_with_the_top_bit_cleared():
    base = 1234
    steps = _splitmix64_outputs(base, 4)
    for s in range(4):
        assert rollouts.step_seed(base, s) == steps[s] & (INT63 - 1)
        groups = _splitmix64_outputs(steps[s] & (INT63 - 1), 3)
        for p in range(3):
            assert rollouts.group_seed(base, s, p) == groups[p] & (INT63 - 1)


def test_sample_seed_is_what_the_server_derives_for_choice_g_of_the_group_request():
    for s, p in [(0, 0), (2, 5), (7, 1)]:
        gs = rollouts.group_seed(99, s, p)
        assert rollouts.rollout_seed(99, s, p, 0) == gs  # choice 0 keeps the request's seed
        assert [rollouts.rollout_seed(99, s, p, g) for g in range(6)] == [choice_seed(gs, g) for g in range(6)]


@pytest.mark.parametrize("base", [0, 1, 1234, INT63 - 1])
def test_seeds_are_distinct_across_steps_prompts_and_samples_and_in_int64_range(base):
    grid = [(s, p, g) for s in range(6) for p in range(8) for g in range(8)]
    seeds = [rollouts.rollout_seed(base, s, p, g) for s, p, g in grid]
    assert len(set(seeds)) == len(grid)
    groups = {rollouts.group_seed(base, s, p) for s in range(6) for p in range(8)}
    steps = {rollouts.step_seed(base, s) for s in range(6)}
    assert len(groups) == 48 and len(steps) == 6
    assert base not in groups | steps  # no derived seed replays the base seed's own samples
    assert all(0 <= x < INT63 for x in [*seeds, *groups, *steps])


def test_seeds_are_stable_across_processes():
    code = ("from sglang_detspec.rollouts import rollout_seed; "
            "print([rollout_seed(7, s, p, g) for s in range(2) for p in range(2) for g in range(3)])")
    env = dict(os.environ, PYTHONHASHSEED="12345")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, check=True)
    assert proc.stdout.strip() == str([rollouts.rollout_seed(7, s, p, g) for s in range(2) for p in range(2)
                                       for g in range(3)])


@pytest.mark.parametrize("bad", [-1, INT63, True, 1.0, "3"])
def test_base_seed_outside_int63_is_refused_with_its_range(bad):
    with pytest.raises(ValueError, match=r"base seed must be an integer in \[0, 2\*\*63 - 1\]"):
        rollouts.group_seed(bad, 0, 0)


@pytest.mark.parametrize("field,args", [("step", (1, -1, 0, 0)), ("prompt", (1, 0, -2, 0)), ("sample", (1, 0, 0, True))])
def test_negative_or_boolean_indices_are_refused_by_name(field, args):
    with pytest.raises(ValueError, match=f"{field} must be a non-negative integer"):
        rollouts.rollout_seed(*args)


def test_group_requests_send_one_request_per_prompt_with_its_group_seed_and_n():
    texts, params = rollouts.group_requests(["a", "b", "c"], 5, 2, group_size=4, max_new_tokens=16)
    assert texts == ["a", "b", "c"]
    assert [p["sampling_seed"] for p in params] == [rollouts.group_seed(5, 2, i) for i in range(3)]
    assert {(p["n"], p["max_new_tokens"], p["temperature"], p["ignore_eos"]) for p in params} == {(4, 16, 1.0, True)}


def _checkpoint():
    gen = torch.Generator().manual_seed(0)
    return {"a.weight": torch.randn(8, 4, generator=gen).to(torch.bfloat16),
            "b.weight": torch.randn(4, generator=gen).to(torch.bfloat16),
            "c.weight": torch.randn(3, 3, generator=gen).to(torch.bfloat16)}


def test_perturbation_is_reproducible_seeded_and_touches_only_the_named_tensors():
    ckpt = _checkpoint()
    one = rollouts.perturbed_tensors(ckpt, ["a.weight", "b.weight"], seed=11, scale=0.5)
    again = rollouts.perturbed_tensors(ckpt, ["a.weight", "b.weight"], seed=11, scale=0.5)
    other = rollouts.perturbed_tensors(ckpt, ["a.weight", "b.weight"], seed=12, scale=0.5)
    assert set(one) == {"a.weight", "b.weight"}
    for name in one:
        assert one[name].dtype == ckpt[name].dtype and one[name].shape == ckpt[name].shape
        assert torch.equal(one[name].view(torch.int16), again[name].view(torch.int16))
        assert not torch.equal(one[name], ckpt[name])
        assert not torch.equal(one[name], other[name])
    # Independent of torch's global RNG.
    torch.manual_seed(999)
    assert torch.equal(rollouts.perturbed_tensors(ckpt, ["a.weight"], 11, 0.5)["a.weight"], one["a.weight"])


def test_scale_zero_gives_exact_copies_and_bad_input_is_refused():
    ckpt = _checkpoint()
    same = rollouts.perturbed_tensors(ckpt, ["c.weight"], seed=3, scale=0.0)
    assert torch.equal(same["c.weight"].view(torch.int16), ckpt["c.weight"].view(torch.int16))
    with pytest.raises(KeyError, match="'missing.weight' is not in the checkpoint"):
        rollouts.perturbed_tensors(ckpt, ["missing.weight"], seed=3, scale=0.1)
    for bad in (-0.1, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match="scale must be a finite number >= 0"):
            rollouts.perturbed_tensors(ckpt, ["c.weight"], seed=3, scale=bad)


def test_write_updated_model_replaces_only_the_updated_tensors(tmp_path):
    from safetensors.torch import load_file, save_file

    ckpt = _checkpoint()
    src = tmp_path / "src"
    src.mkdir()
    save_file(ckpt, str(src / "model.safetensors"))
    (src / "config.json").write_text("{}")
    new = rollouts.perturbed_tensors(ckpt, ["b.weight"], seed=1, scale=1.0)
    dest = rollouts.write_updated_model(src, tmp_path / "dest", new)
    loaded = load_file(str(dest / "model.safetensors"))
    assert (dest / "config.json").read_text() == "{}"
    assert torch.equal(loaded["b.weight"], new["b.weight"])
    assert torch.equal(loaded["a.weight"], ckpt["a.weight"]) and torch.equal(loaded["c.weight"], ckpt["c.weight"])
    assert torch.equal(rollouts.tensors_of(dest, ["b.weight"])["b.weight"], new["b.weight"])
    with pytest.raises(KeyError, match="no tensor 'zzz'"):
        rollouts.write_updated_model(src, tmp_path / "dest2", {"zzz": new["b.weight"]})
    assert not (tmp_path / "dest2").exists()


def test_rollout_records_compare_token_ids_and_exact_logprob_bits():
    def out(ids, lps):
        return {"output_ids": ids, "meta_info": {"output_token_logprobs": [(lp, t, None) for lp, t in zip(lps, ids)]}}

    a = [rollouts.rollout_record(out([1, 2], [-0.5, -1.25])), rollouts.rollout_record(out([3], [0.0]))]
    b = [rollouts.rollout_record(out([1, 2], [-0.5, -1.25])), rollouts.rollout_record(out([3], [-0.0]))]
    c = [rollouts.rollout_record(out([1, 4], [-0.5, -1.25]))]
    assert a[0] == {"output_ids": [1, 2], "logprobs": [(-0.5).hex(), (-1.25).hex()]}
    assert rollouts.compare_records(a, a) == {"tokens": [], "logprobs": []}
    assert rollouts.compare_records(a, b) == {"tokens": [], "logprobs": [1]}  # 0.0 and -0.0 differ in bits
    assert rollouts.compare_records(a, c) == {"tokens": [0, 1], "logprobs": [1]}


def test_engine_kwargs_equal_the_server_command_line():
    pytest.importorskip("sglang.srt.server_args")
    from sglang_detspec.models.tiny_servers import common_args, eagle_args

    argv = common_args(Path("/models/target"), "weighted") + eagle_args(Path("/models/draft"), "DETSPEC_EAGLE",
                                                                        deterministic=True)
    kw = rollouts.engine_kwargs(argv)
    assert kw["model_path"] == "/models/target"
    assert kw["speculative_draft_model_path"] == "/models/draft"
    assert kw["speculative_algorithm"] == "DETSPEC_EAGLE"
    assert kw["enable_deterministic_inference"] is True
    assert kw["speculative_num_steps"] == 3 and kw["speculative_eagle_topk"] == 1
    assert kw["mem_fraction_static"] == 0.1  # common_args passes it twice; the parser keeps the last, as the server's
    assert kw["attention_backend"] == "triton" and kw["sampling_backend"] == "pytorch"
    with pytest.raises(SystemExit):
        rollouts.engine_kwargs(["--model-path", "m", "--no-such-flag"])
