"""Per-step time breakdown of a DETSPEC_EAGLE server (``bench-serve --breakdown``): a timing hook for one extra
server, never part of the product's code path.

How it is installed: ``bench-serve`` writes a ``sitecustomize.py`` that calls :func:`install_from_env` into a
temporary directory and puts it first on that server's ``PYTHONPATH``, with ``SGLANG_DETSPEC_STEP_TIMING`` naming
the JSON file to write. Python runs ``sitecustomize`` in every process of the server; :func:`install_from_env`
only registers an import hook, which patches ``sglang_detspec.integration.sampling.verify`` and ``...workers.single_layer`` right
after SGLang's scheduler imports them (before any worker is built, so the workers' snapshots of the sampling
names take the timed versions).

What is timed, in each decode step of ``DetspecEAGLEWorkerV2.forward_batch_generation`` (prefill steps are not
counted), with ``torch.cuda.synchronize()`` before and after every region and wall-clock time in between:

* ``draft_forward``   -- ``DetspecEagleDraftWorker.draft`` (3 draft steps) and ``_draft_extend_for_decode``, minus
  the draft sampling inside them;
* ``draft_sampling``  -- the plugin's seeded proposal (``_detspec_sample_draft_proposal``) in those two;
* ``verify_forward``  -- the target worker's verify forward (``forward_batch_generation(is_verify=True)``);
* ``verify_sampling`` -- ``detspec_eagle_sample`` (row-local truncation, the rejection-sampling chain);
* ``bookkeeping``     -- the rest of the step (verify preparation, accept bookkeeping, draft inputs).

Synchronising removes the overlap of CPU scheduling with GPU work, and a sampling call can only be timed on its own
when it is not inside a CUDA graph, so the breakdown server runs with CUDA graphs off: its steps are slower than
the throughput run's, and the breakdown says where a step's time goes, not what the throughput run spent.
"""

from __future__ import annotations

import functools
import importlib.abc
import json
import os
import sys
import time
from typing import Callable, Dict, Optional

__all__ = ["ENV_VAR", "PHASES", "install_from_env", "summarize", "SITECUSTOMIZE"]

ENV_VAR = "SGLANG_DETSPEC_STEP_TIMING"
PHASES = ("draft_forward", "draft_sampling", "verify_forward", "verify_sampling", "bookkeeping")
_REGIONS = ("step", "draft", "draft_extend", "draft_sampling", "verify_forward", "verify_sampling")
SITECUSTOMIZE = "from sglang_detspec.bench.serving_bench import step_timing\nstep_timing.install_from_env()\n"
_FLUSH_EVERY = 20


class _Totals:
    def __init__(self, path: str):
        self.path = path
        self.sums = {k: 0.0 for k in _REGIONS}
        self.steps = 0
        self.rows = 0
        self.current: Optional[Dict[str, float]] = None

    def flush(self) -> None:
        tmp = f"{self.path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump({"steps": self.steps, "rows": self.rows, "seconds": self.sums, "pid": os.getpid()}, f)
        os.replace(tmp, self.path)


_TOTALS: Optional[_Totals] = None


def _timed(region: str, fn: Callable, *, when: Callable[..., bool] = lambda *a, **k: True) -> Callable:
    import torch

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t = _TOTALS
        if t is None or t.current is None or not when(*args, **kwargs) or torch.cuda.is_current_stream_capturing():
            return fn(*args, **kwargs)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        torch.cuda.synchronize()
        t.current[region] += time.perf_counter() - t0
        return out

    return wrapper


def _patch_verify(module) -> None:
    module.detspec_eagle_sample = _timed("verify_sampling", module.detspec_eagle_sample)


def _patch_single_layer(module) -> None:
    import torch

    module._detspec_sample_draft_proposal = _timed("draft_sampling", module._detspec_sample_draft_proposal)
    draft_cls, worker_cls = module.DetspecEagleDraftWorker, module.DetspecEAGLEWorkerV2
    draft_cls.draft = _timed("draft", draft_cls.draft)
    draft_cls._draft_extend_for_decode = _timed("draft_extend", draft_cls._draft_extend_for_decode)
    upstream_step = worker_cls.forward_batch_generation
    upstream_init = worker_cls.__init__

    def init(self, *args, **kwargs):
        upstream_init(self, *args, **kwargs)
        target = self.target_worker
        target.forward_batch_generation = _timed("verify_forward", target.forward_batch_generation,
                                                 when=lambda *a, **k: bool(k.get("is_verify")))

    def forward_batch_generation(self, batch, *args, **kwargs):
        t = _TOTALS
        decode = not (batch.forward_mode.is_extend() or batch.is_extend_in_batch or batch.forward_mode.is_idle())
        if t is None or not decode or torch.cuda.is_current_stream_capturing():
            return upstream_step(self, batch, *args, **kwargs)
        t.current = {k: 0.0 for k in _REGIONS}
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            return upstream_step(self, batch, *args, **kwargs)
        finally:
            torch.cuda.synchronize()
            t.current["step"] = time.perf_counter() - t0
            for k, v in t.current.items():
                t.sums[k] += v
            t.steps += 1
            t.rows += int(batch.seq_lens.shape[0])
            t.current = None
            if t.steps % _FLUSH_EVERY == 0:
                t.flush()

    worker_cls.__init__ = init
    worker_cls.forward_batch_generation = forward_batch_generation


_PATCHES = {
    "sglang_detspec.integration.sampling.verify": _patch_verify,
    "sglang_detspec.integration.workers.single_layer": _patch_single_layer,
}


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Finds the two modules through the other finders, then runs their patch right after they execute."""

    def find_spec(self, name, path, target=None):
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                execute = spec.loader.exec_module

                def exec_module(module, execute=execute, patch=patch):
                    execute(module)
                    patch(module)

                spec.loader.exec_module = exec_module
                return spec
        return None


def install_from_env() -> bool:
    """Install the hook when ``SGLANG_DETSPEC_STEP_TIMING`` names an output file (else do nothing)."""
    global _TOTALS
    path = os.environ.get(ENV_VAR)
    if not path or _TOTALS is not None:
        return False
    _TOTALS = _Totals(path)
    sys.meta_path.insert(0, _PatchAfterImport())
    return True


def summarize(before: Optional[dict], after: dict) -> dict:
    """Mean milliseconds per decode step and phase between two snapshots of the timing file (``before`` None: since
    the server started)."""
    before = before or {"steps": 0, "rows": 0, "seconds": {k: 0.0 for k in _REGIONS}}
    steps = after["steps"] - before["steps"]
    if steps <= 0:
        raise ValueError("no decode step was timed between the two snapshots")
    d = {k: (after["seconds"][k] - before["seconds"][k]) * 1000.0 / steps for k in _REGIONS}
    phases = {
        "draft_forward": d["draft"] + d["draft_extend"] - d["draft_sampling"],
        "draft_sampling": d["draft_sampling"],
        "verify_forward": d["verify_forward"],
        "verify_sampling": d["verify_sampling"],
    }
    phases["bookkeeping"] = d["step"] - sum(phases.values())
    return {"steps": steps, "mean_batch": (after["rows"] - before["rows"]) / steps, "step_ms": d["step"],
            "phases_ms": phases}
