"""Property tests for FlashAttention-2 (flashlab.reference.flash2) against the naive reference.

Tolerance: 1e-10, absolute and relative, in float64. Algorithm 1 of FlashAttention-2
rescales o_tilde once per key block and divides once at the end, so rounding stays
near 1e-15; an algorithmic slip (a missing rescale, dividing every step by the wrong
l, a forgotten D or scale in the backward, a skipped ragged block) is off by 1e-3 or
more. 1e-10 separates the two by many orders of magnitude.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import strategies

from flashlab.reference import attention, attention_backward, flash1_forward, flash2_backward, flash2_forward

TOL = 1e-10


@st.composite
def problems(draw, max_n=13, max_d=6):
    """(q, k, v, do, block_q, block_k): leading batch dims, N_q != N_k, ragged blocks,
    blocks from one row to larger than the sequence."""
    q, k, v, rng = draw(strategies.qkv(max_n, max_d))
    block_q, block_k = draw(st.integers(1, max_n + 2)), draw(st.integers(1, max_n + 2))
    do = rng.normal(size=q.shape[:-1] + v.shape[-1:])
    return q, k, v, do, block_q, block_k


@settings(max_examples=150, deadline=None)
@given(problems(), st.booleans(), st.sampled_from([None, 0.3]))
def test_flash2_forward_matches_naive(problem, causal, scale):
    q, k, v, _, block_q, block_k = problem
    o, lse = flash2_forward(q, k, v, block_q, block_k, causal=causal, scale=scale)
    o_ref, lse_ref = attention(q, k, v, causal=causal, scale=scale, return_lse=True)
    np.testing.assert_allclose(o, o_ref, rtol=TOL, atol=TOL)
    assert np.array_equal(np.isneginf(lse), np.isneginf(lse_ref))  # rows that see no key
    finite = np.isfinite(lse_ref)
    np.testing.assert_allclose(lse[finite], lse_ref[finite], rtol=TOL, atol=TOL)


@settings(max_examples=150, deadline=None)
@given(problems(), st.booleans(), st.sampled_from([None, 0.3]))
def test_flash2_backward_matches_naive(problem, causal, scale):
    q, k, v, do, block_q, block_k = problem
    o, lse = flash2_forward(q, k, v, block_q, block_k, causal=causal, scale=scale)
    grads = flash2_backward(q, k, v, o, lse, do, block_q, block_k, causal=causal, scale=scale)
    for name, g, g_ref in zip("qkv", grads, attention_backward(q, k, v, do, causal=causal, scale=scale)):
        np.testing.assert_allclose(g, g_ref, rtol=TOL, atol=TOL, err_msg=f"d{name}")


@settings(max_examples=40, deadline=None)
@given(problems(), st.booleans())
def test_lse_is_m_plus_log_l_of_v1(problem, causal):
    """The one number v2 stores equals what v1's two numbers encode: L = m + log l."""
    q, k, v, _, block_q, _ = problem
    d = q.shape[-1]
    _, lse = flash2_forward(q, k, v, block_q, 3, causal=causal)
    _, m, l = flash1_forward(q, k, v, sram_size=4 * d * 3, causal=causal)
    with np.errstate(divide="ignore"):
        lse1 = np.where(l > 0, m + np.log(l), -np.inf)
    finite = np.isfinite(lse1)
    assert np.array_equal(finite, np.isfinite(lse))
    np.testing.assert_allclose(lse[finite], lse1[finite], rtol=TOL, atol=TOL)


def test_result_does_not_depend_on_block_sizes():
    rng = np.random.default_rng(5)
    q, k, v = rng.normal(size=(2, 37, 8)), rng.normal(size=(2, 29, 8)), rng.normal(size=(2, 29, 5))
    outs = [flash2_forward(q, k, v, bq, bk, causal=True)[0] for bq, bk in [(1, 1), (4, 16), (37, 29), (64, 64)]]
    for o in outs[1:]:
        np.testing.assert_allclose(o, outs[0], rtol=TOL, atol=TOL)


def test_row_that_sees_no_key_gives_zero_output_and_minus_inf_lse():
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(6, 4)), rng.normal(size=(2, 4)), rng.normal(size=(2, 3))
    o, lse = flash2_forward(q, k, v, 2, 2, causal=True)  # bottom-right: rows 0..3 see nothing
    assert np.all(o[:4] == 0) and np.all(np.isneginf(lse[:4]))
    dq, dk, dv = flash2_backward(q, k, v, o, lse, np.ones((6, 3)), 2, 2, causal=True)
    assert np.all(np.isfinite(dq)) and np.all(dq[:4] == 0)


def test_dq_accumulates_over_key_blocks():
    """With one key block dQ is written once; with many it is the sum of the blocks' parts,
    and that sum is still exact (the read-modify-write of Algorithm 2 line 16)."""
    rng = np.random.default_rng(1)
    q, k, v, do = rng.normal(size=(9, 4)), rng.normal(size=(11, 4)), rng.normal(size=(11, 4)), rng.normal(size=(9, 4))
    o, lse = flash2_forward(q, k, v, 4, 4)
    dq_many = flash2_backward(q, k, v, o, lse, do, 4, 2)[0]
    dq_one = flash2_backward(q, k, v, o, lse, do, 4, 11)[0]
    np.testing.assert_allclose(dq_many, dq_one, rtol=TOL, atol=TOL)


@pytest.mark.parametrize("block_q, block_k, name", [(0, 4, "block_q"), (4, 0, "block_k"), (2.5, 4, "block_q")])
def test_bad_block_sizes_are_named(block_q, block_k, name):
    q = np.zeros((4, 2))
    with pytest.raises(ValueError, match=name):
        flash2_forward(q, q, q, block_q, block_k)


def test_backward_checks_shapes():
    q = np.zeros((4, 2))
    o, lse = flash2_forward(q, q, q, 2, 2)
    with pytest.raises(ValueError, match=r"lse must have shape \(4,\)"):
        flash2_backward(q, q, q, o, lse[:3], o, 2, 2)
    with pytest.raises(ValueError, match="do must have the shape"):
        flash2_backward(q, q, q, o, lse, np.zeros((4, 3)), 2, 2)


def test_mismatched_head_dims_rejected():
    with pytest.raises(ValueError, match="head dimension"):
        flash2_forward(np.zeros((4, 2)), np.zeros((4, 3)), np.zeros((4, 3)), 2, 2)


# ---------------------------------------------------------------- counted non-matmul work
from flashlab.hardware import A100  # noqa: E402
from flashlab.reference.counting import count_nonmatmul, matmul_equivalent, nonmatmul_cost_ratio  # noqa: E402


def _closed_form(version, N, d, Br, Bc):
    """Non-matmul ops of the forward for N divisible by Br and Bc, from the lines of the algorithms."""
    tiles, T = (N // Br) * (N // Bc), Br * Bc
    if version == 1:  # FA1 Alg. 1 lines 9-12 per tile; v2: FA2 Alg. 1 lines 8-13
        per_tile = {"exp": T + 2 * Br, "max": T + Br, "add": 2 * T + 3 * Br + Br * d,
                    "multiply": T + 3 * Br + 2 * Br * d, "divide": Br * d, "log": 0}
        return {op: n * tiles for op, n in per_tile.items()}
    per_tile = {"exp": T + Br, "max": T + Br, "add": 2 * T + 2 * Br + Br * d,
                "multiply": T + Br + Br * d, "divide": 0, "log": 0}
    out = {op: n * tiles for op, n in per_tile.items()}
    out["divide"] += N * d  # line 12, once per row
    out["add"] += N  # line 13: m + log l
    out["log"] += N
    return out


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("N, d, Br, Bc", [(64, 8, 16, 16), (128, 16, 32, 64), (96, 4, 48, 32)])
def test_counts_match_closed_form(version, N, d, Br, Bc):
    c = count_nonmatmul(version, N, d, Br, Bc)
    for op, n in _closed_form(version, N, d, Br, Bc).items():
        assert c[op] == n, f"v{version} {op}: counted {c[op]}, closed form {n}"
    assert c["matmul_flops"] == 4 * N * N * d  # Q K^T and P V
    assert c["tiles"] == (N // Br) * (N // Bc)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 70), st.integers(1, 8), st.integers(1, 20), st.integers(1, 20))
def test_deferred_normalisation_saves_work_for_any_shape(N, d, Br, Bc):
    c1, c2 = count_nonmatmul(1, N, d, Br, Bc), count_nonmatmul(2, N, d, Br, Bc)
    assert c2["nonmatmul"] < c1["nonmatmul"]
    assert c2["divide"] == N * d  # one division per output number, whatever the blocks
    assert c1["matmul_flops"] == c2["matmul_flops"] == 4 * N * N * d
    b1, b2 = count_nonmatmul(1, N, d, Br, Bc, backward=True), count_nonmatmul(2, N, d, Br, Bc, backward=True)
    assert b1["multiply"] - b2["multiply"] == N * N  # diag(l)^-1 applied to every score in v1
    assert b1["divide"] - b2["divide"] == N  # 1 / l per row
    assert (b1["stats_per_row"], b2["stats_per_row"]) == (2, 1)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([1, 2]), st.integers(1, 20), st.integers(1, 6), st.integers(1, 9), st.integers(1, 9),
       st.integers(0, 2**32 - 1))
def test_the_counted_loops_compute_attention(version, N, d, Br, Bc, seed):
    """What count_nonmatmul counts is attention: its forward loops give softmax(tau Q K^T) V and
    its backward loops rebuild P, for either version and any (ragged) blocks."""
    from flashlab.reference.counting import _backward_P, _counted, _forward
    from flashlab.reference.softmax import softmax

    rng = np.random.default_rng(seed)
    q, k, v = (rng.normal(size=(N, d)) for _ in range(3))
    tau = 1.0 / np.sqrt(d)
    o = _forward(version, _counted(q), _counted(k), _counted(v), Br, Bc, tau)
    np.testing.assert_allclose(np.asarray(o), attention(q, k, v), rtol=TOL, atol=TOL)
    P = _backward_P(version, _counted(q), _counted(k), Br, Bc, tau)
    np.testing.assert_allclose(P, softmax(tau * q @ k.T), rtol=TOL, atol=TOL)


def test_a100_non_matmul_op_costs_16_matmul_flops():
    assert nonmatmul_cost_ratio(A100) == pytest.approx(16.0)
    c = count_nonmatmul(2, 256, 64, 64, 64)
    t = matmul_equivalent(c, A100)
    assert t["nonmatmul_share_of_time"] > 10 * t["nonmatmul_share_of_ops"]


def test_count_rejects_bad_version():
    with pytest.raises(ValueError, match="version must be 1 or 2; got 3"):
        count_nonmatmul(3, 8, 4, 4, 4)
