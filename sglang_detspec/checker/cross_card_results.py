"""The cross-card results file (``scripts/cross_card.py``): exact logprob bit patterns, validation, comparison.

A results file holds, per algorithm and per sending mode (``sequential``: one request at a time; ``concurrent``: all
in flight at once), every request's samples: output token ids, each token's logprob as an exact bit pattern, and the
verify-step count. Two files are comparable only if they sent the same requests under the same settings on the same
model weights; :func:`compare_files` refuses anything else (:class:`ResultsFileError`, exit 2), because a difference
between different requests says nothing about the cards.

Bit patterns: a logprob is stored as ``float.hex`` of the double JSON gave us (SGLang sends float32 values, which a
double holds exactly, and JSON numbers round-trip), so equality is bitwise, never a tolerance: ``-0.0`` and ``0.0``
differ. Every NaN is stored as ``"nan"`` (JSON carries no NaN payload, so payload bits cannot be compared; a NaN
still differs from every number), a missing logprob (JSON null) as ``None``. Standard library only.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

FORMAT = "sglang-detspec cross-card results"
FORMAT_VERSION = 1
MODES = ("sequential", "concurrent")
#: The settings that must be equal for two files to be comparable (the environment, the device above all, may differ).
COMPARABLE_SETTINGS = ("algorithms", "graphs", "max_new_tokens", "models")

EXIT_SAME, EXIT_DIFFER, EXIT_REFUSED = 0, 1, 2


class ResultsFileError(ValueError):
    """A results file that cannot be read, is malformed, or cannot be compared with the other file."""


def logprob_bits(value: Any) -> Optional[str]:
    """The exact bit pattern of one logprob as JSON gave it: ``float.hex``, ``"nan"`` for any NaN, None for null."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"a logprob must be a number or null, got {value!r}")
    value = float(value)
    return "nan" if math.isnan(value) else value.hex()


def bits_value(bits: Optional[str]) -> Optional[float]:
    """The float a :func:`logprob_bits` pattern stands for (for printing)."""
    if bits is None:
        return None
    return math.nan if bits == "nan" else float.fromhex(bits)


def sample_record(answer: Any, max_new_tokens: int) -> Dict[str, Any]:
    """One ``/generate`` answer (with ``return_logprob``) as ``{"output_ids", "logprobs", "verify_steps"}``; refuses
    an answer without ``max_new_tokens`` ids (``ignore_eos`` is set) or without one logprob per id."""
    if not isinstance(answer, dict):
        raise ValueError(f"an answer must be a JSON object, got {type(answer).__name__}")
    meta = answer.get("meta_info") or {}
    ids = answer.get("output_ids")
    if ids is None:
        ids = meta.get("output_ids")
    if not isinstance(ids, list) or len(ids) != max_new_tokens:
        shown = f"{len(ids)} ids" if isinstance(ids, list) else repr(ids)[:80]
        raise ValueError(f"expected {max_new_tokens} output_ids (ignore_eos is set), got {shown}")
    rows = meta.get("output_token_logprobs")
    if not isinstance(rows, list) or len(rows) != len(ids):
        raise ValueError("meta_info.output_token_logprobs is missing or not one per output id "
                         "(does the server honour return_logprob?)")
    logprobs = []
    for row in rows:
        if not isinstance(row, (list, tuple)) or not row:
            raise ValueError(f"malformed output_token_logprobs row {row!r}")
        logprobs.append(logprob_bits(row[0]))
    return {"output_ids": [int(t) for t in ids], "logprobs": logprobs,
            "verify_steps": int(meta.get("spec_verify_ct") or 0)}


# ---------------------------------------------------------------------------------------------------------------
# Reading and validating


def _require(cond: bool, where: str, what: str) -> None:
    if not cond:
        raise ResultsFileError(f"{where}: {what}")


def validate(data: Any, where: str) -> Dict[str, Any]:
    """``data`` if it is a well-formed results file; else :class:`ResultsFileError` naming the file and the field."""
    _require(isinstance(data, dict), where, "not a JSON object")
    _require(data.get("format") == FORMAT, where, f'"format" is {data.get("format")!r}, expected {FORMAT!r} '
             "(write it with scripts/cross_card.py record)")
    _require(data.get("version") == FORMAT_VERSION, where,
             f'"version" is {data.get("version")!r}; this tool reads version {FORMAT_VERSION}')
    settings = data.get("settings")
    _require(isinstance(settings, dict), where, '"settings" missing or not an object')
    for key in COMPARABLE_SETTINGS:
        _require(key in settings, where, f'"settings.{key}" missing')
    algorithms = settings["algorithms"]
    _require(isinstance(algorithms, list) and algorithms and all(isinstance(a, str) for a in algorithms), where,
             '"settings.algorithms" must be a non-empty list of names')
    max_new = settings["max_new_tokens"]
    _require(isinstance(max_new, int) and max_new > 0, where, '"settings.max_new_tokens" must be a positive integer')
    requests = data.get("requests")
    _require(isinstance(requests, list) and requests, where, '"requests" missing or empty')
    for i, req in enumerate(requests):
        _require(isinstance(req, dict) and isinstance(req.get("id"), str) and isinstance(req.get("n"), int),
                 where, f'"requests[{i}]" needs a string "id" and an integer "n"')
    ids = [r["id"] for r in requests]
    _require(len(set(ids)) == len(ids), where, '"requests" ids are not unique')
    results = data.get("results")
    _require(isinstance(results, dict), where, '"results" missing or not an object')
    for alg in algorithms:
        per_alg = results.get(alg)
        _require(isinstance(per_alg, dict), where, f'"results.{alg}" missing')
        for mode in MODES:
            rows = per_alg.get(mode)
            _require(isinstance(rows, list) and len(rows) == len(requests), where,
                     f'"results.{alg}.{mode}" must hold one entry per request ({len(requests)})')
            for i, (req, samples) in enumerate(zip(requests, rows)):
                at = f'"results.{alg}.{mode}[{i}]" (request {req["id"]})'
                _require(isinstance(samples, list) and len(samples) == req["n"], where,
                         f"{at} must hold n = {req['n']} samples")
                for s in samples:
                    _require(isinstance(s, dict) and isinstance(s.get("output_ids"), list)
                             and isinstance(s.get("logprobs"), list), where,
                             f'{at}: every sample needs "output_ids" and "logprobs" lists')
                    _require(len(s["output_ids"]) == len(s["logprobs"]) == max_new, where,
                             f"{at}: every sample needs max_new_tokens = {max_new} output_ids and logprobs")
                    _require(all(isinstance(t, int) and not isinstance(t, bool) for t in s["output_ids"]), where,
                             f"{at}: output_ids must be integers")
                    _require(all(b is None or _is_bits(b) for b in s["logprobs"]), where,
                             f'{at}: logprobs must be float.hex strings, "nan" or null')
    return data


def _is_bits(b: Any) -> bool:
    if not isinstance(b, str):
        return False
    if b == "nan":
        return True
    try:
        return float.fromhex(b).hex() == b  # canonical float.hex output only: one spelling per bit pattern
    except (ValueError, OverflowError):
        return False


def load(path: Path) -> Dict[str, Any]:
    """Read and validate one results file (gzip-compressed when its name ends in ``.gz``, as the files kept in
    docs/cross_card/ are); :class:`ResultsFileError` (never a traceback) when that fails."""
    path = Path(path)
    try:
        text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    except OSError as e:
        raise ResultsFileError(f"{path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    except (EOFError, UnicodeDecodeError) as e:
        raise ResultsFileError(f"{path}: not a gzip-compressed UTF-8 results file ({e})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ResultsFileError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    return validate(data, str(path))


def comparable(a: Dict[str, Any], b: Dict[str, Any], name_a: str = "A", name_b: str = "B") -> None:
    """Refuse (:class:`ResultsFileError`) two files whose request sets or comparable settings differ."""
    if a["requests"] != b["requests"]:
        ids_a, ids_b = [r["id"] for r in a["requests"]], [r["id"] for r in b["requests"]]
        first = next((i for i, (x, y) in enumerate(zip(a["requests"], b["requests"])) if x != y), min(len(ids_a), len(ids_b)))
        raise ResultsFileError(
            f"{name_a} and {name_b} sent different request sets ({len(ids_a)} vs {len(ids_b)} requests, first "
            f"difference at request {first}): different requests cannot be compared; record both with the same "
            "version of scripts/cross_card.py")
    for key in COMPARABLE_SETTINGS:
        if a["settings"][key] != b["settings"][key]:
            raise ResultsFileError(
                f"{name_a} and {name_b} differ in settings.{key} ({a['settings'][key]!r} vs {b['settings'][key]!r}): "
                "record both with the same --algorithms and --graphs, on the same tiny-pair weights")


# ---------------------------------------------------------------------------------------------------------------
# Comparing


@dataclass
class Difference:
    """The first place where two files' answers to one request differ."""

    algorithm: str
    mode: str
    request: str
    sample: int
    position: int
    kind: str  # "token", "logprob" or "length"
    a_token: Optional[int] = None
    b_token: Optional[int] = None
    a_bits: Optional[str] = None
    b_bits: Optional[str] = None

    def describe(self) -> str:
        where = f"request {self.request} ({self.mode}), sample {self.sample}, position {self.position}"
        if self.kind == "length":
            return f"{where}: the sequences have different lengths"
        lp = (f"logprob {self.a_bits} ({bits_value(self.a_bits)!r}) vs {self.b_bits} ({bits_value(self.b_bits)!r})")
        if self.kind == "token":
            return f"{where}: token {self.a_token} vs {self.b_token}; {lp}"
        return f"{where}: same token {self.a_token}, {lp}"


@dataclass
class AlgorithmComparison:
    algorithm: str
    requests: int
    differing: Dict[str, List[str]] = field(default_factory=lambda: {m: [] for m in MODES})
    token_differing: Dict[str, List[str]] = field(default_factory=lambda: {m: [] for m in MODES})
    first: Optional[Difference] = None
    verify_steps_differ: int = 0  # requests (either mode) whose per-sample verify counts differ: the drafts differ

    @property
    def same(self) -> bool:
        return not any(self.differing.values())


def first_difference(algorithm: str, mode: str, request: str, a: List[dict], b: List[dict]) -> Optional[Difference]:
    """The first (sample, position) where two answers to one request differ in a token or a logprob's bits."""
    for s, (x, y) in enumerate(zip(a, b)):
        ids_a, ids_b, lp_a, lp_b = x["output_ids"], y["output_ids"], x["logprobs"], y["logprobs"]
        for pos in range(max(len(ids_a), len(ids_b), len(lp_a), len(lp_b))):
            if pos >= min(len(ids_a), len(ids_b), len(lp_a), len(lp_b)):
                return Difference(algorithm, mode, request, s, pos, "length")
            if ids_a[pos] != ids_b[pos] or lp_a[pos] != lp_b[pos]:
                kind = "token" if ids_a[pos] != ids_b[pos] else "logprob"
                return Difference(algorithm, mode, request, s, pos, kind, ids_a[pos], ids_b[pos], lp_a[pos], lp_b[pos])
    return None


def compare_algorithm(a: Dict[str, Any], b: Dict[str, Any], algorithm: str) -> AlgorithmComparison:
    requests = a["requests"]
    out = AlgorithmComparison(algorithm, len(requests))
    verify_differ = set()
    for mode in MODES:
        rows_a, rows_b = a["results"][algorithm][mode], b["results"][algorithm][mode]
        for req, xa, xb in zip(requests, rows_a, rows_b):
            diff = first_difference(algorithm, mode, req["id"], xa, xb)
            if [s.get("verify_steps") for s in xa] != [s.get("verify_steps") for s in xb]:
                verify_differ.add(req["id"])
            if diff is None:
                continue
            out.differing[mode].append(req["id"])
            if any(x["output_ids"] != y["output_ids"] for x, y in zip(xa, xb)):
                out.token_differing[mode].append(req["id"])
            if out.first is None:
                out.first = diff
    out.verify_steps_differ = len(verify_differ)
    return out


def compare_data(a: Dict[str, Any], b: Dict[str, Any], name_a: str = "A", name_b: str = "B") -> List[AlgorithmComparison]:
    """Per algorithm, how two comparable files' answers differ (:func:`comparable` refuses the others)."""
    comparable(a, b, name_a, name_b)
    return [compare_algorithm(a, b, alg) for alg in a["settings"]["algorithms"]]


def _device(data: Dict[str, Any]) -> str:
    env = data.get("environment") or {}
    text = f"{env.get('device', '?')} (sglang {env.get('sglang', '?')}, torch {env.get('torch', '?')}, plugin " \
        f"{env.get('plugin_commit') or '?'})"
    return text + (f"; note: {env['note']}" if env.get("note") else "")


def format_comparison(results: List[AlgorithmComparison], a: Dict[str, Any], b: Dict[str, Any],
                      name_a: str = "A", name_b: str = "B") -> str:
    lines = [f"A = {name_a}: {_device(a)}", f"B = {name_b}: {_device(b)}"]
    for r in results:
        if r.same:
            line = (f"{r.algorithm}: all {r.requests} requests bit-identical, one at a time and concurrently "
                    "(tokens and logprobs)")
        else:
            counts = ", ".join(f"{m} {len(r.differing[m])} (tokens in {len(r.token_differing[m])})" for m in MODES)
            line = f"{r.algorithm}: requests that differ, of {r.requests}: {counts}\n  first: {r.first.describe()}"
        if r.verify_steps_differ:
            line += (f"\n  verify-step counts differ in {r.verify_steps_differ} request(s): the draft model's numbers "
                     "differ between the cards")
        lines.append(line)
    return "\n".join(lines)


def compare_files(path_a: Path, path_b: Path) -> tuple:
    """``(exit code, text)``: 0 when every request's tokens and logprob bits match, 1 when some differ; a file that
    is malformed or not comparable raises :class:`ResultsFileError`."""
    a, b = load(path_a), load(path_b)
    results = compare_data(a, b, str(path_a), str(path_b))
    text = format_comparison(results, a, b, str(path_a), str(path_b))
    return (EXIT_SAME if all(r.same for r in results) else EXIT_DIFFER), text
