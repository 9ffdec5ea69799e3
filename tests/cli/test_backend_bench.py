"""`python -m app bench --backends`: backends side by side on one file; the margin where answers part; the
bound from the device's own bandwidth."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli.backend_bench import _first_difference, _margin_at, bound, bytes_per_token, compare
from app.devices.bandwidth import device_bandwidth, nvml_peak_bytes_per_s


def test_bytes_per_token_counts_one_row_of_an_untied_embedding(gemma_path: Path, qwen_path: Path) -> None:
    # gemma-3-270m ties its output to the embedding, so the whole matrix is read (as the output head)
    gemma, qwen = bytes_per_token(gemma_path), bytes_per_token(qwen_path)
    assert 0.9 * gemma_path.stat().st_size < gemma <= gemma_path.stat().st_size
    assert qwen < 0.95 * qwen_path.stat().st_size  # Qwen's separate 151936-row embedding: one row of it


def test_first_difference() -> None:
    assert _first_difference([1, 2, 3], [1, 2, 3]) is None
    assert _first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert _first_difference([1, 2], [1, 2, 3]) == 2


def test_a_backend_profile_and_the_margin_of_its_own_choice(gemma_path: Path, capsys) -> None:
    (r,) = compare(gemma_path, ["llama"], 12, True, 4800.0, widths=(1, 4), repeats=3)
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [p["backend"] for p in printed] == ["llama"]
    assert r["generated"] > 0
    assert r["tok_s"] > 0
    assert r["gb_s"] > 0
    assert sorted(r["verify_ms"]) == [1, 4]
    # the margin at a token its greedy answer chose: the top logit leads, so the gap is positive
    assert _margin_at("llama", gemma_path, r["answer"], 3) > 0


# H100 SXM: its data sheet's bus and clock; H200: NVML's own figures on the H200 the GPU tests run on
# (nvmlDeviceGetMemoryBusWidth 6016 bits, nvmlDeviceGetMaxClockInfo(NVML_CLOCK_MEM) 3201 MHz).
@pytest.mark.parametrize(
    ("gpu", "bus_bits", "max_memory_mhz", "tb_s"),
    [("H100 SXM", 5120, 2619, 3.35), ("H200", 6016, 3201, 4.81)],
)
def test_the_nvml_bound_is_bus_width_times_clock_times_two(
    gpu: str, bus_bits: int, max_memory_mhz: int, tb_s: float
) -> None:
    assert nvml_peak_bytes_per_s(bus_bits, max_memory_mhz) / 1e12 == pytest.approx(tb_s, abs=0.005)


def test_without_a_gpu_there_is_no_bound_and_the_reason_says_why(gemma_path: Path, capsys) -> None:
    found = device_bandwidth()
    if found.bytes_per_s is not None:
        pytest.skip(f"this machine has a GPU bound: {found.source}")
    assert found.source.startswith("no bound: NVML")
    assert "copy:" in found.source
    (r,) = compare(gemma_path, ["llama"], 8, False, None, widths=(1,), repeats=3)
    assert r["bound_share"] is None
    assert r["bandwidth_source"] == found.source
    assert f"bound: none ({found.source})" in capsys.readouterr().out
    assert bound(4800.0).gb_s == 4800.0  # --bandwidth overrides
