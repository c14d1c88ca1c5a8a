"""The ``sglang-detspec`` command: ``serve``, ``check``, ``bench``, ``bench-serve`` and ``demo``.

* ``serve``  launches ``python -m sglang.launch_server`` with the DETSPEC speculative algorithm and deterministic
  inference on (an embedded tiny model pair when no model is given); :mod:`sglang_detspec.serve`. Needs a CUDA
  GPU; ``--dry-run`` prints the command after resolving it through SGLang's own parser and resolution.
* ``check``  sends one seeded probe to any SGLang server next to changing traffic (uniform, mixed sampling
  parameters, long prompts, shared prefixes) and says whether its output ever changed; :mod:`sglang_detspec.checker`.
* ``bench``  runs the sampler benchmark (:func:`sglang_detspec.bench.sampler_bench.main`).
* ``bench-serve`` runs the end-to-end serving benchmark on a generated mid-size pair (no speculation, built-in EAGLE
  with and without rejection sampling, DETSPEC_EAGLE; SGLang's ``bench_serving``); :mod:`sglang_detspec.bench.serving_bench`.
* ``demo``   shows on CPU, with the reference sampler, that a request's draft token depends on its seed and
  never on the batch around it; :mod:`sglang_detspec.demo`.

This module only parses arguments, calls those modules and prints. Importing it is cheap on purpose (no torch,
no requests, no SGLang) so that ``sglang-detspec --help`` answers at once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Callable, Sequence

from sglang_detspec import checker, demo, serve
from sglang_detspec.bench import serving_bench
from sglang_detspec.command_base import EXIT_ERROR, EXIT_FAIL, EXIT_OK, PROG, CliError

__all__ = ["main", "build_parser", "CliError", "EXIT_OK", "EXIT_FAIL", "EXIT_ERROR"]

_Formatter = argparse.RawDescriptionHelpFormatter


_MAIN_EPILOG = f"""\
examples:
  {PROG} demo                                   # CPU: the seeded sampler's invariants in one table
  {PROG} serve --port 30000                     # GPU: tiny model pair, seeded speculative decoding
  {PROG} check --url http://127.0.0.1:30000     # does a fixed seed give one output whatever the traffic?
  {PROG} bench                                  # GPU: fused sampler vs upstream, CSV + PNG
  {PROG} bench-serve --out results/serve        # GPU: serving throughput of 4 configurations, CSV + JSON + PNG

exit codes: {EXIT_OK} all good; {EXIT_FAIL} a checked property does not hold; {EXIT_ERROR} the command could not run;
  {checker.EXIT_INCONCLUSIVE} inconclusive (check: everything matched, but no pressure trial retracted the probe).
"""

_SERVE_DESCRIPTION = """\
Launch `python -m sglang.launch_server` with --speculative-algorithm DETSPEC_EAGLE and
--enable-deterministic-inference. Without --model-path, serve an embedded tiny target + draft pair
(built once and cached; local tokenizer; no downloads): `weighted` has generated weights whose drafts
are really rejected part of the time, `dummy` is config-only (--load-format dummy). Needs a CUDA GPU.
Signals are forwarded to the server and its exit code is returned.
"""

_CHECK_DESCRIPTION = """\
Send one seeded probe prompt to an SGLang server's /generate many times, each time next to different
traffic, and report how many distinct probe outputs came back, where the first one diverged, and the
speculative accept length. The probe (prompt, seed, length) is the same in every trial of every
traffic profile, so the verdict is "one output whatever the traffic".
"""

_DEMO_DESCRIPTION = """\
Draw draft tokens with the reference seeded sampler on CPU: alone, batched, permuted, split and among
other requests, every request draws the same token; seed+1 draws a new one; over many seeds the draws
follow the probabilities. The one-minute explanation of sglang-detspec.
"""

_SERVE_EPILOG = f"""\
examples:
  {PROG} serve                                  # embedded tiny target + EAGLE draft (generated weights)
  {PROG} serve --algorithm DETSPEC_EAGLE3       # tiny target + EAGLE3 draft
  {PROG} serve --tiny-pair dummy                # config-only tiny pair, --load-format dummy
  {PROG} serve --model-path meta-llama/Llama-3.1-8B-Instruct \\
      --draft-model-path jamesliu1/sglang-EAGLE-Llama-3.1-Instruct-8B -- --tp 2
  {PROG} serve --dry-run --num-steps 5          # print the command SGLang would run, run nothing

--dry-run resolves the command exactly as the launch would (SGLang's parser and argument resolution with
this plugin loaded, as on a CUDA device) and fails with the same message a launch would; it needs SGLang
installed (without it, the command is printed unvalidated) and reads the models' config.json.
Any option not listed above (or everything after `--`) goes to sglang.launch_server unchanged and
replaces this command's default for the same option (e.g. --mem-fraction-static 0.8).
"""

_CHECK_EPILOG = f"""\
traffic profiles (--traffic, comma-separated; default: all):
  uniform  trial t next to round(t * max_fillers / (trials - 1)) fillers of random lengths (T 1.0)
  mixed    fillers with greedy, top_k 1/5/50, top_p 0.9, min_p 0.1, T 0.3/1.7, logprobs, stop strings,
           n=2 and varied lengths; the probe arrives before, during or after their prefill
  long     prompts longer than the server's chunked-prefill size (up to its context length)
  prefix   cold radix cache, warm from the probe's own or a longer shared prompt, after /flush_cache
  pressure (only when named; not in all) the probe sent just after enough long requests to overflow the
           server's KV pool twice, so SGLang retracts it and re-prefills it later; needs a small pool
           (e.g. --max-total-tokens 4096) and a probe of a few hundred tokens (--max-new-tokens 256); each
           trial reports whether the probe (meta_info.num_retractions) or another request (also /metrics
           with --enable-metrics) was retracted; a trial without retraction is no evidence;
           --max-fillers does not apply (the load is sized from the server's limits)
Trial 0 of every profile is the probe alone; prefix runs 6 trials, the others --trials each.

examples:
  {PROG} check --url http://127.0.0.1:30000
  {PROG} check --url localhost:30000 --traffic uniform,long --trials 32 --report check.json
  {PROG} check --url localhost:30000 --seeds 1,2,3,4   # also: distinct seeds give distinct outputs
  {PROG} check --url localhost:30000 --wait 600        # wait for a server that is still starting
  {PROG} check --url localhost:30000 --traffic pressure --trials 12 --max-new-tokens 256

Works with any SGLang server, with or without the plugin.
exit codes: 0 every trial of every profile matched (and distinct seeds differed); 1 they did not; 2 could not check;
  3 inconclusive: everything matched, but no pressure trial retracted the probe.
"""

_BENCH_EPILOG = f"""\
examples:
  {PROG} bench --out results/bench             # full grid: sampler_bench.csv + sampler_bench.png
  {PROG} bench --quick --batch 1 128 --vocab 163840

Every argument is passed to sglang_detspec.bench.sampler_bench.main (the same as scripts/bench/bench_sampler.py).
"""

_BENCH_SERVE_DESCRIPTION = """\
Generate a mid-size synthetic Llama pair on the GPU (hidden 2048, 16 layers, vocab 32000, a 1-layer EAGLE draft that
is partly accepted), launch one server per configuration (no speculation, built-in EAGLE + rejection sampling,
built-in deterministic EAGLE, DETSPEC_EAGLE), drive each with SGLang's own `python -m sglang.bench_serving` at every
concurrency, and write bench_serve.csv / .json / .png with DETSPEC's throughput ratios to each built-in
configuration measured in the same run. Needs a CUDA GPU with SGLang (except --dry-run).
"""

_BENCH_SERVE_EPILOG = f"""\
examples:
  {PROG} bench-serve --out results/serve                 # the full grid, concurrencies 1,8,32,128
  {PROG} bench-serve --out results/serve --quick         # concurrencies 1,32, shorter runs
  {PROG} bench-serve --out results/serve --breakdown     # plus a per-step breakdown of DETSPEC_EAGLE
  {PROG} bench-serve --out results/serve --start parallel --order interleaved
  {' ' * len(PROG)} {' ' * 48}# rounds across configurations, ratios paired per round
  {PROG} bench-serve --out x --dry-run                   # print every command, run nothing

exit codes: 0 every run completed; 1 some run failed (see the table); 2 could not run.
"""

_DEMO_EPILOG = f"""\
examples:
  {PROG} demo
  {PROG} demo --kernel on           # also the fused Triton kernel (interpreted on CPU)
  python -m sglang_detspec demo --batch 6

Runs on CPU in seconds. Exit code 1 if an invariant does not hold (they are computed live).
"""


# ----------------------------------------------------------------------------------------------------------------
# argument types: errors appear under the subcommand's usage, naming the argument


def _int_at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            want = f"in {low}..{high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"must be {want}, got {value}")
        return value

    return parse


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(x, 0) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if len(seeds) < 2:
        raise argparse.ArgumentTypeError("give at least two seeds, e.g. --seeds 1,2,3")
    return seeds


def _url(text: str) -> str:
    try:
        return checker.parse_server_url(text)
    except CliError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--url ")) from None


def _traffic(text: str) -> tuple[str, ...]:
    try:
        return checker.parse_traffic(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


# ----------------------------------------------------------------------------------------------------------------
# commands


def cmd_serve(args: argparse.Namespace, passthrough: list[str]) -> int:
    if not args.dry_run:
        serve.check_can_launch()
    cmd, env_changes = serve.build_serve_command(
        model_path=args.model_path, draft_model_path=args.draft_model_path, algorithm=args.algorithm,
        steps=args.num_steps, topk=args.topk, draft_tokens=args.num_draft_tokens,
        attention_backend=args.attention_backend, host=args.host, port=args.port, passthrough=passthrough,
        tiny_models_dir=args.tiny_models_dir, tiny_pair=args.tiny_pair,
    )
    printable = serve.printable_command(cmd, env_changes)
    if args.dry_run:
        resolution = serve.resolve_launch(cmd, env_changes)
        print(printable)
        for line in resolution or ["note: SGLang is not installed in this environment, so the command above was "
                                   "neither parsed nor resolved; install sglang to validate it here"]:
            print(line, file=sys.stderr)
        return EXIT_OK
    serve.check_sglang_parses(cmd[3:])  # one line for a flag SGLang rejects, not its whole usage
    if not serve.plugin_installed():
        print(
            f"warning: the sglang-detspec entry point is not installed in this environment, so SGLang will not "
            f"know {args.algorithm} (pip install sglang-detspec, or pip install -e . in a checkout)",
            file=sys.stderr,
        )
    print(f"{PROG}: {printable}", file=sys.stderr, flush=True)
    env = {k: v for k, v in {**os.environ, **env_changes}.items() if v is not None}
    return serve.run_forwarding_signals(cmd, env)


def cmd_check(args: argparse.Namespace) -> int:
    if args.report:
        # Fail before minutes of trials, not after.
        parent = os.path.dirname(os.path.abspath(args.report))
        if not os.path.isdir(parent):
            raise CliError(f"cannot write the report {args.report}: directory {parent} does not exist")
    result = checker.run_check(
        args.url, prompt=args.prompt, seed=args.seed, temperature=args.temperature,
        max_new_tokens=args.max_new_tokens, trials=args.trials, max_fillers=args.max_fillers, traffic=args.traffic,
        seeds=args.seeds, timeout=args.timeout, wait=args.wait, api_key=args.api_key,
        progress=False if args.no_progress else None, logprobs=args.logprobs, against=args.against,
    )
    for w in result.warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(checker.format_check(result))
    if args.report:
        try:
            with open(args.report, "w", encoding="utf-8") as f:
                json.dump(result.to_dict(), f, indent=2)
                f.write("\n")
        except OSError as e:
            raise CliError(f"cannot write the report {args.report}: {e.strerror or e}") from e
        print(f"report:  {args.report}")
    if result.passed:
        return EXIT_OK
    return checker.EXIT_INCONCLUSIVE if result.inconclusive else EXIT_FAIL


def _load_benchmark():
    try:
        from sglang_detspec.bench import sampler_bench as benchmark
    except ImportError as e:
        if getattr(e, "name", None) == "sglang_detspec.bench.sampler_bench":
            raise CliError("the sampler benchmark (sglang_detspec.bench.sampler_bench) is not part of this installation") from e
        raise CliError(
            f"the sampler benchmark cannot be loaded: {e} (pip install 'sglang-detspec[bench]' installs its extras)"
        ) from e
    main_fn = getattr(benchmark, "main", None)
    if not callable(main_fn):
        raise CliError("sglang_detspec.bench.sampler_bench has no main(argv) function")
    return main_fn


def _benchmark_help(main_fn) -> str:
    """The benchmark's own option help (its parser lives inside ``benchmark.main``), retitled for this command."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main_fn(["--help"], prog=f"{PROG} bench")
    text = out.getvalue()
    _, sep, options = text.partition("options:")
    if not sep:
        return text
    # Its -h line would describe the benchmark's help, which is this very text.
    return "the benchmark's options:" + "".join(
        line for line in options.splitlines(keepends=True) if not line.lstrip().startswith("-h, --help"))


def cmd_bench(args: argparse.Namespace, passthrough: list[str]) -> int:
    main_fn = _load_benchmark()
    if args.help:
        print(args.format_help().rstrip() + "\n\n" + _benchmark_help(main_fn).rstrip())
        return EXIT_OK
    return int(main_fn(list(passthrough), prog=f"{PROG} bench") or 0)


def cmd_bench_serve(args: argparse.Namespace) -> int:
    try:
        return serving_bench.run(args)
    except ValueError as e:
        raise CliError(str(e)) from e


def cmd_demo(args: argparse.Namespace) -> int:
    if args.kernel == "auto":
        import torch

        use_kernel = torch.cuda.is_available()
    else:
        use_kernel = args.kernel == "on"
    result = demo.run_demo(batch=args.batch, vocab=args.vocab, kernel=use_kernel)
    print(result.text)
    return EXIT_OK if result.passed else EXIT_FAIL


# ----------------------------------------------------------------------------------------------------------------
# argument parsing


def _subparser(sub, name: str, help: str, description: str, epilog: str, **kwargs) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=help, description=description, epilog=epilog, formatter_class=_Formatter,
                          allow_abbrev=False, **kwargs)


def _add_serve_arguments(p: argparse.ArgumentParser) -> None:
    d = serve.ServeDefaults()
    p.add_argument("--model-path", "--model", dest="model_path", default=None,
                   help="target model (default: the embedded tiny model)")
    p.add_argument("--draft-model-path", "--speculative-draft-model-path", dest="draft_model_path", default=None,
                   help="EAGLE/EAGLE3 draft model (not needed for NEXTN/MTP targets)")
    p.add_argument("--algorithm", "--speculative-algorithm", dest="algorithm", default=serve.DETSPEC_ALGORITHMS[0],
                   type=str.upper, choices=serve.DETSPEC_ALGORITHMS, help="speculative algorithm (default: %(default)s)")
    p.add_argument("--num-steps", "--speculative-num-steps", dest="num_steps", type=_int_at_least(1), default=d.steps,
                   help="draft steps per verify (default: %(default)s)")
    p.add_argument("--topk", "--speculative-eagle-topk", dest="topk", type=int, default=d.topk,
                   help="draft top-k; rejection sampling needs 1 (default: %(default)s)")
    p.add_argument("--num-draft-tokens", "--speculative-num-draft-tokens", dest="num_draft_tokens", type=int,
                   default=None, help="tokens verified per step (default: --num-steps + 1, the linear chain)")
    p.add_argument("--attention-backend", default=d.attention_backend,
                   help="deterministic inference allows fa3, fa4, flashinfer, triton (default: %(default)s)")
    p.add_argument("--host", default=d.host, help="address to listen on (default: %(default)s)")
    p.add_argument("--port", type=int, default=d.port, help="port to listen on (default: %(default)s)")
    p.add_argument("--tiny-pair", choices=serve.SERVABLE_PAIRS, default=d.tiny_pair,
                   help="which embedded tiny pair to serve without --model-path; qwen3_eagle3, qwen3_moe and "
                   "deepseek_mtp are seeded stand-ins for those model families (default: %(default)s)")
    p.add_argument("--tiny-models-dir", default=None,
                   help="where to build/cache the tiny models (default: the user's cache directory)")
    p.add_argument("--dry-run", action="store_true",
                   help="resolve and print the launch command, run nothing (no GPU needed)")


def _add_check_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", required=True, type=_url, help="the server, http://HOST:PORT, e.g. http://127.0.0.1:30000")
    p.add_argument("--traffic", type=_traffic, default=checker.PROFILES, metavar="PROFILES",
                   help=f"traffic profiles to run: {', '.join(checker.KNOWN_PROFILES)} or all "
                   f"({', '.join(checker.PROFILES)}), comma-separated (default: all)")
    p.add_argument("--trials", type=int, default=checker.DEFAULT_TRIALS,
                   help="probe trials per profile (prefix: always 6), >= 2 (default: %(default)s)")
    p.add_argument("--seed", type=int, default=checker.DEFAULT_SEED, help="the probe's sampling_seed (default: %(default)s)")
    p.add_argument("--seeds", type=_seeds, default=None, metavar="S1,S2,...",
                   help="also send the probe once per seed; fail if distinct seeds give identical outputs")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="sampling temperature of the probe (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=checker.DEFAULT_MAX_NEW_TOKENS,
                   help="probe length in tokens (default: %(default)s)")
    p.add_argument("--max-fillers", type=int, default=checker.DEFAULT_MAX_FILLERS,
                   help="concurrent fillers in the heaviest uniform and mixed trials (default: %(default)s)")
    p.add_argument("--prompt", default=checker.DEFAULT_PROMPT, help="the probe prompt (default: %(default)r)")
    p.add_argument("--report", default=None, metavar="PATH", help="write a JSON report here")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds to wait for one response (default: %(default)s)")
    p.add_argument("--wait", type=float, default=0.0,
                   help="seconds to wait for the server to come up (default: %(default)s)")
    p.add_argument("--api-key", default=None, help="the server's --api-key, if it has one")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--against", type=_url, default=None, metavar="URL",
                   help="a second server (e.g. non-speculative, --enable-deterministic-inference, same target): after "
                   "the trials the probe is sent to it alone, twice; fail unless its tokens equal trial 0's. "
                   "Speculation invariance: DETSPEC_EAGLE's rejection sampling is not expected to pass this")
    p.add_argument("--logprobs", action="store_true",
                   help="the probe also returns its output token logprobs and top-5 logprobs; fail unless they are "
                   "bit-identical in every trial with the reference's tokens (the report names the largest difference)")


def build_parser() -> argparse.ArgumentParser:
    from sglang_detspec import __version__

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Reproducible per-seed speculative decoding for SGLang: serve, check, benchmark, demonstrate.",
        epilog=_MAIN_EPILOG,
        formatter_class=_Formatter,
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    _add_serve_arguments(_subparser(sub, "serve", "launch an SGLang server with seeded speculative decoding (CUDA GPU)",
                                    _SERVE_DESCRIPTION, _SERVE_EPILOG))
    _add_check_arguments(_subparser(sub, "check", "check that a fixed seed gives one output whatever the traffic "
                                    "(any SGLang server)", _CHECK_DESCRIPTION, _CHECK_EPILOG))
    # The benchmark owns its options: -h/--help here lists them (cmd_bench), everything else is passed through.
    p = _subparser(sub, "bench", "benchmark the fused seeded sampler against SGLang's (CUDA GPU)",
                   "Run the sampler benchmark (sglang_detspec.bench.sampler_bench.main) and write its CSV and PNG.",
                   _BENCH_EPILOG, add_help=False, usage=f"{PROG} bench [-h] [BENCHMARK OPTIONS]")
    p.add_argument("-h", "--help", action="store_true", help="show this help and the benchmark's options")
    p.set_defaults(format_help=p.format_help)

    serving_bench.add_arguments(_subparser(sub, "bench-serve", "serving benchmark: DETSPEC_EAGLE vs SGLang's built-in "
                                           "configurations on a mid-size pair (CUDA GPU)", _BENCH_SERVE_DESCRIPTION,
                                           _BENCH_SERVE_EPILOG))

    p = _subparser(sub, "demo", "show on CPU that a seed fixes each request's draft token whatever the batch",
                   _DEMO_DESCRIPTION, _DEMO_EPILOG)
    lo, hi = demo.BATCH_RANGE
    p.add_argument("--batch", type=_int_at_least(lo, hi), default=8,
                   help=f"requests in the demo batch, {lo}..{hi} (default: %(default)s)")
    p.add_argument("--vocab", type=_int_at_least(demo.MIN_VOCAB), default=512,
                   help=f"vocabulary size, >= {demo.MIN_VOCAB} (default: %(default)s)")
    p.add_argument("--kernel", choices=("auto", "on", "off"), default="auto",
                   help="add a column drawn by the fused Triton kernel; auto: only with a CUDA GPU, on: also on "
                   "CPU through Triton's interpreter (default: %(default)s)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Everything after `--` belongs to the wrapped program (sglang.launch_server, the benchmark).
    after: list[str] = []
    if "--" in argv:
        k = argv.index("--")
        argv, after = argv[:k], argv[k + 1 :]
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return EXIT_ERROR
    if args.command not in ("serve", "bench") and (unknown or after):
        parser.parse_args(argv + after)  # reports the unrecognized arguments and exits 2
    try:
        if args.command == "serve":
            return cmd_serve(args, unknown + after)
        if args.command == "check":
            return cmd_check(args)
        if args.command == "bench":
            return cmd_bench(args, unknown + after)
        if args.command == "bench-serve":
            return cmd_bench_serve(args)
        return cmd_demo(args)
    except CliError as e:
        print(f"{PROG} {args.command}: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print(f"{PROG} {args.command}: interrupted", file=sys.stderr)
        return 130
