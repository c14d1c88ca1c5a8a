"""``check --logprobs``: the probe also returns its output token logprobs (and the top ``TOP_LOGPROBS``), and every
trial whose tokens equal the reference's must return bit-identical logprobs.

"Bit-identical" is compared on the floats the server sent (``float.hex``, so -0.0 and 0.0 differ and NaN equals
itself); SGLang writes float32 logprobs as JSON numbers that round-trip exactly. Trials whose tokens differ from the
reference are left out: their logprobs belong to other tokens, and the token verdict already fails.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

#: Top logprobs requested per output position with ``--logprobs``.
TOP_LOGPROBS = 5

#: The request-level fields ``--logprobs`` adds to the probe.
PROBE_FIELDS = {"return_logprob": True, "top_logprobs_num": TOP_LOGPROBS}


def _float(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def parse_token_logprobs(meta: dict) -> list[float] | None:
    """``meta_info.output_token_logprobs`` (``[[logprob, token_id, text], ...]``) as a list of floats, or None."""
    rows = meta.get("output_token_logprobs")
    if not isinstance(rows, list):
        return None
    out = []
    for row in rows:
        value = _float(row[0]) if isinstance(row, (list, tuple)) and row else None
        if value is None:
            return None
        out.append(value)
    return out


def parse_top_logprobs(meta: dict) -> list[list[tuple[float, int]]] | None:
    """``meta_info.output_top_logprobs`` (per position ``[[logprob, token_id, text], ...]``) as (logprob, id) pairs."""
    rows = meta.get("output_top_logprobs")
    if not isinstance(rows, list):
        return None
    out = []
    for position in rows:
        if not isinstance(position, list):
            return None
        pairs = []
        for entry in position:
            if not (isinstance(entry, (list, tuple)) and len(entry) >= 2 and _float(entry[0]) is not None):
                return None
            pairs.append((float(entry[0]), entry[1]))
        out.append(pairs)
    return out


def _bits(x: float) -> str:
    return x.hex() if not math.isnan(x) else "nan"


@dataclass
class LogprobDifference:
    """One logprob that differs from the reference's at the same place."""

    trial: int  # Trial.index
    position: int  # output token position
    kind: str  # "token" (the sampled token's logprob) or "top" (one of the top logprobs)
    rank: int | None  # the rank within the top logprobs (kind "top")
    expected: Any  # the reference's value (a logprob; for "top" a [logprob, token id] pair)
    got: Any
    difference: float  # |expected - got| of the logprobs (inf when one side is missing or the ids differ)


@dataclass
class LogprobCheck:
    """The probe's logprobs across the trials whose tokens equal the reference's."""

    top_logprobs: int
    compared_trials: list[int]
    differing_trials: list[int] = field(default_factory=list)
    missing_trials: list[int] = field(default_factory=list)  # trials that returned no (or malformed) logprobs
    largest: LogprobDifference | None = None

    @property
    def passed(self) -> bool:
        return not self.differing_trials and not self.missing_trials


def _differences(trial: int, ref_tok, got_tok, ref_top, got_top) -> list[LogprobDifference]:
    out = []
    for pos in range(max(len(ref_tok), len(got_tok))):
        a = ref_tok[pos] if pos < len(ref_tok) else None
        b = got_tok[pos] if pos < len(got_tok) else None
        if a is None or b is None:
            out.append(LogprobDifference(trial, pos, "token", None, a, b, math.inf))
        elif _bits(a) != _bits(b):
            out.append(LogprobDifference(trial, pos, "token", None, a, b, abs(a - b)))
    for pos in range(max(len(ref_top), len(got_top))):
        ra = ref_top[pos] if pos < len(ref_top) else []
        gb = got_top[pos] if pos < len(got_top) else []
        for rank in range(max(len(ra), len(gb))):
            a = ra[rank] if rank < len(ra) else None
            b = gb[rank] if rank < len(gb) else None
            if a is not None and b is not None and a[1] == b[1] and _bits(a[0]) == _bits(b[0]):
                continue
            diff = abs(a[0] - b[0]) if a is not None and b is not None and a[1] == b[1] else math.inf
            out.append(LogprobDifference(trial, pos, "top", rank, list(a) if a else None, list(b) if b else None, diff))
    return out


def compare_logprobs(reference, trials: Sequence, same_tokens) -> LogprobCheck:
    """Compare each trial's logprobs with ``reference``'s; ``same_tokens(trial)``: its tokens equal the reference's."""
    check = LogprobCheck(top_logprobs=TOP_LOGPROBS, compared_trials=[])
    if reference.output_logprobs is None:
        check.missing_trials.append(reference.index)
        return check
    ref_top = reference.output_top_logprobs or []
    for t in trials:
        if t is reference or not same_tokens(t):
            continue
        check.compared_trials.append(t.index)
        if t.output_logprobs is None:
            check.missing_trials.append(t.index)
            continue
        diffs = _differences(t.index, reference.output_logprobs, t.output_logprobs, ref_top,
                             t.output_top_logprobs or [])
        if diffs:
            check.differing_trials.append(t.index)
            worst = max(diffs, key=lambda d: d.difference)
            if check.largest is None or worst.difference > check.largest.difference:
                check.largest = worst
    return check


def format_logprob_line(check: LogprobCheck) -> str:
    n = len(check.compared_trials)
    what = f"output token logprobs and top-{check.top_logprobs}"
    if check.passed:
        return f"logprobs: bit-identical to the reference in all {n} trials with its tokens ({what})"
    parts = []
    if check.missing_trials:
        parts.append(f"no logprobs returned by trial(s) {', '.join(map(str, check.missing_trials))} "
                     "(does the server honour return_logprob?)")
    d = check.largest
    if d is not None:
        where = f"token {d.position}" + (f", top rank {d.rank}" if d.kind == "top" else "")
        size = "ids differ" if math.isinf(d.difference) else f"{d.difference:.3g}"
        parts.append(f"{len(check.differing_trials)} of {n} trials with the reference's tokens differ; largest "
                     f"difference {size} at {where} (trial {d.trial} has {d.got!r}, the reference {d.expected!r})")
    return "logprobs: " + "; ".join(parts)
