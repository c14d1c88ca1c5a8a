"""The verify-scheme benchmark's cases (sglang_detspec/bench/verify_schemes_bench.py) compute what they claim to time.

Without a GPU the cases run on CPU tensors (B=2, V=300, S=3): SGLang's Triton chain kernel and its seeded-coin hash
under TRITON_INTERPRET=1 (tests/conftest.py; the hash through sglang_verify_harness.sglang_hash_on_cpu), the
proposal and the coupled race through their CPU dispatch (the torch references). On a GPU the same checks run on
CUDA tensors (the kernels). The CUDA-graph timing itself is exercised only by the ``gpu``-marked smoke test.

Checked against references that are not the code under test where one exists: the coupled verify's emitted
tokens and accept counts against ``coupled_verify_reference`` (the target race at ``seq_lens + j``); the
rejection verify's outputs against the chain rule recomputed in Python from the same coins (accept while
``coin * q < p``), with SGLang's output layout (``accept_token_num`` in [0, S], ``accept_index`` = the retrieve
index of the accepted prefix, then -1); SGLang's coins against the project's own murmur hash; and with q = p both
schemes must accept every draft (the proposals are keyed where the verify looks).
"""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sglang_detspec.bench import verify_schemes_bench as bench
from sglang_detspec.integration import compat
from sglang_detspec.integration.sampling.verify import VerifySite, truncate_target_probs
from sglang_detspec.stream.coupled_reference import (
    UMAX,
    coupled_race_reference,
    coupled_verify_reference,
    resolve_uniform,
)
from sglang_detspec.stream.reference import murmur3_unsalted_hash

import sglang_verify_harness as harness

B, V, S = 2, 300, 3
DEV = "cuda" if torch.cuda.is_available() else "cpu"
ROOT = str(Path(__file__).resolve().parents[3])


@pytest.fixture
def sglang_parts(monkeypatch):
    if DEV == "cpu":
        harness.sglang_hash_on_cpu(monkeypatch)  # SGLang's murmur_hash32 (the coins) on CPU tensors
    return bench.load_sglang_verify()


def _verify(which, inp, parts):
    chain, coin_fn = parts
    coins = bench.seeded_coins(inp, coin_fn)
    candidates = bench.propose_chain(which, inp)
    kwargs = bench.chain_kwargs(inp, candidates, coins)
    assert bench.verify_fn(which, inp, chain)(kwargs) is None
    return kwargs, coins


def _check_layout(kwargs):
    """SGLang's output layout: accept counts in [0, S]; accept_index = retrieve index of the accepted prefix, -1 after."""
    n = kwargs["accept_token_num"].cpu()
    assert kwargs["accept_token_num"].dtype == torch.int32 and n.shape == (B,)
    assert bool(((n >= 0) & (n <= S)).all()), n
    assert kwargs["predicts"].shape == (B * (S + 1),) and kwargs["predicts"].dtype == torch.int32
    acc = kwargs["accept_index"].cpu()
    for b in range(B):
        k = int(n[b])
        assert acc[b].tolist() == [b * (S + 1) + j for j in range(k + 1)] + [-1] * (S - k), (b, acc[b])
    return n


def test_seeded_coins_are_sglangs_murmur_coins(sglang_parts):
    inp = bench.make_step_inputs(B, V, S, DEV, seed=1)
    coins, final = bench.seeded_coins(inp, sglang_parts[1])
    h = murmur3_unsalted_hash(inp.seeds, inp.seq_lens, torch.arange(S + 2, device=DEV))
    u = (h.to(torch.float64) / UMAX).to(torch.float32).clamp_(max=1.0 - 2**-24)
    assert coins.shape == (B, S + 1) and final.shape == (B,)
    assert torch.equal(coins, u[:, : S + 1]) and torch.equal(final, u[:, S + 1])


def test_plain_temperature_rows_skip_the_truncation():
    inp = bench.make_step_inputs(B, V, S, DEV)
    assert truncate_target_probs(VerifySite(inp.sampling_info, S + 1), inp.target_probs) is inp.target_probs


def test_coupled_verify_emits_the_target_race(sglang_parts):
    # the release's clamp, and the float64 uniform torch computes on DEV (the kernel on CUDA, the reference on CPU)
    variant = dict(cap_unit_uniform=compat.seeded_race_caps_unit_uniform(), uniform=resolve_uniform(None, torch.device(DEV)))
    for seed in range(3):
        inp = bench.make_step_inputs(B, V, S, DEV, seed=seed)
        kwargs, _ = _verify("coupled", inp, sglang_parts)
        cand = kwargs["candidates"]
        for i in range(S):  # the proposal is keyed at seq_lens + i, the position verify row i races at
            logq = torch.log(inp.draft_probs[:, i].float())
            want = coupled_race_reference(logq.cpu(), inp.seeds.cpu(), (inp.seq_lens + i).cpu(), **variant)
            assert torch.equal(cand[:, i + 1].cpu(), want)
        positions = inp.seq_lens.view(-1, 1) + torch.arange(S + 1, device=DEV)
        accepted, emitted = coupled_verify_reference(
            inp.target_probs.cpu(), cand[:, 1:].cpu(), inp.seeds.cpu(), positions.cpu(), **variant
        )
        n = _check_layout(kwargs)
        assert n.tolist() == accepted.tolist()
        pred = kwargs["predicts"].view(B, S + 1).cpu().to(torch.int64)
        for b in range(B):
            k = int(n[b])
            assert pred[b, : k + 1].tolist() == emitted[b, : k + 1].tolist()
            assert pred[b, k + 1 :].tolist() == [0] * (S - k)  # un-emitted slots stay 0, as the chain kernel leaves them


def test_rejection_verify_follows_the_chain_rule(sglang_parts):
    for seed in range(3):
        inp = bench.make_step_inputs(B, V, S, DEV, seed=seed)
        kwargs, (coins, _) = _verify("rejection", inp, sglang_parts)
        n = _check_layout(kwargs)
        cand, p, q = kwargs["candidates"].cpu(), inp.target_probs.cpu(), inp.draft_probs.cpu()
        pred = kwargs["predicts"].view(B, S + 1).cpu().to(torch.int64)
        for b in range(B):
            k, row = 0, 0
            while k < S and coins[b, k].cpu() * q[b, row, cand[b, k + 1]] < p[b, row, cand[b, k + 1]]:
                k, row = k + 1, k + 1
            assert int(n[b]) == k, (seed, b)
            assert pred[b, :k].tolist() == cand[b, 1 : k + 1].tolist()  # accepted drafts
            final = int(pred[b, k])  # the correction / bonus draw: a token the residual (or p) gives mass
            assert 0 <= final < V
            mass = p[b, k, final] if k == S else (p[b, k, final] - q[b, k, final]).clamp_min(0)
            assert float(mass) > 0, (seed, b, final)


@pytest.mark.parametrize("which", bench.SCHEMES)
def test_a_draft_equal_to_the_target_is_always_accepted(sglang_parts, which):
    inp = bench.make_step_inputs(B, V, S, DEV, seed=7, draft_noise=0.0)
    kwargs, _ = _verify(which, inp, sglang_parts)
    assert kwargs["accept_token_num"].tolist() == [S] * B


def test_step_total_row_adds_s_proposals_and_one_verify():
    res = {part: {w: dict(median=m, p90=m, peak=pk) for w, (m, pk) in vals.items()} for part, vals in {
        "proposal": {"rejection": (2.0, 0.1), "coupled": (5.0, 3.0)},
        "verify": {"rejection": (10.0, 0.0), "coupled": (20.0, 7.0)},
    }.items()}
    rows = {r["part"]: r for r in bench.rows_for(V, B, S, res)}
    assert rows["step_total"]["rejection_us"] == S * 2.0 + 10.0 and rows["step_total"]["coupled_us"] == S * 5.0 + 20.0
    assert rows["step_total"]["calls"] == S + 1 and rows["step_total"]["coupled_peak_mib"] == 7.0
    assert rows["proposal"]["ratio_coupled_vs_rejection"] == 2.5


def test_imports_without_sglang_and_names_what_to_install():
    code = (
        "import sys; sys.modules['sglang'] = None\n"
        "import sglang_detspec.bench.verify_schemes_bench as b\n"
        "try:\n    b.load_sglang_verify()\nexcept b.SGLangMissing as e:\n    print('MISSING:', e)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "MISSING:" in proc.stdout and "pip install 'sglang>=0.5.17,<0.5.24'" in proc.stdout, proc.stdout


def test_coupled_launches_parse_and_refuse_with_the_flag():
    assert bench.parse_launches("1024x4, 2048X8,") == [(1024, 4), (2048, 8)]
    for bad, match in (("2048", "not BLOCKxWARPS"), ("1000x4", "block_size must be a power of two"), ("1024x3", "num_warps must be a power of two"),
                       ("", "no launch given")):
        with pytest.raises(ValueError, match=f"--coupled-launches.*{match}"):
            bench.parse_launches(bad)


def test_cli_refuses_a_bad_launch_before_any_gpu_work(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--out", str(tmp_path), "--coupled-launches", "64x5"])
    assert e.value.code == 2 and "--coupled-launches: '64x5'" in capsys.readouterr().err


@pytest.mark.gpu  # tests/conftest.py skips it without a GPU, with its GPU_SKIP_REASON
def test_benchmark_smoke_on_the_gpu(tmp_path):
    rows = bench.run(tmp_path, vocabs=[4096], batches=[2], steps=S, calls_per_graph=2, replays=3,
                     coupled_launches=[(256, 2), (1024, 4)], log=lambda *a: None)
    assert [r["part"] for r in rows] == ["proposal", "verify", "step_total"]
    assert all(r["rejection_us"] > 0 and r["coupled_us"] > 0 for r in rows)
    assert (tmp_path / "verify_schemes_bench.csv").exists() and (tmp_path / "verify_schemes_bench.json").exists()
    import csv

    launches = list(csv.DictReader(open(tmp_path / "coupled_launches.csv")))
    assert {(r["part"], r["block"], r["warps"]) for r in launches} >= {("verify", "256", "2"), ("proposal", "1024", "4")}
    assert sum(r["default"] == "True" for r in launches) == 2  # one default launch per part
    assert {(r["block"], r["screen"]) for r in launches if r["part"] == "verify"} >= {
        ("256", "lg2.approx"), ("256", "logf")}  # each launch under both screen forms
