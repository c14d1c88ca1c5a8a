"""``sglang-detspec demo``: the seeded draft sampler's invariants, computed live on CPU with the reference
sampler (and optionally the fused Triton kernel) and printed as one small table.

Importing this module is cheap; torch and the samplers are imported when the demo runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

from sglang_detspec.command_base import PROG, CliError

# The batch sizes the table stays readable for; below 8 tokens, independent draws coincide so often that the
# seed-dependence line could fail by chance.
BATCH_RANGE = (2, 32)
MIN_VOCAB = 8


@dataclass
class DemoResult:
    text: str
    passed: bool
    # The inputs and draws behind the table, so that tests can recompute them independently.
    probs: Any = None
    seeds: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    columns: dict[str, list[int]] = field(default_factory=dict)
    reseeded: list[int] = field(default_factory=list)


def _load_kernel() -> tuple[Callable, str]:
    """The fused Triton sampler and where it runs: the GPU, or Triton's interpreter on CPU tensors."""
    import torch

    if torch.cuda.is_available():
        where = "cuda"
    else:
        # Triton reads TRITON_INTERPRET when a module defining a kernel is imported, so set it first.
        os.environ.setdefault("TRITON_INTERPRET", "1")
        where = "cpu"
    try:
        from sglang_detspec import kernels
    except ImportError as e:
        raise CliError(f"the fused kernel (sglang_detspec.kernels) cannot be imported: {e}") from e
    if where == "cpu" and not kernels.INTERPRETED:
        raise CliError("no CUDA GPU, and the kernels were imported without TRITON_INTERPRET=1: "
                       "set TRITON_INTERPRET=1 to run --kernel on CPU")

    def on_device(p, s, pos, step):
        pk, ik = kernels.seeded_draft_sample(p.to(where), s.to(where), pos.to(where), step)
        return pk.cpu(), ik.cpu()

    return on_device, ("Triton on the GPU" if where == "cuda" else "Triton interpreter on CPU")


def run_demo(
    sampler: Callable | None = None, *, batch: int = 8, vocab: int = 512, extra: int = 24, kernel: bool = False
) -> DemoResult:
    """Compute, live on CPU, the invariants of the seeded draft sampler and render them as a small table.

    ``sampler`` defaults to :func:`sglang_detspec.stream.reference.seeded_draft_sample`; tests pass a broken one to
    prove the checks can fail.  ``kernel``: add a column drawn by the fused Triton kernel (on a permuted batch),
    which must equal the reference's tokens.
    """
    import torch

    if sampler is None:
        try:
            from sglang_detspec.stream.reference import seeded_draft_sample as sampler
        except ImportError as e:
            raise CliError(f"the reference sampler (sglang_detspec.stream.reference) is not available: {e}") from e

    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(batch, vocab, generator=g, dtype=torch.float32) * 2.0, dim=-1)
    base_seeds = [42, 7, 2024, 31337, 4_000_000_007, 9, 1234, 55, 77777, 3, 8080, 600613]
    seeds = torch.tensor([base_seeds[i % len(base_seeds)] + 1000 * (i // len(base_seeds)) for i in range(batch)],
                         dtype=torch.int64)
    positions = torch.randint(1, 4096, (batch,), generator=g, dtype=torch.int64)

    def draw(p, s, pos):
        _, idx = sampler(p, s, pos, 0)
        return idx.reshape(-1).tolist()

    columns: list[tuple[str, list[int]]] = []
    columns.append(("alone", [draw(probs[i : i + 1], seeds[i : i + 1], positions[i : i + 1])[0] for i in range(batch)]))
    columns.append((f"batch of {batch}", draw(probs, seeds, positions)))
    perm = torch.randperm(batch, generator=g)
    permuted = draw(probs[perm], seeds[perm], positions[perm])
    unperm = [0] * batch
    for k, i in enumerate(perm.tolist()):
        unperm[i] = permuted[k]
    columns.append(("permuted", unperm))
    cut = max(1, batch * 3 // 8)
    columns.append((f"split {cut}+{batch - cut}", draw(probs[:cut], seeds[:cut], positions[:cut])
                    + draw(probs[cut:], seeds[cut:], positions[cut:])))
    # Neighbours: the same requests scattered among `extra` unrelated ones.
    other_p = torch.softmax(torch.randn(extra, vocab, generator=g) * 2.0, dim=-1)
    other_s = torch.randint(0, 2**40, (extra,), generator=g, dtype=torch.int64)
    other_pos = torch.randint(1, 4096, (extra,), generator=g, dtype=torch.int64)
    order = torch.randperm(batch + extra, generator=g)
    all_p = torch.cat([probs, other_p])[order]
    all_s = torch.cat([seeds, other_s])[order]
    all_pos = torch.cat([positions, other_pos])[order]
    mixed = draw(all_p, all_s, all_pos)
    where = {int(o): k for k, o in enumerate(order.tolist())}
    columns.append((f"+{extra} others", [mixed[where[i]] for i in range(batch)]))
    reseeded = draw(probs, seeds + 1, positions)
    kernel_where = None
    if kernel:
        kernel_fn, kernel_where = _load_kernel()
        _, kidx = kernel_fn(probs[perm], seeds[perm], positions[perm], 0)
        kernel_col = [0] * batch
        for k, i in enumerate(perm.tolist()):
            kernel_col[i] = int(kidx.reshape(-1)[k])
        columns.append(("fused kernel", kernel_col))

    same = [all(col[i] == columns[0][1][i] for _, col in columns) for i in range(batch)]
    changed = [reseeded[i] != columns[0][1][i] for i in range(batch)]

    # A real sampler, not a hash of the argmax: over many seeds one row's draws follow its probabilities.
    n_seeds = 4096
    small = torch.tensor([0.40, 0.20, 0.15, 0.10, 0.07, 0.05, 0.02, 0.01], dtype=torch.float32)
    many = draw(small.expand(n_seeds, -1).contiguous(), torch.arange(n_seeds, dtype=torch.int64) * 7919 + 1,
                torch.full((n_seeds,), 100, dtype=torch.int64))
    freq = torch.bincount(torch.tensor(many), minlength=small.numel()).double() / n_seeds
    dev = (freq - small.double()).abs().max().item()
    # 5 standard deviations of the largest-variance cell (p = 0.4): a correct sampler fails this ~never.
    limit = 5.0 * (0.4 * 0.6 / n_seeds) ** 0.5

    # Contrast: one shared RNG for the whole batch (what a seedless sampler does).
    g1 = torch.Generator().manual_seed(1)
    shared = torch.multinomial(probs, 1, generator=g1).reshape(-1).tolist()
    g1 = torch.Generator().manual_seed(1)
    shared_perm = torch.multinomial(probs[perm], 1, generator=g1).reshape(-1).tolist()
    shared_unperm = [0] * batch
    for k, i in enumerate(perm.tolist()):
        shared_unperm[i] = shared_perm[k]
    shared_changed = sum(a != b for a, b in zip(shared, shared_unperm))

    names = [name for name, _ in columns]
    widths = [max(len(n), 5) for n in names]
    layout_cells = "  ".join(f"{n:>{w}}" for n, w in zip(names, widths))
    header = f"{'req':>3} {'seed':>13} {'pos':>5} | {layout_cells} | seed+1"
    lines = [
        f"{PROG} demo: the seeded draft sampler (SGLang 0.5.23's key, reference implementation, CPU, vocab {vocab})",
        "Token drawn by each request alone, in one batch, permuted, split, among other requests; then with seed+1:",
        "",
        header,
        "-" * len(header),
    ]
    for i in range(batch):
        cells = "  ".join(f"{col[i]:>{w}}" for (_, col), w in zip(columns, widths))
        flag = "" if same[i] else "  <- batch-dependent!"
        lines.append(f"{i:>3} {int(seeds[i]):>13} {int(positions[i]):>5} | {cells} | {reseeded[i]:>6}{flag}")
    lines.append("")
    ok_layout = all(same)
    ok_seed = any(changed)
    ok_dist = dev <= limit
    mark = {True: "[ok]  ", False: "[FAIL]"}
    lines.append(f"{mark[ok_layout]} batch-invariant: {sum(same)}/{batch} requests drew one token in all "
                 f"{len(columns)} columns" + (f" (fused kernel: {kernel_where}, permuted batch)" if kernel else ""))
    lines.append(f"{mark[ok_seed]} seed-dependent: seed+1 drew a new token for {sum(changed)}/{batch} requests "
                 "(independent draws may coincide)")
    lines.append(f"{mark[ok_dist]} a true sampler: over {n_seeds} seeds, draws from p = "
                 f"{[round(x, 2) for x in small.tolist()]} hit each token at rate p +- {dev:.3f} "
                 f"(limit {limit:.3f})")
    lines.append(f"[info] contrast, one shared RNG (torch.multinomial): permuting the batch changed "
                 f"{shared_changed}/{batch} tokens")
    verdict = ok_layout and ok_seed and ok_dist
    lines.append("PASS: a request's seed, not its batch, decides its token" if verdict else
                 "FAIL: an invariant does not hold (see [FAIL] above)")
    return DemoResult(
        text="\n".join(lines),
        passed=verdict,
        probs=probs,
        seeds=seeds.tolist(),
        positions=positions.tolist(),
        columns=dict(columns),
        reseeded=reseeded,
    )
