"""What ``check`` found: the result dataclasses, the JSON report (``--report``) and the printed text."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from sglang_detspec.checker.client import ServerInfo
from sglang_detspec.checker.logprobs import LogprobCheck, format_logprob_line
from sglang_detspec.command_base import PROG

# ``check``'s exit code when every output matched but a pressure profile never saw the probe retracted: the run is
# no evidence about retraction either way (0 ok, 1 fail, 2 could not check are command_base's).
EXIT_INCONCLUSIVE = 3


@dataclass
class FillerRecord:
    """One filler request of a trial, as sent, with the prompt length the server counted."""

    kind: str
    prompt_words: int
    max_new_tokens: int
    sampling_params: dict
    prompt_tokens: int | None = None
    streamed: bool = False
    delay_fraction: float = 0.0
    num_retractions: int | None = None  # meta_info.num_retractions: how often SGLang retracted it


@dataclass
class Trial:
    """One probe completion and the traffic it ran next to."""

    index: int  # position in the whole run (all profiles)
    profile: str
    profile_trial: int  # position within its profile
    arrival: str  # see sglang_detspec.checker.traffic (alone, during, before, after, warmed)
    label: str
    seed: int
    fillers: int
    filler_max_new_tokens: list[int]
    filler_prompt_words: list[int]
    text: str
    output_ids: list[int] | None
    filler_details: list[FillerRecord] = field(default_factory=list)
    flushed_cache: bool = False
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    spec_verify_ct: int | None = None
    spec_accept_length: float | None = None
    output_logprobs: list[float] | None = None  # with --logprobs: meta_info.output_token_logprobs' values
    output_top_logprobs: list[list[tuple[float, int]]] | None = None  # and the top logprobs (logprob, id)
    # Retraction (SGLang 0.5.17/0.5.23 report meta_info.num_retractions on every request; None: not reported).
    num_retractions: int | None = None  # the probe's
    filler_retractions: int | None = None  # its fillers' together
    server_retractions: int | None = None  # /metrics sglang:num_retracted_requests_total over the trial
    probe_delay_fraction: float = 0.0

    @property
    def probe_retracted(self) -> bool:
        return bool(self.num_retractions)

    @property
    def any_retracted(self) -> bool:
        return self.probe_retracted or bool(self.filler_retractions) or bool(self.server_retractions)


def output_key(trial: Trial, use_ids: bool):
    return tuple(trial.output_ids) if use_ids else trial.text


@dataclass
class Divergence:
    """Where the first probe output that differs from the reference (trial 0 of the run) starts to differ."""

    unit: str  # "token" (output_ids) or "character" (text)
    position: int
    trial: int  # Trial.index
    expected: Any  # the reference's token/character at that position (None: its output ended there)
    got: Any


@dataclass
class ProfileResult:
    """One traffic profile's trials compared with each other and with the run's reference output."""

    name: str
    trials: list[int]  # Trial.index of its trials
    unique_outputs: int
    differing_trials: list[int]  # those whose output differs from the reference
    divergence: Divergence | None  # the earliest one among them
    probe_accept_length: float | None
    notes: list[str] = field(default_factory=list)
    # The pressure profile's trials next to its load (Trial.index), by the retraction the server reported.
    probe_retracted_trials: list[int] | None = None
    other_retraction_trials: list[int] | None = None  # another request was retracted, the probe was not
    no_retraction_trials: list[int] | None = None  # no evidence: the load did not overflow the pool

    @property
    def passed(self) -> bool:
        return not self.differing_trials

    @property
    def inconclusive(self) -> bool:
        """A pressure profile whose probe was never retracted says nothing about retraction."""
        return self.probe_retracted_trials is not None and not self.probe_retracted_trials


@dataclass
class SeedsCheck:
    """Distinct seeds must give distinct outputs; a collision means the seed is ignored (e.g. greedy decoding)."""

    seeds: list[int]
    outputs: list[Trial]
    collisions: list[tuple[int, int]]

    @property
    def passed(self) -> bool:
        return not self.collisions


@dataclass
class AgainstCheck:
    """``--against URL``: the probe sent alone to a second server, which must give the run's reference tokens.

    Against a non-speculative deterministic server this asks for speculation invariance (the same tokens with
    speculative decoding on or off): rejection sampling (``DETSPEC_EAGLE``) spends its randomness differently from
    plain sampling and is not expected to pass; the invariant mode is. Two speculative servers with different drafts
    can be compared the same way. ``sends`` are two, so that a second server which is itself not deterministic is
    told apart from one that differs from the checked server.
    """

    url: str
    server: ServerInfo
    sends: list[Trial]  # Trial.index: position in this list
    compared: str  # "output_ids" or "text"
    divergence: Divergence | None  # the earliest difference from the checked server's reference (trial 0)

    @property
    def self_consistent(self) -> bool:
        return len({output_key(t, self.compared == "output_ids") for t in self.sends}) == 1

    @property
    def passed(self) -> bool:
        return self.divergence is None


def mean_accept_length(trials: list[Trial]) -> float | None:
    vals = [t.spec_accept_length for t in trials if t.spec_accept_length is not None]
    return sum(vals) / len(vals) if vals else None


@dataclass
class CheckResult:
    url: str
    server: ServerInfo
    prompt: str
    seed: int
    temperature: float
    max_new_tokens: int
    traffic: list[str]
    trials: list[Trial]
    profiles: list[ProfileResult]
    compared: str  # "output_ids" or "text"
    unique_outputs: int  # over every trial of every profile
    divergence: Divergence | None
    seeds_check: SeedsCheck | None = None
    warnings: list[str] = field(default_factory=list)
    logprobs_check: LogprobCheck | None = None  # with --logprobs
    against: AgainstCheck | None = None  # with --against URL

    @property
    def deterministic(self) -> bool:
        return self.unique_outputs == 1

    @property
    def all_matched(self) -> bool:
        return (self.deterministic and (self.seeds_check is None or self.seeds_check.passed)
                and (self.logprobs_check is None or self.logprobs_check.passed)
                and (self.against is None or self.against.passed))

    @property
    def inconclusive(self) -> bool:
        """Everything matched, but a pressure profile never saw its probe retracted (exit EXIT_INCONCLUSIVE)."""
        return self.all_matched and any(p.inconclusive for p in self.profiles)

    @property
    def passed(self) -> bool:
        return self.all_matched and not self.inconclusive

    @property
    def differing_trials(self) -> list[int]:
        """Trials whose probe output differs from the reference (trial 0)."""
        return [i for p in self.profiles for i in p.differing_trials]

    @property
    def probe_accept_length(self) -> float | None:
        return mean_accept_length(self.trials)

    def to_dict(self) -> dict:
        from sglang_detspec import __version__

        d = asdict(self)
        for p, pd in zip(self.profiles, d["profiles"]):
            pd["passed"] = p.passed
            pd["inconclusive"] = p.inconclusive
        d = {
            "tool": f"{PROG} check",
            "tool_version": __version__,
            **d,
            "deterministic": self.deterministic,
            "passed": self.passed,
            "inconclusive": self.inconclusive,
            "probe_accept_length": self.probe_accept_length,
            "differing_trials": self.differing_trials,
        }
        if self.seeds_check is not None:
            d["seeds_check"]["passed"] = self.seeds_check.passed
        if self.logprobs_check is not None:
            d["logprobs_check"]["passed"] = self.logprobs_check.passed
        if self.against is not None:
            d["against"]["passed"] = self.against.passed
            d["against"]["self_consistent"] = self.against.self_consistent
        return d


# ----------------------------------------------------------------------------------------------------------------
# the printed report


def _show(unit: str, value: Any) -> str:
    if value is None:
        return "the end"
    return f"id {value}" if unit == "token" else repr(value)


def _where(result: CheckResult, index: int) -> str:
    t = result.trials[index]
    return f"trial {index} ({t.profile} {t.profile_trial})" if len(result.profiles) > 1 else f"trial {index}"


def _range(values: list[int]) -> str:
    return f"{min(values)}-{max(values)}" if min(values) != max(values) else f"{values[0]}"


def _profile_setup(result: CheckResult, p: ProfileResult) -> str:
    """What the profile's trials ran next to, in a few words (the JSON report has every request)."""
    trials = [result.trials[i] for i in p.trials]
    if p.name == "uniform":
        return f"next to {_range([t.fillers for t in trials])} concurrent filler requests"
    if p.name == "mixed":
        values: dict[str, list[str]] = {}  # "top_k=5", "top_k=50" -> "top_k 5/50"
        for t in trials:
            for f in t.filler_details:
                name, _, value = f.kind.partition("=")
                if value not in values.setdefault(name, []):
                    values[name].append(value)
        kinds = ", ".join(name + (" " + "/".join(v) if any(v) else "") for name, v in values.items())
        arrivals = [a for a in ("before", "during", "after") if any(t.arrival == a for t in trials)]
        return f"next to fillers with {kinds}; the probe {'/'.join(arrivals)} their prefill"
    if p.name == "long":
        counted = [f.prompt_tokens for t in trials for f in t.filler_details if f.prompt_tokens is not None]
        chunk = result.server.chunked_prefill_size
        size = f"chunked prefill {chunk}" if chunk and chunk > 0 else "chunked prefill off"
        return f"next to prompts of {_range(counted) if counted else '?'} tokens ({size})"
    if p.name == "pressure":
        loaded = [t for t in trials if t.fillers]
        if not loaded:
            return "no trial next to its load"
        delays = "/".join(f"{d:g}" for d in dict.fromkeys(t.probe_delay_fraction for t in loaded))
        return (f"{_range([t.fillers for t in loaded])} KV-filling requests of {_range(_flat_max_new(loaded))} new "
                f"tokens (KV pool {result.server.max_total_num_tokens or '?'} tokens), the probe {delays} of its "
                "solo time after them")
    cached = [t.cached_tokens for t in trials if t.cached_tokens is not None]
    return ("cold, warm and half-warm radix cache, after /flush_cache"
            + (f" (cached prompt tokens {_range(cached)})" if cached else ""))


def _flat_max_new(trials: list[Trial]) -> list[int]:
    return [n for t in trials for n in t.filler_max_new_tokens] or [0]


def _indices(values: list[int]) -> str:
    return ", ".join(map(str, values)) if values else "none"


def _retraction_text(result: CheckResult, p: ProfileResult) -> str:
    loaded = len(p.probe_retracted_trials) + len(p.other_retraction_trials) + len(p.no_retraction_trials)
    text = (f"probe retracted in {len(p.probe_retracted_trials)} of {loaded} loaded trials "
            f"({_indices(p.probe_retracted_trials)})")
    if p.other_retraction_trials:
        text += f"; only other requests retracted in trials {_indices(p.other_retraction_trials)}"
    if p.no_retraction_trials:
        text += f"; no retraction (no evidence) in trials {_indices(p.no_retraction_trials)}"
    return text + ("; INCONCLUSIVE: the probe was never retracted" if p.inconclusive else "")


def _profile_lines(result: CheckResult, p: ProfileResult) -> list[str]:
    """``name: N trials, U unique output(s), <verdict>; accept A`` and, indented below, what the trials ran next to."""
    n = len(p.trials)
    line = f"{p.name + ':':<8} {n} trials, {p.unique_outputs} unique output(s)"
    d = p.divergence
    if d is None:
        line += ", equal to the reference" if len(result.profiles) > 1 else ""
    else:
        line += (f"; {len(p.differing_trials)} of {n} differ from the reference, first at {d.unit} {d.position} "
                 f"({_where(result, d.trial)} has {_show(d.unit, d.got)}, the reference {_show(d.unit, d.expected)})")
    if p.probe_accept_length is not None:
        line += f"; accept {p.probe_accept_length:.2f}"
    if p.probe_retracted_trials is not None:
        line += f"; {_retraction_text(result, p)}"
    return [line, f"         {_profile_setup(result, p)}"]


def _against_line(ag: AgainstCheck) -> str:
    s = ag.server
    spec = s.speculative_algorithm or "off"
    det = {True: "on", False: "OFF", None: "unknown"}[s.deterministic_inference]
    head = f"against: {ag.url} (SGLang {s.version or '?'}, speculative algorithm: {spec}, deterministic inference: {det})"
    sends = len(ag.sends)
    if ag.passed:
        return f"{head}: the probe alone gave trial 0's output in {sends} of {sends} sends"
    d = ag.divergence
    agree = f"its {sends} sends agree with each other" if ag.self_consistent else \
        f"its {sends} sends differ from each other as well"
    return (f"{head}: differs from trial 0 from {d.unit} {d.position} on (trial 0 has {_show(d.unit, d.expected)}, "
            f"that server's send {d.trial} has {_show(d.unit, d.got)}); {agree}")


def format_check(result: CheckResult) -> str:
    s = result.server
    spec = s.speculative_algorithm or "off"
    if s.speculative_algorithm and not s.plugin_active:
        spec += " (not a DETSPEC algorithm: the sglang-detspec plugin is not in use)"
    det = {True: "on", False: "OFF", None: "unknown"}[s.deterministic_inference]
    unit = "token ids (output_ids)" if result.compared == "output_ids" else "text (the server returned no output_ids)"
    lines = [
        f"server:  {result.url}  SGLang {s.version or '?'}  model {s.model_path or '?'}",
        f"         speculative algorithm: {spec}; deterministic inference: {det}",
        f"probe:   seed {result.seed}, temperature {result.temperature}, {result.max_new_tokens} new tokens, the same "
        f"in every trial; reference: trial 0 ({result.trials[0].profile}, the probe alone)",
    ]
    lines += [line for p in result.profiles for line in _profile_lines(result, p)]
    over = f" of {len(result.profiles)} traffic profiles" if len(result.profiles) > 1 else ""
    lines.append(f"result:  {result.unique_outputs} unique probe output(s) in {len(result.trials)} trials{over}, "
                 f"compared as {unit}")
    d = result.divergence
    if d is not None:
        lines.append(
            f"         first divergence at {d.unit} {d.position}: trial 0 has {_show(d.unit, d.expected)}, "
            f"{_where(result, d.trial)} has {_show(d.unit, d.got)}; {len(result.differing_trials)} of "
            f"{len(result.trials) - 1} trials differ from trial 0"
        )
    acc = result.probe_accept_length
    if acc is not None or s.avg_spec_accept_length is not None:
        parts = []
        if acc is not None:
            parts.append(f"{acc:.2f} tokens per verify step on the probe")
        if s.avg_spec_accept_length is not None:
            parts.append(f"{s.avg_spec_accept_length:.2f} server average")
        lines.append("accept:  " + "; ".join(parts))
    elif s.speculative_algorithm:
        lines.append("accept:  the server reported no speculative accept length")
    sc = result.seeds_check
    if sc is not None:
        if sc.passed:
            lines.append(f"seeds:   {len(sc.seeds)} seeds gave {len(sc.seeds)} distinct outputs")
        else:
            pairs = ", ".join(f"{a} = {b}" for a, b in sc.collisions)
            lines.append(f"seeds:   distinct seeds gave identical outputs: {pairs} (is the seed ignored?)")
    lc = result.logprobs_check
    if lc is not None:
        lines.append(format_logprob_line(lc))
    ag = result.against
    if ag is not None:
        lines.append(_against_line(ag))
    traffic = ", ".join(result.traffic)
    if result.inconclusive:
        lines.append("INCONCLUSIVE: the seeded probe gave one output, but no pressure trial retracted it, so this run "
                     "says nothing about retraction (serve with a smaller --max-total-tokens, or a longer probe: "
                     "--max-new-tokens)")
    elif result.passed:
        lines.append(f"PASS: the seeded probe gave one output whatever the traffic ({traffic})" + (
            ", with bit-identical logprobs" if lc is not None else "") + (
            ", and distinct seeds gave distinct outputs" if sc is not None else "") + (
            f", and the same tokens as {ag.url}" if ag is not None else ""))
    else:
        why = []
        if not result.deterministic:
            failed = ", ".join(p.name for p in result.profiles if not p.passed)
            why.append(f"the seeded probe's output changed with the traffic ({failed})")
        if sc is not None and not sc.passed:
            why.append("distinct seeds gave identical outputs")
        if lc is not None and not lc.passed:
            why.append("the probe's logprobs changed with the traffic" if lc.differing_trials
                       else "the server returned no logprobs")
        if ag is not None and not ag.passed:
            why.append(f"the probe's tokens differ on {ag.url}" + ("" if ag.self_consistent else
                                                                   " (which is not deterministic itself)"))
        lines.append("FAIL: " + "; ".join(why))
    return "\n".join(lines)
