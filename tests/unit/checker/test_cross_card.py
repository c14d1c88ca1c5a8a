"""``scripts/cross_card.py`` on CPU (``sglang_detspec.checker.cross_card`` and ``.cross_card_results``).

The comparison on hand-built results files, with the controls that must fail (one flipped logprob bit, one changed
token, another request set, malformed files); the exact bit patterns of logprobs (-0.0, NaN, float32 values through
JSON); the request set and the server arguments; sending requests to a small in-process HTTP server (answers in
request order, a malformed answer named, a slow server timed out); argument handling (exit 2 with a message naming
the flag, no traceback). Whole ``record`` runs: test_cross_card_record.py. No GPU, no SGLang server.
"""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sglang_detspec.checker import cross_card
from sglang_detspec.checker import cross_card_results as crf

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "cross_card.py"


# ---------------------------------------------------------------------------------------------------------------
# Bit patterns


def _double_bits(x: float) -> bytes:
    return struct.pack("<d", x)


@pytest.mark.parametrize("x", [0.0, -0.0, -1e-45, -1.401298464324817e-45, -0.6931471805599453, -87.33654,
                               -math.inf, -3.4028234663852886e38, -2.0 ** -149])
def test_bits_round_trip_exactly(x):
    bits = crf.logprob_bits(x)
    assert _double_bits(crf.bits_value(bits)) == _double_bits(x)


def test_negative_zero_differs_from_zero_and_every_nan_is_one_pattern():
    assert crf.logprob_bits(-0.0) != crf.logprob_bits(0.0)
    quiet_nan = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000001))[0]
    assert crf.logprob_bits(math.nan) == crf.logprob_bits(quiet_nan) == crf.logprob_bits(-math.nan) == "nan"
    assert crf.logprob_bits(math.nan) != crf.logprob_bits(0.0)
    assert math.isnan(crf.bits_value("nan"))
    assert crf.logprob_bits(None) is None and crf.bits_value(None) is None
    assert crf.logprob_bits(-2) == (-2.0).hex()


@pytest.mark.parametrize("bad", [True, "0.5", [0.1]])
def test_a_logprob_that_is_not_a_number_is_refused(bad):
    with pytest.raises(ValueError, match="number or null"):
        crf.logprob_bits(bad)


def test_float32_logprobs_survive_json_and_neighbours_stay_apart():
    # What the server does: float32 values, written as JSON numbers; one float32 ulp apart must stay apart.
    f32 = [struct.unpack("<f", struct.pack("<f", v))[0] for v in (-0.1, -2.5e-3, -11.75, -1e-38)]
    nudged = [struct.unpack("<f", struct.pack("<I", struct.unpack("<I", struct.pack("<f", v))[0] + 1))[0] for v in f32]
    for v, w in zip(f32, nudged):
        back = json.loads(json.dumps(v))
        assert crf.logprob_bits(back) == crf.logprob_bits(v)
        assert crf.logprob_bits(json.loads(json.dumps(w))) != crf.logprob_bits(back)


# ---------------------------------------------------------------------------------------------------------------
# Hand-built results files


def _answer(ids, logprobs, verify=5):
    return {"text": "x", "output_ids": list(ids),
            "meta_info": {"output_token_logprobs": [[lp, t, None] for lp, t in zip(logprobs, ids)],
                          "spec_verify_ct": verify}}


def _samples(req_index: int, n: int, length: int):
    out = []
    for s in range(n):
        ids = [(7 * req_index + 3 * s + k) % 50 for k in range(length)]
        lps = [-(1 + req_index + s + k) / 8.0 for k in range(length)]
        out.append(crf.sample_record(_answer(ids, lps), length))
    return out


def _file(device="NVIDIA H100 80GB HBM3", length=6, algorithms=("DETSPEC_EAGLE", "DETSPEC_EAGLE_INVARIANT")):
    requests = [{"id": "r0", "text": "a", "n": 1}, {"id": "r1", "text": "b", "n": 4}, {"id": "r2", "text": "c", "n": 1}]
    results = {alg: {m: [_samples(i, r["n"], length) for i, r in enumerate(requests)] for m in crf.MODES}
               for alg in algorithms}
    return {"format": crf.FORMAT, "version": crf.FORMAT_VERSION, "environment": {"device": device},
            "settings": {"algorithms": list(algorithms), "graphs": "on", "max_new_tokens": length,
                         "models": {"target": "t", "draft": "d"}},
            "requests": requests, "results": results}


def _write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def _compare(capsys, a, b):
    code = cross_card.main(["compare", str(a), str(b)])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_identical_files_compare_equal(tmp_path, capsys):
    a = _write(tmp_path, "h100.json", _file())
    b = _write(tmp_path, "h200.json", _file(device="NVIDIA H200"))
    code, out, err = _compare(capsys, a, b)
    assert code == 0, out + err
    assert "DETSPEC_EAGLE: all 3 requests bit-identical" in out
    assert "DETSPEC_EAGLE_INVARIANT: all 3 requests bit-identical" in out
    assert "NVIDIA H200" in out and "SAME" in out


def test_one_flipped_logprob_bit_is_found_and_located(tmp_path, capsys):
    other = _file(device="NVIDIA H200")
    sample = other["results"]["DETSPEC_EAGLE_INVARIANT"]["concurrent"][1][2]
    original = crf.bits_value(sample["logprobs"][4])
    flipped = struct.unpack("<d", struct.pack("<Q", struct.unpack("<Q", struct.pack("<d", original))[0] ^ 1))[0]
    sample["logprobs"][4] = crf.logprob_bits(flipped)
    code, out, _ = _compare(capsys, _write(tmp_path, "a.json", _file()), _write(tmp_path, "b.json", other))
    assert code == 1
    assert "DETSPEC_EAGLE: all 3 requests bit-identical" in out
    assert "DETSPEC_EAGLE_INVARIANT: requests that differ, of 3: sequential 0 (tokens in 0), concurrent 1 (tokens in 0)" in out
    assert "request r1 (concurrent), sample 2, position 4: same token" in out
    assert original.hex() in out and flipped.hex() in out and "DIFFERENT" in out


def test_one_changed_token_is_found(tmp_path, capsys):
    other = _file()
    other["results"]["DETSPEC_EAGLE"]["sequential"][0][0]["output_ids"][3] += 1
    code, out, _ = _compare(capsys, _write(tmp_path, "a.json", _file()), _write(tmp_path, "b.json", other))
    assert code == 1
    assert "DETSPEC_EAGLE: requests that differ, of 3: sequential 1 (tokens in 1), concurrent 0 (tokens in 0)" in out
    ids = _file()["results"]["DETSPEC_EAGLE"]["sequential"][0][0]["output_ids"]
    assert f"request r0 (sequential), sample 0, position 3: token {ids[3]} vs {ids[3] + 1}" in out


def test_negative_zero_against_zero_is_a_difference(tmp_path, capsys):
    a, b = _file(), _file()
    a["results"]["DETSPEC_EAGLE"]["sequential"][2][0]["logprobs"][0] = crf.logprob_bits(0.0)
    b["results"]["DETSPEC_EAGLE"]["sequential"][2][0]["logprobs"][0] = crf.logprob_bits(-0.0)
    code, out, _ = _compare(capsys, _write(tmp_path, "a.json", a), _write(tmp_path, "b.json", b))
    assert code == 1 and "request r2 (sequential), sample 0, position 0" in out


def test_differing_verify_counts_are_reported_but_do_not_fail(tmp_path, capsys):
    other = _file()
    other["results"]["DETSPEC_EAGLE_INVARIANT"]["sequential"][0][0]["verify_steps"] = 9
    code, out, _ = _compare(capsys, _write(tmp_path, "a.json", _file()), _write(tmp_path, "b.json", other))
    assert code == 0
    assert "verify-step counts differ in 1 request(s)" in out


def test_another_request_set_is_refused(tmp_path, capsys):
    other = _file()
    other["requests"][1]["text"] = "another prompt"
    code, out, err = _compare(capsys, _write(tmp_path, "a.json", _file()), _write(tmp_path, "b.json", other))
    assert code == 2 and out == ""
    assert "different request sets" in err and "first difference at request 1" in err and "Traceback" not in err


@pytest.mark.parametrize("key, value", [("graphs", "off"), ("max_new_tokens", 6), ("models", {"target": "x", "draft": "d"})])
def test_other_settings_are_refused(tmp_path, capsys, key, value):
    other = _file()
    if key == "max_new_tokens":  # the same lengths, another declared setting
        other["settings"][key] = 7
        for alg in other["results"].values():
            for rows in alg.values():
                for samples in rows:
                    for s in samples:
                        s["output_ids"].append(0)
                        s["logprobs"].append(None)
    else:
        other["settings"][key] = value
    code, _, err = _compare(capsys, _write(tmp_path, "a.json", _file()), _write(tmp_path, "b.json", other))
    assert code == 2 and f"settings.{key}" in err


def _break(data, how):
    if how == "format":
        data["format"] = "something else"
    elif how == "version":
        data["version"] = 99
    elif how == "no_requests":
        del data["requests"]
    elif how == "duplicate_ids":
        data["requests"][2]["id"] = "r0"
    elif how == "missing_algorithm":
        del data["results"]["DETSPEC_EAGLE"]
    elif how == "short_mode":
        data["results"]["DETSPEC_EAGLE"]["concurrent"].pop()
    elif how == "wrong_n":
        data["results"]["DETSPEC_EAGLE"]["sequential"][1].pop()
    elif how == "bad_hex":
        data["results"]["DETSPEC_EAGLE"]["sequential"][0][0]["logprobs"][1] = "-0.25"
    elif how == "float_logprob":
        data["results"]["DETSPEC_EAGLE"]["sequential"][0][0]["logprobs"][1] = -0.25
    elif how == "short_sample":
        data["results"]["DETSPEC_EAGLE"]["sequential"][1][3]["logprobs"].pop()
    elif how == "string_id":
        data["results"]["DETSPEC_EAGLE"]["sequential"][0][0]["output_ids"][1] = "5"
    return data


MALFORMED = {
    "format": '"format"', "version": '"version"', "no_requests": '"requests"', "duplicate_ids": "not unique",
    "missing_algorithm": '"results.DETSPEC_EAGLE" missing', "short_mode": '"results.DETSPEC_EAGLE.concurrent"',
    "wrong_n": "n = 4 samples", "bad_hex": "float.hex strings", "float_logprob": "float.hex strings",
    "string_id": "output_ids must be integers", "short_sample": "max_new_tokens = 6 output_ids and logprobs",
}


@pytest.mark.parametrize("how", sorted(MALFORMED))
def test_malformed_files_are_refused_naming_the_field(tmp_path, capsys, how):
    bad = _write(tmp_path, "bad.json", _break(_file(), how))
    code, out, err = _compare(capsys, _write(tmp_path, "good.json", _file()), bad)
    assert code == 2 and out == ""
    assert str(bad) in err and MALFORMED[how] in err and "Traceback" not in err


def test_unreadable_and_non_json_files_are_refused(tmp_path, capsys):
    good = _write(tmp_path, "good.json", _file())
    code, _, err = _compare(capsys, good, tmp_path / "missing.json")
    assert code == 2 and "cannot read it" in err
    broken = tmp_path / "broken.json"
    broken.write_text('{"format": ')
    code, _, err = _compare(capsys, broken, good)
    assert code == 2 and "not JSON" in err
    code, _, err = _compare(capsys, _write(tmp_path, "list.json", [1, 2]), good)
    assert code == 2 and "not a JSON object" in err


def test_a_gzip_compressed_file_compares_like_its_json(tmp_path, capsys):
    import gzip

    plain = _write(tmp_path, "h200.json", _file(device="NVIDIA H200"))
    packed = tmp_path / "h100.json.gz"
    packed.write_bytes(gzip.compress(json.dumps(_file()).encode()))
    code, out, err = _compare(capsys, packed, plain)
    assert code == 0 and "SAME" in out, out + err
    flipped = _file()
    flipped["results"]["DETSPEC_EAGLE"]["sequential"][0][0]["output_ids"][0] += 1
    packed.write_bytes(gzip.compress(json.dumps(flipped).encode()))
    code, out, err = _compare(capsys, packed, plain)
    assert code == 1, out + err  # control: the compressed file's contents are really compared
    not_gzip = tmp_path / "plain.json.gz"
    not_gzip.write_text(json.dumps(_file()))
    code, _, err = _compare(capsys, not_gzip, plain)
    assert code == 2 and "plain.json.gz" in err


# ---------------------------------------------------------------------------------------------------------------
# Answers, the request set, the servers


def test_sample_record_reads_a_generate_answer_and_refuses_short_ones():
    rec = crf.sample_record(_answer([4, 5], [-0.5, -0.0], verify=2), 2)
    assert rec == {"output_ids": [4, 5], "logprobs": [(-0.5).hex(), (-0.0).hex()], "verify_steps": 2}
    with pytest.raises(ValueError, match="expected 3 output_ids"):
        crf.sample_record(_answer([4, 5], [-0.5, -0.1]), 3)
    no_logprobs = _answer([4, 5], [-0.5, -0.1])
    del no_logprobs["meta_info"]["output_token_logprobs"]
    with pytest.raises(ValueError, match="return_logprob"):
        crf.sample_record(no_logprobs, 2)


def test_parse_answer_takes_n_samples_and_names_the_request(monkeypatch):
    monkeypatch.setattr(cross_card, "MAX_NEW_TOKENS", 2)
    req = {"id": "p0-v0-s7-n4", "n": 4}
    answers = [_answer([i, i + 1], [-0.5, -0.25]) for i in range(4)]
    assert [s["output_ids"][0] for s in cross_card.parse_answer(req, answers)] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="p0-v0-s7-n4: 3 answers, expected n = 4"):
        cross_card.parse_answer(req, answers[:3])
    with pytest.raises(ValueError, match="p0-v0-s7-n4: expected 2 output_ids"):
        cross_card.parse_answer({"id": "p0-v0-s7-n4", "n": 1}, _answer([1], [-0.5]))


def test_the_request_set_covers_the_issue_and_is_seeded():
    reqs = cross_card.request_set()
    assert reqs == cross_card.request_set()  # fixed: two cards send the same requests
    assert len({r["id"] for r in reqs}) == len(reqs)
    params = [r["sampling_params"] for r in reqs]
    assert {p["temperature"] for p in params} == {1.0, 0.7}
    assert any("top_p" in p for p in params) and any("top_k" in p for p in params)
    assert {p["n"] for p in params} == {1, 4} and all(r["n"] == r["sampling_params"]["n"] for r in reqs)
    assert all(isinstance(p["sampling_seed"], int) and p["ignore_eos"] for p in params)
    assert {p["max_new_tokens"] for p in params} == {48}
    assert len({r["text"] for r in reqs}) >= 3 and len({p["sampling_seed"] for p in params}) >= 2
    assert cross_card.payload(reqs[0])["return_logprob"] is True


def _flag(args, flag):
    return args[len(args) - 1 - args[::-1].index(flag) + 1]  # the last value: SGLang's parser keeps it


def test_server_args_per_algorithm_and_graphs():
    t, d = Path("/m/target"), Path("/m/draft")
    eagle = cross_card.server_args(t, d, "DETSPEC_EAGLE", "on")
    assert _flag(eagle, "--speculative-algorithm") == "DETSPEC_EAGLE" and "--enable-deterministic-inference" in eagle
    assert _flag(eagle, "--speculative-draft-model-path") == str(d) and _flag(eagle, "--model-path") == str(t)
    assert _flag(eagle, "--cuda-graph-max-bs-decode") == "32" and "disabled" not in eagle
    inv = cross_card.server_args(t, d, "DETSPEC_EAGLE_INVARIANT", "off")
    assert _flag(inv, "--speculative-algorithm") == "DETSPEC_EAGLE_INVARIANT"
    assert _flag(inv, "--cuda-graph-backend-decode") == "disabled"
    plain = cross_card.server_args(t, d, "NONE", "on")
    assert "--enable-deterministic-inference" in plain and not any(a.startswith("--speculative") for a in plain)


class _Handler(BaseHTTPRequestHandler):
    delay = 0.0
    malformed_seed = None

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        time.sleep(self.delay)
        sp = body["sampling_params"]
        length = sp["max_new_tokens"] if sp["sampling_seed"] != self.malformed_seed else 1
        answers = [_answer([(sp["sampling_seed"] + s + k) % 97 for k in range(length)], [-0.5] * length)
                   for s in range(sp["n"])]
        data = json.dumps(answers if sp["n"] > 1 else answers[0]).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *a):
        pass


class _FakeServer:
    def __init__(self, **attrs):
        handler = type("H", (_Handler,), attrs)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def _small_set():
    return [r for r in cross_card.request_set() if r["text"] == cross_card.PROMPTS[0]][:6]


def test_collect_sends_both_modes_and_keeps_request_order(capsys):
    reqs = _small_set()
    with _FakeServer() as srv:
        got = cross_card.collect(srv, reqs, "DETSPEC_EAGLE", timeout=30)
    assert set(got) == set(crf.MODES)
    for mode in crf.MODES:
        assert [len(s) for s in got[mode]] == [r["n"] for r in reqs]
        assert [s[0]["output_ids"][0] for s in got[mode]] == [r["sampling_params"]["sampling_seed"] % 97 for r in reqs]
    assert cross_card.modes_differ(reqs, got, "DETSPEC_EAGLE") == []
    got["concurrent"][2][0]["output_ids"][5] += 1
    assert [d.request for d in cross_card.modes_differ(reqs, got, "DETSPEC_EAGLE")] == [reqs[2]["id"]]
    assert "DETSPEC_EAGLE: 6/6 one at a time" in capsys.readouterr().out


def test_collect_names_a_malformed_answer_and_times_out_a_slow_server():
    reqs = _small_set()
    with _FakeServer(malformed_seed=reqs[0]["sampling_params"]["sampling_seed"]) as srv:
        with pytest.raises(ValueError, match=f"request {reqs[0]['id']}: expected 48 output_ids"):
            cross_card.collect(srv, reqs, "DETSPEC_EAGLE", timeout=30)
    with _FakeServer(delay=3.0) as srv:
        t0 = time.time()
        with pytest.raises(OSError):  # socket timeouts are OSErrors: record() reports them and exits 2
            cross_card.collect(srv, reqs[:1], "DETSPEC_EAGLE", timeout=0.5)
        assert time.time() - t0 < 3.0


# ---------------------------------------------------------------------------------------------------------------
# Arguments


@pytest.mark.parametrize("argv, message", [
    (["record"], "--out"),
    (["record", "--out", "x.json", "--algorithms", "EAGLE"], "--algorithms: unknown 'EAGLE'"),
    (["record", "--out", "x.json", "--algorithms", ","], "--algorithms is empty"),
    (["record", "--out", "x.json", "--algorithms", "NONE,NONE"], "names an algorithm twice"),
    (["record", "--out", "x.json", "--graphs", "maybe"], "--graphs"),
    (["record", "--out", "x.json", "--start-timeout", "0"], "--start-timeout must be a positive"),
    (["record", "--out", "x.json", "--request-timeout", "-1"], "--request-timeout must be a positive"),
    (["compare", "a.json"], "required: b"),
    ([], "required: command"),
])
def test_bad_arguments_exit_2_naming_the_flag(capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        cross_card.parse_args(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_out_must_not_be_a_directory(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cross_card.parse_args(["record", "--out", str(tmp_path)])
    assert e.value.code == 2 and "is a directory" in capsys.readouterr().err


def test_compare_with_is_checked_before_any_gpu_time(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    with pytest.raises(SystemExit) as e:
        cross_card.parse_args(["record", "--out", str(tmp_path / "o.json"), "--compare-with", str(bad)])
    assert e.value.code == 2 and "--compare-with" in capsys.readouterr().err
    # A well-formed file of other requests (the hand-built one) is refused too.
    other = _write(tmp_path, "other.json", _file())
    with pytest.raises(SystemExit) as e:
        cross_card.parse_args(["record", "--out", str(tmp_path / "o.json"), "--compare-with", str(other)])
    assert e.value.code == 2 and "record with the same ones" in capsys.readouterr().err


def test_record_refuses_without_a_gpu(tmp_path, capsys):
    from sglang_detspec import server_process

    if server_process.launch_skip_reason() is None:
        pytest.skip("a GPU with sglang is here: record would really run")
    code = cross_card.main(["record", "--out", str(tmp_path / "o.json")])
    assert code == 2 and "cross_card record:" in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()


def test_the_script_runs_help_without_torch_or_sglang():
    probe = (
        "import runpy, sys\n"
        "sys.argv = ['cross_card.py', 'record', '--help']\n"
        "try:\n"
        f"    runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "print('heavy:', sorted(m for m in ('torch', 'sglang', 'numpy') if m in sys.modules))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert "--compare-with" in out.stdout and "heavy: []" in out.stdout



def test_plugin_commit_names_this_checkout():
    commit = cross_card.plugin_commit()
    if not (REPO / ".git").exists():
        assert commit is None
        return
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert commit in (head, head + "+dirty")
