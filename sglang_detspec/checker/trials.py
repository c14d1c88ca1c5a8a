"""One ``check`` trial on the wire: its requests sent in the order its plan's arrival asks for
(:class:`TrialRunner`), the answers turned into the report's records (:func:`to_trial`, :func:`filler_record`), and
each traffic profile's plans (:func:`profile_plans`; the long and pressure profiles size theirs from the server).
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait

from sglang_detspec.checker import logprobs as lp
from sglang_detspec.checker import traffic as tr
from sglang_detspec.checker.client import Client, ServerInfo, float_or_none
from sglang_detspec.checker.report import FillerRecord, Trial
from sglang_detspec.command_base import CliError

__all__ = ["TrialRunner", "to_trial", "filler_record", "profile_plans", "response_meta", "int_or_none"]


def response_meta(body: dict) -> dict:
    meta = body.get("meta_info")
    return meta if isinstance(meta, dict) else {}


def int_or_none(x) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def to_trial(index: int, plan: tr.TrialPlan, seed: int, body: dict, fillers: list[FillerRecord]) -> Trial:
    meta = response_meta(body)
    ids = body.get("output_ids")
    if ids is None:
        ids = meta.get("output_ids")
    if not (isinstance(ids, list) and all(isinstance(i, int) for i in ids)):
        ids = None
    completion = int_or_none(meta.get("completion_tokens"))
    verify_ct = int_or_none(meta.get("spec_verify_ct"))
    accept = float_or_none(meta.get("spec_accept_length"))
    if accept is None and verify_ct and completion:
        accept = completion / verify_ct  # what 0.5.17/0.5.23 report as spec_accept_length
    return Trial(
        index=index, profile=plan.profile, profile_trial=plan.index, arrival=plan.arrival, label=plan.label,
        seed=seed, fillers=len(fillers), filler_max_new_tokens=[f.max_new_tokens for f in fillers],
        filler_prompt_words=[f.prompt_words for f in fillers], text=body["text"], output_ids=ids,
        filler_details=fillers, flushed_cache=plan.flush_cache_first, completion_tokens=completion,
        prompt_tokens=int_or_none(meta.get("prompt_tokens")), cached_tokens=int_or_none(meta.get("cached_tokens")),
        spec_verify_ct=verify_ct, spec_accept_length=accept,
        output_logprobs=lp.parse_token_logprobs(meta), output_top_logprobs=lp.parse_top_logprobs(meta),
        num_retractions=int_or_none(meta.get("num_retractions")), probe_delay_fraction=plan.probe_delay_fraction,
        filler_retractions=sum(counted) if (counted := [f.num_retractions for f in fillers
                                                        if f.num_retractions is not None]) else None,
    )


class TrialRunner:
    """Sends one trial's requests in the order its plan's arrival asks for and waits for all of them (a failed
    filler is a broken server too)."""

    def __init__(self, client: Client, pool: ThreadPoolExecutor, probe: dict, flush_wait_s: float):
        self.client = client
        self.pool = pool
        self.probe = probe
        self.flush_wait_s = flush_wait_s
        self.solo_s = 0.0  # the probe's time alone, from the latest ALONE trial (every profile starts with one)

    def _timed_probe(self) -> tuple[dict, float]:
        start = time.monotonic()
        body = self.client.generate(self.probe)[0]
        return body, time.monotonic() - start

    def _started_generate(self, started: threading.Semaphore, body: dict) -> list[dict]:
        started.release()
        return self.client.generate(body)

    def _probe_after(self, started: threading.Semaphore, fillers: int, delay_s: float) -> tuple[dict, float]:
        """The probe once every filler's thread is sending (the pool has a worker for each), and ``delay_s`` later."""
        for _ in range(fillers):
            started.acquire()
        time.sleep(delay_s)
        return self._timed_probe()

    def _delayed(self, delay_s: float, body: dict) -> list[dict]:
        time.sleep(delay_s)
        return self.client.generate(body)

    def run(self, plan: tr.TrialPlan) -> tuple[dict, list[list[dict] | dict]]:
        """The probe's completion and each filler's answer (a list of completions, or a streamed last chunk)."""
        if plan.flush_cache_first:
            self.client.flush_cache(self.flush_wait_s)
        submit, fillers = self.pool.submit, plan.fillers
        if plan.arrival == tr.ALONE:
            body, self.solo_s = self._timed_probe()
            return body, []
        if plan.arrival == tr.WARMED:
            answers = [future.result() for future in [submit(self.client.generate, f.payload) for f in fillers]]
            return self._timed_probe()[0], answers
        if plan.arrival == tr.DURING:
            half = len(fillers) // 2
            futures = [submit(self.client.generate, f.payload) for f in fillers[:half]]
            probe = submit(self._timed_probe)
            futures += [submit(self.client.generate, f.payload) for f in fillers[half:]]
        elif plan.arrival == tr.UNDER_PRESSURE:
            # Every filler is queued first, so the probe is the youngest request: SGLang retracts the running
            # request with the fewest output tokens first.
            started = threading.Semaphore(0)
            futures = [submit(self._started_generate, started, f.payload) for f in fillers]
            probe = submit(self._probe_after, started, len(fillers),
                           tr.PRESSURE_MIN_DELAY_S + plan.probe_delay_fraction * self.solo_s)
        elif plan.arrival == tr.BEFORE:
            probe = submit(self._timed_probe)
            futures = [submit(self._delayed, f.delay_fraction * self.solo_s, f.payload) for f in fillers]
        elif plan.arrival == tr.AFTER:
            futures, first_chunks = [], []
            for f in fillers:
                if f.stream:
                    event = threading.Event()
                    futures.append(submit(self.client.generate_streamed, f.payload, event.set))
                    first_chunks.append((event, futures[-1]))
                else:
                    futures.append(submit(self.client.generate, f.payload))
            for event, future in first_chunks:
                # A filler that fails (or times out, --timeout) before its first chunk ends the wait too.
                while not event.wait(0.02) and not future.done():
                    pass
            probe = submit(self._timed_probe)
        else:  # pragma: no cover - the plans only use the arrivals above
            raise ValueError(f"unknown arrival {plan.arrival!r}")
        wait(futures + [probe])
        answers = [f.result() for f in futures]
        return probe.result()[0], answers


def filler_record(filler: tr.Filler, answer: list[dict] | dict) -> FillerRecord:
    first = answer[0] if isinstance(answer, list) else answer
    sp = filler.payload["sampling_params"]
    extra = {k: v for k, v in filler.payload.items() if k not in ("text", "sampling_params")}
    return FillerRecord(kind=filler.kind, prompt_words=filler.prompt_words, max_new_tokens=sp["max_new_tokens"],
                        sampling_params={**sp, **extra},
                        prompt_tokens=int_or_none(response_meta(first).get("prompt_tokens")),
                        streamed=filler.stream, delay_fraction=filler.delay_fraction,
                        num_retractions=int_or_none(response_meta(first).get("num_retractions")))


def _tokens_per_word(client: Client, rng: random.Random) -> float:
    body, words = tr.calibration_payload(rng)
    tokens = int_or_none(response_meta(client.generate(body)[0]).get("prompt_tokens"))
    if not tokens:
        raise CliError(f"{client.url}/generate reports no meta_info.prompt_tokens, which the long profile sizes its "
                       "prompts by; leave it out (--traffic uniform,mixed,prefix)")
    return tokens / words


def profile_plans(profile: str, *, client: Client, server: ServerInfo, prompt: str, trials: int, max_fillers: int,
           max_new_tokens: int, rng: random.Random) -> tuple[list[tr.TrialPlan], tr.LongLengths | list[str] | None]:
    """A profile's plans, and what sized them: the long profile's LongLengths, the pressure profile's notes."""
    if profile == "uniform":
        return tr.uniform_plan(trials, max_fillers, max_new_tokens, rng), None
    if profile == "mixed":
        return tr.mixed_plan(trials, max_fillers, max_new_tokens, rng), None
    if profile == "prefix":
        return tr.prefix_plan(prompt, max_new_tokens, rng), None
    if profile == "pressure":
        ratio = _tokens_per_word(client, rng)
        try:
            load = tr.pressure_load(max_total_num_tokens=server.max_total_num_tokens,
                                    max_running_requests=server.max_running_requests, probe_new_tokens=max_new_tokens,
                                    filler_prompt_tokens=tr.pressure_prompt_tokens(ratio))
        except ValueError as e:
            raise CliError(f"{e}; or leave it out of --traffic") from None
        return tr.pressure_plan(trials, load, rng), load.notes
    lengths = tr.long_lengths(chunked_prefill_size=server.chunked_prefill_size, context_length=server.context_length,
                              max_req_input_len=server.max_req_input_len,
                              max_total_num_tokens=server.max_total_num_tokens,
                              filler_max_new_tokens=2 * max_new_tokens)
    ratio = _tokens_per_word(client, rng)
    lengths.notes.append(f"planned prompt lengths {lengths.lengths} tokens at {ratio:.2f} tokens per word (measured)")
    return tr.long_plan(trials, lengths, ratio, max_new_tokens, rng), lengths
