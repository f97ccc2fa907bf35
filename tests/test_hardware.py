"""flashlab.hardware: every number has a source, the derived rates agree with the
datasheets, and the roofline helpers behave."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from flashlab import hardware as hw

NUMERIC_FIELDS = [
    f.name
    for f in dataclasses.fields(hw.GPU)
    if f.name not in {"name", "arch", "year", "sources"} and not (f.name == "tmem_per_sm")
]


@pytest.mark.parametrize("gpu", hw.GPUS.values(), ids=list(hw.GPUS))
def test_every_number_has_a_source(gpu):
    for name in NUMERIC_FIELDS:
        assert gpu.source(name).strip(), f"{gpu.name}.{name} has no source"
    if gpu.tmem_per_sm:
        assert gpu.source("tmem_per_sm")


@pytest.mark.parametrize("gpu", hw.GPUS.values(), ids=list(hw.GPUS))
def test_per_cycle_rates_rebuild_the_datasheet_peak(gpu):
    """SMs x 16-bit MMA FLOPs per cycle x clock must give the datasheet's dense bf16 peak (within 1 %)."""
    assert gpu.mma_flops_from_cycles == pytest.approx(gpu.peak_flops("bf16"), rel=0.01)


def test_published_ratios():
    # A100 ridge point: 312e12 / 1.555e12 ~ 200 FLOP/B (seed book §1.4 rounds the bandwidth to 1.5 TB/s)
    assert hw.A100.ridge_point() == pytest.approx(200, rel=0.01)
    assert hw.H200.ridge_point() == pytest.approx(206, rel=0.01)
    # A100: a non-matmul FLOP costs ~16 matmul FLOPs (FlashAttention-2 §3.1: 312 vs 19.5)
    assert hw.A100.peak_flops("fp16") / hw.A100.fp32_flops == pytest.approx(16, rel=0.01)
    # H100: 3.9 TFLOPS of exp (FlashAttention-3 §3), 256x less than the 989 TFLOPS of matmul
    assert hw.H100.exp_per_second == pytest.approx(3.9e12, rel=0.01)
    assert hw.H100.peak_flops() / hw.H100.exp_per_second == pytest.approx(256, rel=0.01)
    # B300 doubles the exp unit; B200 does not
    assert hw.B300.mufu_exp_per_cycle == 2 * hw.B200.mufu_exp_per_cycle == 2 * hw.H100.mufu_exp_per_cycle


def test_roofline():
    gpu = hw.H200
    ridge = gpu.ridge_point()
    got = gpu.attainable_flops(np.array([ridge / 10, ridge, ridge * 10]))
    np.testing.assert_allclose(got, [gpu.peak_flops() / 10, gpu.peak_flops(), gpu.peak_flops()])
    assert hw.arithmetic_intensity(100.0, 4.0) == 25.0


def test_memory_hierarchy_table_orders_fast_to_large():
    rows = hw.memory_hierarchy_table(hw.A100)
    assert rows[0]["bandwidth"] > rows[1]["bandwidth"] and rows[0]["capacity"] < rows[1]["capacity"]
    assert rows[0]["capacity"] == 108 * 192 * 1024  # ~20 MB (FlashAttention §2.1)


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: hw.get("V100"), ["name must be one of", "'V100'"]),
        (lambda: hw.A100.peak_flops("fp8"), ["dtype must be one of", "A100", "'fp8'"]),
        (lambda: hw.arithmetic_intensity(1.0, 0.0), ["bytes_moved must be positive"]),
        (lambda: hw.roofline(-1.0, 1.0, 1.0), ["intensity must be non-negative"]),
    ],
)
def test_bad_input(call, words):
    with pytest.raises(ValueError) as info:
        call()
    for word in words:
        assert word in str(info.value)


def test_get_is_case_insensitive():
    assert hw.get("h200") is hw.H200


def test_sram_is_l1_plus_shared_and_smem_max_fits_inside():
    """sram_per_sm is the combined L1 + shared-memory array; smem_max_per_sm the most of it
    that can be shared memory (A100: 192 and 164 KB; Hopper and Blackwell: 256 and 228 KB)."""
    kb = hw.KB
    expected = {"A100": (192, 164), "H100": (256, 228), "H200": (256, 228), "B200": (256, 228), "B300": (256, 228)}
    for name, (sram, smem) in expected.items():
        gpu = hw.get(name)
        assert (gpu.sram_per_sm, gpu.smem_max_per_sm) == (sram * kb, smem * kb), name
        assert 0 < gpu.smem_max_per_sm < gpu.sram_per_sm
        assert gpu.smem_max_total == gpu.sm_count * gpu.smem_max_per_sm
    assert hw.memory_hierarchy_table(hw.H200)[0]["level"].startswith("SRAM (L1 + shared memory")


def test_h200_is_h100_with_more_memory():
    """Same GH100 chip: every per-SM number is the H100's; only HBM differs."""
    same = ["sm_count", "sram_per_sm", "smem_max_per_sm", "tensor_flops", "clock_hz", "mma_flops_per_cycle",
            "mufu_exp_per_cycle", "smem_bytes_per_cycle", "register_file_per_sm", "sram_bandwidth"]
    for name in same:
        assert getattr(hw.H200, name) == getattr(hw.H100, name), name
    assert hw.H200.hbm_capacity > hw.H100.hbm_capacity and hw.H200.hbm_bandwidth > hw.H100.hbm_bandwidth
