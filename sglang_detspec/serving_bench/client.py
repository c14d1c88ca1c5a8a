"""Runs SGLang's own serving benchmark client several times in one process: ``python -m
sglang_detspec.serving_bench.client RUNS.json``.

Each entry of ``RUNS.json`` (``{"runs": [{"argv": [...], "reset_url": URL or null}, ...]}``) is the argument list
of one ``python -m sglang.bench_serving`` run; this module sets ``sys.argv`` to it and calls that module's own
``cli_main`` (its parser, its ``run_benchmark``), exactly what the command line does -- but the import of
``bench_serving`` (transformers, aiohttp, ...; 5-20 s) is paid once per configuration instead of once per
concurrency. Before a run it POSTs ``/set_internal_state`` with no change to ``reset_url``, which zeroes SGLang's
speculation counters, so the ``accept_length`` bench_serving reads afterwards is that run's. A run that raises is
reported and the next one still runs.
"""

from __future__ import annotations

import json
import sys
import traceback
import urllib.request


def _reset(url: str) -> bool:
    req = urllib.request.Request(url + "/set_internal_state", data=json.dumps({"server_args": {}}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return bool(json.loads(r.read().decode()).get("updated", True))
    except Exception as e:  # informational: the run's accept length is then the server's cumulative one
        print(f"[bench-serve client] could not reset the speculation counters: {e}", flush=True)
        return False


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0]) as f:
        runs = json.load(f)["runs"]
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # 0.5.17 marks the module path deprecated
        from sglang.bench_serving import cli_main

    failed = 0
    for run in runs:
        reset = _reset(run["reset_url"]) if run.get("reset_url") else None
        print(f"[bench-serve client] $ python -m sglang.bench_serving {' '.join(run['argv'])}", flush=True)
        print(f"[bench-serve client] counters reset: {reset}", flush=True)
        sys.argv = ["sglang.bench_serving", *run["argv"]]
        try:
            cli_main()
        except SystemExit as e:
            if e.code not in (0, None):
                failed += 1
                print(f"[bench-serve client] bench_serving exited {e.code}", flush=True)
        except Exception:
            failed += 1
            traceback.print_exc()
        sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
