"""Verify-scheme benchmark: the coupled (``DETSPEC_*_INVARIANT``) kernels beside the rejection-sampling ones.

    python scripts/bench/bench_verify_schemes.py --out DIR [--quick] [--vocabs V ...] [--batches B ...] [--steps S]
                                                 [--coupled-launches 1024x4,2048x8,...]

Needs a CUDA GPU and SGLang 0.5.17 - 0.5.23 (its chain kernel, its seeded verify coins and, for the coupled race,
its ``multinomial_with_seed`` clamp). For one decode step of a linear topk-1 chain with ``S`` draft steps
(``S + 1`` verify rows per request), it measures, in one run, on the same inputs:

* ``proposal`` (one draft step on a ``[B, V]`` float32 q; a decode step runs ``S`` of them): rejection =
  :func:`~sglang_detspec.integration.sampling.proposal.seeded_draft_proposal` under ``scheme.REJECTION`` (the fused seeded
  sampler), coupled = the same entry point under ``scheme.selected(scheme.COUPLED)`` (``log q`` + the coupled race).
* ``verify`` over ``target_probs`` ``[B, S+1, V]``: rejection = SGLang's ``chain_speculative_sampling_triton`` with
  the keyword arguments ``eagle_sample`` passes (0.5.17 and 0.5.23 pass the same ones: outputs ``predicts`` int32
  ``[B*(S+1)]``, ``accept_index`` int32 ``[B, S+1]``, ``accept_token_num`` int32 ``[B]``; int64 ``candidates`` /
  ``retrive_*`` of the chain; SGLang's seeded coins from its own ``_seeded_verify_coins``; ``draft_probs``
  ``[B, S, V]``; thresholds 1.0, SGLang's defaults, which the Triton kernel does not read; ``deterministic=True``),
  behind :func:`~sglang_detspec.integration.sampling.verify.truncate_target_probs` exactly as DETSPEC's chain wrapper runs
  it; coupled = :func:`~sglang_detspec.integration.sampling.coupled_verify.coupled_chain_verify` with those kwargs and a
  minimal ``sampling_info`` (what ``coupled_target_tokens`` reads: seeds, the ``need_*`` flags, ``top_ks`` /
  ``top_ps`` / ``min_ps``; temperatures for completeness).
* ``step_total``: ``S`` proposals + 1 verify (sum of medians; peak = the larger of the two).
* with ``--coupled-launches BLOCKxWARPS,...``: the coupled race alone
  (:func:`~sglang_detspec.kernels.coupled_race_probs.coupled_race_probs`) on the proposal's ``[B, V]`` and the
  verify's ``[B*(S+1), V]`` rows under each stage-1 launch, beside its default launch (``race_launch``), each with
  both screen forms (``fast_screen``: ``lg2.approx``, the default, and libdevice's ``logf``), in
  ``coupled_launches.csv``: what its ``LAUNCH_TABLE`` and screen default are chosen from.

Row-local truncation: ``truncate_target_probs`` returns ``target_probs`` itself, launching nothing, unless a row has
top-k, top-p or min-p (SGLang's host-side ``need_*`` flags). The benchmark's rows are plain temperature rows, so the
rejection verify's timed call includes it at zero cost, and the coupled verify skips its truncation too; truncated
batches are not measured here (``scripts/bench/bench_truncation.py`` times the truncation kernel).

Each case is captured in a CUDA graph (``--calls-per-graph`` calls back to back) and replayed with
:func:`sglang_detspec.bench.sampler_bench.graph_time_us`; median (and p90) µs per call, the ratio coupled / rejection, and
:func:`sglang_detspec.bench.sampler_bench.peak_extra_mib` of one eager call. Writes ``verify_schemes_bench.csv`` and
``.json`` to ``--out`` and prints a table.

Caveats: kernel times only -- not timed (the same under both schemes): the target softmax, the coins (``eagle_sample``
computes them under both schemes; the coupled verify does not read them), allocating the outputs, the draft and
target forwards. Inputs are synthetic: target logits ``randn * 3``, draft logits = target + ``randn`` (the mean
accepted drafts are reported); the chain kernel's final draw reads ``p`` and, after a rejection, ``q`` too, so its
time depends slightly on acceptance, the coupled race's does not. Small ``B * V`` stays in the 50 MB L2 across
back-to-back calls (both schemes alike). ``block_verification`` (0.5.23) stays False: DETSPEC refuses it.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Dict, List, Optional, Sequence

import torch

from sglang_detspec.bench.sampler_bench import VOCABS, graph_time_us, peak_extra_mib
from sglang_detspec.integration.sampling import scheme
from sglang_detspec.integration.sampling.coupled_verify import coupled_chain_verify
from sglang_detspec.integration.sampling.proposal import seeded_draft_proposal
from sglang_detspec.integration.sampling.verify import VerifySite, truncate_target_probs
from sglang_detspec.kernels.launch_checks import require_launch

BATCHES = (1, 8, 32, 128, 256)
QUICK_BATCHES = (1, 128)
STEPS = 3
SCHEMES = ("rejection", "coupled")
_SCHEME_OF = {"rejection": scheme.REJECTION, "coupled": scheme.COUPLED}
#: the coupled race's two screen forms (kernels/coupled_scoring.py::exponential_f32), by ``fast_screen``
SCREENS = {True: "lg2.approx", False: "logf"}
_INSTALL = ("install SGLang 0.5.17 - 0.5.23 in this Python (pip install 'sglang>=0.5.17,<0.5.24'), or put the "
            "staged SGLang bundle on PYTHONPATH")


class SGLangMissing(RuntimeError):
    """SGLang's verify pieces are not importable (the message names what to install)."""


def load_sglang_verify():
    """SGLang's ``(chain_speculative_sampling_triton, _seeded_verify_coins)``, imported here, not at module import.

    The chain kernel lives in ``sglang.kernels.ops.speculative.reject_sampling`` in 0.5.17 (``eagle_sample``
    imports it from there) and 0.5.23 (``verify_sampling`` re-exports that function on CUDA).
    """
    try:
        from sglang.kernels.ops.speculative.reject_sampling import chain_speculative_sampling_triton
        from sglang.srt.speculative.eagle_utils import _seeded_verify_coins
    except ImportError as e:
        raise SGLangMissing(f"the verify-scheme benchmark needs SGLang's rejection-sampling verify ({e}); {_INSTALL}") from e
    return chain_speculative_sampling_triton, _seeded_verify_coins


def sampling_info_for(seeds: torch.Tensor) -> SimpleNamespace:
    """A plain-temperature batch's ``sampling_info``: what ``coupled_target_tokens`` / ``truncate_target_probs`` read."""
    bs, dev = seeds.shape[0], seeds.device
    return SimpleNamespace(
        sampling_seed=seeds, temperatures=torch.ones(bs, 1, device=dev),
        top_ks=torch.full((bs,), 1 << 30, dtype=torch.int32, device=dev),  # SGLang's TOP_K_ALL
        top_ps=torch.ones(bs, device=dev), min_ps=torch.zeros(bs, device=dev),
        need_top_k_sampling=False, need_top_p_sampling=False, need_min_p_sampling=False, is_all_greedy=False,
        acc_additive_penalties=None, acc_scaling_penalties=None, logit_bias=None,
    )


def make_step_inputs(batch: int, vocab: int, steps: int, device, seed: int = 0, draft_noise: float = 1.0):
    """One decode step's inputs: ``draft_probs`` ``[B, S, V]``, ``target_probs`` ``[B, S+1, V]``, seeds, seq_lens, root.

    ``draft_noise = 0`` makes q equal to the target's first ``S`` rows (every draft is then accepted by both schemes).
    """
    g = torch.Generator(device=device).manual_seed(seed)
    t_logits = torch.randn(batch, steps + 1, vocab, device=device, generator=g) * 3.0
    d_logits = t_logits[:, :steps] + torch.randn(batch, steps, vocab, device=device, generator=g) * draft_noise
    seeds = torch.randint(-(2**63), 2**63 - 1, (batch,), device=device, dtype=torch.int64, generator=g)
    return SimpleNamespace(
        steps=steps, target_probs=torch.softmax(t_logits, dim=-1), draft_probs=torch.softmax(d_logits, dim=-1),
        seeds=seeds, seq_lens=torch.randint(16, 4096, (batch,), device=device, dtype=torch.int64, generator=g),
        root=torch.randint(0, vocab, (batch,), device=device, dtype=torch.int64, generator=g),
        sampling_info=sampling_info_for(seeds),
    )


def proposal_fn(which: str) -> Callable:
    """``fn(q, seeds, positions, draft_step) -> (q(x) [B,1], x [B,1])``: the one proposal entry point under ``which``."""
    chosen = _SCHEME_OF[which]

    def propose(q, seeds, positions, draft_step):
        with scheme.selected(chosen):
            return seeded_draft_proposal(q, seeds, positions, draft_step)

    return propose


def propose_chain(which: str, inp) -> torch.Tensor:
    """``candidates`` ``[B, S+1]`` int64: the root, then draft ``i`` proposed from ``q_i`` keyed at ``seq_lens + i``."""
    fn = proposal_fn(which)
    tokens = [inp.root]
    for i in range(inp.steps):
        tokens.append(fn(inp.draft_probs[:, i], inp.seeds, inp.seq_lens + i, i)[1].view(-1))
    return torch.stack(tokens, dim=1)


def seeded_coins(inp, seeded_verify_coins: Callable):
    """SGLang's ``(coins [B, S+1], coins_for_final_sampling [B])`` for this batch (its ``_seeded_verify_coins``)."""
    return seeded_verify_coins(sampling_seed=inp.seeds, seq_lens=inp.seq_lens, draft_token_num=inp.steps + 1,
                               device=inp.seeds.device)


def chain_kwargs(inp, candidates: torch.Tensor, coins) -> Dict:
    """The keyword arguments SGLang's ``eagle_sample`` passes the chain kernel, with fresh outputs."""
    bs, n = candidates.shape
    dev = candidates.device
    retrive_index = torch.arange(bs * n, dtype=torch.int64, device=dev).view(bs, n)
    next_token = torch.arange(1, n + 1, dtype=torch.int64, device=dev).masked_fill(
        torch.arange(n, device=dev) == n - 1, -1).expand(bs, n).contiguous()
    return dict(
        predicts=torch.zeros(bs * n, dtype=torch.int32, device=dev),
        accept_index=torch.full((bs, n), -1, dtype=torch.int32, device=dev),  # max_tree_depth = S + 1 for a chain
        accept_token_num=torch.empty(bs, dtype=torch.int32, device=dev),
        candidates=candidates, retrive_index=retrive_index, retrive_next_token=next_token,
        retrive_next_sibling=torch.full((bs, n), -1, dtype=torch.int64, device=dev),
        uniform_samples=coins[0], uniform_samples_for_final_sampling=coins[1],
        target_probs=inp.target_probs, draft_probs=inp.draft_probs,
        threshold_single=1.0, threshold_acc=1.0, deterministic=True,
    )


def verify_fn(which: str, inp, chain_kernel: Optional[Callable] = None) -> Callable:
    """``fn(kwargs)``: the verify DETSPEC runs under ``which`` (module docstring), filling the kwargs' outputs."""
    if which == "coupled":
        return lambda kwargs: coupled_chain_verify(inp.sampling_info, inp.seq_lens, **kwargs)
    site = VerifySite(inp.sampling_info, inp.steps + 1, seq_lens=inp.seq_lens)

    def rejection(kwargs):
        # DETSPEC's chain wrapper (verify._truncate_then_chain): the row-local truncation, then SGLang's kernel.
        return chain_kernel(**{**kwargs, "target_probs": truncate_target_probs(site, kwargs["target_probs"])})

    return rejection


def _timed(fn: Callable, args, calls_per_graph: int, replays: int) -> Dict:
    t = sorted(graph_time_us(fn, args, calls_per_graph, replays))
    return dict(median=statistics.median(t), p90=t[(9 * len(t)) // 10], peak=peak_extra_mib(fn, args))


def measure(batch: int, vocab: int, steps: int, chain_kernel, seeded_verify_coins, calls_per_graph: int,
            replays: int, device) -> Dict[str, Dict[str, Dict]]:
    """``{part: {scheme: {median, p90, peak[, accepted]}}}`` for one (batch, vocab)."""
    inp = make_step_inputs(batch, vocab, steps, device)
    coins = seeded_coins(inp, seeded_verify_coins)
    q = inp.draft_probs[:, 1].contiguous()
    res: Dict[str, Dict[str, Dict]] = {"proposal": {}, "verify": {}}
    for which in SCHEMES:
        res["proposal"][which] = _timed(proposal_fn(which), (q, inp.seeds, inp.seq_lens + 1, 1), calls_per_graph,
                                        replays)
        fn = verify_fn(which, inp, chain_kernel)
        kwargs = chain_kwargs(inp, propose_chain(which, inp), coins)
        fn(kwargs)
        accepted = float(kwargs["accept_token_num"].float().mean())
        res["verify"][which] = dict(_timed(fn, (kwargs,), calls_per_graph, replays), accepted=accepted)
    return res


def rows_for(vocab: int, batch: int, steps: int, res) -> List[Dict]:
    out = []
    total = {w: dict(median=steps * res["proposal"][w]["median"] + res["verify"][w]["median"], p90=None,
                     peak=max(res["proposal"][w]["peak"], res["verify"][w]["peak"])) for w in SCHEMES}
    for part, calls, r in (("proposal", 1, res["proposal"]), ("verify", 1, res["verify"]),
                           ("step_total", steps + 1, total)):
        rej, cpl = r["rejection"], r["coupled"]
        out.append(dict(
            vocab=vocab, batch=batch, steps=steps, part=part, calls=calls,
            rejection_us=round(rej["median"], 3), coupled_us=round(cpl["median"], 3),
            ratio_coupled_vs_rejection=round(cpl["median"] / rej["median"], 4),
            rejection_p90_us="" if rej["p90"] is None else round(rej["p90"], 3),
            coupled_p90_us="" if cpl["p90"] is None else round(cpl["p90"], 3),
            rejection_peak_mib=round(rej["peak"], 3), coupled_peak_mib=round(cpl["peak"], 3),
            rejection_mean_accepted=round(rej["accepted"], 3) if "accepted" in rej else "",
            coupled_mean_accepted=round(cpl["accepted"], 3) if "accepted" in cpl else "",
        ))
    return out


def parse_launches(text: str) -> List[tuple]:
    """``"1024x4,2048x8"`` -> ``[(1024, 4), (2048, 8)]``; ValueError naming the flag otherwise."""
    launches = []
    for part in filter(None, (x.strip() for x in text.split(","))):
        try:
            block, warps = (int(v) for v in part.lower().split("x"))
        except ValueError:
            raise ValueError(f"--coupled-launches: {part!r} is not BLOCKxWARPS (e.g. 2048x8)") from None
        try:
            require_launch(block, warps)  # refused here, before any GPU work
        except ValueError as e:
            raise ValueError(f"--coupled-launches: {part!r}: {e}") from None
        launches.append((block, warps))
    if not launches:
        raise ValueError("--coupled-launches: no launch given (e.g. 1024x4,2048x8)")
    return launches


def measure_launches(batch: int, vocab: int, steps: int, launches, calls_per_graph: int, replays: int,
                     device) -> List[Dict]:
    """The coupled race alone on proposal-shaped and verify-shaped rows, under the default and each launch."""
    from sglang_detspec.kernels.coupled_race_probs import coupled_race_probs, race_launch

    inp = make_step_inputs(batch, vocab, steps, device)
    shapes = (("proposal", inp.draft_probs[:, 1].contiguous(), inp.seeds, inp.seq_lens + 1),
              ("verify", inp.target_probs.reshape(-1, vocab), inp.seeds.repeat_interleave(steps + 1),
               (inp.seq_lens.view(-1, 1) + torch.arange(steps + 1, device=device)).reshape(-1)))
    out = []
    for part, probs, seeds, positions in shapes:
        default = race_launch(probs.shape[0], vocab)
        want = coupled_race_probs(probs, seeds, positions)
        base = None
        for block, warps in [default, *[x for x in launches if x != default]]:
            for fast in (True, False):  # the default screen (lg2.approx) first: it is the base of vs_default

                def race(pr, se, po, block=block, warps=warps, fast=fast):
                    return coupled_race_probs(pr, se, po, block_size=block, num_warps=warps, fast_screen=fast)

                screen = SCREENS[fast]
                if not torch.equal(race(probs, seeds, positions), want):  # every launch is the same exact race
                    raise RuntimeError(f"coupled race launch {block}x{warps} ({screen} screen) gave other tokens "
                                       f"than {default} (B={batch}, V={vocab}, {part}): a kernel bug, report it")
                t = _timed(race, (probs, seeds, positions), calls_per_graph, replays)
                base = base or t["median"]
                out.append(dict(vocab=vocab, batch=batch, part=part, rows=probs.shape[0], block=block, warps=warps,
                                screen=screen, default=(block, warps) == default and fast,
                                median_us=round(t["median"], 3), p90_us=round(t["p90"], 3),
                                vs_default=round(t["median"] / base, 4)))
    return out


def run(out_dir: Path, quick: bool = False, vocabs: Optional[Sequence[int]] = None,
        batches: Optional[Sequence[int]] = None, steps: int = STEPS, calls_per_graph: int = 10,
        replays: Optional[int] = None, coupled_launches: Optional[Sequence[tuple]] = None, log=print) -> List[Dict]:
    if not torch.cuda.is_available():
        raise RuntimeError("the verify-scheme benchmark needs a CUDA GPU")
    if steps < 1:
        raise ValueError(f"--steps must be >= 1, got {steps}")
    chain_kernel, seeded_verify_coins = load_sglang_verify()
    from sglang_detspec.integration import compat

    device = torch.device("cuda")
    vocabs = list(vocabs or (VOCABS[-1:] if quick else VOCABS))
    batches = list(batches or (QUICK_BATCHES if quick else BATCHES))
    replays = replays or (20 if quick else 100)
    out_dir.mkdir(parents=True, exist_ok=True)
    log(f"device: {torch.cuda.get_device_name()}  sglang {compat.installed_sglang_version()}  S = {steps} "
        f"({steps + 1} verify rows)  {replays} replays of {calls_per_graph} calls")
    log(f"{'V':>7} {'B':>4} {'part':<10} {'rejection_us':>12} {'coupled_us':>10} {'x':>6} "
        f"{'rejMiB':>8} {'cplMiB':>8} {'accepted rej/cpl':>16}")
    rows: List[Dict] = []
    launch_rows: List[Dict] = []
    for vocab in vocabs:
        for batch in batches:
            if coupled_launches:
                for lr in measure_launches(batch, vocab, steps, coupled_launches, calls_per_graph, replays, device):
                    launch_rows.append(lr)
                    log(f"{vocab:>7} {batch:>4} coupled race {lr['part']:<8} rows {lr['rows']:>5} launch "
                        f"{lr['block']}x{lr['warps']} {lr['screen']:<10}{' (default)' if lr['default'] else ''}: "
                        f"{lr['median_us']:.2f} us, x{lr['vs_default']:.3f} of the default")
            res = measure(batch, vocab, steps, chain_kernel, seeded_verify_coins, calls_per_graph, replays, device)
            for row in rows_for(vocab, batch, steps, res):
                rows.append(row)
                acc = f"{row['rejection_mean_accepted']}/{row['coupled_mean_accepted']}" if row["part"] == "verify" else ""
                log(f"{vocab:>7} {batch:>4} {row['part']:<10} {row['rejection_us']:>12.2f} {row['coupled_us']:>10.2f} "
                    f"{row['ratio_coupled_vs_rejection']:>6.2f} {row['rejection_peak_mib']:>8.2f} "
                    f"{row['coupled_peak_mib']:>8.2f} {acc:>16}")
                sys.stdout.flush()
            torch.cuda.empty_cache()
    meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                sglang=compat.installed_sglang_version(), steps=steps, calls_per_graph=calls_per_graph,
                replays=replays, cap_unit_uniform=compat.seeded_race_caps_unit_uniform(),
                time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                note="step_total = steps x proposal + verify (sum of medians); its peak is the larger of the two")
    try:
        import triton

        meta["triton"] = triton.__version__
    except Exception:  # pragma: no cover
        pass
    csv_path = out_dir / "verify_schemes_bench.csv"
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    if launch_rows:
        with open(out_dir / "coupled_launches.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(launch_rows[0].keys()))
            w.writeheader()
            w.writerows(launch_rows)
    (out_dir / "verify_schemes_bench.json").write_text(
        json.dumps(dict(meta=meta, rows=rows, coupled_launches=launch_rows), indent=1))
    log(f"wrote {csv_path} and verify_schemes_bench.json")
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_verify_schemes", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="output directory (CSV, JSON)")
    ap.add_argument("--quick", action="store_true", help=f"V = {VOCABS[-1]}, B = 1 and 128, 20 replays")
    ap.add_argument("--vocabs", type=int, nargs="+", default=None, help=f"default {list(VOCABS)}")
    ap.add_argument("--batches", type=int, nargs="+", default=None, help=f"default {list(BATCHES)}")
    ap.add_argument("--steps", type=int, default=STEPS, help="draft steps S (S + 1 verify rows)")
    ap.add_argument("--calls-per-graph", type=int, default=10)
    ap.add_argument("--replays", type=int, default=None)
    ap.add_argument("--coupled-launches", default=None, metavar="BLOCKxWARPS,...",
                    help="also time the coupled race alone under these stage-1 launches, e.g. 1024x4,2048x8,4096x16")
    args = ap.parse_args(argv)
    try:
        launches = parse_launches(args.coupled_launches) if args.coupled_launches is not None else None
    except ValueError as e:
        ap.error(str(e))
    if not torch.cuda.is_available():
        print("bench_verify_schemes: no CUDA GPU visible; the benchmark measures CUDA-graph replays on a GPU "
              "(run scripts/run_gpu_checks.sh on a GPU machine)", file=sys.stderr)
        return 2
    try:
        run(args.out, quick=args.quick, vocabs=args.vocabs, batches=args.batches, steps=args.steps,
            calls_per_graph=args.calls_per_graph, replays=args.replays, coupled_launches=launches)
    except SGLangMissing as e:
        print(f"bench_verify_schemes: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
