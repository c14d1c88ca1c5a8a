"""How far a speculative server's token logprobs are from the non-speculative server's (issue 34, item 4).

    python scripts/cross_card.py record --out gap.json --algorithms DETSPEC_EAGLE,DETSPEC_EAGLE_INVARIANT,NONE
    python scripts/cross_card.py logprob-gap gap.json

``NONE`` in a results file is the target alone with the plugin's token-id sampler (the reference the invariant mode
reproduces). A logprob is comparable only where both servers scored the same token after the same tokens: for each
sample, the positions before the first token on which the algorithm and ``NONE`` differ (the prompt and seed are the
same). The invariant mode emits ``NONE``'s tokens, so every position is compared; DETSPEC_EAGLE's rejection sampling
draws other tokens for the same seed, so only the common prefix is. Reported per algorithm, from the one-at-a-time
answers: positions compared, how many logprobs are bit-identical, and the largest and mean absolute difference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List

from sglang_detspec.checker.cross_card_results import ResultsFileError, bits_value

__all__ = ["REFERENCE", "LogprobGap", "logprob_gaps", "format_gaps"]

#: The algorithm name a results file gives the non-speculative server.
REFERENCE = "NONE"
MODE = "sequential"


@dataclass
class LogprobGap:
    algorithm: str
    samples: int = 0
    positions: int = 0  # logprobs compared (same token after the same tokens)
    identical: int = 0  # of those, bit-identical
    max_abs: float = 0.0
    sum_abs: float = 0.0

    @property
    def mean_abs(self) -> float:
        return self.sum_abs / self.positions if self.positions else 0.0

    def add(self, ours: Dict[str, Any], reference: Dict[str, Any]) -> None:
        self.samples += 1
        for tok, ref_tok, bits, ref_bits in zip(ours["output_ids"], reference["output_ids"], ours["logprobs"],
                                                reference["logprobs"]):
            if tok != ref_tok:
                return  # later positions follow other tokens: not comparable
            self.positions += 1
            if bits == ref_bits:
                self.identical += 1
                continue
            a, b = bits_value(bits), bits_value(ref_bits)
            diff = float("inf") if a is None or b is None or a != a or b != b else abs(a - b)
            self.max_abs = max(self.max_abs, diff)
            self.sum_abs += diff


def logprob_gaps(data: Dict[str, Any]) -> List[LogprobGap]:
    """One :class:`LogprobGap` per speculative algorithm of a validated results file that also recorded NONE."""
    algorithms = data["settings"]["algorithms"]
    if REFERENCE not in algorithms:
        raise ResultsFileError(
            f"the file recorded {', '.join(algorithms)} but not {REFERENCE}, the non-speculative reference: record "
            f"with --algorithms {','.join([a for a in algorithms if a != REFERENCE] + [REFERENCE])}")
    reference = data["results"][REFERENCE][MODE]
    gaps = []
    for alg in algorithms:
        if alg == REFERENCE:
            continue
        gap = LogprobGap(alg)
        for ours_req, ref_req in zip(data["results"][alg][MODE], reference):
            for ours, ref in zip(ours_req, ref_req):
                gap.add(ours, ref)
        gaps.append(gap)
    return gaps


def format_gaps(gaps: List[LogprobGap], device: str) -> str:
    lines = [f"token logprobs against {REFERENCE} (no speculation, token-id sampler) on {device}, requests sent one "
             "at a time; compared where both scored the same token after the same tokens:"]
    for g in gaps:
        if not g.positions:
            lines.append(f"{g.algorithm}: no comparable position in {g.samples} samples")
            continue
        lines.append(f"{g.algorithm}: {g.positions} positions in {g.samples} samples, {g.identical} bit-identical "
                     f"({100.0 * g.identical / g.positions:.1f}%), max |difference| {g.max_abs:.3g}, "
                     f"mean {g.mean_abs:.3g} nats")
    return "\n".join(lines)
