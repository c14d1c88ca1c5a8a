"""The traffic profiles ``check --traffic`` runs around the seeded probe: which filler requests each trial
sends, and when the probe arrives relative to them.

Every profile is a changing-batch experiment on the *same* probe (same prompt, seed and length), and trial 0
of every profile is the probe alone, so each profile also measures how long the probe takes by itself:

* ``uniform`` -- trial t runs next to round(t * max_fillers / (trials - 1)) concurrent fillers of random
  prompt and completion lengths, all sampled at temperature 1.0 (the original experiment);
* ``mixed``   -- fillers whose sampling takes other code paths: greedy, ``top_k`` 1 / 5 / 50, ``top_p``,
  ``min_p``, temperatures 0.3 and 1.7, ``return_logprob`` with top logprobs, stop strings, ``n`` = 2,
  varied ``max_new_tokens``; the probe arrives before their prefill (they follow while it decodes), during
  it (all at once), or after it (once every streamed filler has produced its first token), by trial index;
* ``long``    -- prompts longer than the server's chunked-prefill size (several lengths, sized with the
  server's own token counts and capped by its context length and KV pool), so prefill chunks of other
  requests interleave with the probe's decode steps;
* ``prefix``  -- the probe with a cold radix cache, warm from its own earlier run, warm from a longer filler
  sharing its prompt (whole or half), next to prefix-sharing fillers, and cold again after ``/flush_cache``;
* ``pressure`` (opt-in, not in ``all``: it needs a server with a small KV pool, e.g. ``--max-total-tokens 4096``)
  -- the probe sent just after enough long fillers to overflow the KV pool about twice (sized from the server's
  ``max_total_num_tokens`` and ``max_running_requests``), so SGLang retracts running requests and re-prefills
  them later; the youngest running request (fewest output tokens) is retracted first, which the late probe is.

Plans are deterministic given the trial index and ``plan_seed`` (a ``random.Random``); only the ``before``
delays scale with the probe's measured solo time. This module builds plans; :mod:`.run` sends them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

PROFILES = ("uniform", "mixed", "long", "prefix")  # what ``all`` (and the default) runs
# Profiles only run when named: pressure needs a server sized for it (a KV pool small enough to exhaust).
OPT_IN_PROFILES = ("pressure",)
KNOWN_PROFILES = PROFILES + OPT_IN_PROFILES

# How the probe is timed against a trial's fillers.
ALONE = "alone"  # no fillers
DURING = "during"  # submitted amid the fillers: its prefill shares batches with theirs
BEFORE = "before"  # sent first; the fillers follow while it decodes (at fractions of its solo time)
AFTER = "after"  # sent once every streamed filler produced its first token (their prefill is over)
WARMED = "warmed"  # the fillers ran to completion first; they only left their prefixes in the radix cache
UNDER_PRESSURE = "under pressure"  # sent after the fillers that overflow the KV pool (at a fraction of its solo time)

PREFIX_TRIALS = 6
# Chunk size assumed where the server reports none (or -1: chunked prefill off): long prompts still matter.
DEFAULT_LONG_REFERENCE_TOKENS = 4096
LONGEST_TARGET_TOKENS = 10_000
LONG_FILLERS_PER_TRIAL = 3
# Headroom for prompts sized by a measured tokens-per-word ratio: a long prompt must never exceed the
# server's limit (a 400 would abort the check) and the KV pool must not overflow (retraction re-prefills a
# request and can change its continuation, which would be reported as non-determinism).
_LENGTH_MARGIN = 0.1
_KV_POOL_SHARE = 0.5

_FILLER_WORDS = (
    "river stone lantern orbit copper meadow signal harbor violet engine puzzle winter falcon ledger canyon "
    "marble thunder pocket glacier velvet compass ember saddle quartz tunnel willow anchor prism beacon"
).split()

# (kind, sampling-parameter overrides, request-level fields): each takes another path through the sampler.
MIXED_KINDS: tuple[tuple[str, dict, dict], ...] = (
    ("greedy", {"temperature": 0.0}, {}),
    ("top_k=1", {"top_k": 1}, {}),
    ("top_k=5", {"top_k": 5}, {}),
    ("top_k=50", {"top_k": 50}, {}),
    ("top_p=0.9", {"top_p": 0.9}, {}),
    ("min_p=0.1", {"min_p": 0.1}, {}),
    ("temperature=0.3", {"temperature": 0.3}, {}),
    ("temperature=1.7", {"temperature": 1.7}, {}),
    ("logprobs", {}, {"return_logprob": True, "top_logprobs_num": 5}),
    ("stop strings", {"stop": [" the", ".", "\n"], "ignore_eos": False}, {}),
    ("n=2", {"n": 2}, {}),
)
_MIXED_ARRIVALS = (BEFORE, DURING, AFTER)


def parse_traffic(text: str) -> tuple[str, ...]:
    """``--traffic`` value -> profile names in their canonical run order; raises ValueError naming the fix."""
    names = [x.strip().lower() for x in text.split(",")]
    choices = ", ".join((*KNOWN_PROFILES, "all"))
    if not any(names) or any(not n for n in names):
        raise ValueError(f"expected comma-separated profile names ({choices}), got {text!r}")
    picked = set()
    for n in names:
        if n == "all":
            picked.update(PROFILES)
        elif n in KNOWN_PROFILES:
            picked.add(n)
        else:
            raise ValueError(f"unknown traffic profile {n!r}; choose from {choices} (comma-separated)")
    return tuple(p for p in KNOWN_PROFILES if p in picked)


def payload(text: str, *, max_new_tokens: int, seed: int, temperature: float = 1.0, **fields) -> dict:
    """A ``/generate`` body; sampling overrides go in ``fields``, request-level keys in ``fields["request"]``.

    ``ignore_eos`` (default on) keeps a completion ``max_new_tokens`` long, so probe outputs compare position
    by position and a filler's length is what the plan says.
    """
    request = fields.pop("request", {})
    sampling = {"temperature": temperature, "max_new_tokens": max_new_tokens, "sampling_seed": seed,
                "ignore_eos": True, **fields}
    return {"text": text, "sampling_params": sampling, **request}


@dataclass
class Filler:
    kind: str
    payload: dict
    prompt_words: int
    # AFTER trials: streamed, so that its first chunk (the end of its prefill) is observable.
    stream: bool = False
    # BEFORE trials: sent this fraction of the probe's solo time after the probe.
    delay_fraction: float = 0.0


@dataclass
class TrialPlan:
    profile: str
    index: int  # within the profile
    arrival: str
    fillers: list[Filler] = field(default_factory=list)
    flush_cache_first: bool = False
    label: str = ""
    probe_delay_fraction: float = 0.0  # UNDER_PRESSURE: the probe follows its fillers this fraction of its solo time


def _words(rng: random.Random, n: int) -> str:
    start = rng.randrange(len(_FILLER_WORDS))
    return " ".join(_FILLER_WORDS[(start + k * 7) % len(_FILLER_WORDS)] for k in range(n))


def _prompt(profile: str, trial: int, j: int, words: str) -> str:
    # A distinct first token sequence per filler: no filler's prompt is served from another's cache entry.
    return f"Request {profile}.{trial}.{j}: {words}"


def calibration_payload(rng: random.Random) -> tuple[dict, int]:
    """A long-profile-shaped prompt of known word count and a 1-token completion: the server's
    ``prompt_tokens`` for it gives the tokens-per-word ratio the long prompts are sized by."""
    text = f"Calibration: {_words(rng, 400)}"
    return payload(text, max_new_tokens=1, seed=rng.randrange(2**31)), len(text.split())


def _ramp(t: int, trials: int, top: int) -> int:
    """0 for the first trial, ``top`` for the last, evenly in between."""
    return round(t * top / (trials - 1)) if trials > 1 else 0


def uniform_plan(trials: int, max_fillers: int, max_new_tokens: int, rng: random.Random) -> list[TrialPlan]:
    """Trial t runs next to ``_ramp(t)`` fillers (0 for the first trial, ``max_fillers`` for the last) of random
    prompt and completion lengths, so batch size and composition differ in every trial and change while the
    probe decodes (fillers finish at different steps)."""
    plans = []
    for t in range(trials):
        fillers = []
        for j in range(_ramp(t, trials, max_fillers)):
            words = rng.randint(3, 160)
            fillers.append(Filler("uniform", payload(
                _prompt("uniform", t, j, _words(rng, words)), max_new_tokens=rng.randint(1, 2 * max_new_tokens),
                seed=rng.randrange(2**31)), words))
        plans.append(TrialPlan("uniform", t, DURING if fillers else ALONE, fillers,
                               label=f"{len(fillers)} concurrent fillers"))
    return plans


def mixed_plan(trials: int, max_fillers: int, max_new_tokens: int, rng: random.Random) -> list[TrialPlan]:
    """Trial 0 alone; trial t >= 1 next to ``1 + _ramp(t - 1)`` fillers cycling through :data:`MIXED_KINDS`
    (filler j of trial t is kind ``(t - 1 + j) % len(MIXED_KINDS)``), the probe arriving before / during /
    after their prefill for t = 1, 2, 3 (mod 3)."""
    plans = [TrialPlan("mixed", 0, ALONE, label="alone")]
    for t in range(1, trials):
        arrival = _MIXED_ARRIVALS[(t - 1) % len(_MIXED_ARRIVALS)]
        count = 1 + _ramp(t - 1, trials - 1, max_fillers - 1)
        fillers = []
        for j in range(count):
            kind, sampling, request = MIXED_KINDS[(t - 1 + j) % len(MIXED_KINDS)]
            words = rng.randint(3, 120)
            body = payload(_prompt("mixed", t, j, _words(rng, words)), max_new_tokens=rng.randint(1, 3 * max_new_tokens),
                           seed=rng.randrange(2**31), request=request, **sampling)
            # Streaming n > 1 interleaves the samples' chunks; those fillers simply go first, unstreamed.
            stream = arrival == AFTER and sampling.get("n", 1) == 1
            delay = 0.1 + 0.6 * j / max(1, count - 1) if arrival == BEFORE else 0.0
            fillers.append(Filler(kind, body, words, stream=stream, delay_fraction=delay))
        plans.append(TrialPlan("mixed", t, arrival, fillers,
                               label=f"probe {arrival} the prefill of {', '.join(f.kind for f in fillers)}"))
    return plans


@dataclass
class LongLengths:
    """The prompt lengths (tokens) of the long profile and what bounded them."""

    lengths: list[int]
    chunk: int | None  # the server's chunked-prefill size; None: it reported none, or -1 (off)
    cap: int  # the longest prompt this server takes here (context length, KV pool, filler output)
    trial_budget: int  # prompt + output tokens of one trial's fillers together
    caveats: list[str]  # what this server's limits left out of the experiment (printed as warnings)
    notes: list[str]  # for the JSON report: how the prompts were sized

    @property
    def over_chunk(self) -> list[int]:
        return [n for n in self.lengths if self.chunk is not None and n > self.chunk]


def long_lengths(*, chunked_prefill_size: int | None, context_length: int | None, max_req_input_len: int | None,
                 max_total_num_tokens: int | None, filler_max_new_tokens: int) -> LongLengths:
    """A ladder of prompt lengths around and beyond the chunk size (12,288 down to 100 tokens for a 4096 chunk),
    capped by the server's limits less the filler's own output and a margin for the tokens-per-word estimate."""
    chunk = chunked_prefill_size if chunked_prefill_size is not None and chunked_prefill_size > 0 else None
    ref = chunk or DEFAULT_LONG_REFERENCE_TOKENS
    caveats, notes = [], []
    limits = [n for n in (context_length, max_req_input_len) if n]
    if max_total_num_tokens:
        limits.append(int(max_total_num_tokens * _KV_POOL_SHARE))
    if not limits:
        limits.append(LONGEST_TARGET_TOKENS)
        caveats.append(f"the server reports no context length: long prompts capped at {LONGEST_TARGET_TOKENS} tokens")
    cap = max(16, int((min(limits) - filler_max_new_tokens) * (1 - _LENGTH_MARGIN)))
    ladder = [100, ref // 2, ref - ref // 16, ref + ref // 16, ref * 3 // 2, 2 * ref + ref // 8,
              max(LONGEST_TARGET_TOKENS, 3 * ref)]
    # Longest first: even a run of a few trials sends the prompts that span several chunks.
    lengths = sorted({min(n, cap) for n in ladder}, reverse=True)
    if chunk is None:
        notes.append("chunked prefill is off or unreported: each long prompt is prefilled in one piece")
    elif cap <= chunk:
        caveats.append(f"no prompt can exceed the chunked-prefill size ({chunk} tokens) on this server: its limits "
                       f"leave {cap} tokens per prompt, so prefill is never split here (serve it with a smaller "
                       "--chunked-prefill-size to cover chunking)")
    budget = int(max_total_num_tokens * _KV_POOL_SHARE) if max_total_num_tokens else cap
    return LongLengths(lengths, chunk, cap, budget, caveats, [*caveats, *notes])


def long_plan(trials: int, lengths: LongLengths, tokens_per_word: float, max_new_tokens: int,
              rng: random.Random) -> list[TrialPlan]:
    """Trial 0 alone; trial t >= 1 next to 1-3 long fillers whose lengths walk the ladder, the probe arriving
    amid them (odd t) or first, decoding while their chunks are prefilled (even t). A trial's fillers stay
    within ``lengths.trial_budget`` tokens in all."""
    plans = [TrialPlan("long", 0, ALONE, label="alone")]
    step = 0
    for t in range(1, trials):
        arrival = DURING if t % 2 else BEFORE
        fillers, targets = [], []
        for j in range(1 + (t - 1) % LONG_FILLERS_PER_TRIAL):
            tokens = lengths.lengths[step % len(lengths.lengths)]
            out = rng.randint(1, 2 * max_new_tokens)
            if fillers and sum(targets) + tokens + out > lengths.trial_budget:
                break
            step += 1
            targets.append(tokens + out)
            words = max(1, int(tokens / tokens_per_word))
            body = payload(_prompt("long", t, j, _words(rng, words)), max_new_tokens=out, seed=rng.randrange(2**31))
            fillers.append(Filler("long", body, words, delay_fraction=0.2 + 0.3 * j if arrival == BEFORE else 0.0))
        plans.append(TrialPlan("long", t, arrival, fillers,
                               label=f"probe {arrival} {len(fillers)} long prompt(s)"))
    return plans


def prefix_plan(prompt: str, max_new_tokens: int, rng: random.Random) -> list[TrialPlan]:
    """Six trials around the radix cache; those marked flush start from an empty cache (``/flush_cache``)."""
    words = prompt.split()
    half = " ".join(words[: max(1, len(words) // 2)])

    def sharing(j: int, head: str, n_words: int) -> Filler:
        return Filler("shares the probe's prefix", payload(
            f"{head} {_words(rng, n_words)}", max_new_tokens=rng.randint(1, max_new_tokens),
            seed=rng.randrange(2**31)), len(head.split()) + n_words)

    return [
        TrialPlan("prefix", 0, ALONE, flush_cache_first=True, label="cold cache"),
        TrialPlan("prefix", 1, ALONE, label="warm: its own prompt cached by trial 0"),
        TrialPlan("prefix", 2, WARMED, [sharing(0, prompt, 40)], flush_cache_first=True,
                  label="warm: cached by a longer prompt that starts with it"),
        TrialPlan("prefix", 3, WARMED, [sharing(0, half, 40)], flush_cache_first=True,
                  label="half warm: cached by a prompt sharing its first half"),
        TrialPlan("prefix", 4, DURING, [sharing(j, prompt, 10 + 20 * j) for j in range(3)], flush_cache_first=True,
                  label="next to fillers sharing its prompt, cold cache"),
        TrialPlan("prefix", 5, ALONE, flush_cache_first=True, label="cold again after /flush_cache"),
    ]


# The pressure profile: fillers ask for this many times the KV pool (prompt + output tokens), so that SGLang's
# admission (which reserves only a decaying fraction of each request's max_new_tokens) over-commits the pool
# and decode runs out of KV slots; below the minimum, exhaustion is not certain and the profile is refused.
PRESSURE_OVERCOMMIT = 2.0
PRESSURE_MIN_OVERCOMMIT = 1.25
PRESSURE_MAX_FILLERS = 64  # also the cap where the server reports no max_running_requests
PRESSURE_PROMPT_WORDS = 12
# The probe's delay after its fillers, in fractions of its solo time: it arrives as the youngest request (SGLang
# retracts the running request with the fewest output tokens first), at different points of their decode.
PRESSURE_DELAYS = (0.0, 0.05, 0.15, 0.3)
# ... plus this many seconds, so that every filler's request (sent from a thread pool) reaches the server first.
PRESSURE_MIN_DELAY_S = 0.1


@dataclass
class PressureLoad:
    """How many fillers of how many tokens the pressure profile sends, and from which server limits."""

    fillers: int
    filler_new_tokens: int
    filler_prompt_tokens: int  # estimated from the measured tokens per word
    pool_tokens: int  # the server's max_total_num_tokens
    max_running_requests: int | None
    demand_tokens: int  # prompt + output tokens of one trial's fillers and the probe together
    notes: list[str]


def pressure_load(*, max_total_num_tokens: int | None, max_running_requests: int | None, probe_new_tokens: int,
                  filler_prompt_tokens: int) -> PressureLoad:
    """Size the pressure trials to ask for :data:`PRESSURE_OVERCOMMIT` times the KV pool; ValueError (naming the
    server flag or the option that fixes it) where this server's limits cannot overflow its pool."""
    if not max_total_num_tokens:
        raise ValueError("the server reports no max_total_num_tokens, which the pressure profile sizes its load by")
    per_request = filler_prompt_tokens + probe_new_tokens
    cap = min(PRESSURE_MAX_FILLERS, max_running_requests - 1 if max_running_requests else PRESSURE_MAX_FILLERS)
    fillers = max(0, min(cap, -(-int(PRESSURE_OVERCOMMIT * max_total_num_tokens) // per_request)))
    demand = (fillers + 1) * per_request
    if fillers < 2 or demand < PRESSURE_MIN_OVERCOMMIT * max_total_num_tokens:
        longer = -(-int(PRESSURE_OVERCOMMIT * max_total_num_tokens) // max(2, cap + 1)) - filler_prompt_tokens
        running = f"max_running_requests {max_running_requests}" if max_running_requests else "no reported limit"
        raise ValueError(
            f"{fillers} fillers of {per_request} tokens next to the probe (the most this server runs at once less "
            f"one for the probe, capped at {PRESSURE_MAX_FILLERS}; {running}) ask for {demand} tokens, too few to "
            f"overflow its KV pool of {max_total_num_tokens} tokens (max_total_num_tokens): serve it with "
            f"--max-total-tokens {max(256, demand // 2)} or less, or give the probe --max-new-tokens {longer} or more")
    notes = [f"pressure: {fillers} fillers of ~{filler_prompt_tokens} prompt + {probe_new_tokens} new tokens and the "
             f"probe ask for {demand} tokens of a {max_total_num_tokens}-token KV pool "
             f"({demand / max_total_num_tokens:.1f}x; max_running_requests {max_running_requests or '?'})"]
    return PressureLoad(fillers, probe_new_tokens, filler_prompt_tokens, max_total_num_tokens, max_running_requests,
                        demand, notes)


def pressure_prompt_tokens(tokens_per_word: float) -> int:
    """The estimated prompt length of a pressure filler (its "Request pressure.T.J:" head counts as two words)."""
    return max(1, round((PRESSURE_PROMPT_WORDS + 2) * tokens_per_word))


def pressure_plan(trials: int, load: PressureLoad, rng: random.Random) -> list[TrialPlan]:
    """Trial 0 alone; trial t >= 1 sends ``load.fillers`` fillers at once (as long as the probe, or up to 1/8
    longer, so the pool stays full after the probe is re-prefilled), then the probe after
    ``PRESSURE_DELAYS[(t - 1) % 4]`` of its solo time (plus :data:`PRESSURE_MIN_DELAY_S`)."""
    plans = [TrialPlan("pressure", 0, ALONE, label="alone")]
    words = PRESSURE_PROMPT_WORDS
    for t in range(1, trials):
        delay = PRESSURE_DELAYS[(t - 1) % len(PRESSURE_DELAYS)]
        fillers = [Filler("pressure", payload(
            _prompt("pressure", t, j, _words(rng, words)),
            max_new_tokens=rng.randint(load.filler_new_tokens, load.filler_new_tokens * 9 // 8),
            seed=rng.randrange(2**31)), words) for j in range(load.fillers)]
        plans.append(TrialPlan("pressure", t, UNDER_PRESSURE, fillers, probe_delay_fraction=delay,
                               label=f"probe {delay:g} of its solo time after {len(fillers)} KV-filling requests"))
    return plans
