"""``sglang-detspec serve``: the ``sglang.launch_server`` command for seeded speculative decoding, its dry-run
resolution through SGLang's own parser and argument resolution, and running it with signals forwarded.

Importing this module is cheap; SGLang, torch and the tiny models are imported by the functions that need them.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from typing import Sequence

from sglang_detspec.command_base import DETSPEC_ALGORITHMS, PROG, CliError
from sglang_detspec.models.family_config import FAMILY_ALGORITHMS, FAMILY_PAIRS
from sglang_detspec.models.tiny_config import MAX_POS, TINY_PAIRS
from sglang_detspec.models.tiny_models import ensure_tiny_models
from sglang_detspec.models.tiny_servers import SERVABLE_PAIRS, server_flags

# DETSPEC_ALGORITHMS and SERVABLE_PAIRS are the command's --algorithm and --tiny-pair choices.
__all__ = ["DETSPEC_ALGORITHMS", "TINY_PAIRS", "SERVABLE_PAIRS", "ServeDefaults", "build_serve_command", "printable_command",
           "resolve_launch", "check_sglang_parses", "check_can_launch", "cuda_available", "plugin_installed", "run_forwarding_signals"]


# The tiny pair is served with room for prompts of 16,384 tokens (the positions its configs declare), prefilled in
# chunks of 4096 (the deterministic prefill alignment of the triton backend, the smallest safe chunk), so that
# `check`'s long profile really splits prompts into chunks beside the probe.
TINY_CONTEXT_LENGTH = MAX_POS
TINY_CHUNKED_PREFILL_SIZE = 4096


@dataclass
class ServeDefaults:
    steps: int = 3
    topk: int = 1
    attention_backend: str = "triton"
    host: str = "127.0.0.1"
    port: int = 30000
    tiny_pair: str = "weighted"


def _flags_in(args: Sequence[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in args if a.startswith("--")}


def build_serve_command(
    *,
    model_path: str | None,
    draft_model_path: str | None,
    algorithm: str,
    steps: int,
    topk: int,
    draft_tokens: int | None,
    attention_backend: str,
    host: str,
    port: int,
    passthrough: Sequence[str] = (),
    tiny_models_dir: str | None = None,
    tiny_pair: str = ServeDefaults.tiny_pair,
    env: dict | None = None,
) -> tuple[list[str], dict[str, str | None]]:
    """The ``sglang.launch_server`` command line and the environment changes for ``serve``.

    ``draft_tokens`` None means ``steps + 1``, the linear chain the plugin resolves to. A flag given in
    ``passthrough`` replaces the default for that flag (SGLang's argparse would keep the last occurrence anyway;
    dropping ours keeps the printed command unambiguous). With no ``model_path`` the embedded tiny target + draft
    pair ``tiny_pair`` is built once (cached) and served offline with its own flags
    (:func:`sglang_detspec.models.tiny_servers.server_flags`). ``env_changes`` maps a variable to its new value, or to
    None for a variable to unset.
    """
    env = dict(os.environ if env is None else env)
    env_changes: dict[str, str | None] = {}  # None: unset
    tiny = model_path is None
    if tiny:
        if draft_model_path is not None:
            raise CliError("--draft-model-path needs --model-path (the tiny target comes with its own drafts)")
        model_path, draft_model_path = _tiny_pair_paths(tiny_pair, algorithm, tiny_models_dir)
        # The tiny models carry a local tokenizer (and generated or dummy weights): nothing may be downloaded.
        for k, v in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}.items():
            if env.get(k) != v:
                env_changes[k] = v

    if "TRITON_INTERPRET" in env:
        # Set for CPU tests; a GPU server under the Triton interpreter would crawl (or fail to launch kernels).
        env_changes["TRITON_INTERPRET"] = None

    plugins = env.get("SGLANG_PLUGINS")
    if plugins and "detspec" not in [p.strip() for p in plugins.split(",")]:
        # SGLANG_PLUGINS filters which entry points SGLang loads; without ours DETSPEC_* is an unknown algorithm.
        env_changes["SGLANG_PLUGINS"] = plugins + ",detspec"

    defaults: list[tuple[str, list[str]]] = [
        ("--model-path", [model_path]),
        ("--speculative-algorithm", [algorithm]),
    ]
    if draft_model_path is not None:
        defaults.append(("--speculative-draft-model-path", [draft_model_path]))
    defaults += [
        ("--speculative-num-steps", [str(steps)]),
        ("--speculative-eagle-topk", [str(topk)]),
        ("--speculative-num-draft-tokens", [str(steps + 1 if draft_tokens is None else draft_tokens)]),
        ("--enable-deterministic-inference", []),
        ("--attention-backend", [attention_backend]),
    ]
    if tiny:
        long_context = {"--context-length": [str(TINY_CONTEXT_LENGTH)],
                        "--chunked-prefill-size": [str(TINY_CHUNKED_PREFILL_SIZE)]}
        defaults += [(flag, long_context.pop(flag, list(values))) for flag, values in server_flags(tiny_pair)]
        defaults += list(long_context.items())
    defaults += [("--host", [host]), ("--port", [str(port)])]

    given = _flags_in(passthrough)
    cmd = [sys.executable, "-m", "sglang.launch_server"]
    for flag, values in defaults:
        if flag not in given:
            cmd += [flag, *values]
    cmd += list(passthrough)
    _check_values(cmd[3:])
    return cmd, env_changes


def _tiny_pair_paths(tiny_pair: str, algorithm: str, tiny_models_dir: str | None) -> tuple[str, str]:
    """Build (once, cached) the embedded pair ``tiny_pair`` and return its (target, draft) directories for
    ``algorithm``. A model-family pair has one draft, served by the algorithms ``FAMILY_ALGORITHMS`` names."""
    if tiny_pair in FAMILY_PAIRS and algorithm not in FAMILY_ALGORITHMS[tiny_pair]:
        raise CliError(f"--tiny-pair {tiny_pair} is served with --algorithm "
                       f"{' or '.join(FAMILY_ALGORITHMS[tiny_pair])} (its draft's kind), not {algorithm}")
    try:
        if tiny_pair in FAMILY_PAIRS:
            from sglang_detspec.models.family_pairs import ensure_family_pair

            pair = ensure_family_pair(tiny_models_dir, tiny_pair)
            return str(pair.target), str(pair.draft)
        models = ensure_tiny_models(tiny_models_dir, pair=tiny_pair)
    except NotImplementedError as e:
        raise CliError(f"the {tiny_pair!r} tiny pair cannot be built by this installation ({e}); "
                       "use --tiny-pair dummy") from e
    except (OSError, RuntimeError, ValueError) as e:
        raise CliError(f"building the {tiny_pair!r} tiny models failed: {e}") from e
    return str(models.target), str(models.eagle3_draft if algorithm.startswith("DETSPEC_EAGLE3") else models.eagle_draft)


def _looks_local(path: str) -> bool:
    """A path no Hugging Face repo id can be (``ORG/NAME`` is relative and has no ``.``/``..``/``~`` first part)."""
    return os.path.isabs(path) or path.startswith(("~", "./", "../", ".\\", "..\\")) or path in (".", "..")


def _check_values(argv: Sequence[str]) -> None:
    """Refuse values SGLang's parser accepts but no launch can use, naming the flag and the valid range: a port
    outside 1..65535, a memory fraction outside (0, 1], a local model path that does not exist (SGLang would
    report it as a malformed Hugging Face repo id)."""
    port = _flag_value(argv, "--port")
    if port is not None:
        try:
            port_ok = 1 <= int(port) <= 65535
        except ValueError:
            port_ok = False
        if not port_ok:
            raise CliError(f"--port {port}: a TCP port is an integer in 1..65535")
    fraction = _flag_value(argv, "--mem-fraction-static")
    if fraction is not None:
        try:
            fraction_ok = 0 < float(fraction) <= 1
        except ValueError:
            fraction_ok = False
        if not fraction_ok:
            raise CliError(f"--mem-fraction-static {fraction}: a fraction of the GPU's memory, 0 < x <= 1 "
                           "(e.g. 0.8)")
    for flag in ("--model-path", "--speculative-draft-model-path"):
        path = _flag_value(argv, flag)
        if path is not None and _looks_local(path) and not os.path.exists(os.path.expanduser(path)):
            raise CliError(f"{flag} {path}: no such file or directory (a local model is a directory with "
                           "config.json; a Hugging Face model is named ORG/NAME)")


def check_sglang_parses(argv: Sequence[str]) -> None:
    """Parse ``argv`` with SGLang's own launch_server options; a rejected flag or value becomes one
    :class:`CliError` line (argparse would print SGLang's whole usage, hundreds of lines, before it).

    A ``--config`` file is left to SGLang (its options are merged into ``argv`` by SGLang's own loader).
    """
    if "--config" in argv:
        return
    import argparse

    from sglang.srt.server_args import ServerArgs

    class _Parser(argparse.ArgumentParser):
        def error(self, message: str):
            raise CliError(f"sglang.launch_server rejects the command: {message}")

    parser = _Parser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    parser.parse_args(list(argv))


def printable_command(cmd: Sequence[str], env_changes: dict[str, str | None]) -> str:
    """``cmd`` as one shell line, prefixed by ``env -u X K=V`` for the environment changes."""
    line = shlex.join(cmd)
    if not env_changes:
        return line
    # env(1) takes its -u options before the NAME=VALUE assignments.
    unset = [f"-u {k}" for k, v in env_changes.items() if v is None]
    assign = [f"{k}={shlex.quote(v)}" for k, v in env_changes.items() if v is not None]
    return " ".join(["env", *unset, *assign, line])


# (resolved field, what the summary calls it, the launch flag that sets it)
_SUMMARY_FIELDS = (
    ("speculative_algorithm", "algorithm", "--speculative-algorithm"),
    ("speculative_num_steps", "steps", "--speculative-num-steps"),
    ("speculative_eagle_topk", "topk", "--speculative-eagle-topk"),
    ("speculative_num_draft_tokens", "draft tokens", "--speculative-num-draft-tokens"),
    ("speculative_use_rejection_sampling", "rejection sampling", None),
    ("enable_deterministic_inference", "deterministic inference", None),
    ("attention_backend", "attention backend", "--attention-backend"),
    ("sampling_backend", "sampling backend", None),
    ("chunked_prefill_size", "chunked prefill size", None),
    ("disable_radix_cache", "radix cache", None),  # shown as on/off, the flag's opposite
)


def _shown(value) -> str:
    return {True: "on", False: "off"}.get(value, str(value)) if isinstance(value, bool) else str(value)


def _flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The last value ``argv`` gives ``flag`` (``--flag V`` or ``--flag=V``), as SGLang's argparse keeps it."""
    value = None
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def resolve_launch(cmd: Sequence[str], env_changes: dict[str, str | None]) -> list[str] | None:
    """Resolve ``cmd``'s arguments exactly as ``python -m sglang.launch_server`` would before loading a model --
    SGLang's ``load_plugins()`` (this plugin's resolution hook and refusals included), its own
    ``prepare_server_args`` parser and resolution -- in this process, with the launch's environment.

    Returns lines for the user: the resolved speculative settings, and every flag of ``cmd`` whose value
    resolution changed; None where SGLang is not installed (nothing can be resolved). Raises :class:`CliError`
    with SGLang's or the plugin's message when the launch would fail. ``--device cuda`` is added when the command
    names no device (a launch on a GPU machine detects it; resolution never touches the device).
    """
    import importlib.util

    if importlib.util.find_spec("sglang") is None:
        return None
    for k, v in env_changes.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    argv = list(cmd[3:])
    device_added = "--device" not in _flags_in(argv)
    if device_added:
        argv += ["--device", "cuda"]
    try:
        from sglang.srt.plugins import load_plugins
        from sglang.srt.server_args import prepare_server_args

        from sglang_detspec.integration import compat

        check_sglang_parses(argv)
        load_plugins()
        server_args = prepare_server_args(argv)
        resolve_once = getattr(server_args, "resolve_once", None)  # 0.5.23; 0.5.17 resolves in __post_init__
        if resolve_once is not None:
            resolve_once()
    except CliError:
        raise
    except SystemExit as e:  # SGLang's argparse printed the reason (an unknown or malformed flag) above
        raise CliError(f"sglang.launch_server's parser rejects the command (exit {e.code}; its message is above)") from None
    except Exception as e:
        from sglang_detspec.integration.setup.refusals import DetspecConfigError

        who = "sglang-detspec refuses the launch" if isinstance(e, DetspecConfigError) else (
            f"SGLang cannot resolve the launch ({type(e).__name__})")
        raise CliError(f"{who}: {' '.join(str(e).split())}") from None
    resolved = {name: compat.read_field(server_args, name, None) for name, _, _ in _SUMMARY_FIELDS}
    shown = {**resolved, "disable_radix_cache": not resolved["disable_radix_cache"]}
    where = (" (as on a CUDA device; memory-sized defaults such as the chunked prefill size are this machine's, a "
             "GPU's can differ)") if device_added else ""
    lines = [f"SGLang {compat.installed_sglang_version()} with sglang-detspec resolves{where}: "
             + ", ".join(f"{label} {_shown(shown[name])}" for name, label, _ in _SUMMARY_FIELDS)]
    for name, _, flag in _SUMMARY_FIELDS:
        given = _flag_value(argv, flag) if flag else None
        if given is not None and given != str(resolved[name]):
            lines.append(f"note: SGLang resolves {flag} {given} to {resolved[name]}")
    return lines


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def plugin_installed() -> bool:
    from importlib.metadata import entry_points

    return any(ep.value.startswith("sglang_detspec") for ep in entry_points(group="sglang.srt.plugins"))


def check_can_launch() -> None:
    """A real launch needs SGLang and a CUDA GPU; say which is missing and what runs instead."""
    import importlib.util

    if importlib.util.find_spec("sglang") is None:
        raise CliError("SGLang is not installed in this Python environment (pip install sglang)")
    if not cuda_available():
        raise CliError(
            "a CUDA GPU is needed and torch sees none on this machine (torch.cuda.is_available() is False); "
            f"`{PROG} demo` runs on CPU, `{PROG} serve --dry-run` prints and validates the launch command"
        )


def run_forwarding_signals(cmd: Sequence[str], env: dict | None = None) -> int:
    """Run ``cmd`` and return its exit code (128 + N when killed by signal N), forwarding SIGINT, SIGTERM,
    SIGHUP and SIGQUIT to it.

    The child gets its own session so that a terminal's Ctrl-C reaches it exactly once (through us) instead of
    twice (terminal + forward); SGLang's launcher turns that one SIGINT into an orderly shutdown of its
    scheduler processes.
    """
    proc = subprocess.Popen(list(cmd), env=env, start_new_session=True)
    forwarded = [signal.SIGINT, signal.SIGTERM]
    forwarded += [getattr(signal, n) for n in ("SIGHUP", "SIGQUIT") if hasattr(signal, n)]
    previous = {}

    def forward(signum, _frame):
        if proc.poll() is None:
            try:
                proc.send_signal(signum)
            except ProcessLookupError:
                pass

    in_main = threading.current_thread() is threading.main_thread()
    if in_main:
        for s in forwarded:
            previous[s] = signal.signal(s, forward)
    try:
        rc = proc.wait()
    finally:
        if in_main:
            for s, h in previous.items():
                signal.signal(s, h)
        if proc.poll() is None:  # we are leaving on an exception: do not orphan a GPU server
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    return rc if rc >= 0 else 128 - rc
