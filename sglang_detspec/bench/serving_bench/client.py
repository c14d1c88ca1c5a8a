"""Runs SGLang's own serving benchmark client several times in one process: ``python -m
sglang_detspec.bench.serving_bench.client RUNS.json``.

Each entry of ``RUNS.json`` (``{"runs": [{"argv": [...], "reset_url": URL or null}, ...]}``) is the argument list
of one ``python -m sglang.bench_serving`` run; this module sets ``sys.argv`` to it and calls that module's own
``cli_main`` (its parser, its ``run_benchmark``), exactly what the command line does -- but the import of
``bench_serving`` (transformers, aiohttp, ...; 5-20 s) is paid once per configuration instead of once per
concurrency. Before a run it POSTs ``/set_internal_state`` with no change to ``reset_url``, which zeroes SGLang's
speculation counters, so the ``accept_length`` bench_serving reads afterwards is that run's. A run that raises is
reported and the next one still runs.

An entry with ``"repetitions": R`` (and ``"min_seconds"``, ``"concurrency"``, ``"output_file"``) is a measured point:
its argv runs once as a calibration (warm-up included, discarded by the reader), then R more times with
``--num-prompts`` sized from the calibration's duration (:func:`..configs.repetition_prompts`) so that the R runs
together last at least ``min_seconds``, repetition r with ``--seed`` :func:`..configs.round_seed` (a new prompt
set). ``output_file`` then holds 1 + R lines; the last R are the measurement.
``--order interleaved`` splits a point in two kinds of entry: one with ``"calibrate": POINT`` (the point's fields)
runs only the calibration and remembers the size it gives under the name POINT; one with ``"sized_by": POINT``
(``argv``, ``reset_url``, ``round``) is repetition ``round`` with that size, so the runner can list the repetitions
of every point in rounds. A ``sized_by`` entry whose calibration failed is skipped and counted as failed.

``bench_serving`` imports every dataset module at start-up, some with dependencies only they use (HF ``datasets``
for MMMU, ``PIL`` for images) that a serving machine may lack; the benchmark uses ``random-ids`` alone, so a dataset
module that fails on one of :data:`DATASET_ONLY_MODULES` is replaced by a stub whose names raise if called (and the
log says so). The dependency itself is never faked: other libraries test for it.
``--check`` only imports it that way (the runner's preflight).
"""

from __future__ import annotations

import json
import sys
import traceback
import types
import urllib.request

#: Imported by bench_serving's dataset modules other than random-ids (mmmu.py, image.py in 0.5.17).
DATASET_ONLY_MODULES = ("datasets", "PIL")  # PIL: SGLang itself needs it too, so it is rarely missing
_DATASETS_PACKAGE = "sglang.benchmark.datasets."


class _Missing(types.ModuleType):
    """Stands in for one of bench_serving's dataset modules whose dependency is not installed: every name it
    exports is a callable that raises (they are only registered, never called, unless that dataset is chosen)."""

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)

        def unavailable(*_a, **_k):
            raise RuntimeError(f"{self.__name__}.{attr} needs a module that is not installed (stubbed by bench-serve)")

        return unavailable


def _failing_dataset_module(tb) -> str:
    """The ``sglang.benchmark.datasets.X`` module whose import raised, from the traceback ('' if none)."""
    name = ""
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename.replace("\\", "/")
        if "/sglang/benchmark/datasets/" in path and not path.endswith("__init__.py"):
            name = _DATASETS_PACKAGE + path.rsplit("/", 1)[1][: -len(".py")]
        tb = tb.tb_next
    return name


def import_cli_main():
    """bench_serving's ``cli_main``, with its dataset modules whose only-their-own dependency is missing replaced by
    :class:`_Missing`; returns (cli_main, the stubbed module names)."""
    import warnings

    stubbed = []
    while True:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # 0.5.17 marks the module path deprecated
                from sglang.bench_serving import cli_main
            return cli_main, stubbed
        except ModuleNotFoundError as e:
            module = _failing_dataset_module(e.__traceback__)
            if (e.name or "").split(".")[0] not in DATASET_ONLY_MODULES or not module or module in stubbed:
                raise
            stubbed.append(module)
            for name in [m for m in sys.modules if m.startswith(("sglang.bench", "sglang.benchmark"))]:
                if name not in stubbed:
                    del sys.modules[name]  # re-import the half-imported package with the stub in place
            sys.modules[module] = _Missing(module)


def _reset(url: str) -> bool:
    req = urllib.request.Request(url + "/set_internal_state", data=json.dumps({"server_args": {}}).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return bool(json.loads(r.read().decode()).get("updated", True))
    except Exception as e:  # informational: the run's accept length is then the server's cumulative one
        print(f"[bench-serve client] could not reset the speculation counters: {e}", flush=True)
        return False


def _run_once(cli_main, argv) -> bool:
    """One bench_serving run; False if it failed (reported)."""
    print(f"[bench-serve client] $ python -m sglang.bench_serving {' '.join(argv)}", flush=True)
    sys.argv = ["sglang.bench_serving", *argv]
    try:
        cli_main()
    except SystemExit as e:
        if e.code not in (0, None):
            print(f"[bench-serve client] bench_serving exited {e.code}", flush=True)
            return False
    except Exception:
        traceback.print_exc()
        return False
    finally:
        sys.stdout.flush()
    return True


def _sized(argv, n: int, round_index: int):
    """``argv`` with ``--num-prompts n`` and, if it has a ``--seed``, the seed of repetition ``round_index``
    (:func:`..configs.round_seed`)."""
    from sglang_detspec.bench.serving_bench.configs import round_seed

    argv = list(argv)
    argv[argv.index("--num-prompts") + 1] = str(n)
    if "--seed" in argv:
        i = argv.index("--seed") + 1
        argv[i] = str(round_seed(int(argv[i]), round_index))
    return argv


def _last_duration(path) -> float:
    with open(path) as f:
        lines = [ln for ln in f.read().splitlines() if ln.strip()]
    return float(json.loads(lines[-1])["duration"])


def _calibrate(cli_main, run):
    """A measured point's calibration run; the requests per repetition it sizes, or None if it failed."""
    from sglang_detspec.bench.serving_bench.configs import BenchSettings, repetition_prompts

    reset_url = run.get("reset_url")
    print(f"[bench-serve client] counters reset: {_reset(reset_url) if reset_url else None}", flush=True)
    if not _run_once(cli_main, run["argv"]):
        return None
    calibration_n = int(run["argv"][run["argv"].index("--num-prompts") + 1])
    settings = BenchSettings(repetitions=run["repetitions"], min_seconds=run["min_seconds"])
    try:
        n = repetition_prompts(calibration_n, _last_duration(run["output_file"]), settings, run["concurrency"])
    except (OSError, ValueError, KeyError, IndexError) as e:
        print(f"[bench-serve client] no calibration result ({e}); repetitions keep {calibration_n} requests", flush=True)
        n = calibration_n
    return n


def _run_sized(cli_main, run, n: int, round_index: int) -> bool:
    """Repetition ``round_index`` (1-based) of a point: ``n`` requests, the speculation counters reset first; False if
    it failed."""
    reset_url = run.get("reset_url")
    print(f"[bench-serve client] counters reset: {_reset(reset_url) if reset_url else None}", flush=True)
    return _run_once(cli_main, _sized(run["argv"], n, round_index))


def _run_point(cli_main, run) -> int:
    """A measured point: the calibration run, then ``repetitions`` sized runs; returns the number of failed runs."""
    n = _calibrate(cli_main, run)
    if n is None:
        return 1 + run["repetitions"]
    print(f"[bench-serve client] {run['repetitions']} repetitions of {n} requests", flush=True)
    return sum(not _run_sized(cli_main, run, n, r) for r in range(1, run["repetitions"] + 1))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cli_main, stubbed = import_cli_main()
    if stubbed:
        print(f"[bench-serve client] stubbed {', '.join(stubbed)} (their dependencies are not installed; the "
              "random-ids dataset does not use them)", flush=True)
    if argv[0] == "--check":
        print("[bench-serve client] sglang.bench_serving imports", flush=True)
        return 0
    with open(argv[0]) as f:
        runs = json.load(f)["runs"]

    failed, sizes = 0, {}
    for run in runs:
        if run.get("calibrate"):
            sizes[run["calibrate"]] = n = _calibrate(cli_main, run)
            print(f"[bench-serve client] {run['calibrate']}: repetitions of {n} requests" if n else
                  f"[bench-serve client] {run['calibrate']}: calibration failed, its repetitions will be skipped",
                  flush=True)
            failed += n is None
            continue
        if run.get("sized_by"):
            n = sizes.get(run["sized_by"])
            if n is None:
                print(f"[bench-serve client] skipped: {run['sized_by']} has no calibration", flush=True)
                failed += 1
            else:
                failed += not _run_sized(cli_main, run, n, run["round"])
            continue
        if run.get("repetitions"):
            failed += _run_point(cli_main, run)
            continue
        reset = _reset(run["reset_url"]) if run.get("reset_url") else None
        print(f"[bench-serve client] counters reset: {reset}", flush=True)
        failed += not _run_once(cli_main, run["argv"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
