"""scripts/run_sglang_harness.py on CPU: its parser of SGLang's determinism harness output, its verdicts, and the
real installed harness (``sglang.test.test_deterministic``) plus ``scripts/sglang_harness_mixed.py`` run against
a small fake batched server.

The constructed outputs below follow the harness's print statements, quoted beside each one; the expected counts
are the numbers written into that text, never recomputed with the parser's own patterns.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import io
import itertools
import json
import os
import random
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


rh = _load("run_sglang_harness", ROOT / "scripts" / "run_sglang_harness.py")
mixed = _load("sglang_harness_mixed", ROOT / "scripts" / "sglang_harness_mixed.py")


def counts(groups):
    return [(g.samples, g.unique) for g in groups]


# ------------------------------------------------------------------------------------------------------------
# single mode


def single_output(texts, total, unique):
    lines = []
    for i, text in enumerate(texts, start=1):
        # test_deterministic.py:468: print(f"Trial {i} with batch size {batch_size}: {text}")  (batch_size == i)
        lines.append(f"Trial {i} with batch size {i}: {text}")
    # test_deterministic.py:470: print(f"Total samples: {len(texts)}, Unique samples: {len(set(texts))}")
    lines.append(f"Total samples: {total}, Unique samples: {unique}")
    return "\n".join(lines) + "\n"


def test_single_mode_counts():
    out = single_output(["a b c"] * 3 + ["a b d"] * 2, total=5, unique=2)
    assert counts(rh.parse_unique_counts("single", out, n_trials=5)) == [(5, 2)]


def test_single_mode_generated_text_cannot_fake_a_summary_line():
    # The harness replaces only "\n" in a trial's text; \r, \x1c and \u2028 stay inside the trial's line.
    texts = ["x\rTotal samples: 9, Unique samples: 9", "y\u2028Total samples: 9, Unique samples: 9",
             "z\x1cTotal samples: 9, Unique samples: 9"]
    out = single_output(texts, total=3, unique=3)
    assert counts(rh.parse_unique_counts("single", out, n_trials=3)) == [(3, 3)]


def test_single_mode_crash_is_an_error_showing_the_raw_text():
    # What 0.5.17's single mode prints when the server answers 400: send_single prints the error body
    # (test_deterministic.py:168, print(f"Error: {ret}")) and returns None, and text.replace then raises.
    out = "Error: {'error': {'message': 'The input is too long'}}\n"
    with pytest.raises(rh.HarnessParseError) as exc:
        rh.parse_unique_counts("single", out, n_trials=4)
    assert "The input is too long" in str(exc.value)
    assert "found 0" in str(exc.value)


def test_single_mode_two_summaries_are_ambiguous():
    out = single_output(["a"], total=1, unique=1) + "Total samples: 1, Unique samples: 1\n"
    with pytest.raises(rh.HarnessParseError, match="found 2"):
        rh.parse_unique_counts("single", out, n_trials=1)


def test_single_mode_total_must_match_the_trials_asked_for():
    out = single_output(["a"] * 4, total=4, unique=1)
    with pytest.raises(rh.HarnessParseError, match="count 4 samples"):
        rh.parse_unique_counts("single", out, n_trials=5)


def test_more_unique_outputs_than_samples_is_an_error():
    out = single_output(["a", "b"], total=2, unique=3)
    with pytest.raises(rh.HarnessParseError, match="impossible"):
        rh.parse_unique_counts("single", out, n_trials=2)


# ------------------------------------------------------------------------------------------------------------
# prefix mode

PREFIX_LENGTHS = [1, 511, 2048, 4097]  # test_deterministic.py:475: len_prefix = [1, 511, 2048, 4097]


def prefix_output(per_trial, summary):
    """per_trial: for each trial, the number of rows of each prefix; summary: (samples, unique) per prefix."""
    lines = []
    for i, rows in enumerate(per_trial, start=1):
        # test_deterministic.py:489-492: msg = f"Testing Trial {i} with batch size {batch_size},"
        #                                msg += f" # prefix length {len_prefix[i]}: {len(ret_dict[i])},"
        lines.append(f"Testing Trial {i} with batch size {sum(rows)}," +
                     "".join(f" # prefix length {n}: {r}," for n, r in zip(PREFIX_LENGTHS, rows)))
    for i, (samples, unique) in enumerate(summary):
        # test_deterministic.py:503-505: f"Prompt {i} with prefix length {len_prefix[i]}: total samples:
        #                                {len(outputs[i])}, Unique samples: {len(set(outputs[i]))}"
        lines.append(f"Prompt {i} with prefix length {PREFIX_LENGTHS[i]}: total samples: {samples}, "
                     f"Unique samples: {unique}")
    return "\n".join(lines) + "\n"


def test_prefix_mode_counts_each_prefix():
    per_trial = [[1, 0, 0, 0], [0, 1, 1, 0], [1, 0, 1, 1]]  # batch sizes 1, 2, 3
    out = prefix_output(per_trial, [(2, 1), (1, 1), (2, 2), (1, 1)])
    groups = rh.parse_unique_counts("prefix", out, n_trials=3)
    assert counts(groups) == [(2, 1), (1, 1), (2, 2), (1, 1)]
    assert [g.label for g in groups] == ["prefix 1 chars", "prefix 511 chars", "prefix 2048 chars", "prefix 4097 chars"]


def test_prefix_mode_trial_lines_are_not_summaries():
    out = prefix_output([[1, 0, 0, 0]], [])
    with pytest.raises(rh.HarnessParseError, match=r"found indices \[\]"):
        rh.parse_unique_counts("prefix", out, n_trials=1)


def test_prefix_mode_missing_prompt_is_an_error():
    out = prefix_output([[1, 0, 0, 0], [0, 1, 1, 0]], [(1, 1), (1, 1), (1, 1), (0, 0)])
    lines = [line for line in out.split("\n") if not line.startswith("Prompt 1 ")]
    with pytest.raises(rh.HarnessParseError, match=r"found indices \[0, 2, 3\]"):
        rh.parse_unique_counts("prefix", "\n".join(lines), n_trials=2)


def test_prefix_mode_totals_must_add_up():
    # Batch sizes 1 + 2 + 3 = 6 rows, but the summaries count 5.
    out = prefix_output([[1, 0, 0, 0], [0, 1, 1, 0], [1, 0, 1, 1]], [(2, 1), (1, 1), (1, 1), (1, 1)])
    with pytest.raises(rh.HarnessParseError, match="count 5 samples, 3 trials give 6"):
        rh.parse_unique_counts("prefix", out, n_trials=3)


# ------------------------------------------------------------------------------------------------------------
# mixed mode (scripts/sglang_harness_mixed.py)


def mixed_output(summary):
    lines = ["Testing Trial 1 with batch size 1, number of prompt 1: 1, number of prompt 2: 0, "
             "number of long prompt: 0"]
    for label, (samples, unique) in zip(("Prompt 1", "Prompt 2", "Long prompt"), summary):
        # sglang_harness_mixed.py: print(f"{label}: total samples: {len(texts)}, Unique samples: {len(set(texts))}")
        lines.append(f"{label}: total samples: {samples}, Unique samples: {unique}")
    return "\n".join(lines) + "\n"


def test_mixed_mode_counts_each_prompt_kind():
    out = mixed_output([(4, 1), (1, 1), (1, 1)])  # batch sizes 1, 2, 3: 6 rows
    assert counts(rh.parse_unique_counts("mixed", out, n_trials=3)) == [(4, 1), (1, 1), (1, 1)]


def test_mixed_mode_missing_kind_is_an_error():
    out = mixed_output([(5, 1), (1, 1)])
    with pytest.raises(rh.HarnessParseError, match="Long prompt"):
        rh.parse_unique_counts("mixed", out, n_trials=3)


def test_mixed_batch_composition():
    rng = random.Random(5)
    seen_long = 0
    for batch_size in range(1, 40):
        p1, p2, n_long = mixed.batch_composition(rng, batch_size, max_long=3)
        assert p1 + p2 + n_long == batch_size
        assert p1 >= 1 and p2 >= 0 and 0 <= n_long <= 3
        seen_long += n_long
    assert mixed.batch_composition(random.Random(0), 1, max_long=3) == (1, 0, 0)
    assert seen_long > 0


# ------------------------------------------------------------------------------------------------------------
# The harness's --help, verdicts and the table

# The usage line of `python -m sglang.test.test_deterministic --help` on sglang 0.5.17 and 0.5.23.
HELP_0517 = """usage: test_deterministic.py [-h] [--host HOST] [--port PORT]
                             [--test-mode {single,prefix,radix_cache,p_vs_d}]
                             [--profile] [--profile-steps PROFILE_STEPS]
"""


def test_harness_modes_from_help():
    assert rh.harness_modes(HELP_0517) == ["single", "prefix", "radix_cache", "p_vs_d"]
    with pytest.raises(rh.HarnessParseError):
        rh.harness_modes("Traceback (most recent call last):\nModuleNotFoundError: No module named 'requests'\n")


def run(server, mode, *groups, error=None):
    return rh.Run(server, mode, [], "", groups=[rh.Group(f"g{i}", s, u) for i, (s, u) in enumerate(groups)],
                  error=error)


D, C = rh.DETSPEC_SERVER, rh.CONTROL_SERVER


def test_exit_code_passes_only_with_deterministic_detspec_and_a_varying_control():
    good = [run(D, "single", (16, 1)), run(D, "prefix", (20, 1), (1, 1), (0, 0)), run(C, "single", (16, 16)),
            run(C, "prefix", (20, 1))]
    assert rh.overall_exit(good) == 0
    # The control never varied: the run could not have failed, so it proves nothing.
    assert rh.overall_exit([good[0], good[1], run(C, "single", (16, 1))]) == 1
    # DETSPEC gave two outputs for one prompt.
    assert rh.overall_exit([run(D, "single", (16, 1)), run(D, "prefix", (20, 2), (5, 1)), good[2]]) == 1
    # A run that did not complete beats every verdict.
    assert rh.overall_exit(good + [run(D, "mixed", error="timed out")]) == 2


def test_a_prompt_sampled_once_compares_nothing():
    assert not rh.is_deterministic([rh.Group("a", 1, 1), rh.Group("b", 0, 0)])
    assert rh.is_deterministic([rh.Group("a", 1, 1), rh.Group("b", 2, 1)])


def test_table_shows_every_run_and_its_verdict():
    table = rh.format_table([run(D, "single", (16, 1)), run(C, "single", (16, 9)), run(C, "prefix", error="exit 1")])
    lines = table.split("\n")
    assert len(lines) == 5  # header, rule, three runs
    assert "1/16" in lines[2] and "PASS" in lines[2]
    assert "9/16" in lines[3] and "varies" in lines[3]
    assert "ERROR" in lines[4] and "exit 1" in lines[4]


def test_help_imports_neither_torch_nor_sglang():
    code = ("import runpy, sys\n"
            "sys.argv = ['run_sglang_harness.py', '--help']\n"
            "try:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
            "except SystemExit as e:\n    assert e.code == 0\n"
            # The script imports the package's server launcher (standard library only), never its SGLang layer.
            "heavy = [m for m in ('torch', 'sglang', 'triton', 'sglang_detspec.integration') if m in sys.modules]\n"
            "assert not heavy, heavy\nprint('OK')\n")
    # the checkout's package, whichever one this Python has installed (scripts import the installed package)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT / "scripts", capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "--prefix-trials" in proc.stdout and proc.stdout.rstrip().endswith("OK")


# ------------------------------------------------------------------------------------------------------------
# The real harness against a fake batched server (needs sglang installed). One run goes through run_one's
# subprocess, as on the GPU machine; the others run the same command lines in this process, since importing
# sglang costs ~10 s of CPU per process.

needs_sglang = pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="needs sglang installed")


class BatchedFake:
    """Answers /generate for a text or a list of texts, as SGLang does, and /flush_cache. ``varying``: every
    output differs (a global counter); otherwise an output depends on the prompt, seed and temperature only."""

    def __init__(self, varying: bool):
        self.varying = varying
        self.counter = itertools.count()
        self.batches = []
        self.texts = []  # every prompt received, in order

    def output(self, text: str, sp: dict) -> dict:
        key = [text, sp.get("sampling_seed"), sp["temperature"], sp["max_new_tokens"]]
        if self.varying:
            key.append(next(self.counter))
        digest = hashlib.sha256(json.dumps(key).encode()).hexdigest()
        return {"text": f" tok{digest[:8]}\nline two {digest[8:12]}", "meta_info": {"completion_tokens": 3}}

    def __enter__(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/flush_cache":
                    return self.reply(200, b"Cache flushed.\n", "text/plain")
                req = json.loads(body)
                texts = req["text"] if isinstance(req["text"], list) else [req["text"]]
                fake.batches.append(len(texts))
                fake.texts.extend(texts)
                outs = [fake.output(t, req["sampling_params"]) for t in texts]
                self.reply(200, json.dumps(outs if isinstance(req["text"], list) else outs[0]).encode())

            def reply(self, code, data, ctype="application/json"):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.port = self.server.server_address[1]
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


ARGS = argparse.Namespace(temperature=1.0, sampling_seed=7, max_new_tokens=3, n_trials=4, prefix_trials=4,
                          run_timeout=120)


def in_process(mode: str, varying: bool):
    """Run harness_command(mode)'s command line in this process; return (stdout, batch sizes served)."""
    with BatchedFake(varying) as fake:
        cmd = rh.harness_command(mode, fake.port, ARGS)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            if cmd[1] == "-m":
                # The module's __main__ block (runpy cannot run it under pytest, whose import hook claims
                # every test_*.py): parse the command line with its BenchArgs, then call test_deterministic.
                harness = importlib.import_module(cmd[2])
                parser = argparse.ArgumentParser()
                harness.BenchArgs.add_cli_args(parser)
                harness.test_deterministic(parser.parse_args(cmd[3:]))
            else:
                assert cmd[1] == str(rh.MIXED_SCRIPT)
                assert mixed.main(cmd[2:]) == 0
    return out.getvalue(), fake


@needs_sglang
def test_real_harness_single_mode_through_run_one(tmp_path):
    with BatchedFake(varying=False) as fake:
        server = rh.server_process.Server(rh.server_process.ServerSpec(D, []), fake.port, tmp_path / "server.log")
        result = rh.run_one(server, "single", ARGS, tmp_path)  # never started: its log_text is ""
    assert result.error is None, result.error
    assert counts(result.groups) == [(4, 1)]
    assert fake.batches == [1, 2, 3, 4]  # the harness's batch sizes 1..n_trials
    assert result.verdict.startswith("PASS")
    assert "Total samples: 4, Unique samples: 1" in Path(result.log).read_text()


@needs_sglang
def test_real_harness_single_mode_on_a_varying_server():
    stdout, fake = in_process("single", varying=True)
    assert counts(rh.parse_unique_counts("single", stdout, n_trials=4)) == [(4, 4)]
    assert fake.batches == [1, 2, 3, 4]


@needs_sglang
def test_real_harness_prefix_mode():
    stdout, fake = in_process("prefix", varying=False)
    groups = rh.parse_unique_counts("prefix", stdout, n_trials=4)
    assert len(groups) == 4 and sum(g.samples for g in groups) == 1 + 2 + 3 + 4
    assert all(g.unique == (1 if g.samples else 0) for g in groups)
    assert fake.batches == [1, 2, 3, 4]


@needs_sglang
def test_mixed_adaptation_through_the_real_harness():
    from sglang.test import test_deterministic as harness

    stdout, fake = in_process("mixed", varying=False)
    groups = rh.parse_unique_counts("mixed", stdout, n_trials=4)
    assert [g.label for g in groups] == ["Prompt 1", "Prompt 2", "Long prompt"]
    # Each kind's samples are the rows the server really received with that prompt, and a deterministic
    # server gives each kind one output (a row counted under the wrong kind would make two).
    kinds = [harness.PROMPT_1, harness.PROMPT_2, harness.LONG_PROMPT[:16000]]
    assert set(fake.texts) <= set(kinds)
    assert [g.samples for g in groups] == [fake.texts.count(k) for k in kinds]
    assert [g.unique for g in groups] == [1 if g.samples else 0 for g in groups]
    assert fake.batches == [1, 2, 3, 4]
