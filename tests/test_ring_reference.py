"""Tests of flashlab.reference.ring: ring attention over P simulated ranks against naive
attention and its backward, P in {1, 2, 3, 4}, causal and not, plain and zig-zag layouts;
the layouts, the pieces of each step, and the per-rank work that zig-zag balances.

Tolerance: float64 throughout. The ring merges P partial softmaxes by (C) and sums
P partial gradients, which reorders a few sums and exps: results move by a few 1e-16
relative. 1e-12, the float64 tolerance of every reference test, leaves three orders of
magnitude and still catches any slip (a block merged twice or missed is off by O(1)).
Work counts are integers and compared exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from flashlab.reference import attention, attention_backward
from flashlab.reference.ring import (
    LAYOUTS,
    ring_attention,
    ring_attention_backward,
    ring_work,
    shard,
    shard_positions,
    step_pieces,
    unshard,
)

TOL = 1e-12


@st.composite
def ring_case(draw):
    """(q, k, v, do, P, causal, layout): N = P * chunks (x 2 for zig-zag), d != d_v."""
    P = draw(st.integers(1, 4))
    causal = draw(st.booleans())
    layout = draw(st.sampled_from(LAYOUTS))
    per_rank = draw(st.integers(1, 3)) * (2 if layout == "zigzag" else 1)
    lead = draw(st.sampled_from([(), (2,), (2, 3)]))
    d, d_v = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    spread = draw(st.sampled_from([0.1, 1.0, 10.0]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = P * per_rank
    q = rng.normal(scale=spread, size=lead + (n, d))
    k = rng.normal(scale=spread, size=lead + (n, d))
    v = rng.normal(size=lead + (n, d_v))
    do = rng.normal(size=lead + (n, d_v))
    return q, k, v, do, P, causal, layout


@settings(max_examples=60, deadline=None)
@given(ring_case())
def test_ring_forward_equals_attention(case):
    q, k, v, _, P, causal, layout = case
    o, lse = ring_attention(q, k, v, P, causal, layout)
    o_ref, lse_ref = attention(q, k, v, causal, return_lse=True)
    np.testing.assert_allclose(o, o_ref, rtol=TOL, atol=TOL)
    np.testing.assert_allclose(lse, lse_ref, rtol=TOL, atol=TOL)


@settings(max_examples=60, deadline=None)
@given(ring_case())
def test_ring_backward_equals_attention_backward(case):
    q, k, v, do, P, causal, layout = case
    o, lse = ring_attention(q, k, v, P, causal, layout)
    got = ring_attention_backward(q, k, v, o, lse, do, P, causal, layout)
    for name, g, ref in zip(("dq", "dk", "dv"), got, attention_backward(q, k, v, do, causal)):
        np.testing.assert_allclose(g, ref, rtol=TOL, atol=TOL, err_msg=name)


def test_a_scale_is_passed_to_every_piece():
    rng = np.random.default_rng(1)
    q, k, v, do = (rng.normal(size=(2, 8, 4)) for _ in range(4))
    o, lse = ring_attention(q, k, v, 2, True, scale=0.3)
    np.testing.assert_allclose(o, attention(q, k, v, True, 0.3), rtol=TOL, atol=TOL)
    got = ring_attention_backward(q, k, v, o, lse, do, 2, True, scale=0.3)
    for g, ref in zip(got, attention_backward(q, k, v, do, True, 0.3)):
        np.testing.assert_allclose(g, ref, rtol=TOL, atol=TOL)


def test_zigzag_layout_holds_chunks_r_and_2p_minus_1_minus_r():
    assert [p.tolist() for p in shard_positions(8, 2, "zigzag")] == [[0, 1, 6, 7], [2, 3, 4, 5]]
    assert [p.tolist() for p in shard_positions(8, 2, "plain")] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    for layout in LAYOUTS:
        every = np.sort(np.concatenate(shard_positions(24, 3, layout)))
        assert every.tolist() == list(range(24))  # each token on exactly one rank
    x = np.arange(2 * 12 * 3.0).reshape(2, 12, 3)
    np.testing.assert_array_equal(unshard(shard(x, 3, "zigzag"), "zigzag"), x)


def test_pieces_skip_only_the_future():
    """Each piece's mask, laid over the global positions, is exactly the causal mask there:
    the pieces of a rank over all steps cover every visible pair once and nothing else."""
    n, P = 24, 3
    for layout in LAYOUTS:
        pos = shard_positions(n, P, layout)
        for r in range(P):
            seen = np.zeros((len(pos[r]), n), dtype=int)
            for src in range(P):
                for pc in step_pieces(r, src, P, len(pos[r]), True, layout):
                    rows, cols = pos[r][pc.q], pos[src][pc.k]
                    block = np.ones((len(rows), len(cols)), dtype=bool)
                    if pc.causal:
                        block = np.tril(block)
                        assert (rows == cols).all(), "a causal piece pairs the same positions"
                    else:
                        assert (cols[None, :] <= rows[:, None]).all(), "an unmasked piece sees only the past"
                    seen[np.ix_(np.arange(len(pos[r]))[pc.q], cols)] += block
            np.testing.assert_array_equal(seen, pos[r][:, None] >= np.arange(n)[None, :])


def test_zigzag_balances_the_causal_triangle():
    n, P = 64, 4
    C = n // (2 * P)
    zig, plain = ring_work(n, P, True, "zigzag"), ring_work(n, P, True, "plain")
    assert zig.sum() == plain.sum() == n * (n + 1) // 2  # the same triangle, shared differently
    assert (zig.sum(axis=0) == 2 * P * C * C + C).all()  # every rank: the same work
    assert (zig[1:] == 2 * C * C).all()  # every step after the first: 2C x C pairs on each rank
    B = n // P
    assert plain.sum(axis=0).tolist() == [r * B * B + B * (B + 1) // 2 for r in range(P)]
    # each step waits for its busiest rank: plain pays a full block at every step after the first
    assert plain.max(axis=1).sum() == (P - 1) * B * B + B * (B + 1) // 2
    assert zig.max(axis=1).sum() == zig.sum() // P
    assert (ring_work(n, P, False, "plain") == B * B).all()


@pytest.mark.parametrize("call, match", [
    (lambda: shard_positions(10, 3, "plain"), "divisible by 3"),
    (lambda: shard_positions(12, 4, "zigzag"), "divisible by 8"),
    (lambda: shard_positions(8, 2, "striped"), "layout must be one of"),
    (lambda: ring_attention(np.ones((8, 2)), np.ones((4, 2)), np.ones((4, 2)), 2), "same length N"),
    (lambda: ring_attention(np.ones((8, 2)), np.ones((8, 2)), np.ones((8, 2)), 0), "P must be an integer >= 1"),
])
def test_bad_arguments_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ------------------------------------------------------------------ the model of one ring step
def test_step_bytes_and_flops_follow_the_formulas():
    from flashlab.parallel.model import ring_step_bytes, ring_step_flops

    n, d, H = 4096, 128, 16
    assert ring_step_bytes(n, d, H) == 2 * n * d * H * 2  # K and V in bf16: 32 MiB
    assert ring_step_bytes(n, d, H, backward=True) == 2 * n * d * H * (2 + 4)  # + dK, dV in fp32
    assert ring_step_bytes(n, d, 4, batch=2) == 2 * n * d * 4 * 2 * 2  # GQA: only the K/V heads travel
    assert ring_step_flops(n, d, H) == 4 * n * n * d * H
    assert ring_step_flops(n, d, H, causal=True, backward=True) == 4 * n * n * d * H * 0.5 * 2.5


def test_hiding_length_is_where_compute_meets_transfer():
    from flashlab.parallel.model import NVLINK_H200_ONE_WAY, hiding_length, ring_step_time

    assert NVLINK_H200_ONE_WAY == 450e9
    assert hiding_length(450.0) == pytest.approx(1000.0)  # n* = b R / (2 W): 2 * 450e12 / 9e11
    assert hiding_length(450.0, causal=True) == pytest.approx(2000.0)  # half the FLOPs per byte
    assert hiding_length(450.0, group=4) == pytest.approx(250.0)  # GQA sends a quarter of the bytes
    for causal in (False, True):
        for backward in (False, True):
            n_star = hiding_length(500.0, causal=causal, backward=backward)
            below, above = (ring_step_time(int(n), 64, 8, 500.0, causal=causal, backward=backward)
                            for n in (0.9 * n_star, 1.1 * n_star))
            assert below["compute"] < below["transfer"] and above["compute"] > above["transfer"]
            assert above["step"] == above["compute"]
