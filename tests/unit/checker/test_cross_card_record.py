"""``scripts/cross_card.py record`` whole, on CPU: against a fake ``sglang.launch_server`` process
(``tests/unit/fake_launch_server``; SGLang cannot serve on CPU), recorded twice and compared: equal cards compare
same, a card whose token differs and a card whose logprob moves with the batch are found.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_detspec.checker import cross_card

REPO = Path(__file__).resolve().parents[3]


FAKE_SGLANG = REPO / "tests" / "unit" / "fake_launch_server"


@pytest.fixture
def fake_card(monkeypatch, tmp_path):
    """``record`` as on a GPU machine, except that ``python -m sglang.launch_server`` is the fake, the device name
    is given, and the tiny pair is two small directories (only their bytes are hashed)."""
    from sglang_detspec import server_process
    from sglang_detspec.models import tiny_models

    target, draft = tmp_path / "models" / "target", tmp_path / "models" / "eagle_draft"
    for d in (target, draft):
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps({"name": d.name}))
    monkeypatch.setattr(tiny_models, "ensure_tiny_models",
                        lambda root, pair: tiny_models.TinyModels(target, draft, tmp_path / "unused"))
    monkeypatch.setattr(server_process, "launch_skip_reason", lambda: None)
    monkeypatch.setenv("PYTHONPATH", str(FAKE_SGLANG))

    def record(name, *extra, device="NVIDIA H100 80GB HBM3", env=None):
        monkeypatch.setattr(cross_card, "environment", lambda: {"device": device, "sglang": "fake", "torch": "-"})
        for key in ("FAKE_CARD_NUDGE", "FAKE_CARD_TOKEN"):
            monkeypatch.delenv(key, raising=False)
        for key, value in (env or {}).items():
            monkeypatch.setenv(key, value)
        out = tmp_path / name
        code = cross_card.main(["record", "--out", str(out), "--start-timeout", "60", "--request-timeout", "30",
                                *extra])
        return code, out

    return record


def test_record_twice_on_equal_cards_compares_same(fake_card, capsys):
    code, a = fake_card("h100.json", "--algorithms", "DETSPEC_EAGLE,NONE")
    assert code == 0, capsys.readouterr()
    data = json.loads(a.read_text())
    assert data["environment"]["device"] == "NVIDIA H100 80GB HBM3" and data["requests"] == cross_card.request_set()
    assert data["batch_invariance"] == {"DETSPEC_EAGLE": {"differing_requests": []}, "NONE": {"differing_requests": []}}
    assert "--speculative-algorithm" not in data["servers"]["NONE"]["command"]
    code, _ = fake_card("h200.json", "--algorithms", "DETSPEC_EAGLE,NONE", "--compare-with", str(a),
                        "--note", "commit abc1234", device="NVIDIA H200")
    out = capsys.readouterr().out
    assert code == 0, out
    assert "DETSPEC_EAGLE: all 60 requests bit-identical" in out and "NONE: all 60 requests bit-identical" in out
    assert "NVIDIA H200" in out and "note: commit abc1234" in out and "SAME" in out and "60/60 one at a time" in out


def test_record_finds_a_card_whose_token_differs(fake_card, capsys):
    code, a = fake_card("a.json")
    assert code == 0
    seed = cross_card.SEEDS[1]
    code, _ = fake_card("b.json", "--compare-with", str(a), env={"FAKE_CARD_TOKEN": f"DETSPEC_EAGLE_INVARIANT:{seed}:17"})
    out = capsys.readouterr().out
    assert code == 1
    assert "DETSPEC_EAGLE: all 60 requests bit-identical" in out
    assert "DETSPEC_EAGLE_INVARIANT: requests that differ, of 60: sequential 30 (tokens in 30), concurrent 30 (tokens in 30)" in out
    assert f"first: request p0-v0-s{seed}-n1 (sequential), sample 0, position 17: token " in out


def test_record_finds_batch_variance_on_its_own_card_and_across(fake_card, capsys):
    code, clean = fake_card("clean.json", "--algorithms", "DETSPEC_EAGLE")
    assert code == 0
    seed = cross_card.SEEDS[0]
    code, nudged = fake_card("nudged.json", "--algorithms", "DETSPEC_EAGLE", env={"FAKE_CARD_NUDGE": f"DETSPEC_EAGLE:{seed}:5"})
    out = capsys.readouterr().out
    assert code == 1 and nudged.exists()
    assert "request(s) differ between sending modes; first: request p" in out and "same token" in out
    assert json.loads(nudged.read_text())["batch_invariance"]["DETSPEC_EAGLE"]["differing_requests"]
    assert cross_card.main(["compare", str(clean), str(nudged)]) == 1
    out = capsys.readouterr().out
    assert "DETSPEC_EAGLE: requests that differ, of 60: sequential 0 (tokens in 0), concurrent " in out
