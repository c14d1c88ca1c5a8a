"""End to end: RL rollouts in-process (issue 34) -- ``sglang.Engine`` with DETSPEC_EAGLE and DETSPEC_EAGLE_INVARIANT,
weight updates, memory release / resume, and examples/grpo_rollout.py, on the weighted tiny pair.

Every Engine runs in its own process (``engine_scenarios.py``), all started at once beside the two HTTP servers
they are compared with, so the module costs about one start-up:

* (a) the Engine gives the HTTP server's tokens and logprob bits for the same seeded requests (a 4 prompts x
  ``n = 4`` group batch and two ``n = 1`` requests with top-k / top-p and greedy), for both algorithms; the plugin's
  hooks are active in the Engine's process. Control: the DETSPEC_EAGLE server and the invariant Engine differ.
* (b) after ``update_weights_from_tensor`` of three target tensors and one draft tensor, the probe equals a freshly
  started Engine loaded with the updated checkpoints (written with safetensors); the probe beside other requests
  keeps its bits; ``update_weights_from_disk`` of the same target changes nothing further. Controls: the target
  update changes the tokens, and so does the draft update (DETSPEC_EAGLE's tokens depend on the draft).
* (c) ``release_memory_occupation`` / ``resume_memory_occupation`` with ``--enable-memory-saver
  --enable-weights-cpu-backup`` and ``SGLANG_MEMORY_SAVER_CUDA_GRAPH=1`` (CUDA graphs released too) gives the same
  bits. Control: the release really freed GPU memory (NVML per process). Skipped where ``torch_memory_saver`` is not
  installed.
* (d) examples/grpo_rollout.py runs end to end in time and re-runs a step bit for bit. Control: every update changed
  some samples, so the re-run is not vacuous.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sglang_detspec.rollouts import ROLLOUT_PROMPTS

import e2e_harness as h
from e2e_harness import register_cuda_ci

register_cuda_ci(est_time=420, suite="detspec-e2e")

DETSPEC_SERVER, INVARIANT_SERVER = "detspec_eagle_graph", "invariant_graph"
pytestmark = h.module_marks(DETSPEC_SERVER, INVARIANT_SERVER)

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
N = 4
MAX_NEW_TOKENS = 24
PROMPTS = list(ROLLOUT_PROMPTS[:4])  # what examples/grpo_rollout.py --prompts 4 sends
SEEDS = [301 + 11 * i for i in range(len(PROMPTS))]
#: The fake training update: target tensors x0.05 std, the draft's MLP x1.0 std (large, so its proposals change).
TARGET_SCALE, DRAFT_SCALE, UPDATE_SEED = 0.05, 1.0, 2024
#: Limits for the example: its rollout loop alone (after start-up) and its whole process beside the other start-ups.
EXAMPLE_LOOP_LIMIT_S, EXAMPLE_WALL_LIMIT_S = 60, 420
SCENARIO_TIMEOUT_S = 540
#: Upstream's breakable prefill CUDA graphs refuse SGLANG_MEMORY_SAVER_CUDA_GRAPH=1 at start-up ("Breakable CUDA graph
#: is not compatible with memory saver mode", 0.5.17); decode and draft graphs are released and resumed.
MEMORY_SAVER_ARGS = ["--enable-memory-saver", "--enable-weights-cpu-backup", "--disable-prefill-cuda-graph"]


def _requests():
    group = {"prompts": PROMPTS, "params": [{"n": N, "temperature": 1.0, "max_new_tokens": MAX_NEW_TOKENS,
                                             "ignore_eos": True, "sampling_seed": s} for s in SEEDS]}
    singles = {"prompts": [PROMPTS[0], PROMPTS[1]], "params": [
        {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True,
         "sampling_seed": 7},
        {"temperature": 0.0, "max_new_tokens": MAX_NEW_TOKENS, "ignore_eos": True, "sampling_seed": 8}]}
    fillers = {"prompts": [h.filler_request(i)[0] for i in range(6)],
               "params": [{"n": N, "temperature": 1.0, "max_new_tokens": 16 + 9 * i, "ignore_eos": True,
                           "sampling_seed": 5000 + i} for i in range(6)]}
    return {"group": group, "singles": singles, "fillers": fillers}


def _http_probe(url, requests):
    from sglang_detspec.rollouts import rollout_record

    group = h.post_json(url, "/generate", {"text": requests["group"]["prompts"], "return_logprob": True,
                                           "sampling_params": requests["group"]["params"]}, timeout=600)
    singles = h.post_json(url, "/generate", {"text": requests["singles"]["prompts"], "return_logprob": True,
                                             "sampling_params": requests["singles"]["params"]}, timeout=600)
    return [rollout_record(o) for o in list(group) + list(singles)]


def _memory_saver_skip_reason():
    try:
        import torch_memory_saver  # noqa: F401
    except ImportError as exc:
        return f"torch_memory_saver is not installed in this Python ({exc}); SGLang's --enable-memory-saver needs it"
    return None


def _engine_args(target, draft, algorithm, extra=()):
    from sglang_detspec.models.tiny_servers import common_args, eagle_args

    args = common_args(Path(target), h.tiny_pair()) + eagle_args(Path(draft), algorithm, deterministic=True)
    return args + (h.INVARIANT_ARGS if algorithm == "DETSPEC_EAGLE_INVARIANT" else []) + list(extra)


def _write_updated_models(models, root: Path):
    from safetensors.torch import load_file

    from sglang_detspec.rollouts import (
        DRAFT_UPDATE_TENSORS,
        TARGET_UPDATE_TENSORS,
        perturbed_tensors,
        write_updated_model,
    )

    target = load_file(str(Path(models.target) / "model.safetensors"))
    draft = load_file(str(Path(models.eagle_draft) / "model.safetensors"))
    new_target = perturbed_tensors(target, TARGET_UPDATE_TENSORS, UPDATE_SEED, TARGET_SCALE)
    new_draft = perturbed_tensors(draft, DRAFT_UPDATE_TENSORS, UPDATE_SEED + 1, DRAFT_SCALE)
    return (write_updated_model(models.target, root / "updated_target", new_target),
            write_updated_model(models.eagle_draft, root / "updated_draft", new_draft))


def _start(name, cmd, root: Path, env=None):
    log = open(root / f"{name}.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ, **(env or {})},
                            start_new_session=True)
    return proc, log, time.monotonic()


@pytest.fixture(scope="module")
def runs(e2e_pool, tiny_models):
    from sglang_detspec.rollouts import DRAFT_UPDATE_TENSORS, TARGET_UPDATE_TENSORS

    root = h.out_dir() / "engine"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    updated_target, updated_draft = _write_updated_models(tiny_models, root)
    requests = _requests()
    m = tiny_models
    port = 33000

    def ports():
        nonlocal port
        port = h.free_port(port + 100)
        return ["--port", str(port), "--nccl-port", str(port + 1)]

    jobs = {
        "updates": {"scenario": "updates", "argv": _engine_args(m.target, m.eagle_draft, "DETSPEC_EAGLE", ports()),
                    "updated_target_dir": str(updated_target), "updated_draft_dir": str(updated_draft),
                    "target_update_names": list(TARGET_UPDATE_TENSORS),
                    "draft_update_names": list(DRAFT_UPDATE_TENSORS)},
        "invariant": {"scenario": "generate",
                      "argv": _engine_args(m.target, m.eagle_draft, "DETSPEC_EAGLE_INVARIANT", ports())},
        "fresh_updated": {"scenario": "generate",
                          "argv": _engine_args(updated_target, updated_draft, "DETSPEC_EAGLE", ports())},
    }
    memory_skip = _memory_saver_skip_reason()
    if memory_skip is None:
        jobs["memory"] = {"scenario": "memory", "env": {"SGLANG_MEMORY_SAVER_CUDA_GRAPH": "1"},
                          "argv": _engine_args(m.target, m.eagle_draft, "DETSPEC_EAGLE",
                                               [*MEMORY_SAVER_ARGS, *ports()])}
    procs = {}
    for name, job in jobs.items():
        job["requests"] = requests
        (root / f"{name}.job.json").write_text(json.dumps(job))
        procs[name] = _start(name, [sys.executable, str(HERE / "engine_scenarios.py"), str(root / f"{name}.job.json"),
                                    str(root / f"{name}.out.json")], root)
    example_out = root / "grpo_rollout.json"
    procs["example"] = _start("example", [sys.executable, str(REPO / "examples" / "grpo_rollout.py"), "--out",
                                          str(example_out), "--steps", "3", "--prompts", "4", "--group-size", "4"],
                              root)
    try:
        http = {name: _http_probe(e2e_pool.ready(name).base_url, requests) for name in (DETSPEC_SERVER, INVARIANT_SERVER)}
    finally:
        results, walls = {}, {}
        for name, (proc, log, t0) in procs.items():
            try:
                proc.wait(timeout=max(1, SCENARIO_TIMEOUT_S - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait()
            log.close()
            walls[name] = round(time.monotonic() - t0, 1)
            out = root / f"{name}.out.json"
            results[name] = json.loads(out.read_text()) if out.is_file() else {
                "error": f"no results (exit {proc.returncode}); log tail:\n" + (root / f"{name}.log").read_text()[-4000:]}
    results["example"] = {"returncode": procs["example"][0].returncode, "wall_s": walls["example"],
                          "json": json.loads(example_out.read_text()) if example_out.is_file() else None,
                          "log_tail": (root / "example.log").read_text()[-3000:]}
    h.record("engine_walls_s", walls)
    return {"http": http, "engines": results, "memory_skip": memory_skip}


def _engine(runs, name):
    res = runs["engines"][name]
    if "error" in res:
        pytest.fail(f"engine scenario {name} failed:\n{res['error']}")
    return res


def _diffs(a, b):
    from sglang_detspec.rollouts import compare_records

    return compare_records(a, b)


# ---------------------------------------------------------------------------------------------- (a) Engine == HTTP


@pytest.mark.parametrize("engine,server", [("updates", DETSPEC_SERVER), ("invariant", INVARIANT_SERVER)])
def test_engine_gives_the_http_servers_tokens_and_logprob_bits(runs, engine, server):
    res = _engine(runs, engine)
    diffs = _diffs(res["records"]["before"], runs["http"][server])
    h.record(f"engine_vs_http_{engine}", diffs)
    assert diffs == {"tokens": [], "logprobs": []}
    assert all(v and v > 0 for v in res["verify_ct"]["before"]), res["verify_ct"]["before"]  # speculation ran


@pytest.mark.parametrize("engine", ["updates", "invariant"])
def test_the_plugin_is_loaded_in_the_engine_process_and_n_samples_are_distinct(runs, engine):
    res = _engine(runs, engine)
    status = res["plugin_status"]
    h.record(f"engine_plugin_status_{engine}", status)
    assert "DETSPEC_EAGLE" in status["algorithms"] and "DETSPEC_EAGLE_INVARIANT" in status["algorithms"]
    assert status["resolution_hook_active"] and status["request_validation_active"]
    groups = [res["records"]["before"][i * N:(i + 1) * N] for i in range(len(PROMPTS))]
    assert [len({tuple(r["output_ids"]) for r in g}) for g in groups] == [N] * len(PROMPTS)  # the n > 1 hook ran


def test_control_the_comparison_tells_the_two_algorithms_apart(runs):
    diffs = _diffs(_engine(runs, "invariant")["records"]["before"], runs["http"][DETSPEC_SERVER])
    assert diffs["tokens"], "the invariant Engine gave DETSPEC_EAGLE's tokens: the comparison cannot fail"


# ----------------------------------------------------------------------------------------------- (b) weight updates


def test_control_the_target_update_changes_the_tokens(runs):
    recs = _engine(runs, "updates")["records"]
    diffs = _diffs(recs["before"], recs["after_target"])
    h.record("engine_target_update_changed", diffs)
    assert diffs["tokens"], "update_weights_from_tensor changed no token: the update did not reach the target"


def test_after_the_update_the_probe_keeps_its_bits_beside_other_requests(runs):
    recs = _engine(runs, "updates")["records"]
    assert _diffs(recs["after_target"], recs["after_target_cobatched"]) == {"tokens": [], "logprobs": []}


def test_control_the_draft_update_reaches_the_draft(runs):
    recs = _engine(runs, "updates")["records"]
    diffs = _diffs(recs["after_target"], recs["after_draft"])
    h.record("engine_draft_update_changed", diffs)
    assert diffs["tokens"], "a draft update changed no DETSPEC_EAGLE token: it did not reach the draft"


def test_updated_engine_equals_a_fresh_engine_loaded_with_the_updated_checkpoints(runs):
    updated = _engine(runs, "updates")["records"]["after_draft"]
    fresh = _engine(runs, "fresh_updated")["records"]["before"]
    diffs = _diffs(updated, fresh)
    h.record("engine_updated_vs_fresh", diffs)
    assert diffs == {"tokens": [], "logprobs": []}


def test_update_from_disk_of_the_same_target_changes_nothing_further(runs):
    recs = _engine(runs, "updates")["records"]
    diffs = _diffs(recs["after_draft"], recs["after_disk"])
    h.record("engine_disk_update_vs_tensor_update", diffs)
    assert diffs == {"tokens": [], "logprobs": []}


# -------------------------------------------------------------------------------------- (c) memory release / resume


def _memory(runs):
    if runs["memory_skip"]:
        pytest.skip(runs["memory_skip"])
    return _engine(runs, "memory")


def test_release_and_resume_keep_the_tokens_and_logprob_bits(runs):
    recs = _memory(runs)["records"]
    diffs = _diffs(recs["before"], recs["after_resume"])
    h.record("engine_release_resume", diffs)
    assert diffs == {"tokens": [], "logprobs": []}


def test_control_the_release_really_freed_gpu_memory(runs):
    mem = _memory(runs)["memory"]
    h.record("engine_memory_mib", mem)
    before, released = mem["before_release"].get("engine_mib"), mem["released"].get("engine_mib")
    if before is None or released is None:
        pytest.skip(f"no per-process GPU memory reading from NVML here: {mem}")
    assert before - released > 64, mem


# ----------------------------------------------------------------------------------------------------- (d) example


def test_example_runs_end_to_end_in_time_and_reproduces_a_step(runs):
    ex = runs["engines"]["example"]
    h.record("engine_example", {"returncode": ex["returncode"], "wall_s": ex["wall_s"],
                                "summary": (ex["json"] or {}).get("summary"),
                                "timings_s": (ex["json"] or {}).get("timings_s")})
    assert ex["returncode"] == 0 and ex["json"], ex["log_tail"]
    s, t = ex["json"]["summary"], ex["json"]["timings_s"]
    assert s["rerun_identical_tokens"] and s["rerun_identical_logprobs"], s["rerun_diffs"]
    assert t["rollouts_s"] + t["rerun_s"] < EXAMPLE_LOOP_LIMIT_S, t
    assert ex["wall_s"] < EXAMPLE_WALL_LIMIT_S, ex["wall_s"]
    # Control: each update changed some samples, so reproducing the step is not vacuous.
    assert all(c and c > 0 for c in s["samples_changed_from_previous_step"][1:]), s


if __name__ == "__main__":
    h.run_module(__file__)
