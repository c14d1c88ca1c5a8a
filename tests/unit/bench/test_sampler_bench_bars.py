"""The sampler benchmark's exit status (``sampler_bench.check_bars``): its time bars were set for an H200 and gate
only that card; the memory bar and token mismatches gate every card."""

import pytest

torch = pytest.importorskip("torch")
from sglang_detspec.bench import sampler_bench as sb  # noqa: E402


def _row(batch, median_us, peak_mib=0.06, mismatches=0, vocab=163840):
    return {"method": "fused", "batch": batch, "vocab": vocab, "median_us": median_us, "peak_extra_mib": peak_mib,
            "mismatches_vs_upstream": mismatches}


def _failed(lines):
    return [line for line in lines if line.startswith("FAIL")]


def test_time_bars_gate_the_card_they_were_set_for():
    slow = [_row(128, 40.66), _row(1, 4.8)]
    assert len(_failed(sb.check_bars(slow, "NVIDIA H200"))) == 1  # control: 40.66 us > 40 us fails on an H200
    assert not _failed(sb.check_bars([_row(128, 38.6), _row(1, 4.6)], "NVIDIA H200"))


def test_time_bars_are_information_on_another_card():
    lines = sb.check_bars([_row(128, 40.66), _row(1, 4.8)], "NVIDIA H100 80GB HBM3")
    assert not _failed(lines)
    assert any(line.startswith("INFO fused B=128") and "not gated on NVIDIA H100 80GB HBM3" in line for line in lines)


@pytest.mark.parametrize("card", ["NVIDIA H200", "NVIDIA H100 80GB HBM3"])
def test_memory_and_mismatches_gate_every_card(card):
    assert len(_failed(sb.check_bars([_row(128, 30.0, peak_mib=5.0)], card))) == 1
    assert len(_failed(sb.check_bars([_row(8, 6.0, mismatches=3)], card))) == 1
