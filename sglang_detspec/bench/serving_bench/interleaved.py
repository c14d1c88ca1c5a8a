"""``--order interleaved``: the client's run list that measures every configuration in rounds, and its reading.

Every server is up (``--start parallel``). The list first calibrates each (configuration, concurrency) point once,
in configuration order (the calibration also warms the server, as in the sequential order), then holds
``--repetitions`` rounds: in round r the configurations of :func:`..configs.round_order` (the first one rotating),
each one repetition at every concurrency, sized by its own calibration (:mod:`.client`'s ``calibrate`` /
``sized_by`` entries). One client process runs the whole list, so bench_serving is imported once. Each repetition
appends to a file of its own round, so a failed run cannot shift the later rounds' results onto the wrong round.
Standard library only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Mapping, Sequence, Tuple

from sglang_detspec.bench.serving_bench import configs as cfgs
from sglang_detspec.bench.serving_bench import results

__all__ = ["Point", "client_runs", "read_points", "expected_resets", "client_timeout"]

#: A measured point: (configuration, concurrency).
Point = Tuple[str, int]


def _point_name(name: str, c: int) -> str:
    return f"{name}-c{c}"


def round_file(work: Path, name: str, c: int, r: int) -> Path:
    """Where round ``r`` (0-based) of a point appends its bench_serving line."""
    return work / f"{_point_name(name, c)}-round{r + 1}.jsonl"


def client_runs(servers: Mapping[str, Tuple[int, str]], settings: cfgs.BenchSettings, target: Path, work: Path,
                python: str) -> List[dict]:
    """The client's entries for the configurations of ``servers`` (``{name: (port, base url)}``, in table order):
    the calibrations, then the rounds. Clears the files the entries will append to."""
    names = [n for n in settings.configs if n in servers]

    def argv(name: str, c: int, output: Path) -> List[str]:
        output.unlink(missing_ok=True)
        return cfgs.bench_serving_command(python, servers[name][0], target, settings, c, output)[3:]

    runs = []
    for name in names:
        for c in settings.concurrencies:
            output = work / f"{_point_name(name, c)}-calibration.jsonl"
            runs.append({"calibrate": _point_name(name, c), "argv": argv(name, c, output),
                         "reset_url": servers[name][1], "repetitions": settings.repetitions,
                         "min_seconds": settings.min_seconds, "concurrency": c, "output_file": str(output)})
    for r, order in enumerate(cfgs.round_order(tuple(names), settings.repetitions)):
        for name in order:
            for c in settings.concurrencies:
                runs.append({"sized_by": _point_name(name, c), "argv": argv(name, c, round_file(work, name, c, r)),
                             "reset_url": servers[name][1], "round": r + 1})
    return runs


def expected_resets(names: Sequence[str], settings: cfgs.BenchSettings) -> int:
    """Counter resets a complete run logs: one before every calibration and every repetition."""
    return len(names) * len(settings.concurrencies) * (1 + settings.repetitions)


def client_timeout(names: Sequence[str], settings: cfgs.BenchSettings) -> float:
    """The sequential order's per-configuration client timeout (runner), summed over the configurations."""
    return len(names) * sum(60 + -(-cfgs.num_prompts(settings, c) // c) * settings.output_len * 0.05
                            + 3 * settings.min_seconds + 30 * settings.repetitions for c in settings.concurrencies)


def read_points(names: Sequence[str], settings: cfgs.BenchSettings, work: Path, *, why: str,
                interrupted: bool) -> Dict[Point, results.RunResult]:
    """Each point's row (:func:`..results.read_rounds`); a point without results is an error row saying ``why``.
    ``interrupted``: rounds never reached are not errors."""
    rows = {}
    for name in names:
        for c in settings.concurrencies:
            n = cfgs.num_prompts(settings, c)
            files = [round_file(work, name, c, r) for r in range(settings.repetitions)]
            try:
                rows[(name, c)] = results.read_rounds(files, config=name, concurrency=c, calibration_prompts=n,
                                                      require_all=not interrupted)
            except (OSError, ValueError) as e:
                rows[(name, c)] = results.RunResult(config=name, concurrency=c, num_prompts=n, error=f"{why}: {e}")
    return rows
