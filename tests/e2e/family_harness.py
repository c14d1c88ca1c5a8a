"""The model-family pairs' E2E servers (tests/e2e/test_e2e_families.py) and the helpers that module needs beyond
:mod:`e2e_harness`: seeded sweeps, what a server says it serves, refusal lines in a start-up log.

Every family server is named ``family_<pair>_<role>`` (:func:`server_name`); :func:`family_specs` builds only the pairs
the selected tests' ``e2e_server`` marks name (``tests/e2e/conftest.py`` merges them into the session's pool), so a
run of the other E2E modules builds no family pair, and ``-k qwen3_moe`` starts only that pair's servers. Standard
library only at import, like :mod:`e2e_harness`.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from e2e_harness import (
    GRAPHS_OFF,
    INVARIANT_ARGS,
    TOKEN_ID_SAMPLER_ENV,
    HTTPStatusError,
    ServerSpec,
    common_args,
    eagle_args,
    get_json,
    post_json,
)

#: The pairs served end to end here. ``qwen3_eagle3`` (reduced-vocabulary EAGLE3 draft) is served, under DETSPEC_EAGLE3
#: and DETSPEC_EAGLE3_INVARIANT, by tests/e2e/test_e2e_reduced_vocab.py, not here.
E2E_PAIRS = ("qwen3_moe", "deepseek_mtp")
#: The builtin algorithm a user serves each pair's draft with: an EAGLE draft with EAGLE, DeepSeek's own MTP layer
#: with NEXTN (SGLang resolves NEXTN to EAGLE; the plugin's twin of both is DETSPEC_EAGLE).
BUILTIN_ALGORITHM = {"qwen3_moe": "EAGLE", "deepseek_mtp": "NEXTN"}
DETSPEC = "DETSPEC_EAGLE"
INVARIANT = "DETSPEC_EAGLE_INVARIANT"

#: Every served pair's roles: DETSPEC_EAGLE with CUDA graphs on / off, the builtin control (rejection sampling, no
#: determinism), the non-speculative token-id reference and the invariant mode with graphs on / off.
ROLES = ("detspec_graph", "detspec_nograph", "builtin_rs", "nonspec_token_id", "invariant_graph", "invariant_nograph")
#: Configurations expected to be refused at start-up: (pair, role).
REFUSED = (("deepseek_mtp", "detspec_flashinfer"),)
_PREFIX = "family_"
_ALL_PAIRS = ("qwen3_moe", "deepseek_mtp")  # longest-match order does not matter: no pair prefixes another


def server_name(pair: str, role: str) -> str:
    """The pool's name of ``pair``'s ``role`` server, e.g. ``family_qwen3_moe_detspec_graph``."""
    if (pair not in E2E_PAIRS or role not in ROLES) and (pair, role) not in REFUSED:
        raise ValueError(f"no family E2E server {role!r} for pair {pair!r}: the served pairs are {E2E_PAIRS} with roles "
                         f"{ROLES}; refused at start-up: {REFUSED}")
    return f"{_PREFIX}{pair}_{role}"


def parse_server_name(name: str) -> Optional[Tuple[str, str]]:
    """``(pair, role)`` of a family server's name, None for any other server's name."""
    if not name.startswith(_PREFIX):
        return None
    rest = name[len(_PREFIX):]
    for pair in _ALL_PAIRS:
        if rest.startswith(pair + "_"):
            role = rest[len(pair) + 1:]
            if (pair in E2E_PAIRS and role in ROLES) or (pair, role) in REFUSED:
                return pair, role
    return None


def pair_servers(pair: str) -> List[str]:
    """The names of every server of served ``pair`` (its :data:`ROLES`)."""
    return [server_name(pair, role) for role in ROLES]


def _pair_specs(pair: str, target: Path, draft: Path) -> Dict[str, ServerSpec]:
    """``{role: spec}`` of ``pair``, served from ``target`` with ``draft``. The invariant sweep's servers take decode
    graphs up to 32 requests (``INVARIANT_ARGS``) as tests/e2e/test_e2e_invariant.py's do."""
    base = common_args(target, pair)
    detspec = base + eagle_args(draft, DETSPEC, deterministic=True)
    invariant = base + eagle_args(draft, INVARIANT, deterministic=True) + INVARIANT_ARGS
    specs = {}
    if pair in E2E_PAIRS:
        specs.update({
            "detspec_graph": ServerSpec("", detspec),
            "detspec_nograph": ServerSpec("", detspec + GRAPHS_OFF),
            "builtin_rs": ServerSpec("", base + eagle_args(draft, BUILTIN_ALGORITHM[pair], rejection_sampling=True)),
            "nonspec_token_id": ServerSpec("", base + ["--enable-deterministic-inference"] + INVARIANT_ARGS,
                                           env={TOKEN_ID_SAMPLER_ENV: "1"}),
            "invariant_graph": ServerSpec("", invariant),
            "invariant_nograph": ServerSpec("", invariant + GRAPHS_OFF),
        })
    if pair == "deepseek_mtp":
        # SGLang's deterministic mode allows DeepSeek models only the fa3 / fa4 / triton attention backends.
        specs["detspec_flashinfer"] = ServerSpec("", detspec + ["--attention-backend", "flashinfer"], expect_exit=True)
    return specs


def family_specs(root: Optional[Path], names: Iterable[str]) -> Dict[str, ServerSpec]:
    """The specs of the family servers among ``names`` (other names are ignored), building (once, cached under
    ``root``, the package's default cache root when None) only the pairs they belong to."""
    from sglang_detspec.models.family_pairs import ensure_family_pair

    wanted: Dict[str, List[str]] = {}
    for name in names:
        parsed = parse_server_name(name)
        if parsed is not None:
            wanted.setdefault(parsed[0], []).append(parsed[1])
    specs = {}
    for pair, roles in wanted.items():
        built = ensure_family_pair(root, pair)
        by_role = _pair_specs(pair, built.target, built.draft)
        for role in roles:
            spec = by_role[role]
            specs[server_name(pair, role)] = ServerSpec(server_name(pair, role), spec.args, spec.expect_exit, spec.env)
    return specs


# ---------------------------------------------------------------------------------------------
# What a running server says it serves, and what a refused one said


#: The resolved server arguments the families module records per server: the attention and MoE backends SGLang
#: chose (a silent switch away from what the test asked would show here), the algorithm, the graphs.
SERVED_FIELDS = ("attention_backend", "moe_runner_backend", "speculative_algorithm", "speculative_draft_model_path",
                 "enable_deterministic_inference", "sampling_backend", "disable_cuda_graph", "cuda_graph_backend_decode",
                 "cuda_graph_max_bs_decode", "disable_radix_cache", "chunked_prefill_size", "version")


def served_settings(base_url: str, get=None) -> dict:
    """:data:`SERVED_FIELDS` of the server's ``/server_info`` (``/get_server_info`` where the first is missing);
    a field the release does not report is left out. Raises the last error when neither endpoint answers."""
    get = get or get_json
    last: Optional[Exception] = None
    for path in ("/server_info", "/get_server_info"):
        try:
            info = get(base_url, path)
        except (HTTPStatusError, OSError) as e:  # urllib's HTTPError is an OSError
            last = e
            continue
        return {k: info[k] for k in SERVED_FIELDS if k in info}
    raise RuntimeError(f"{base_url}: neither /server_info nor /get_server_info answered ({last})")


def refusal_line(log: str, *needles: str) -> Optional[str]:
    """The last line of ``log`` holding every one of ``needles`` (whitespace-normalised), None if none does."""
    for line in reversed(log.splitlines()):
        if all(n in line for n in needles):
            return " ".join(line.split())
    return None


# ---------------------------------------------------------------------------------------------
# Seeded sweeps (tests/e2e/test_e2e_invariant.py's, sized for a family pair)


def sweep_params(seed: int, *, max_new_tokens: int, temperature: float = 1.0) -> dict:
    return {"temperature": temperature, "top_p": 1.0, "max_new_tokens": max_new_tokens, "ignore_eos": True,
            "sampling_seed": seed}


def seed_sweep(base_url: str, seeds: Sequence[int], prompts: Sequence[str], *, max_new_tokens: int,
               batch: int = 8, in_flight: int = 64, post=None) -> List[dict]:
    """Every seed's response in seed order: seed ``s`` on prompt ``prompts[(s - 1) % len(prompts)]``, ``batch``
    requests per ``/generate`` POST, ``in_flight`` requests in flight. Refuses any answer that is not one response of
    ``max_new_tokens`` output ids per request (``ignore_eos``), naming the seed."""
    post = post or post_json
    if batch < 1 or in_flight < batch:
        raise ValueError(f"seed_sweep: batch {batch} and in_flight {in_flight}: need 1 <= batch <= in_flight")

    def one(chunk):
        body = {"text": [prompts[(s - 1) % len(prompts)] for s in chunk],
                "sampling_params": [sweep_params(s, max_new_tokens=max_new_tokens) for s in chunk]}
        out = post(base_url, "/generate", body, timeout=300)
        if not isinstance(out, list) or len(out) != len(chunk):
            raise RuntimeError(f"/generate of {len(chunk)} requests returned {str(out)[:300]}")
        for s, r in zip(chunk, out):
            ids = r.get("output_ids") if isinstance(r, dict) else None
            if ids is None or len(ids) != max_new_tokens:
                raise RuntimeError(f"seed {s}: expected {max_new_tokens} output ids (ignore_eos), got {str(r)[:300]}")
        return out

    chunks = [list(seeds[i:i + batch]) for i in range(0, len(seeds), batch)]
    with ThreadPoolExecutor(max(1, in_flight // batch)) as pool:
        return [r for part in pool.map(one, chunks) for r in part]
