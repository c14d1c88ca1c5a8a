"""The ``sglang-detspec check`` tool run against E2E servers, as a user runs it, and the assertions the modules share on
its reports. Standard library only at import time, like ``e2e_harness`` (whose results file the summaries go to)."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, Optional, Sequence

from e2e_harness import out_dir, record, server_process

#: The traffic profiles of ``check --traffic all``.
ALL_PROFILES = ("uniform", "mixed", "long", "prefix")


def run_check(srv, traffic: str, report_path: Path, *, trials: int, seed: int, seeds: str = "1,2",
              extra: Sequence[str] = (), timeout: float = 900) -> dict:
    """``sglang-detspec check --traffic TRAFFIC`` against ``srv`` in a subprocess (as a user runs it): its exit code,
    stdout, the tail of stderr and the JSON report it wrote (``{}`` if none)."""
    cmd = [
        sys.executable, "-m", "sglang_detspec", "check", "--url", srv.base_url, "--traffic", traffic,
        "--trials", str(trials), "--seed", str(seed), "--seeds", seeds, "--wait", "120", "--timeout", "300",
        "--report", str(report_path), "--no-progress", *extra,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    return {"returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr[-2000:], "report": report}


def pressure_profile(report: dict) -> dict:
    """The ``pressure`` profile's entry of a check report (``{}`` if the report has none)."""
    return next((p for p in report.get("profiles", []) if p["name"] == "pressure"), {})


def check_summary(traffic: str, result: dict) -> dict:
    """What e2e_results.json keeps of one :func:`run_check` (the report itself lies beside it)."""
    rep = result["report"]
    return {
        "traffic": traffic,
        "returncode": result["returncode"],
        "unique_outputs": rep.get("unique_outputs"),
        "profiles": {p["name"]: {"unique": p["unique_outputs"], "passed": p.get("passed"),
                                 "accept": p.get("probe_accept_length")} for p in rep.get("profiles", [])},
        "probe_accept_length": rep.get("probe_accept_length"),
        "first_output_ids": (rep.get("trials") or [{}])[0].get("output_ids"),
        "stdout": result["stdout"][-2500:],
    }


def run_checks(servers: Dict[str, server_process.Server], traffic: Dict[str, str], *, trials: int, seed: int,
               annotate=None) -> Dict[str, dict]:
    """:func:`run_check` against every server at once (profile ``traffic[name]``); each summary goes to
    e2e_results.json as ``check_<name>`` (plus ``annotate(name, server)``'s fields), each report to checks/."""
    out = out_dir() / "checks"
    out.mkdir(exist_ok=True)
    with ThreadPoolExecutor(len(servers)) as pool:
        futures = {name: pool.submit(run_check, srv, traffic[name], out / f"{name}.json", trials=trials, seed=seed)
                   for name, srv in servers.items()}
        results = {name: f.result() for name, f in futures.items()}
    for name, r in results.items():
        extra = annotate(name, servers[name]) if annotate else {}
        record(f"check_{name}", {**check_summary(traffic[name], r), **extra})
        print(f"--- {name} (check --traffic {traffic[name]}): exit {r['returncode']}\n{r['stdout'][-2500:]}")
    return results


def assert_one_output_per_profile(result: dict, *, min_trials: Optional[int] = None,
                                  trials: Optional[int] = None, profiles: Optional[Sequence[str]] = None) -> None:
    """One :func:`run_check` result: a report was written, one probe output overall and under every profile, the seeds
    check passed; with ``min_trials`` / ``trials`` each profile ran at least / exactly that many trials, with
    ``profiles`` the report has exactly those. The exit code is not asserted here (a control's may be 1)."""
    rep = result["report"]
    assert rep, f"no report (exit {result['returncode']}):\n{result['stdout']}{result['stderr']}"
    assert rep["unique_outputs"] == 1, result["stdout"]
    if profiles is not None:
        assert {p["name"] for p in rep["profiles"]} == set(profiles), rep["profiles"]
    for profile in rep["profiles"]:
        assert profile["unique_outputs"] == 1, profile
        if min_trials is not None:
            assert len(profile["trials"]) >= min_trials, profile
        if trials is not None:
            assert len(profile["trials"]) == trials, profile
    assert rep["seeds_check"]["passed"], rep["seeds_check"]
