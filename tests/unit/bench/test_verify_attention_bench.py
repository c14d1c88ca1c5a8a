"""scripts/bench/bench_verify_attention.py's argument handling and its refusal without a GPU (CPU); the timing and
the kernel checks it runs need CUDA and SGLang (results.md, 2026-12-07 third run)."""

import pytest
import torch

from sglang_detspec.bench import verify_attention_bench as bench


def test_defaults():
    args = bench._args(["--out", "d"])
    assert (args.out, args.quick, args.chain, args.replays) == ("d", False, 4, 20)


@pytest.mark.parametrize("argv, words", [
    ([], "--out"),
    (["--out", "d", "--chain", "0"], "--chain must be >= 1"),
    (["--out", "d", "--replays", "2"], "--replays >= 3"),
    (["--out", "d", "--chain", "x"], "invalid int value"),
])
def test_bad_arguments_exit_2_naming_the_flag(capsys, argv, words):
    with pytest.raises(SystemExit) as exited:
        bench._args(argv)
    assert exited.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a CUDA GPU")
def test_without_a_gpu_it_refuses_and_writes_nothing(tmp_path, capsys):
    assert bench.main(["--out", str(tmp_path / "out")]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_the_pairs_are_the_served_pairs_attention_shapes():
    """The attention shapes timed are those of bench-serve's two pairs (hidden, layers, heads, KV heads)."""
    from sglang_detspec.bench.serving_bench import PAIRS

    for name, (q_heads, kv_heads, dim, layers) in bench.PAIRS.items():
        hidden, served_layers, heads, served_kv_heads = PAIRS[name][:4]
        assert (heads, served_kv_heads, hidden // heads, served_layers) == (q_heads, kv_heads, dim, layers)
