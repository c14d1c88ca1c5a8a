"""A retracted DETSPEC request replays its tokens from the prompt, so memory pressure cannot change them.

Why: under KV-cache pressure SGLang retracts running requests (``ScheduleBatch.retract_decode``: fewest output
tokens first) and re-prefills them later over prompt + output so far. The re-prefill then samples the next token
with the target's plain sampler, where the uninterrupted request would have got it from a draft-and-verify round:
rejection sampling spends its per-request randomness differently from plain sampling, so the continuation changes
from that token on (measured on the H200, sglang 0.5.17, weighted tiny pair: the two retracted probes of a pressure
run diverged at tokens 164 and 197 of 256). Reconstructing the draft round at the retraction boundary would need the
prefill's hidden states to equal the verify forwards' bit for bit, which nothing guarantees.

What this module does instead is exact by construction: a DETSPEC request's trajectory is a function of its prompt,
its seed and its sampling parameters alone (that is what ``sglang-detspec check`` tests under changing batches), so
a retracted request is rewound to its prompt and regenerates the same tokens, then goes on. SGLang already does the
same for ``input_embeds`` requests (``Req.reset_for_retract``), without the bookkeeping below.

* :func:`replay_from_prompt` (``HookRegistry`` AROUND hook on ``Req.reset_for_retract``) remembers the tokens
  already emitted and clears every per-output field of the request (the table is
  :data:`PER_OUTPUT_REQ_FIELDS`): output ids, output logprobs, the speculative
  statistics (so ``meta_info``'s accept length is the uninterrupted request's), the reasoning-token counters and the
  incremental-detokenization window.
* :func:`hold_stream_during_replay` (AROUND hook on the scheduler's per-request output accumulator,
  ``_GenerationStreamAccumulator.accept``) sends nothing for the request until it has regenerated every token it had
  already sent (its send offsets would otherwise move backwards and the client would receive tokens twice), checking
  each regenerated token against the one sent. A mismatch would mean the tokens the client already holds are not
  the request's: the request is aborted with an error naming the position, never continued silently.

Cost: a retracted request recomputes its output so far (decode rounds, not one prefill), so retraction costs more
than upstream's re-prefill; it happens only when the pool overflows. Not replayed (SGLang's behaviour, logged once):
grammar-constrained requests, whose grammar state has consumed the output and cannot be rewound generically.

Active only in a scheduler process whose DETSPEC workers passed the start-up check (:func:`enable_replay`, called
by :mod:`.scheduler_check`); every other server keeps SGLang's retraction unchanged.
"""

from __future__ import annotations

import copy
import logging
from array import array
from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

from sglang_detspec.integration.setup.hooks import hook_active, register_once

logger = logging.getLogger(__name__)

__all__ = [
    "KEEP_UNLESS_LIST",
    "PER_OUTPUT_REQ_FIELDS",
    "REPLAY_ATTR",
    "ReplayState",
    "enable_replay",
    "hold_stream_during_replay",
    "install_retraction_replay",
    "replay_enabled",
    "replay_from_prompt",
    "retraction_replay_active",
    "retraction_replay_targets",
]

# What a rewound request resets, and where its output leaves the scheduler (the same on 0.5.17 - 0.5.23).
# ``Req.reset_for_retract`` (0.5.17 schedule_batch.py:1603, 0.5.23 :2049) keeps ``output_ids``; the scheduler's
# per-request output step is ``_GenerationStreamAccumulator.accept(self, *, req)`` in
# ``managers/scheduler_components/output_streamer.py`` on every supported release (0.5.17 :362, 0.5.21 :417,
# 0.5.23 :444): it advances ``send_token_offset`` / ``send_decode_id_offset`` / ``send_output_token_logprobs_offset``
# to the current lengths, so it must not run while a rewound request is shorter than what it sent.

RETRACTION_RESET_TARGET = "sglang.srt.managers.schedule_batch.Req.reset_for_retract"
RETRACTION_ACCEPT_TARGET = (
    "sglang.srt.managers.scheduler_components.output_streamer._GenerationStreamAccumulator.accept"
)

#: A field whose fresh value depends on the request (``[]`` when it asked for logprobs / a sampling mask, else
#: ``None``): a list is emptied, anything else kept.
KEEP_UNLESS_LIST = object()

#: Per holder (``"req"`` the ``Req``, ``"logprob"`` its ``ReqLogprob``), every field a request fills as it emits
#: tokens, with the value ``Req.__init__`` gives it (0.5.17 - 0.5.23; a field absent on the installed release is
#: skipped). ``tests/unit/integration/setup/test_retraction_replay.py`` checks the values against a fresh ``Req`` of the installed
#: release and that no other output-named field exists there.
PER_OUTPUT_REQ_FIELDS = {
    "req": {
        # speculative statistics (meta_info spec_verify_ct, accept length, histograms)
        "spec_verify_ct": 0,
        "spec_num_correct_drafts": 0,
        "spec_num_block_accept_tokens": 0,
        "spec_num_cap_tokens": 0,
        "spec_correct_drafts_histogram": [],
        "spec_cap_lens_histogram": [],
        # reasoning-token counting (update_reasoning_tokens runs per output token)
        "reasoning_tokens": 0,
        "_is_reasoning_over": False,
        "_think_end_matcher": None,
        "_think_end_match_len": 0,
        "_think_start_match_len": 0,
        # the incremental-detokenization window (init_incremental_detokenize rebuilds it when these are None)
        "surr_offset": None,
        "read_offset": None,
        "finished_len": None,
        # per-token payloads
        "hidden_states": [],
        "hidden_states_tensor": None,
        "output_token_sampling_mask": KEEP_UNLESS_LIST,
        "output_token_sampling_logprobs": KEEP_UNLESS_LIST,
        "output_topk_p": None,
        "output_topk_index": None,
        "output_dsa_topk_indices": None,
        "customized_info": None,
    },
    "logprob": {
        "output_token_logprobs_val": KEEP_UNLESS_LIST,
        "output_token_logprobs_idx": KEEP_UNLESS_LIST,
        "output_top_logprobs_val": KEEP_UNLESS_LIST,
        "output_top_logprobs_idx": KEEP_UNLESS_LIST,
        "output_token_ids_logprobs_val": KEEP_UNLESS_LIST,
        "output_token_ids_logprobs_idx": KEEP_UNLESS_LIST,
    },
}


def retraction_replay_targets() -> Tuple[str, str]:
    """Dotted paths of ``Req.reset_for_retract`` and the scheduler's per-request output step (same names
    0.5.17 - 0.5.23)."""
    return RETRACTION_RESET_TARGET, RETRACTION_ACCEPT_TARGET


def finish_abort(message: str) -> Any:
    """SGLang's abort finish reason with ``message`` (an internal error: HTTP 500)."""
    from http import HTTPStatus

    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    return FINISH_ABORT(message, status_code=HTTPStatus.INTERNAL_SERVER_ERROR)


def is_abort(finish_reason: Any) -> bool:
    """Whether ``finish_reason`` is SGLang's abort (a client disconnect, a timeout, an error), not a length/stop."""
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    return isinstance(finish_reason, FINISH_ABORT)


#: The attribute a request being replayed carries (a :class:`ReplayState`); absent otherwise.
REPLAY_ATTR = "_detspec_replay"

_enabled = False
_warned_grammar = False


@dataclass
class ReplayState:
    """What a retracted request had emitted, and how much of it the replay has regenerated and checked."""

    sent: array  # the output ids at retraction (every token the client may already hold)
    checked: int = 0  # regenerated tokens compared with ``sent`` so far
    failed: bool = False  # a regenerated token differed: the request is being aborted

    @property
    def done(self) -> bool:
        return not self.failed and self.checked >= len(self.sent)


def enable_replay() -> None:
    """Turn replay on in this process (a DETSPEC scheduler, after its workers were checked)."""
    global _enabled
    _enabled = True


def replay_enabled() -> bool:
    return _enabled


def _rewind(req: Any) -> None:
    """Reset the per-output fields of ``req`` to a fresh request's values (output ids keep their container type)."""
    req.output_ids = req.output_ids[:0]  # a new, empty array("q") (0.5.17 - 0.5.23) or list
    for holder_name, fields in PER_OUTPUT_REQ_FIELDS.items():
        holder = req if holder_name == "req" else getattr(req, holder_name, None)
        if holder is None:
            continue
        for name, fresh in fields.items():
            if not hasattr(holder, name):  # a field of another release
                continue
            if fresh is KEEP_UNLESS_LIST:
                if isinstance(getattr(holder, name), list):
                    setattr(holder, name, [])
            else:
                setattr(holder, name, copy.copy(fresh))


def replay_from_prompt(original: Callable, req: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND hook on ``Req.reset_for_retract``: upstream's reset, then rewind the request to its prompt."""
    sent = array("q", req.output_ids)  # before upstream's reset: it drops them itself for input_embeds requests
    result = original(req, *args, **kwargs)
    if not _enabled:
        return result
    if getattr(req, "grammar", None) is not None:
        global _warned_grammar
        if not _warned_grammar:
            _warned_grammar = True
            logger.warning(
                "sglang-detspec: a grammar-constrained request (%s) was retracted; its grammar state cannot be "
                "rewound, so it is re-prefilled as upstream does and its continuation may change (retraction "
                "happens when the KV pool overflows: raise --max-total-tokens or lower --max-running-requests)",
                req.rid,
            )
        return result
    previous: Optional[ReplayState] = getattr(req, REPLAY_ATTR, None)
    if previous is not None and len(previous.sent) > len(sent):
        # Retracted again before its replay caught up: the client holds the longer list.
        sent = previous.sent
    if not sent:
        return result
    _rewind(req)
    setattr(req, REPLAY_ATTR, ReplayState(sent=sent))
    logger.info(
        "sglang-detspec: request %s retracted after %d output tokens; it restarts from its prompt and regenerates "
        "them (checked against what was sent) so that its seeded tokens do not depend on memory pressure",
        req.rid,
        len(sent),
    )
    return result


def _check_regenerated(req: Any, state: ReplayState) -> None:
    out = req.output_ids
    upto = min(len(out), len(state.sent))
    for i in range(state.checked, upto):
        if out[i] != state.sent[i]:
            state.failed = True
            message = (
                f"sglang-detspec: request {req.rid} was retracted and replayed from its prompt, but its output "
                f"token {i} came out {out[i]} instead of the {state.sent[i]} already sent, so the tokens sent "
                "before retraction are not this request's; aborted. Please report this with the server command "
                "line (a determinism bug)."
            )
            logger.error(message)
            req.to_finish = finish_abort(message)
            return
    state.checked = upto


def hold_stream_during_replay(original: Callable, accumulator: Any, *args: Any, req: Any, **kwargs: Any) -> Any:
    """AROUND hook on ``_GenerationStreamAccumulator.accept``: nothing leaves for a request still replaying."""
    state: Optional[ReplayState] = getattr(req, REPLAY_ATTR, None)
    if state is None:
        return original(accumulator, *args, req=req, **kwargs)
    if not state.failed:
        _check_regenerated(req, state)
    if state.done:
        delattr(req, REPLAY_ATTR)
        return original(accumulator, *args, req=req, **kwargs)
    if req.finished():
        # Nothing past what was already sent leaves: after a mismatch the regenerated tokens are not the ones the
        # client holds, and a replay that stopped short has nothing new.
        req.finished_len = min(len(req.output_ids), req.send_token_offset)
        if not state.failed and not is_abort(req.finished_reason):
            # (An abort -- the client went away, a timeout -- stops a replay as it stops any request.)
            # It stopped before reaching what it had sent: the client holds tokens this request did not produce.
            message = (
                f"sglang-detspec: request {req.rid} was retracted and replayed from its prompt, but it finished "
                f"after {len(req.output_ids)} tokens where {len(state.sent)} had already been sent; aborted "
                "(a determinism bug: please report it with the server command line)."
            )
            logger.error(message)
            req.finished_reason = finish_abort(message)
        delattr(req, REPLAY_ATTR)
        return original(accumulator, *args, req=req, **kwargs)
    return None


def install_retraction_replay() -> tuple:
    """Register both hooks with ``HookRegistry`` (once per process); return their targets."""
    reset_target, accept_target = retraction_replay_targets()
    return (
        register_once(reset_target, replay_from_prompt, "AROUND"),
        register_once(accept_target, hold_stream_during_replay, "AROUND"),
    )


def retraction_replay_active() -> bool:
    """Whether both hooks are in place on the installed SGLang."""
    reset_target, accept_target = retraction_replay_targets()
    return hook_active(reset_target, replay_from_prompt) and hook_active(accept_target, hold_stream_during_replay)
