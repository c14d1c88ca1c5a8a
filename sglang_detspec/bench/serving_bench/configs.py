"""The benchmark's configuration table and settings: which servers ``bench-serve`` launches, with which flags, and
the ``bench_serving`` command that drives each one. Standard library only (parsed and tested on CPU).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import List, Optional, Tuple

__all__ = ["BenchConfig", "CONFIGS", "DEFAULT_CONFIGS", "DETSPEC", "BenchSettings", "QUICK", "config_by_name",
           "parse_configs", "parse_concurrencies", "num_prompts", "mem_fraction", "repetition_prompts", "round_seed",
           "server_args", "bench_serving_command", "estimate_seconds", "ORDERS", "round_order", "order_description"]

SPEC_SHAPE = ("--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4")


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """One server configuration. ``builtin``: SGLang's own (DETSPEC's throughput is divided by each of these).
    ``unavailable``: why it cannot run yet (the table keeps a row for modes that are planned but not built)."""

    name: str
    label: str
    algorithm: Optional[str]  # --speculative-algorithm; None: no speculation
    rejection_sampling: bool
    deterministic: bool
    builtin: bool
    extra_args: Tuple[str, ...] = ()
    unavailable: Optional[str] = None
    opt_in: bool = False  # run only when named in --configs
    env: Tuple[Tuple[str, str], ...] = ()  # the server's extra environment (e.g. which batch-invariant kernels)

    def speculative_args(self, draft: Path) -> List[str]:
        if self.algorithm is None:
            return []
        return ["--speculative-draft-model-path", str(draft), *SPEC_SHAPE, "--speculative-algorithm", self.algorithm,
                *(["--speculative-use-rejection-sampling"] if self.rejection_sampling else [])]


DETSPEC = "detspec"
CONFIGS: Tuple[BenchConfig, ...] = (
    BenchConfig("no_spec", "no speculation (deterministic)", None, False, True, True),
    BenchConfig("eagle_rs", "built-in EAGLE + rejection sampling (not deterministic)", "EAGLE", True, False, True),
    BenchConfig("eagle_det", "built-in deterministic EAGLE (no rejection sampling)", "EAGLE", False, True, True),
    # DETSPEC always samples by rejection (the plugin turns it on); the flag is not passed.
    BenchConfig(DETSPEC, "DETSPEC_EAGLE (deterministic, rejection sampling)", "DETSPEC_EAGLE", False, True, False),
    # What SGLang's deterministic mode itself costs (batch-invariant kernels), beside "no_spec": the part of the gap
    # between DETSPEC_EAGLE and built-in EAGLE + RS that no sampler can remove. Opt-in (--configs ...,no_spec_fast),
    # and after DETSPEC: configurations run in table order, so a time-limited run loses it first.
    BenchConfig("no_spec_fast", "no speculation (not deterministic)", None, False, False, True, opt_in=True),
    # The speculation-invariant mode (issue 18): the coupled race instead of rejection sampling. Opt-in while its
    # acceptance is being measured; like no_spec_fast it runs after DETSPEC.
    BenchConfig("detspec_invariant", "DETSPEC_EAGLE_INVARIANT (deterministic, same tokens as no speculation)",
                "DETSPEC_EAGLE_INVARIANT", False, True, False, opt_in=True),
    # DETSPEC_EAGLE on SGLang's own deterministic kernels (SGLANG_DETSPEC_OPS=sglang): what the plugin's
    # batch-invariant GEMM and RMSNorm gain, measured in the same run. Opt-in.
    BenchConfig("detspec_sglang_ops", "DETSPEC_EAGLE on SGLang's deterministic kernels", "DETSPEC_EAGLE", False, True,
                False, opt_in=True, env=(("SGLANG_DETSPEC_OPS", "sglang"),)),
    # No speculation on the plugin's kernels: the token-id reference server (SGLANG_DETSPEC_TOKEN_ID_SAMPLER=1), i.e.
    # deterministic decoding with the plugin installed and nothing speculative. Opt-in.
    BenchConfig("no_spec_plugin_ops", "no speculation (deterministic, the plugin's kernels)", None, False, True, False,
                opt_in=True, env=(("SGLANG_DETSPEC_TOKEN_ID_SAMPLER", "1"),)),
    # DETSPEC_EAGLE with the deterministic Triton attention's unified KV indices rebuilt in every layer, as SGLang
    # does (SGLANG_DETSPEC_ATTN_INDEX_CACHE=0, issue 32): what the default once-per-forward build gains. Opt-in.
    BenchConfig("detspec_no_attn_cache", "DETSPEC_EAGLE, attention indices built per layer (SGLang's way)",
                "DETSPEC_EAGLE", False, True, False, opt_in=True, env=(("SGLANG_DETSPEC_ATTN_INDEX_CACHE", "0"),)),
    # DETSPEC_EAGLE with no weight shape's GEMM split along K (SGLANG_DETSPEC_GEMM_SPLIT_K=0, issue 32): what the
    # default SPLIT_K_TABLE gains or costs beside "detspec". Opt-in.
    BenchConfig("detspec_no_split_k", "DETSPEC_EAGLE, no GEMM split along K", "DETSPEC_EAGLE", False, True, False,
                opt_in=True, env=(("SGLANG_DETSPEC_GEMM_SPLIT_K", "0"),)),
    # DETSPEC_EAGLE with the verify's seeded coins in SGLang's torch ops (SGLANG_DETSPEC_VERIFY_COINS_KERNEL=0, issue
    # 32): what the one-launch coins gain in the verify's eager sampling. Opt-in.
    BenchConfig("detspec_torch_coins", "DETSPEC_EAGLE, verify coins in SGLang's torch ops", "DETSPEC_EAGLE", False,
                True, False, opt_in=True, env=(("SGLANG_DETSPEC_VERIFY_COINS_KERNEL", "0"),)),
    # DETSPEC_EAGLE with the target's verify attention in the split-KV decode kernel's order
    # (SGLANG_DETSPEC_DECODE_ORDER_VERIFY=1, issue 32) instead of the plugin's split-KV verify kernel. Opt-in.
    BenchConfig("detspec_decode_verify", "DETSPEC_EAGLE, verify attention in the decode kernel's order",
                "DETSPEC_EAGLE", False, True, False, opt_in=True, env=(("SGLANG_DETSPEC_DECODE_ORDER_VERIFY", "1"),)),
    # DETSPEC_EAGLE with the target's verify attention in SGLang's one-stage extend kernel
    # (SGLANG_DETSPEC_SPLIT_KV_VERIFY=0, issue 32): what the default split-KV verify kernel gains. Opt-in.
    BenchConfig("detspec_one_stage_verify", "DETSPEC_EAGLE, verify attention in SGLang's one-stage extend kernel",
                "DETSPEC_EAGLE", False, True, False, opt_in=True, env=(("SGLANG_DETSPEC_SPLIT_KV_VERIFY", "0"),)),
    # DETSPEC_EAGLE with the draft's extend of each verified chain in the split-KV verify kernel too
    # (SGLANG_DETSPEC_SPLIT_KV_DRAFT_EXTEND=1, issue 32): what it gains beside "detspec". Opt-in, like the switch.
    BenchConfig("detspec_split_kv_draft_extend", "DETSPEC_EAGLE, draft extend in the split-KV verify kernel",
                "DETSPEC_EAGLE", False, True, False, opt_in=True, env=(("SGLANG_DETSPEC_SPLIT_KV_DRAFT_EXTEND", "1"),)),
    # The invariant mode with its draft's GEMMs on cuBLAS (SGLANG_DETSPEC_FAST_INVARIANT_DRAFT=1, issue 32 item 3):
    # what leaving the draft non-invariant gains beside "detspec_invariant". Opt-in, like the switch.
    BenchConfig("detspec_invariant_fast_draft", "DETSPEC_EAGLE_INVARIANT, draft GEMMs on cuBLAS",
                "DETSPEC_EAGLE_INVARIANT", False, True, False, opt_in=True,
                env=(("SGLANG_DETSPEC_FAST_INVARIANT_DRAFT", "1"),)),
)
DEFAULT_CONFIGS = tuple(c.name for c in CONFIGS if c.unavailable is None and not c.opt_in)


def config_by_name(name: str) -> BenchConfig:
    for c in CONFIGS:
        if c.name == name:
            return c
    raise ValueError(f"unknown configuration {name!r}; choose from {', '.join(c.name for c in CONFIGS)}")


def parse_configs(text: str) -> Tuple[str, ...]:
    """``"no_spec,detspec"`` -> names in table order; unknown, repeated, unavailable or empty lists are errors."""
    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise ValueError("give at least one configuration")
    if len(set(names)) != len(names):
        raise ValueError(f"configuration listed twice in {text!r}")
    for n in names:
        c = config_by_name(n)
        if c.unavailable:
            raise ValueError(f"configuration {n!r} cannot run: {c.unavailable}")
    return tuple(c.name for c in CONFIGS if c.name in names)


def parse_concurrencies(text: str) -> Tuple[int, ...]:
    """``"1,8,32,128"`` -> (1, 8, 32, 128): positive integers, strictly increasing."""
    parts = [x.strip() for x in text.split(",") if x.strip()]
    if not parts:
        raise ValueError("give at least one concurrency, e.g. 1,8,32,128")
    try:
        values = [int(x) for x in parts]
    except ValueError:
        raise ValueError(f"concurrencies must be integers, got {text!r}") from None
    if any(v < 1 for v in values):
        raise ValueError(f"concurrencies must be at least 1, got {text!r}")
    if any(b <= a for a, b in zip(values, values[1:])):
        raise ValueError(f"concurrencies must be strictly increasing (no repeats), got {text!r}")
    return tuple(values)


@dataclasses.dataclass(frozen=True)
class BenchSettings:
    configs: Tuple[str, ...] = DEFAULT_CONFIGS
    concurrencies: Tuple[int, ...] = (1, 8, 32, 128)
    prompts_per_concurrency: int = 4  # waves: num_prompts = max(this * concurrency, MIN_PROMPTS)
    input_len: int = 256
    output_len: int = 256
    temperature: float = 1.0
    seed: int = 42
    parallel_start: bool = False  # sequential starts: each server loads alone on the GPU
    breakdown: bool = False
    breakdown_concurrency: int = 8
    repetitions: int = 3  # measured runs per (configuration, concurrency); the table gives median and min - max
    min_seconds: float = 20.0  # measured traffic per point, summed over its repetitions (a calibration run sizes them)
    order: str = "sequential"  # one of ORDERS: each configuration's repetitions in one block, or rounds across them

    def validate(self) -> "BenchSettings":
        if min(self.prompts_per_concurrency, self.input_len, self.output_len) < 1:
            raise ValueError("--num-prompts-per-concurrency, --input-len and --output-len must be at least 1")
        if self.repetitions < 1:
            raise ValueError(f"--repetitions must be at least 1, got {self.repetitions}")
        if not 0 <= self.min_seconds <= 3600:
            raise ValueError(f"--min-seconds must be between 0 and 3600, got {self.min_seconds}")
        if self.temperature <= 0:
            raise ValueError("--temperature must be positive: greedy decoding needs no rejection sampling")
        if self.breakdown_concurrency < 1:
            raise ValueError("--breakdown-concurrency must be at least 1")
        if self.order not in ORDERS:
            raise ValueError(f"--order must be one of {', '.join(ORDERS)}, got {self.order!r}")
        if self.order == "interleaved" and not self.parallel_start:
            raise ValueError("--order interleaved needs --start parallel: the rounds alternate between the servers, "
                             "so every server must be up for the whole measurement, but --start sequential (the "
                             "default) starts each one only when its turn comes. Add --start parallel, or use "
                             "--order sequential")
        return self

    @property
    def max_concurrency(self) -> int:
        return max(self.concurrencies + ((self.breakdown_concurrency,) if self.breakdown else ()))

    @property
    def context_length(self) -> int:
        return self.input_len + self.output_len + 64  # room for the draft tokens of the last verify


#: ``--order``: ``sequential`` measures each configuration's repetitions in one block and releases its server before
#: the next; ``interleaved`` measures in rounds (:func:`round_order`), so the machine's slow drift falls on every
#: configuration of a round alike and the per-round ratios cancel it.
ORDERS = ("sequential", "interleaved")


def round_order(configs: Tuple[str, ...], repetitions: int) -> List[List[str]]:
    """The configurations' order in each round of ``--order interleaved``: round r (0-based) starts at configuration
    r mod n, so over n rounds each configuration runs once in every position (the first after the calibrations,
    the one after the slowest neighbour, ...); fewer rounds cancel position effects only partly."""
    n = len(configs)
    return [list(configs[r % n:] + configs[:r % n]) for r in range(repetitions)] if n else []


def order_description(settings: "BenchSettings") -> str:
    """One paragraph on how the measurement is ordered, for ``--dry-run`` and the run's log."""
    reps = settings.repetitions
    if settings.order == "sequential":
        return (f"order: sequential: each configuration alone in turn, a calibration run then {reps} repetitions at "
                f"every concurrency; its server is released before the next configuration is measured; ratios are "
                f"ratios of medians")
    rounds = "; ".join(f"round {r + 1}: {', '.join(names)}"
                       for r, names in enumerate(round_order(settings.configs, reps)))
    return (f"order: interleaved: every server up; one calibration run per configuration and concurrency (in order "
            f"{', '.join(settings.configs)}), then {reps} rounds of one repetition per configuration at every "
            f"concurrency ({rounds}); servers released at the end; ratios are given both as ratios of medians and "
            f"paired: the median and min - max of the per-round ratios")


#: ``--quick``: two concurrencies, shorter outputs, two waves, one repetition of at least 5 s.
QUICK = dict(concurrencies=(1, 32), prompts_per_concurrency=2, output_len=128, repetitions=1, min_seconds=5.0)
MIN_PROMPTS = 8


def num_prompts(settings: BenchSettings, concurrency: int) -> int:
    """Requests of the calibration run at ``concurrency`` (the measured repetitions are sized from its duration)."""
    return max(settings.prompts_per_concurrency * concurrency, MIN_PROMPTS)


#: A measured repetition never sends more than this many times the calibration run's requests.
MAX_SCALE = 64


def repetition_prompts(calibration_prompts: int, calibration_s: float, settings: BenchSettings, concurrency: int) -> int:
    """Requests per measured repetition so that the repetitions together last at least ``settings.min_seconds``:
    the calibration run's rate scaled to ``min_seconds / repetitions``, in whole waves of ``concurrency``, at least
    the calibration's own count and at most :data:`MAX_SCALE` times it."""
    per_rep_s = settings.min_seconds / settings.repetitions
    if calibration_s <= 0:
        return calibration_prompts
    wanted = calibration_prompts * per_rep_s / calibration_s * 1.1  # 10 % margin: the calibration includes warm-up
    waves = -(-int(min(max(wanted, calibration_prompts), calibration_prompts * MAX_SCALE)) // concurrency)
    return max(waves * concurrency, calibration_prompts)


def mem_fraction(servers: int, parallel: bool) -> float:
    """``--mem-fraction-static`` of each server: side by side an equal share, ``min(0.8 / servers, 0.4)`` (each holds
    its pair's weights, its graphs and a KV pool sized for the largest concurrency); alone, 0.5 (more than enough)."""
    return round(min(0.8 / servers, 0.4), 3) if parallel else 0.5


def server_args(config: BenchConfig, target: Path, draft: Path, settings: BenchSettings, *,
                mem_fraction: float) -> List[str]:
    """``launch_server`` arguments (without ``--port``) of ``config`` on the pair. Every configuration shares the
    same target flags: triton attention and pytorch sampling (what works on the project's H200 bundle), CUDA graphs
    up to the largest concurrency, a KV pool sized for it, ``--sleep-on-idle`` (servers waiting their turn poll
    their sockets instead of spinning a core; a request wakes them at once)."""
    max_c = settings.max_concurrency
    pool_tokens = max_c * (settings.context_length + 16)
    args = [
        "--model-path", str(target), "--dtype", "bfloat16",
        "--attention-backend", "triton", "--sampling-backend", "pytorch",
        "--mem-fraction-static", f"{mem_fraction:g}",
        "--max-running-requests", str(max_c), "--max-total-tokens", str(pool_tokens),
        "--cuda-graph-max-bs-decode", str(max_c), "--cuda-graph-max-bs-prefill", "256",
        "--context-length", str(max(settings.context_length, 2048)),
        "--sleep-on-idle", "--host", "127.0.0.1", "--log-level", "info",
    ]
    args += config.speculative_args(draft)
    if config.deterministic:
        args.append("--enable-deterministic-inference")
    return args + list(config.extra_args)


def round_seed(seed: int, round_index: int) -> int:
    """bench_serving's ``--seed`` for repetition ``round_index`` of a point (1-based; 0 is the calibration).

    Each repetition draws a new prompt set, the same for every configuration in that round, so rounds stay paired.
    With one fixed set a seeded server replays the same trajectories in every repetition: bench_serving sends no
    request seed, so every DETSPEC request runs with SGLang's default seed, and its accept length would be one draw
    repeated R times instead of R draws (EAGLE + RS, unseeded, draws anew each time)."""
    return seed + round_index


def bench_serving_command(python: str, port: int, target: Path, settings: BenchSettings, concurrency: int,
                          output_file: Path) -> List[str]:
    """SGLang's own benchmark client against one server at one concurrency: the ``random-ids`` dataset sent as token
    ids (fixed lengths: range ratio 1), the same ``--seed`` for every configuration (so each gets the same prompts;
    the client moves it per repetition, :func:`round_seed`),
    ``--temperature`` for every request, results appended to ``output_file`` (JSON lines)."""
    return [
        python, "-m", "sglang.bench_serving", "--backend", "sglang", "--host", "127.0.0.1", "--port", str(port),
        "--model", str(target), "--tokenizer", str(target),
        "--dataset-name", "random-ids", "--tokenize-prompt",
        "--random-input-len", str(settings.input_len), "--random-output-len", str(settings.output_len),
        "--random-range-ratio", "1.0",
        "--num-prompts", str(num_prompts(settings, concurrency)), "--max-concurrency", str(concurrency),
        "--request-rate", "inf", "--seed", str(settings.seed), "--temperature", f"{settings.temperature:g}",
        "--warmup-requests", "1", "--ready-check-timeout-sec", "30", "--disable-tqdm",
        "--output-file", str(output_file),
    ]


#: Rough costs on an H200 for the default mid-size pair (start-up measured for the tiny pair: 33-60 s alone,
#: 119-134 s for many side by side); the decode rates are guesses until the first run, so the estimate says so.
_START_ALONE_S, _START_PARALLEL_S, _GENERATE_S, _CLIENT_OVERHEAD_S = 70.0, 150.0, 25.0, 3.0
_CLIENT_IMPORT_S = 10.0  # one client process per server (bench_serving's imports)
_STEP_S = {1: 0.004, 8: 0.005, 32: 0.007, 128: 0.012}


def estimate_seconds(settings: BenchSettings) -> float:
    servers = len(settings.configs) + (1 if settings.breakdown else 0)
    start = _START_PARALLEL_S if settings.parallel_start else _START_ALONE_S * servers
    runs = [(c, num_prompts(settings, c)) for c in settings.concurrencies]
    if settings.breakdown:
        runs_breakdown = [(settings.breakdown_concurrency, num_prompts(settings, settings.breakdown_concurrency))]
    else:
        runs_breakdown = []

    def run_s(c: int, n: int, factor: float = 1.0) -> float:
        step = _STEP_S.get(c) or _STEP_S[min(_STEP_S, key=lambda k: abs(k - c))]
        waves = -(-n // c)
        return _CLIENT_OVERHEAD_S + waves * settings.output_len * step * factor

    total = _GENERATE_S + start
    measured = max(settings.min_seconds, _CLIENT_OVERHEAD_S * settings.repetitions)
    total += sum(run_s(c, n) + measured for c, n in runs) * len(settings.configs)
    total += sum(run_s(c, n, 3.0) for c, n in runs_breakdown)  # eager and synchronised: slower
    # Client start-up (bench_serving's imports): one process per configuration, or one for every round of every
    # configuration (plus the breakdown's own) when interleaved; then stopping each server.
    clients = servers if settings.order == "sequential" else 1 + (1 if settings.breakdown else 0)
    return total + _CLIENT_IMPORT_S * clients + 10.0 * servers
