"""The simulated two-level memory (flashlab.memory): counts, capacity, exactness.

The IO counts must follow Theorem 2 of the FlashAttention paper: Theta(Nd + N^2) for
standard attention and Theta(N^2 d^2 / M) for Algorithm 1. We check the exponents by
fitting log-log slopes to simulated sweeps, the exact ledgers against the closed forms
in the module, and the arithmetic of the real-data runs against the float64
references (1e-12: both sides are float64 and take the same few steps per tile).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from flashlab.memory import (
    HBM,
    SRAM,
    SRAMOverflowError,
    count_flash,
    count_standard,
    flash_io_formula,
    simulate_flash,
    simulate_standard,
    standard_io_formula,
    standard_tile,
)
from flashlab.reference import attention
from flashlab.reference.flash1 import block_sizes, flash1_forward


def slope(xs, ys) -> float:
    """Least-squares slope of log y against log x."""
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


# ---- exponents of Theorem 2 ---------------------------------------------------------


def test_both_counts_grow_as_n_squared_at_large_n() -> None:
    Ns = [2048, 4096, 8192]
    std = [count_standard(N, 64, 32768).total for N in Ns]
    fl = [count_flash(N, 64, 32768).total for N in Ns]
    assert slope(Ns, std) == pytest.approx(2.0, abs=0.05)
    assert slope(Ns, fl) == pytest.approx(2.0, abs=0.05)


def test_flash_count_falls_as_one_over_m() -> None:
    Ms = [8192, 16384, 32768, 65536]
    assert slope(Ms, [count_flash(4096, 64, M).total for M in Ms]) == pytest.approx(-1.0, abs=0.1)


def test_flash_count_grows_as_d_squared_while_tc_is_large() -> None:
    ds = [16, 32, 64, 128]
    assert slope(ds, [count_flash(8192, d, 65536).total for d in ds]) == pytest.approx(2.0, abs=0.1)


def test_standard_count_hardly_depends_on_m_once_tiles_exceed_d() -> None:
    # the N^2 terms (write S, read S, write P, read P) do not shrink with a bigger SRAM
    small, big = count_standard(2048, 64, 16384).total, count_standard(2048, 64, 131072).total
    assert 4 * 2048**2 < big < small < 1.5 * big


# ---- exact ledgers ------------------------------------------------------------------

GRID = [(N, d, M) for N in (1, 7, 64, 100, 130) for d in (8, 16) for M in (4 * d, 8 * d, 4 * d * d, 4 * d * d + 8 * d)]


@pytest.mark.parametrize("N,d,M", GRID)
def test_counts_equal_the_closed_forms(N: int, d: int, M: int) -> None:
    assert count_flash(N, d, M).total == flash_io_formula(N, d, M)
    assert count_standard(N, d, M).total == standard_io_formula(N, d, M)


def test_flash_ledger_per_array() -> None:
    N, d, M = 1000, 32, 4096
    Br, Bc = block_sizes(M, d)
    Tc = math.ceil(N / Bc)
    c = count_flash(N, d, M)
    assert c.reads["K"] == c.reads["V"] == N * d  # K_j, V_j loaded once each (line 6)
    assert c.reads["Q"] == Tc * N * d  # every outer step sweeps all of Q (line 8)
    assert c.reads["O"] == Tc * N * d
    assert c.writes["O"] == (Tc + 1) * N * d  # line 2 once, line 12 Tc times
    assert c.reads["l"] == c.reads["m"] == Tc * N
    assert "Q" not in c.writes and "K" not in c.writes


def test_standard_ledger_per_array() -> None:
    N, d, M = 1000, 32, 4096
    b = standard_tile(d, M)
    assert 2 * b * d + b * b <= M < 2 * (b + 1) * d + (b + 1) ** 2
    c = count_standard(N, d, M)
    assert c.writes["S"] == c.reads["S"] == c.writes["P"] == c.reads["P"] == N * N  # a row fits: N <= M
    assert c.reads["Q"] == N * d and c.writes["O"] == N * d
    assert c.reads["K"] == c.reads["V"] == math.ceil(N / b) * N * d
    long = count_standard(300, 4, 64)  # N > M: each row of S is streamed twice
    assert long.reads["S"] == 2 * 300 * 300


def test_counting_mode_and_real_mode_keep_the_same_ledger() -> None:
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(3, 77, 8))
    assert simulate_flash(q, k, v, 96)[3] == count_flash(77, 8, 96)
    assert simulate_standard(q, k, v, 96)[1] == count_standard(77, 8, 96)


# ---- the arithmetic is real ---------------------------------------------------------


@pytest.mark.parametrize("N,d,M", [(1, 8, 32), (5, 8, 32), (64, 16, 256), (100, 16, 1024), (257, 8, 96), (130, 4, 64)])
def test_simulated_runs_compute_attention(N: int, d: int, M: int) -> None:
    rng = np.random.default_rng(N * 1000 + d)
    q, k, v = rng.normal(size=(3, N, d)) * 2.0
    expected = attention(q, k, v)
    o, m, l, _ = simulate_flash(q, k, v, M)
    o_ref, m_ref, l_ref = flash1_forward(q, k, v, M)
    np.testing.assert_allclose(o, o_ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(m, m_ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(l, l_ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(o, expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(simulate_standard(q, k, v, M)[0], expected, rtol=0, atol=1e-12)


# ---- capacity -----------------------------------------------------------------------


@pytest.mark.parametrize("N,d,M", GRID + [(3000, 64, 16384), (4096, 64, 32768)])
def test_sram_capacity_is_never_exceeded(N: int, d: int, M: int) -> None:
    fl, std = count_flash(N, d, M), count_standard(N, d, M)
    assert 0 < fl.peak_sram <= M and 0 < std.peak_sram <= M
    Br, Bc = block_sizes(M, d)
    assert fl.peak_sram == 2 * min(Bc, N) * d + 2 * min(Br, N) * d  # K_j, V_j, Q_i, O_i


def test_over_capacity_load_raises_and_says_why() -> None:
    sram = SRAM(HBM({"Q": (100, 8), "K": (100, 8)}), capacity=500)
    sram.load("Q", slice(0, 40))  # 320 elements
    with pytest.raises(SRAMOverflowError, match=r"M = 500.*320 resident.*Q\[0:40\].*K\[0:40\].*320 more"):
        sram.load("K", slice(0, 40))
    assert sram.counts().reads == {"Q": 320}  # the refused load moved nothing


def test_free_releases_space_and_hold_frees_on_exit() -> None:
    sram = SRAM(HBM({"Q": (100, 8)}), capacity=500)
    block = sram.load("Q", slice(0, 50))
    sram.free(block)
    with sram.hold(sram.load("Q", slice(50, 100))):
        assert sram.used == 400
    assert sram.used == 0 and sram.peak == 400
    assert sram.counts().reads == {"Q": 800}


def test_store_requires_a_resident_block_of_the_right_shape() -> None:
    sram = SRAM(HBM({"O": np.zeros((4, 4))}), capacity=64)
    with pytest.raises(ValueError, match="resident"):
        sram.store("O", slice(0, 2), np.ones((2, 4)))
    with pytest.raises(ValueError, match=r"\(2, 4\)"):
        sram.store("O", slice(0, 2), sram.alloc((3, 4)))


# ---- bad input ----------------------------------------------------------------------


def test_sram_smaller_than_4d_is_rejected_with_the_minimum() -> None:
    with pytest.raises(ValueError, match=r"4d = 256.*sram_size=200"):
        count_flash(1024, 64, 200)
    with pytest.raises(ValueError, match=r"multiple of 4d = 256.*try 1024 or 1280"):
        count_flash(1024, 64, 1100)
    with pytest.raises(ValueError, match=r"2d \+ 1 = 129"):
        count_standard(1024, 64, 100)
    with pytest.raises(ValueError, match="N must be an integer"):
        count_flash(0, 64, 1024)
    with pytest.raises(ValueError, match=r"shape \(N, d\)"):
        simulate_flash(np.zeros((4, 8)), np.zeros((5, 8)), np.zeros((5, 8)), 64)
