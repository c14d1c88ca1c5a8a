"""``cross_card.py logprob-gap`` (``sglang_detspec.checker.logprob_gap``) on hand-built results files: only positions
where both servers scored the same token after the same tokens are compared; a file without NONE is refused."""

from __future__ import annotations

import json
import struct

import pytest

from sglang_detspec.checker import cross_card
from sglang_detspec.checker import cross_card_results as crf
from sglang_detspec.checker import logprob_gap as lg

LENGTH = 5
ALGORITHMS = ("DETSPEC_EAGLE", "DETSPEC_EAGLE_INVARIANT", "NONE")


def _next_up(x: float) -> float:
    return struct.unpack("<d", struct.pack("<q", struct.unpack("<q", struct.pack("<d", x))[0] - 1))[0]


def _sample(ids, lps):
    return {"output_ids": list(ids), "logprobs": [crf.logprob_bits(x) for x in lps], "verify_steps": 3}


def _file(algorithms=ALGORITHMS):
    requests = [{"id": "r0", "text": "a", "n": 1}, {"id": "r1", "text": "b", "n": 2}]
    ref = [[_sample([1, 2, 3, 4, 5], [-0.5, -1.0, -1.5, -2.0, -2.5])],
           [_sample([6, 7, 8, 9, 10], [-0.25] * 5), _sample([6, 8, 8, 9, 10], [-0.75] * 5)]]
    # The invariant mode: the reference's tokens; one logprob off by one ulp.
    inv = json.loads(json.dumps(ref))
    inv[0][0]["logprobs"][2] = crf.logprob_bits(_next_up(-1.5))
    # DETSPEC_EAGLE: r0 leaves the reference's tokens at position 2 (later logprobs far off, never compared); r1's
    # first sample at position 0; its second sample equal throughout but 0.125 off at position 4.
    det = [[_sample([1, 2, 9, 4, 5], [-0.5, -1.0, -9.0, -9.0, -9.0])],
           [_sample([7, 7, 8, 9, 10], [-3.0] * 5), _sample([6, 8, 8, 9, 10], [-0.75] * 4 + [-0.875])]]
    by_alg = {"NONE": ref, "DETSPEC_EAGLE_INVARIANT": inv, "DETSPEC_EAGLE": det}
    return {"format": crf.FORMAT, "version": crf.FORMAT_VERSION, "environment": {"device": "NVIDIA H100 80GB HBM3"},
            "settings": {"algorithms": list(algorithms), "graphs": "on", "max_new_tokens": LENGTH,
                         "models": {"target": "t", "draft": "d"}},
            "requests": requests, "results": {a: {m: by_alg[a] for m in crf.MODES} for a in algorithms}}


def test_only_positions_after_the_same_tokens_are_compared():
    gaps = {g.algorithm: g for g in lg.logprob_gaps(crf.validate(_file(), "test"))}
    inv, det = gaps["DETSPEC_EAGLE_INVARIANT"], gaps["DETSPEC_EAGLE"]
    assert (inv.samples, inv.positions, inv.identical) == (3, 15, 14)
    assert inv.max_abs == abs(_next_up(-1.5) + 1.5) > 0
    # r0: positions 0, 1; r1 sample 0: none; r1 sample 1: all 5, the last 0.125 off.
    assert (det.samples, det.positions, det.identical) == (3, 7, 6)
    assert det.max_abs == 0.125 and det.mean_abs == pytest.approx(0.125 / 7)


def test_control_counting_past_a_divergence_would_report_the_far_logprobs():
    """The -9.0 logprobs after r0's divergence must not count: a version that ignored the tokens would see them."""
    data = crf.validate(_file(), "test")
    for sample in (data["results"]["DETSPEC_EAGLE"]["sequential"][0][0],):
        sample["output_ids"] = [1, 2, 3, 4, 5]  # as if the tokens had not diverged
    det = {g.algorithm: g for g in lg.logprob_gaps(data)}["DETSPEC_EAGLE"]
    assert det.max_abs == 7.5 and det.positions == 10


def test_the_command_prints_each_algorithm_and_exits_0(tmp_path, capsys):
    path = tmp_path / "gap.json"
    path.write_text(json.dumps(_file()))
    assert cross_card.main(["logprob-gap", str(path)]) == 0
    out = capsys.readouterr().out
    assert "DETSPEC_EAGLE: 7 positions in 3 samples, 6 bit-identical (85.7%)" in out
    assert "DETSPEC_EAGLE_INVARIANT: 15 positions in 3 samples, 14 bit-identical" in out
    assert "NVIDIA H100 80GB HBM3" in out


def test_a_file_without_none_is_refused_naming_the_flag(tmp_path, capsys):
    path = tmp_path / "h100.json"
    path.write_text(json.dumps(_file(("DETSPEC_EAGLE", "DETSPEC_EAGLE_INVARIANT"))))
    assert cross_card.main(["logprob-gap", str(path)]) == 2
    err = capsys.readouterr().err
    assert "--algorithms DETSPEC_EAGLE,DETSPEC_EAGLE_INVARIANT,NONE" in err and "Traceback" not in err


def test_none_serves_with_the_plugins_token_id_sampler():
    assert cross_card.server_env("NONE") == {"SGLANG_DETSPEC_TOKEN_ID_SAMPLER": "1"}
    assert cross_card.server_env("DETSPEC_EAGLE") == {} == cross_card.server_env("DETSPEC_EAGLE_INVARIANT")
    pytest.importorskip("sglang")
    from sglang_detspec.integration.setup.token_id_sampler_opt_in import TOKEN_ID_SAMPLER_ENV

    assert cross_card.TOKEN_ID_SAMPLER_ENV == TOKEN_ID_SAMPLER_ENV
