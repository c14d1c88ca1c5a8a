"""``sglang-detspec serve``: the launch command it builds, its dry run through SGLang's own resolution (the
plugin's refusals included), its refusal without a GPU, signal forwarding."""

import argparse
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from sglang_detspec.models.tiny_models import ensure_tiny_models

HAS_CUDA = torch.cuda.is_available()


def cli(*args, env=None, timeout=120):
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_detspec", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def split_dry_run(stdout: str):
    """``env [-u X] [K=V ...] python -m sglang.launch_server ARGS`` -> (env assignments, unset names, ARGS)."""
    words = shlex.split(stdout.strip())
    assign, unset = {}, set()
    if words[0] == "env":
        words = words[1:]
        while words[0] == "-u":
            unset.add(words[1])
            words = words[2:]
        while "=" in words[0] and not words[0].startswith("/"):
            k, v = words[0].split("=", 1)
            assign[k] = v
            words = words[1:]
    assert words[:3] == [sys.executable, "-m", "sglang.launch_server"], words[:3]
    return assign, unset, words[3:]


def opt(args, flag):
    """Value of ``flag`` in an argv list; asserts it occurs exactly once."""
    assert args.count(flag) == 1, (flag, args)
    return args[args.index(flag) + 1]


@pytest.mark.skipif(HAS_CUDA, reason="checks the refusal on a machine without a CUDA GPU")
def test_serve_refuses_cleanly_without_gpu():
    proc = cli("serve")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "CUDA GPU" in lines[0] and "demo" in lines[0]
    assert proc.stdout == ""


@pytest.mark.parametrize("pair", ["weighted", "dummy"])
def test_dry_run_tiny_models(tmp_path, pair):
    args = ["--tiny-pair", pair] if pair == "dummy" else []  # weighted is the default
    proc = cli("serve", "--dry-run", "--tiny-models-dir", str(tmp_path), *args, env={"TRITON_INTERPRET": "1"})
    assert proc.returncode == 0, proc.stderr
    assign, unset, args = split_dry_run(proc.stdout)
    models = ensure_tiny_models(tmp_path, pair=pair)  # already built by the command: same directories
    assert opt(args, "--model-path") == str(models.target)
    assert opt(args, "--speculative-draft-model-path") == str(models.eagle_draft)
    assert opt(args, "--speculative-algorithm") == "DETSPEC_EAGLE"
    assert args.count("--enable-deterministic-inference") == 1
    assert opt(args, "--speculative-num-steps") == "3"
    assert opt(args, "--speculative-eagle-topk") == "1"
    assert opt(args, "--speculative-num-draft-tokens") == "4"
    assert opt(args, "--attention-backend") == "triton"
    assert opt(args, "--port") == "30000"
    # Long prompts are chunked beside the probe: 16,384 positions (what the configs declare, so no override
    # switch), chunks of 4096, the triton backend's deterministic prefill alignment.
    assert opt(args, "--context-length") == "16384" and args.count("--context-length") == 1
    assert opt(args, "--chunked-prefill-size") == "4096"
    assert "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN" not in assign
    if pair == "dummy":
        assert opt(args, "--load-format") == "dummy"
        assert opt(args, "--speculative-draft-load-format") == "dummy"
    else:  # real (generated) weights, loaded with SGLang's default format
        assert "--load-format" not in args and "--speculative-draft-load-format" not in args
        assert list(models.target.glob("*.safetensors")), "the weighted pair has weight files"
    # Offline: the tiny models have a local tokenizer; the GPU server must not be interpreted.
    assert assign.get("HF_HUB_OFFLINE") == "1"
    assert "TRITON_INTERPRET" in unset
    assert (models.target / "tokenizer.json").is_file()
    # SGLang resolved the command with the plugin (the dry run is the real resolution).
    assert "with sglang-detspec resolves" in proc.stderr
    assert ("algorithm DETSPEC_EAGLE, steps 3, topk 1, draft tokens 4, rejection sampling on, "
            "deterministic inference on, attention backend triton") in proc.stderr


def test_dry_run_eagle3_and_passthrough(tmp_path):
    proc = cli("serve", "--dry-run", "--tiny-models-dir", str(tmp_path), "--algorithm", "DETSPEC_EAGLE3",
               "--port", "31234", "--mem-fraction-static", "0.5", "--", "--log-level", "warning")
    assert proc.returncode == 0, proc.stderr
    _, _, args = split_dry_run(proc.stdout)
    models = ensure_tiny_models(tmp_path, pair="weighted")
    assert opt(args, "--speculative-draft-model-path") == str(models.eagle3_draft)
    assert opt(args, "--speculative-algorithm") == "DETSPEC_EAGLE3"
    assert opt(args, "--port") == "31234"
    # A passed-through flag replaces the default instead of appearing twice.
    assert opt(args, "--mem-fraction-static") == "0.5"
    assert args[-2:] == ["--log-level", "warning"]
    assert "algorithm DETSPEC_EAGLE3, steps 3, topk 1, draft tokens 4, rejection sampling on" in proc.stderr


def test_dry_run_user_model(tmp_path):
    # The tiny pair's directories stand in for the user's models: the dry run reads their config.json.
    models = ensure_tiny_models(tmp_path, pair="dummy")
    proc = cli("serve", "--dry-run", "--model-path", str(models.target), "--draft-model-path", str(models.eagle_draft),
               "--attention-backend", "fa3", "--", "--tp", "2", env={"SGLANG_PLUGINS": "other"})
    assert proc.returncode == 0, proc.stderr
    assign, _, args = split_dry_run(proc.stdout)
    assert opt(args, "--model-path") == str(models.target)
    assert opt(args, "--speculative-draft-model-path") == str(models.eagle_draft)
    assert opt(args, "--attention-backend") == "fa3"
    assert "--load-format" not in args and "--mem-fraction-static" not in args
    assert args[-2:] == ["--tp", "2"]
    assert "HF_HUB_OFFLINE" not in assign
    # SGLANG_PLUGINS filters entry points: ours must stay in the list or DETSPEC_EAGLE is unknown.
    assert assign["SGLANG_PLUGINS"] == "other,detspec"
    assert "attention backend fa3" in proc.stderr


def test_dry_run_refuses_what_the_plugin_refuses(tmp_path):
    proc = cli("serve", "--dry-run", "--tiny-models-dir", str(tmp_path), "--tiny-pair", "dummy", "--topk", "2")
    assert proc.returncode == 2
    assert proc.stdout == ""  # no command to copy: a launch would fail the same way
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("sglang-detspec serve: error: sglang-detspec refuses the launch: ")
    assert "--speculative-eagle-topk 2" in last


def test_dry_run_draft_tokens_follow_the_steps(tmp_path):
    proc = cli("serve", "--dry-run", "--tiny-models-dir", str(tmp_path), "--tiny-pair", "dummy", "--num-steps", "5")
    assert proc.returncode == 0, proc.stderr
    _, _, args = split_dry_run(proc.stdout)
    assert opt(args, "--speculative-num-steps") == "5"
    assert opt(args, "--speculative-num-draft-tokens") == "6"
    assert "steps 5, topk 1, draft tokens 6" in proc.stderr and "note: SGLang resolves" not in proc.stderr
    # An explicit value off the chain is refused (SGLang alone would quietly reset it to steps + 1).
    proc = cli("serve", "--dry-run", "--tiny-models-dir", str(tmp_path), "--tiny-pair", "dummy",
               "--num-draft-tokens", "7")
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("sglang-detspec serve: error: sglang-detspec refuses the launch: ")
    assert "--speculative-num-draft-tokens 7" in last and "--speculative-num-steps 3" in last


@pytest.mark.parametrize("args, message", [
    (["--port", "99999"], "--port 99999: a TCP port is an integer in 1..65535"),
    (["--port", "0"], "--port 0: a TCP port is an integer in 1..65535"),
    (["--port", "-1"], "--port -1: a TCP port is an integer in 1..65535"),
    (["--", "--port", "70000"], "--port 70000: a TCP port is an integer in 1..65535"),
    (["--mem-fraction-static", "2"], "--mem-fraction-static 2: a fraction of the GPU's memory, 0 < x <= 1"),
    (["--mem-fraction-static", "0"], "--mem-fraction-static 0: a fraction of the GPU's memory, 0 < x <= 1"),
    (["--model-path", "/nonexistent"], "--model-path /nonexistent: no such file or directory"),
    (["--model-path", "./no/such/dir"], "--model-path ./no/such/dir: no such file or directory"),
])
def test_values_no_launch_can_use_are_one_line_naming_the_flag(tmp_path, args, message):
    # Checked when the command is built, before SGLang is imported: the same for --dry-run and a launch.
    proc = cli("serve", "--dry-run", "--tiny-models-dir", str(tmp_path), "--tiny-pair", "dummy", *args)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(f"sglang-detspec serve: error: {message}"), proc.stderr


def test_a_flag_sglang_rejects_is_one_line_not_its_usage(tmp_path):
    proc = cli("serve", "--dry-run", "--tiny-models-dir", str(tmp_path), "--tiny-pair", "dummy",
               "--attention-backend", "bogus")
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert "usage:" not in proc.stderr, proc.stderr[:2000]
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "sglang-detspec serve: error: sglang.launch_server rejects the command: argument --attention-backend: "
        "invalid choice: 'bogus'"), proc.stderr[-2000:]


def test_dry_run_of_an_unreadable_model_fails_like_the_launch(tmp_path):
    # A Hugging Face name that cannot be fetched (offline): SGLang's own failure, as one line.
    proc = cli("serve", "--dry-run", "--model-path", "no-such-org/no-such-model", "--draft-model-path", str(tmp_path),
               env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines()[-1].startswith("sglang-detspec serve: error: SGLang cannot resolve the launch")


def test_dry_run_without_sglang_says_it_did_not_validate(tmp_path):
    # sys.modules["sglang"] = None makes SGLang unimportable (find_spec answers None), as in an environment without it.
    code = ("import sys; sys.modules['sglang'] = None; from sglang_detspec.cli import main; "
            f"sys.exit(main(['serve', '--dry-run', '--tiny-pair', 'dummy', '--tiny-models-dir', {str(tmp_path)!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    _, _, args = split_dry_run(proc.stdout)
    assert opt(args, "--speculative-algorithm") == "DETSPEC_EAGLE"
    assert proc.stderr.strip() == ("note: SGLang is not installed in this environment, so the command above was "
                                   "neither parsed nor resolved; install sglang to validate it here")


def test_unknown_tiny_pair_is_usage_error():
    proc = cli("serve", "--dry-run", "--tiny-pair", "huge")
    assert proc.returncode == 2
    assert "argument --tiny-pair: invalid choice: 'huge'" in proc.stderr and "'dummy', 'weighted'" in proc.stderr


def test_dry_run_command_parses_with_installed_sglang(tmp_path):
    """Every flag serve emits exists in the installed SGLang's own launch_server parser (0.5.17 and 0.5.23)."""
    proc = cli("serve", "--dry-run", "--tiny-models-dir", str(tmp_path), "--tiny-pair", "dummy")
    assert proc.returncode == 0, proc.stderr
    _, _, args = split_dry_run(proc.stdout)
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(args)
    assert ns.model_path == str(ensure_tiny_models(tmp_path, pair="dummy").target)
    assert ns.speculative_algorithm == "DETSPEC_EAGLE"
    assert ns.enable_deterministic_inference is True
    assert ns.speculative_num_draft_tokens == 4 and ns.speculative_eagle_topk == 1
    assert ns.load_format == "dummy"


def test_unknown_option_for_other_commands_is_usage_error():
    proc = cli("demo", "--no-such-flag")
    assert proc.returncode == 2
    assert "unrecognized arguments: --no-such-flag" in proc.stderr


CHILD = textwrap.dedent(
    """
    import signal, sys, time, pathlib
    out = pathlib.Path(sys.argv[1])
    def on(signum, frame):
        out.write_text(f"got {signum}")
        sys.exit(7)
    signal.signal(signal.SIGTERM, on)
    signal.signal(signal.SIGINT, on)
    out.write_text("ready")
    time.sleep(60)
    sys.exit(0)
    """
)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_are_forwarded_and_exit_code_returned(tmp_path, sig):
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    out = tmp_path / "out.txt"
    wrapper = (
        "import sys; from sglang_detspec.serve import run_forwarding_signals; "
        f"sys.exit(run_forwarding_signals([sys.executable, {str(child)!r}, {str(out)!r}]))"
    )
    proc = subprocess.Popen([sys.executable, "-c", wrapper])
    try:
        deadline = time.time() + 60
        while not (out.exists() and out.read_text() == "ready"):
            assert time.time() < deadline, "child did not start"
            assert proc.poll() is None
            time.sleep(0.05)
        proc.send_signal(sig)
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert out.read_text() == f"got {int(sig)}"
    assert rc == 7


def test_killed_child_exit_code(tmp_path):
    from sglang_detspec.serve import run_forwarding_signals

    rc = run_forwarding_signals([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    assert rc == 128 + 9
    assert run_forwarding_signals([sys.executable, "-c", "raise SystemExit(3)"]) == 3
