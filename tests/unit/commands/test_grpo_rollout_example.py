"""examples/grpo_rollout.py on the CPU: argument handling (each bad flag named with its fix), the plan's seeds and the
dry run (which must start nothing and import neither SGLang nor torch)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_detspec.rollouts import group_seed, rollout_seed, step_seed

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "grpo_rollout.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("grpo_rollout_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_defaults(example):
    args = example.parse_args([])
    assert (args.algorithm, args.steps, args.prompts, args.group_size, args.rerun_step) == ("DETSPEC_EAGLE", 3, 4, 4, 1)
    assert example.parse_args(["--steps", "1"]).rerun_step == 0
    assert example.parse_args(["--algorithm", "detspec_eagle_invariant"]).algorithm == "DETSPEC_EAGLE_INVARIANT"


@pytest.mark.parametrize("argv,flag,fix", [
    (["--steps", "0"], "--steps", "--steps 3"),
    (["--steps", "three"], "--steps", "--steps 3"),
    (["--prompts", "9"], "--prompts", "--prompts 4"),
    (["--group-size", "33"], "--group-size", "--group-size 4"),
    (["--group-size", "0"], "--group-size", "--group-size 4"),
    (["--max-new-tokens", "0"], "--max-new-tokens", "--max-new-tokens 32"),
    (["--base-seed", "-1"], "--base-seed", "--base-seed 1234"),
    (["--base-seed", str(1 << 63)], "--base-seed", "--base-seed 1234"),
    (["--update-scale", "-0.1"], "--update-scale", "--update-scale 0.05"),
    (["--update-scale", "nan"], "--update-scale", "--update-scale 0.05"),
    (["--rerun-step", "3"], "--rerun-step", "raise --steps"),
    (["--steps", "2", "--rerun-step", "2"], "--rerun-step", "raise --steps"),
    (["--algorithm", "EAGLE"], "--algorithm", "DETSPEC_EAGLE_INVARIANT"),
])
def test_bad_arguments_exit_2_naming_the_flag_and_the_fix(example, capsys, argv, flag, fix):
    with pytest.raises(SystemExit) as exc:
        example.parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and fix in err, err


def test_out_must_not_be_a_directory(example, capsys, tmp_path):
    with pytest.raises(SystemExit):
        example.parse_args(["--out", str(tmp_path)])
    assert "--out" in capsys.readouterr().err


def test_plan_seeds_follow_the_rollout_contract(example):
    args = example.parse_args(["--steps", "3", "--prompts", "3", "--group-size", "5", "--base-seed", "77"])
    plan = example.plan(args)
    assert [s["update_seed"] for s in plan["schedule"]] == [None, step_seed(77, 1), step_seed(77, 2)]
    seeds = []
    for s in plan["schedule"]:
        for g in s["groups"]:
            assert g["group_seed"] == group_seed(77, s["step"], g["prompt"])
            assert g["sample_seeds"] == [rollout_seed(77, s["step"], g["prompt"], k) for k in range(5)]
            seeds += g["sample_seeds"]
    assert len(seeds) == 3 * 3 * 5 == len(set(seeds))
    assert plan["prompts"] == list(example.PROMPTS[:3])
    json.dumps(plan)  # the plan goes into the results JSON as it is


def test_dry_run_prints_the_plan_and_imports_neither_sglang_nor_torch(tmp_path):
    out = tmp_path / "never.json"
    code = ("import runpy, sys; sys.argv = [sys.argv[1], '--dry-run', '--steps', '2', '--group-size', '3', "
            f"'--out', {str(out)!r}]\n"
            "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
            "except SystemExit as e:\n    assert e.code in (0, None), e.code\n"
            "print('IMPORTED', [m for m in ('sglang', 'torch') if m in sys.modules])")
    proc = subprocess.run([sys.executable, "-c", code, str(EXAMPLE)], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "IMPORTED []" in proc.stdout
    assert "2 steps x 4 prompts x 3 samples" in proc.stdout
    assert f"sampling_seed {group_seed(1234, 1, 3)}, n 3" in proc.stdout
    assert "restore step 1's weights" in proc.stdout
    assert not out.exists()
