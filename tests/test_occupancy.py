"""The grid and warp models of chapter 5 (flashlab.sim.occupancy): hand-computed cases,
wave quantisation, utilisation <= 1, monotonicity."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from flashlab.hardware import A100, H200
from flashlab.sim.occupancy import operand_reads, programs, schedule, warp_exchange


def test_seed_example_b1_h16_on_a100():
    """Batch 1, 16 heads: v1 launches 16 programs, so 16 of 108 SMs work (92 idle)."""
    s = schedule("v1", 1, 16, 8192, 128, A100.sm_count, 1e-6)
    assert (s.programs, s.busy_sms, s.waves) == (16, 16, 1)
    assert s.utilisation == pytest.approx(16 / 108)
    assert s.time_s == pytest.approx(64 * 64 * 1e-6)  # Tr = Tc = 64 tiles, one after another


def test_v2_splits_the_sequence():
    """Same problem, v2: 16 x 64 = 1024 programs of 64 tiles; ceil(1024/108) = 10 waves."""
    s = schedule("v2", 1, 16, 8192, 128, A100.sm_count, 1e-6)
    assert (s.programs, s.busy_sms, s.waves) == (1024, 108, 10)
    assert s.time_s == pytest.approx(10 * 64 * 1e-6)
    assert s.utilisation == pytest.approx(1024 / 1080)


def test_one_program_too_many_costs_a_wave():
    s = schedule("v1", 1, 109, 128, 128, 108, 1.0)
    assert s.waves == 2 and s.time_s == 2.0 and s.utilisation == pytest.approx(109 / 216)
    assert schedule("v1", 1, 108, 128, 128, 108, 1.0).utilisation == pytest.approx(1.0)


def test_ragged_sequence_uses_ceil():
    assert len(programs("v2", 1, 1, 1000, 128)) == 8  # ceil(1000/128), not 7
    assert programs("v1", 2, 3, 1000, 128, 64) == [8 * 16] * 6


def test_causal_block_counts():
    # N = 4 blocks of 1: query block i sees key blocks 0..i
    assert programs("v2", 1, 1, 4, 1, causal=True) == [1, 2, 3, 4]
    assert programs("v1", 1, 2, 4, 1, causal=True) == [10, 10]
    assert programs("v2", 1, 1, 8, 4, 2, causal=True) == [2, 4]  # Br=4, Bc=2: rows 0-3 see keys 0-3


def test_programs_per_sm_adds_slots():
    s = schedule("v2", 1, 1, 256 * 128, 128, 108, 1.0, programs_per_sm=2)
    assert s.slots == 216 and s.waves == math.ceil(256 / 216)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["v1", "v2"]), st.integers(1, 8), st.integers(1, 40), st.integers(1, 3000),
       st.sampled_from([16, 64, 128]), st.sampled_from([A100.sm_count, H200.sm_count, 7]), st.booleans(),
       st.integers(1, 3))
def test_utilisation_is_a_fraction_and_time_covers_the_work(part, b, h, n, br, sms, causal, per_sm):
    s = schedule(part, b, h, n, br, sms, 1.0, causal=causal, programs_per_sm=per_sm)
    assert 0 < s.utilisation <= 1 + 1e-12
    work = sum(programs(part, b, h, n, br, causal=causal))
    assert s.time_s >= work / s.slots - 1e-9  # no schedule beats perfect balance
    assert s.time_s >= max(programs(part, b, h, n, br, causal=causal))  # nor its longest program
    assert s.busy_sms <= sms


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 8), st.integers(1, 40), st.integers(1, 3000), st.sampled_from([16, 64, 128]))
def test_v2_never_slower_than_v1_and_more_heads_never_faster(b, h, n, br):
    v1 = schedule("v1", b, h, n, br, 108, 1.0)
    v2 = schedule("v2", b, h, n, br, 108, 1.0)
    assert v2.time_s <= v1.time_s + 1e-9
    assert v2.programs >= v1.programs
    assert schedule("v2", b, h + 1, n, br, 108, 1.0).time_s >= v2.time_s


def test_v1_utilisation_grows_with_heads_until_the_sms_are_full():
    u = [schedule("v1", 1, h, 4096, 128, 108, 1.0).utilisation for h in (1, 16, 54, 108)]
    assert u == sorted(u) and u[-1] == pytest.approx(1.0)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="partition"):
        schedule("v3", 1, 1, 128, 128, 108, 1.0)
    with pytest.raises(ValueError, match="sm_count"):
        schedule("v1", 1, 1, 128, 128, 0, 1.0)
    with pytest.raises(ValueError, match="tile_time"):
        schedule("v1", 1, 1, 128, 128, 108, -1.0)
    with pytest.raises(ValueError, match="scheme"):
        warp_exchange("split_n", 64, 64)
    with pytest.raises(ValueError, match="Br must be a multiple of warps"):
        warp_exchange("split_q", 66, 64, warps=4)


def test_warp_exchange_by_hand():
    # Br = 64, d = 64, 4 warps, fp32: writes 4*64 + 4*64 + 4*64*64 numbers
    k = warp_exchange("split_k", 64, 64, warps=4)
    assert k["bytes_written"] == 4 * (4 * 64 * 2 + 4 * 64 * 64)
    assert k["bytes_read"] == 4 * (4 * 4 * 64 + 4 * 64 + 4 * 64 * 64)
    assert k["barriers"] == 3
    assert warp_exchange("split_q", 64, 64, warps=4) == {"bytes_written": 0, "bytes_read": 0, "barriers": 0}


def test_split_k_exchange_grows_with_warps():
    w = [warp_exchange("split_k", 128, 128, warps=n)["bytes_written"] for n in (1, 2, 4, 8)]
    assert w == sorted(w) and w[-1] == 8 * w[0]


def test_operand_reads_by_hand():
    # Br = 128, Bc = d = 64, 4 warps, bf16: split-K reads Q_i four times (64 KiB) + K_j, V_j once (16 KiB);
    # split-Q reads K_j and V_j once per warp (4 x 16 KiB)
    assert operand_reads("split_k", 128, 64, 64) == 80 * 1024
    assert operand_reads("split_q", 128, 64, 64) == 64 * 1024
    assert operand_reads("split_q", 128, 64, 64, warps=1) == 2 * 64 * 64 * 2  # one warp reads K_j, V_j once
    with pytest.raises(ValueError, match="scheme"):
        operand_reads("split_x", 128, 64, 64)
