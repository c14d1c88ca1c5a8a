"""Running ``check``: send every traffic profile's trials around the seeded probe, then compare the probe's
outputs within each profile and across all of them against the run's reference (trial 0, the probe alone).

:func:`run_check` is the API (the GPU end-to-end tests call it through the command); it returns a
:class:`~sglang_detspec.checker.report.CheckResult` and raises :class:`~sglang_detspec.command_base.CliError` (one
readable line, never a traceback) when the server cannot be checked.
"""

from __future__ import annotations

import math
import random
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from sglang_detspec.checker import logprobs as lp
from sglang_detspec.checker import traffic as tr
from sglang_detspec.checker.client import (
    Client,
    ServerInfo,
    ServerUnreachable,
    connect,
    fetch_server_info,
    parse_server_url,
    retracted_requests_total,
)
from sglang_detspec.checker.progress import ProgressBar
from sglang_detspec.checker.report import (
    AgainstCheck,
    CheckResult,
    Divergence,
    ProfileResult,
    SeedsCheck,
    Trial,
    mean_accept_length,
    output_key,
)
from sglang_detspec.checker.trials import TrialRunner, filler_record, profile_plans, to_trial
from sglang_detspec.command_base import PROG, CliError

DEFAULT_PROMPT = "Once upon a time, in a small town by the sea, there lived"
DEFAULT_SEED = 42
DEFAULT_TRIALS = 16
DEFAULT_MAX_NEW_TOKENS = 32
DEFAULT_MAX_FILLERS = 15


def first_divergence(reference: Trial, trials: Sequence[Trial], use_ids: bool) -> Divergence | None:
    """The earliest position at which any of ``trials`` differs from ``reference``."""
    ref = output_key(reference, use_ids)
    best: Divergence | None = None
    for t in trials:
        other = output_key(t, use_ids)
        if other == ref:
            continue
        pos = next((k for k, (a, b) in enumerate(zip(ref, other)) if a != b), min(len(ref), len(other)))
        if best is None or pos < best.position:
            best = Divergence(unit="token" if use_ids else "character", position=pos, trial=t.index,
                              expected=ref[pos] if pos < len(ref) else None, got=other[pos] if pos < len(other) else None)
    return best


#: How often ``--against`` sends the probe to the second server (twice: is that server deterministic itself?).
AGAINST_SENDS = 2


def _connect_against(other: Client, wait: float, warnings: list[str]) -> ServerInfo:
    """Before any trial: a second server that cannot be reached fails the check in seconds, not after it, and one
    that does not honour sampling_seed is said so while there is still time to stop the check."""
    try:
        info = connect(other, wait)
    except CliError as e:
        raise type(e)(f"--against {other.url}: {e}") from e
    if info.deterministic_inference is False:
        warnings.append(f"deterministic inference is OFF on the --against server {other.url}: its sampling_seed is not "
                        "honoured, so its tokens say nothing about this server's (launch it with "
                        "--enable-deterministic-inference)")
    return info


def _check_against(other: Client, info: ServerInfo, probe: dict, seed: int, reference: Trial,
                   use_ids: bool) -> AgainstCheck:
    """Send the probe alone to the second server (after the checked server's trials, so that nothing of it runs
    beside them) and compare its outputs with the checked server's reference."""
    plan = tr.TrialPlan("against", 0, tr.ALONE, label="the probe alone on the --against server")
    try:
        sends = [to_trial(i, plan, seed, other.generate(probe)[0], []) for i in range(AGAINST_SENDS)]
    except CliError as e:
        raise type(e)(f"--against {other.url}: {e}") from e
    ids = use_ids and all(t.output_ids is not None for t in sends)
    return AgainstCheck(url=other.url, server=info, sends=sends, compared="output_ids" if ids else "text",
                        divergence=first_divergence(reference, sends, ids))


def _retraction_lists(trials: list[Trial]) -> dict:
    """The pressure profile's loaded trials split by what the server reported about retraction."""
    loaded = [t for t in trials if t.fillers]
    return {
        "probe_retracted_trials": [t.index for t in loaded if t.probe_retracted],
        "other_retraction_trials": [t.index for t in loaded if not t.probe_retracted and t.any_retracted],
        "no_retraction_trials": [t.index for t in loaded if not t.any_retracted],
    }


def _compare_profile(name: str, trials: list[Trial], reference: Trial, use_ids: bool, notes: list[str]) -> ProfileResult:
    ref = output_key(reference, use_ids)
    return ProfileResult(
        **(_retraction_lists(trials) if name == "pressure" else {}),
        name=name, trials=[t.index for t in trials], unique_outputs=len({output_key(t, use_ids) for t in trials}),
        differing_trials=[t.index for t in trials if output_key(t, use_ids) != ref],
        divergence=first_divergence(reference, trials, use_ids), probe_accept_length=mean_accept_length(trials),
        notes=notes,
    )


def _coverage_warnings(name: str, trials: list[Trial], lengths: tr.LongLengths | None,
                       server: ServerInfo) -> list[str]:
    """Where a profile's traffic could not do what it is there for (the verdict stands, the evidence is weaker)."""
    out = []
    if name == "pressure":
        loaded = [t for t in trials if t.fillers]
        if loaded and all(t.num_retractions is None and t.server_retractions is None for t in loaded):
            out.append("pressure profile: the server reports neither meta_info.num_retractions nor /metrics' "
                       "sglang:num_retracted_requests_total (--enable-metrics), so no retraction could be confirmed")
        elif loaded and not any(t.probe_retracted for t in loaded):
            out.append("pressure profile: no trial retracted the probe (serve with a smaller --max-total-tokens or give "
                       "a longer --max-new-tokens); the profile is inconclusive")
    elif lengths is not None:
        out += [f"long profile: {n}" for n in lengths.caveats]
        counted = [f.prompt_tokens for t in trials for f in t.filler_details if f.prompt_tokens is not None]
        if lengths.over_chunk and counted and max(counted) <= lengths.chunk:
            out.append(f"long profile: no filler prompt exceeded the chunked-prefill size {lengths.chunk} (longest "
                       f"{max(counted)} tokens): the prompts came out shorter than their word counts predicted")
    if name == "prefix":
        warm = [t.cached_tokens for t in trials if not t.flushed_cache or t.arrival == tr.WARMED]
        if warm and not any(warm):
            out.append("prefix profile: the radix cache served no prompt token to the warm trials "
                       f"(disable_radix_cache: {server.disable_radix_cache}); they ran cold")
    return out


def _validate(*, trials, max_fillers, max_new_tokens, temperature, seeds, seed, traffic, timeout=120.0,
              wait=0.0) -> tuple[str, ...]:
    if isinstance(traffic, str):
        try:
            traffic = tr.parse_traffic(traffic)
        except ValueError as e:
            raise CliError(f"--traffic: {e}") from None
    unknown = [p for p in traffic if p not in tr.KNOWN_PROFILES]
    if unknown or not traffic:
        raise CliError(f"--traffic: unknown or no profile {unknown}; choose from {', '.join(tr.KNOWN_PROFILES)}")
    if trials < 2:
        raise CliError("--trials must be at least 2 (one trial has nothing to compare with)")
    if max_fillers < 0:
        raise CliError("--max-fillers must be >= 0")
    if max_fillers < 1 and "mixed" in traffic:
        raise CliError("--max-fillers 0 leaves the mixed profile without fillers; give >= 1 or leave it out of --traffic")
    if max_new_tokens < 1:
        raise CliError("--max-new-tokens must be >= 1")
    # NaN passes every comparison's negation and inf is no temperature or time: both refused by name.
    if not (math.isfinite(temperature) and temperature >= 0):
        raise CliError(f"--temperature must be a finite number >= 0 (0: greedy), got {temperature}")
    if not (math.isfinite(timeout) and timeout > 0):
        raise CliError(f"--timeout must be a finite number of seconds > 0 (per response), got {timeout}")
    if not (math.isfinite(wait) and wait >= 0):
        raise CliError(f"--wait must be a finite number of seconds >= 0 (0: do not wait), got {wait}")
    if seeds is not None and len(set(seeds)) < 2:
        raise CliError("--seeds needs at least two distinct seeds")
    for s in [seed, *(seeds or ())]:
        if not -(2**63) <= s < 2**63:
            raise CliError(f"seed {s} is outside SGLang's sampling_seed range [-2**63, 2**63 - 1]")
    return tuple(p for p in tr.KNOWN_PROFILES if p in traffic)


def run_check(
    url: str,
    *,
    prompt: str = DEFAULT_PROMPT,
    seed: int = DEFAULT_SEED,
    temperature: float = 1.0,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    trials: int = DEFAULT_TRIALS,
    max_fillers: int = DEFAULT_MAX_FILLERS,
    traffic: Sequence[str] | str = tr.PROFILES,
    seeds: Sequence[int] | None = None,
    timeout: float = 120.0,
    wait: float = 0.0,
    api_key: str | None = None,
    progress: bool | None = False,
    plan_seed: int = 0,
    logprobs: bool = False,
    against: str | None = None,
) -> CheckResult:
    """Run every profile of ``traffic`` (``trials`` trials each; prefix: six) around the seeded probe and compare
    all its outputs; with ``seeds``, also send the probe once per seed and report seeds with identical outputs.

    Raises :class:`CliError` (one line) when the server is unreachable, is not SGLang or answers an error.
    ``progress``: a progress bar on stderr (None: only on a terminal). ``logprobs``: the probe also asks for its
    output token logprobs and top logprobs, which must be bit-identical in every trial with the reference's tokens.
    ``against``: a second server's URL; the probe, sent alone to it, must give the reference's tokens there too
    (:class:`~sglang_detspec.checker.report.AgainstCheck`; logprobs are not compared across servers).
    """
    profiles = _validate(trials=trials, max_fillers=max_fillers, max_new_tokens=max_new_tokens,
                         temperature=temperature, seeds=seeds, seed=seed, traffic=traffic, timeout=timeout,
                         wait=wait)
    pressure_fillers = tr.PRESSURE_MAX_FILLERS if "pressure" in profiles else 0
    workers = max(max_fillers, tr.LONG_FILLERS_PER_TRIAL, 3, pressure_fillers) + 2
    client = Client(url, timeout=timeout, api_key=api_key, pool_size=workers)
    other = None
    # Everything that can refuse --against runs inside the try, so the checked server's client is closed too.
    try:
        if against is not None and parse_server_url(against) == client.url:
            raise CliError(f"--against {against} is the checked server itself; give a second server, e.g. a "
                           "non-speculative one launched with --enable-deterministic-inference on the same target")
        other = Client(against, timeout=timeout, api_key=api_key, pool_size=1) if against is not None else None
        server = connect(client, wait)
        warnings = []
        if server.deterministic_inference is False:
            warnings.append(
                "deterministic inference is OFF on this server (launch it with --enable-deterministic-inference, "
                f"e.g. `{PROG} serve`): sampling_seed is not honoured and outputs may change with load"
            )
        elif server.deterministic_inference is None:
            warnings.append("the server does not report enable_deterministic_inference; cannot tell if it is on")
        if temperature == 0:
            warnings.append("temperature 0 is greedy decoding: the seed plays no part in this check")
        other_info = _connect_against(other, wait, warnings) if other is not None else None

        rng = random.Random(plan_seed)
        probe = tr.payload(prompt, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed,
                           **({"request": dict(lp.PROBE_FIELDS)} if logprobs else {}))
        results: list[Trial] = []
        by_profile: dict[str, tuple[list[Trial], tr.LongLengths | list[str] | None]] = {}
        total = sum(tr.PREFIX_TRIALS if p == "prefix" else trials for p in profiles) + len(seeds or ()) + (
            AGAINST_SENDS if against is not None else 0)
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="detspec-check") as pool, \
                ProgressBar(total, enabled=progress, stream=sys.stderr) as bar:
            if bar.enabled:
                # Someone is watching the bar for minutes: what is known before the first trial (a server that
                # does not honour the seed) is said now, while stopping is still cheap; the CLI's summary repeats it.
                for w in warnings:
                    print(f"warning: {w}", file=sys.stderr, flush=True)
            runner = TrialRunner(client, pool, probe, flush_wait_s=min(30.0, timeout))
            for profile in profiles:
                mine: list[Trial] = []
                try:
                    plans, lengths = profile_plans(profile, client=client, server=server, prompt=prompt, trials=trials,
                                            max_fillers=max_fillers, max_new_tokens=max_new_tokens, rng=rng)
                    for plan in plans:
                        where = f"{profile} trial {plan.index} ({plan.label})"
                        bar.show(where)
                        counted = retracted_requests_total(client) if plan.arrival == tr.UNDER_PRESSURE else None
                        body, answers = runner.run(plan)
                        fillers = [filler_record(f, a) for f, a in zip(plan.fillers, answers)]
                        mine.append(to_trial(len(results), plan, seed, body, fillers))
                        if counted is not None and (after := retracted_requests_total(client)) is not None:
                            mine[-1].server_retractions = after - counted
                        results.append(mine[-1])
                        bar.advance()
                except CliError as e:
                    # Say which traffic broke the server: the message alone cannot.
                    raise type(e)(f"{profile} traffic: {e}") from e
                by_profile[profile] = (mine, lengths)
            seeds_check = None
            if seeds:
                bar.show("distinct seeds")
                outs = []
                seed_plan = tr.TrialPlan("seeds", 0, tr.ALONE, label="distinct seed")
                for s in seeds:
                    p = tr.payload(prompt, temperature=temperature, max_new_tokens=max_new_tokens, seed=s)
                    outs.append(to_trial(len(outs), seed_plan, s, client.generate(p)[0], []))
                    bar.advance()
                seeds_check = SeedsCheck(seeds=list(seeds), outputs=outs, collisions=[])

            use_ids = all(t.output_ids is not None for t in results)
            reference = results[0]
            against_check = None
            if other is not None:
                bar.show("against " + other.url)
                against_check = _check_against(other, other_info, probe, seed, reference, use_ids)
                bar.advance(AGAINST_SENDS)
        compared = []
        for name, (mine, sizing) in by_profile.items():
            lengths = sizing if isinstance(sizing, tr.LongLengths) else None
            notes = lengths.notes if lengths else list(sizing or [])
            compared.append(_compare_profile(name, mine, reference, use_ids, notes))
            warnings += _coverage_warnings(name, mine, lengths, server)
        if seeds_check is not None:
            ids_for_seeds = all(t.output_ids is not None for t in seeds_check.outputs)
            outs = seeds_check.outputs
            for i in range(len(outs)):
                for j in range(i + 1, len(outs)):
                    if outs[i].seed != outs[j].seed and output_key(outs[i], ids_for_seeds) == output_key(
                        outs[j], ids_for_seeds
                    ):
                        seeds_check.collisions.append((outs[i].seed, outs[j].seed))
        accepts = [t.spec_accept_length for t in results if t.spec_accept_length is not None]
        if accepts and max(accepts) < 1.05:
            warnings.append(
                f"the probe's speculative accept length is {sum(accepts) / len(accepts):.2f}: almost no draft token "
                "is accepted, so speculative decoding brings no speed-up on this server"
            )
        if server.speculative_algorithm:
            # Re-read: the server-wide average accept length grows with the requests this check just sent.
            try:
                server.avg_spec_accept_length = fetch_server_info(client).avg_spec_accept_length
            except CliError:
                pass
        return CheckResult(
            url=client.url, server=server, prompt=prompt, seed=seed, temperature=temperature,
            max_new_tokens=max_new_tokens, traffic=list(profiles), trials=results, profiles=compared,
            compared="output_ids" if use_ids else "text",
            unique_outputs=len({output_key(t, use_ids) for t in results}),
            divergence=first_divergence(reference, results, use_ids), seeds_check=seeds_check, warnings=warnings,
            logprobs_check=lp.compare_logprobs(
                reference, results, lambda t: output_key(t, use_ids) == output_key(reference, use_ids)
            ) if logprobs else None,
            against=against_check,
        )
    finally:
        client.close()
        if other is not None:
            other.close()


__all__ = ["run_check", "first_divergence", "ServerUnreachable", "DEFAULT_PROMPT", "DEFAULT_SEED", "DEFAULT_TRIALS",
           "DEFAULT_MAX_NEW_TOKENS", "DEFAULT_MAX_FILLERS"]
