"""Retraction replay (issue 19) on SGLang's real ``Req`` and its real per-request output step.

A request emits tokens through ``_GenerationStreamAccumulator.accept`` (what the scheduler calls after every batch),
is retracted with upstream's own ``Req.reset_for_retract``, regenerates its tokens and goes on. What the client
receives is the concatenation of the deltas ``accept`` hands out; it must equal the request's final output exactly
(no token twice, none lost), for output ids, incremental-detokenization ids and logprobs. The control: the same
run without the stream hold sends the replayed tokens a second time. The field table in ``compat`` is checked
against a fresh ``Req`` of the installed release, so a release that adds an output field fails here.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import re
from array import array

import pytest

from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH, Req
from sglang.srt.managers.scheduler_components import output_streamer
from sglang.srt.sampling.sampling_params import SamplingParams

from sglang_detspec.integration.setup import retraction

PROMPT = array("q", [11, 12, 13, 14, 15, 16, 17])
# The request's trajectory: what it generates whenever it runs from its prompt (a deterministic request's tokens).
TRAJECTORY = [101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112]


def _req(*, return_logprob: bool = True, max_new_tokens: int = len(TRAJECTORY)) -> Req:
    params = SamplingParams(max_new_tokens=max_new_tokens)
    params.normalize(None)
    req = Req("probe", "", array("q", PROMPT), params, return_logprob=return_logprob, stream=True)
    req.vocab_size = 1024  # what the scheduler sets from the model config
    return req


def _accumulator():
    """A real ``_GenerationStreamAccumulator`` (its required fields given plain values: streaming every token)."""
    values = {"default_stream_interval": 1, "default_force_stream_interval": 1}
    kwargs = {}
    for f in dataclasses.fields(output_streamer._GenerationStreamAccumulator):
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        if f.name in values:
            kwargs[f.name] = values[f.name]
        elif f.name == "disaggregation_mode":
            from sglang.srt.disaggregation.utils import DisaggregationMode

            kwargs[f.name] = DisaggregationMode.NULL
        elif f.name == "spec_algorithm":
            from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

            kwargs[f.name] = SpeculativeAlgorithm.EAGLE
        elif f.name.startswith("return_"):
            kwargs[f.name] = f.name == "return_logprob"
        elif f.name.startswith("get_") or f.name.startswith("is_"):
            kwargs[f.name] = lambda *a, **k: None
        else:
            kwargs[f.name] = None
    return output_streamer._GenerationStreamAccumulator(**kwargs)


class Client:
    """What the client receives: the deltas of every ``accept`` that produced output."""

    def __init__(self, hold: bool):
        self.hold = hold
        self.ids, self.decode_ids, self.logprobs, self.finish = [], [], [], None

    def step(self, req: Req) -> None:
        acc = _accumulator()
        # Upstream's own accept, unwrapped: another test in this worker process may have loaded the plugin, whose
        # HookRegistry wrapper would otherwise hold the control's stream too.
        upstream_accept = inspect.unwrap(type(acc).accept)
        if self.hold:
            retraction.hold_stream_during_replay(upstream_accept, acc, req=req)
        else:
            upstream_accept(acc, req=req)
        if acc.rids:
            self.ids += list(acc.output_ids[0])
            self.decode_ids += list(acc.decode_ids_list[0])
            self.logprobs += list(acc.output_token_logprobs_val[0])
            self.finish = acc.finished_reasons[0]


def _emit(req: Req, tokens, client: Client, *, accepted_per_round: int = 3) -> None:
    """Append ``tokens`` in verify-sized rounds as the result processor would, then run the output step."""
    for start in range(0, len(tokens), accepted_per_round):
        chunk = tokens[start:start + accepted_per_round]
        for t in chunk:
            req.output_ids.append(t)
            req.logprob.output_token_logprobs_val.append(-t / 1000.0)
            req.logprob.output_token_logprobs_idx.append(t)
        req.spec_verify_ct += 1
        req.spec_num_correct_drafts += len(chunk) - 1
        req.update_finish_state(len(chunk))
        client.step(req)
        if req.finished():
            return


def _retract(req: Req) -> None:
    # Upstream releases the KV before resetting (release_req) and asserts so; these requests never held any.
    retraction.replay_from_prompt(Req.reset_for_retract, req)


def _regenerate(req: Req, client: Client, trajectory=TRAJECTORY) -> None:
    """Run the request from wherever it stands to the end of ``trajectory`` (a replay starts from the prompt)."""
    _emit(req, trajectory[len(req.output_ids):], client)


@pytest.fixture
def replay_on():
    retraction.enable_replay()
    yield
    retraction._enabled = False  # noqa: SLF001 - the process flag, reset between tests


def _run(client: Client, retract_after: int) -> Req:
    req = _req()
    _emit(req, TRAJECTORY[:retract_after], client)
    _retract(req)
    _regenerate(req, client)
    return req


@pytest.mark.parametrize("retract_after", [3, 6, 9])
def test_the_client_receives_each_token_once_across_a_retraction(replay_on, retract_after):
    client = Client(hold=True)
    req = _run(client, retract_after)
    assert list(req.output_ids) == TRAJECTORY
    assert client.ids == TRAJECTORY
    assert client.logprobs == [-t / 1000.0 for t in TRAJECTORY]
    # The incremental-detokenization ids: the prompt tail once, then every output token once.
    assert client.decode_ids[-len(TRAJECTORY):] == TRAJECTORY
    assert client.decode_ids[:-len(TRAJECTORY)] == list(PROMPT)[-len(client.decode_ids) + len(TRAJECTORY):]
    assert client.finish is not None and client.finish["type"] == "length"
    assert not hasattr(req, retraction.REPLAY_ATTR)


def test_control_without_the_hold_the_client_gets_replayed_tokens_twice(replay_on):
    client = Client(hold=False)
    req = _run(client, 6)
    assert list(req.output_ids) == TRAJECTORY
    assert client.ids != TRAJECTORY and len(client.ids) > len(TRAJECTORY), client.ids


def test_the_replay_starts_from_the_prompt_and_resets_per_output_state(replay_on):
    req = _req()
    _emit(req, TRAJECTORY[:6], Client(hold=True))
    assert req.spec_verify_ct == 2 and req.read_offset is not None
    _retract(req)
    assert len(req.output_ids) == 0 and isinstance(req.output_ids, array)
    assert req.origin_input_ids + req.output_ids == PROMPT  # what the re-prefill will compute
    assert req.logprob.output_token_logprobs_val == [] and req.logprob.output_token_logprobs_idx == []
    assert req.spec_verify_ct == 0 and req.spec_num_correct_drafts == 0
    assert req.read_offset is None and req.surr_offset is None
    assert req.retraction_count == 1  # upstream's count survives: meta_info.num_retractions
    state = getattr(req, retraction.REPLAY_ATTR)
    assert list(state.sent) == TRAJECTORY[:6] and state.checked == 0


def test_speculative_statistics_are_the_uninterrupted_requests(replay_on):
    plain = _req()
    _emit(plain, TRAJECTORY, Client(hold=True))
    replayed = _run(Client(hold=True), 6)
    assert (replayed.spec_verify_ct, replayed.spec_num_correct_drafts) == (
        plain.spec_verify_ct, plain.spec_num_correct_drafts)


def test_nothing_is_sent_while_the_replay_is_behind(replay_on):
    client = Client(hold=True)
    req = _req()
    _emit(req, TRAJECTORY[:9], client)
    sent = list(client.ids)
    _retract(req)
    _emit(req, TRAJECTORY[:6], client)  # regenerated, not yet past what was sent
    assert client.ids == sent
    _emit(req, TRAJECTORY[6:10], client)
    assert client.ids == TRAJECTORY[:10]


def test_a_regenerated_token_that_differs_aborts_the_request_naming_it(replay_on, caplog):
    client = Client(hold=True)
    req = _req()
    _emit(req, TRAJECTORY[:6], client)
    _retract(req)
    wrong = TRAJECTORY[:4] + [999] + TRAJECTORY[5:]
    with caplog.at_level(logging.ERROR, logger=retraction.__name__):
        _emit(req, wrong[:6], client)
    assert isinstance(req.to_finish, FINISH_ABORT) and "output token 4 came out 999 instead of the 105" in \
        req.to_finish.message
    assert "token 4" in caplog.text
    assert client.ids == TRAJECTORY[:6]  # nothing from the wrong replay reached the client
    _emit(req, wrong[6:9], client)  # the next step finishes it with the abort
    assert req.finished() and client.finish["type"] == "abort"
    assert client.ids == TRAJECTORY[:6]


def test_a_replay_that_finishes_short_of_what_was_sent_is_an_abort(replay_on):
    client = Client(hold=True)
    req = _req()
    _emit(req, TRAJECTORY[:9], client)
    _retract(req)
    _emit(req, TRAJECTORY[:3], client)
    req.finished_reason = FINISH_LENGTH(length=3)  # e.g. an EOS the uninterrupted request did not sample
    client.step(req)
    assert client.finish["type"] == "abort" and "finished after 3 tokens where 9" in client.finish["message"]
    assert client.ids == TRAJECTORY[:9]


def test_a_client_abort_during_the_replay_is_not_reported_as_a_determinism_bug(replay_on, caplog):
    client = Client(hold=True)
    req = _req()
    _emit(req, TRAJECTORY[:9], client)
    _retract(req)
    _emit(req, TRAJECTORY[:3], client)
    req.finished_reason = FINISH_ABORT("client disconnected")  # what the scheduler sets on an abort request
    with caplog.at_level(logging.ERROR, logger=retraction.__name__):
        client.step(req)
    assert client.finish["type"] == "abort" and client.finish["message"] == "client disconnected"
    assert "determinism bug" not in caplog.text
    assert client.ids == TRAJECTORY[:9]


def test_retracted_again_before_catching_up_keeps_the_longer_sent_list(replay_on):
    client = Client(hold=True)
    req = _req()
    _emit(req, TRAJECTORY[:9], client)
    _retract(req)
    _emit(req, TRAJECTORY[:3], client)
    _retract(req)
    assert list(getattr(req, retraction.REPLAY_ATTR).sent) == TRAJECTORY[:9]
    _regenerate(req, client)
    assert client.ids == TRAJECTORY and req.retraction_count == 2


def test_not_enabled_upstream_retraction_is_unchanged():
    assert not retraction.replay_enabled()
    req = _req()
    _emit(req, TRAJECTORY[:6], Client(hold=True))
    _retract(req)
    assert list(req.output_ids) == TRAJECTORY[:6] and not hasattr(req, retraction.REPLAY_ATTR)


def test_grammar_requests_are_not_rewound_and_it_is_logged(replay_on, caplog, monkeypatch):
    monkeypatch.setattr(retraction, "_warned_grammar", False)
    req = _req()
    _emit(req, TRAJECTORY[:6], Client(hold=True))
    req.grammar = object()
    with caplog.at_level(logging.WARNING, logger=retraction.__name__):
        _retract(req)
    assert list(req.output_ids) == TRAJECTORY[:6]
    assert "grammar-constrained request (probe) was retracted" in caplog.text


# --- the field table against the installed release ----------------------------------------------------------

_OUTPUT_FIELD = re.compile(r"^(output_|spec_|_?think|_?is_reasoning|reasoning_|hidden_states|surr_|read_offset"
                           r"|finished_len|customized_info)")
# Fields that match the pattern but are not per-output state, with why.
_NOT_PER_OUTPUT = {
    "output_ids": "rewound by the module itself (its container type is kept)",
    "origin_input_ids": "the prompt",
}


@pytest.mark.parametrize("return_logprob", [False, True])
def test_the_field_table_matches_a_fresh_request(return_logprob):
    fresh = _req(return_logprob=return_logprob)
    for holder_name, fields in retraction.PER_OUTPUT_REQ_FIELDS.items():
        holder = fresh if holder_name == "req" else getattr(fresh, holder_name)
        for name, value in fields.items():
            if not hasattr(holder, name):
                continue  # a field of another release
            actual = getattr(holder, name)
            if value is retraction.KEEP_UNLESS_LIST:
                assert actual is None or actual == [], (holder_name, name, actual)
            else:
                assert actual == value, (holder_name, name, actual, value)


def test_every_output_field_of_this_release_is_in_the_table():
    fresh = _req()
    declared = set(retraction.PER_OUTPUT_REQ_FIELDS["req"]) | set(_NOT_PER_OUTPUT)
    missing = sorted(n for n in vars(fresh) if _OUTPUT_FIELD.match(n) and n not in declared)
    assert not missing, f"fields a Req fills per output token that a rewind would not reset: {missing}"
    logprob_declared = set(retraction.PER_OUTPUT_REQ_FIELDS["logprob"])
    logprob_names = [f.name for f in dataclasses.fields(fresh.logprob)]  # a slotted dataclass
    logprob_missing = sorted(n for n in logprob_names if n.startswith("output_") and n not in logprob_declared)
    assert not logprob_missing, logprob_missing


def test_the_hook_targets_resolve_on_this_release():
    import pkgutil

    for target in retraction.retraction_replay_targets():
        assert callable(pkgutil.resolve_name(target)), target
