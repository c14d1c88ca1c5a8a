"""One ``sglang.Engine`` scenario of tests/e2e/test_e2e_engine.py, run as its own process (an Engine owns its
process's event loop and scheduler children, so each scenario gets a fresh process and they start side by side):

    python tests/e2e/engine_scenarios.py JOB.json OUT.json

JOB.json: ``{"scenario": "generate" | "updates" | "memory", "argv": [launch_server flags], "requests": {...},
"env": {...}, ...}``. OUT.json: ``{"records": {label: [rollout_record, ...]}, "verify_ct": {label: [...]},
"plugin_status": {...}, "memory": {...}, "timings_s": {...}}``, or ``{"error": traceback}``.

* ``generate`` -- start, run the probe requests, stop;
* ``updates``  -- the probe; ``update_weights_from_tensor`` of the target tensors (``target_updates``), the probe alone
  and beside filler requests; the draft tensors (``draft_updates``), the probe; ``update_weights_from_disk`` of
  ``updated_target_dir``, the probe;
* ``memory``   -- the probe; ``release_memory_occupation()``; ``resume_memory_occupation()``; the probe; the GPU
  memory the engine's processes hold at each point.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path


def _records(outs):
    from sglang_detspec.rollouts import rollout_record

    return [rollout_record(o) for o in outs], [o.get("meta_info", {}).get("spec_verify_ct") for o in outs]


def _probe(engine, requests, out, label, extra_group=None):
    """The group batch (prompts x n) and the singles batch; ``extra_group`` appends filler prompts to the group
    batch (same n) so the probe shares its batches with other requests; only the probe's outputs are kept."""
    group = requests["group"]
    texts, params = list(group["prompts"]), list(group["params"])
    if extra_group:
        texts += extra_group["prompts"]
        params += extra_group["params"]
    outs = engine.generate(prompt=texts, sampling_params=params, return_logprob=True)
    keep = len(group["prompts"]) * group["params"][0]["n"]
    singles = engine.generate(prompt=requests["singles"]["prompts"], sampling_params=requests["singles"]["params"],
                              return_logprob=True)
    recs, verify = _records(list(outs[:keep]) + list(singles))
    out["records"][label] = recs
    out["verify_ct"][label] = verify


def _gpu_memory_of_this_engine():
    """MiB of GPU memory held by this process and its children (NVML per process), and the device's used MiB."""
    info = {}
    try:
        import psutil
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)  # the lent machines' E2E runs use one GPU
        pids = {os.getpid(), *(c.pid for c in psutil.Process().children(recursive=True))}
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        mine = [p.usedGpuMemory for p in procs if p.pid in pids and p.usedGpuMemory is not None]
        info["engine_mib"] = sum(mine) / 2**20 if mine else None
        info["device_used_mib"] = pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
    except Exception as exc:  # informational: the test skips its memory control without a reading
        info["error"] = f"{type(exc).__name__}: {exc}"
    return info


def _check(result, what):
    ok, message = (result[0], result[1]) if isinstance(result, (tuple, list)) else (bool(result), str(result))
    if not ok:
        raise RuntimeError(f"{what} failed: {message}")


def run(job: dict) -> dict:
    import torch

    import sglang

    from sglang_detspec.plugin import plugin_status
    from sglang_detspec.rollouts import engine_kwargs, tensors_of

    out = {"records": {}, "verify_ct": {}, "memory": {}, "timings_s": {}}
    t0 = time.monotonic()
    kwargs = engine_kwargs(job["argv"])
    kwargs["log_level"] = "warning"
    engine = sglang.Engine(**kwargs)
    out["timings_s"]["engine_start"] = round(time.monotonic() - t0, 2)
    # The plugin as the Engine's own process sees it (Engine.__init__ ran load_plugins()).
    out["plugin_status"] = plugin_status()
    requests = job["requests"]
    try:
        _probe(engine, requests, out, "before")
        if job["scenario"] == "updates":
            device = "cuda" if torch.cuda.is_available() else None
            target = tensors_of(Path(job["updated_target_dir"]), job["target_update_names"], device=device)
            _check(engine.update_weights_from_tensor(list(target.items())), "update_weights_from_tensor (target)")
            _probe(engine, requests, out, "after_target")
            _probe(engine, requests, out, "after_target_cobatched", extra_group=requests["fillers"])
            draft = tensors_of(Path(job["updated_draft_dir"]), job["draft_update_names"], device=device)
            _check(engine.update_weights_from_tensor(list(draft.items())), "update_weights_from_tensor (draft)")
            _probe(engine, requests, out, "after_draft")
            _check(engine.update_weights_from_disk(job["updated_target_dir"]), "update_weights_from_disk (target)")
            _probe(engine, requests, out, "after_disk")
        elif job["scenario"] == "memory":
            out["memory"]["before_release"] = _gpu_memory_of_this_engine()
            engine.release_memory_occupation()
            out["memory"]["released"] = _gpu_memory_of_this_engine()
            engine.resume_memory_occupation()
            out["memory"]["resumed"] = _gpu_memory_of_this_engine()
            _probe(engine, requests, out, "after_resume")
        elif job["scenario"] != "generate":
            raise ValueError(f"unknown scenario {job['scenario']!r}")
    finally:
        engine.shutdown()
    out["timings_s"]["total"] = round(time.monotonic() - t0, 2)
    return out


def main(argv):
    job_path, out_path = Path(argv[1]), Path(argv[2])
    job = json.loads(job_path.read_text())
    os.environ.update(job.get("env", {}))
    try:
        result = run(job)
    except BaseException:
        result = {"error": traceback.format_exc()}
    out_path.write_text(json.dumps(result) + "\n")
    return 0 if "error" not in result else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
