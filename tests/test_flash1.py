"""Property tests for FlashAttention v1 (flashlab.reference.flash1) against the naive reference.

Tolerance: 1e-10, absolute and relative, in float64. Algorithm 1 renormalises O_i after
every tile, so each output passes through up to Tc rescale-and-divide steps instead of
one softmax; with at most a few dozen tiles the accumulated rounding stays near 1e-15.
Any algorithmic slip (a missing rescale factor, a wrong max, a skipped ragged block)
is off by O(1e-2) or more, so 1e-10 separates the two by many orders of magnitude.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import strategies

from flashlab.reference import (
    attention,
    attention_backward,
    block_sizes,
    causal_mask,
    flash1_backward,
    flash1_block_counts,
    flash1_flops,
    flash1_forward,
)
from flashlab.reference.flash1 import flash1_step

TOL = 1e-10


@st.composite
def problems(draw, max_n=13, max_d=6):
    """(q, k, v, sram_size): leading batch dims, N_q != N_k, ragged last blocks, and M from
    the minimum 4d (blocks of one row) to huge (one K/V block)."""
    q, k, v, _ = draw(strategies.qkv(max_n, max_d))
    d = q.shape[-1]
    sram_size = draw(st.one_of(st.integers(4 * d, 4 * d * 5), st.just(4 * d), st.just(10**6)))
    return q, k, v, sram_size


# ---------------------------------------------------------------- block sizes
@pytest.mark.parametrize(
    "sram_size, d, expected",
    [
        (1024, 64, (4, 4)),  # M / 4d = 4 exactly
        (32768, 64, (64, 128)),  # Bc = 128, Br capped at d = 64
        (1025, 64, (5, 5)),  # ceil, not floor: 1025 / 256 = 4.004 -> 5
        (256, 64, (1, 1)),  # the minimum M = 4d: blocks of one row
        (98304, 128, (128, 192)),  # 192 KB of fp16 = 98304 numbers at d = 128
    ],
)
def test_block_sizes_by_hand(sram_size, d, expected):
    assert block_sizes(sram_size, d) == expected


@pytest.mark.parametrize("sram_size, d", [(255, 64), (3, 1), (0, 8)])
def test_block_sizes_rejects_too_small_sram(sram_size, d):
    with pytest.raises(ValueError, match="sram_size"):
        block_sizes(sram_size, d)


def test_block_sizes_error_names_minimum_and_value():
    with pytest.raises(ValueError) as info:
        block_sizes(100, 64)
    assert "256" in str(info.value) and "100" in str(info.value)


@pytest.mark.parametrize("bad", [1024.0, "1024", None, True])
def test_sram_size_must_be_an_int(bad):
    q = np.zeros((4, 8))
    with pytest.raises(ValueError, match="sram_size"):
        flash1_forward(q, q, q, bad)


def test_shape_errors_name_the_arguments():
    q, k, v = np.zeros((4, 8)), np.zeros((5, 8)), np.zeros((5, 3))
    with pytest.raises(ValueError, match="head dimension"):
        flash1_forward(q, np.zeros((5, 7)), v, 64)
    with pytest.raises(ValueError, match="N_k"):
        flash1_forward(q, k, np.zeros((6, 3)), 64)
    o, m, l = flash1_forward(q, k, v, 64)
    with pytest.raises(ValueError, match="do must have the shape"):
        flash1_backward(q, k, v, o, m, l, np.zeros((4, 8)), 64)
    with pytest.raises(ValueError, match="m must have shape"):
        flash1_backward(q, k, v, o, m[:3], l, np.zeros((4, 3)), 64)


# ---------------------------------------------------------------- forward
@settings(max_examples=120, deadline=None)
@given(problem=problems(), causal=st.booleans(), scale=st.sampled_from([None, 0.3]))
def test_forward_equals_attention_and_lse(problem, causal, scale):
    q, k, v, sram_size = problem
    o, m, l = flash1_forward(q, k, v, sram_size, causal=causal, scale=scale)
    expected, lse = attention(q, k, v, causal=causal, scale=scale, return_lse=True)
    np.testing.assert_allclose(o, expected, rtol=TOL, atol=TOL)
    seen = np.isfinite(lse)  # rows that see at least one key
    np.testing.assert_allclose((m + np.log(np.where(seen, l, 1.0)))[seen], lse[seen], rtol=TOL, atol=TOL)
    assert np.all(np.isneginf(m[~seen])) and np.all(l[~seen] == 0) and np.all(o[~seen] == 0)


def test_rows_that_see_no_key():
    """Causal with N_q > N_k: the first N_q - N_k queries see nothing (bottom-right alignment)."""
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(7, 4)), rng.normal(size=(3, 4)), rng.normal(size=(3, 2))
    with np.errstate(all="raise"):  # no -inf - (-inf) = NaN anywhere
        o, m, l = flash1_forward(q, k, v, 16, causal=True)
    assert np.all(np.isneginf(m[:4])) and np.all(l[:4] == 0) and np.all(o[:4] == 0)
    np.testing.assert_allclose(o, attention(q, k, v, causal=True), rtol=TOL, atol=TOL)


def test_step_folds_tiles_into_the_normalised_state():
    """flash1_step (Alg. 1 lines 10-13) from the empty state, tile by tile, gives attention;
    a row whose scores are all -inf stays (O, l, m) = (0, 0, -inf) without NaN."""
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(5, 4)), rng.normal(size=(9, 4)), rng.normal(size=(9, 3))
    state = (np.zeros((5, 3)), np.zeros(5), np.full(5, -np.inf))
    for start in range(0, 9, 4):  # tiles of 4, 4 and a ragged 1
        state = flash1_step(*state, 3 * q @ k[start:start + 4].T, v[start:start + 4])
    np.testing.assert_allclose(state[0], attention(q, k, v, scale=3), rtol=TOL, atol=TOL)
    S = np.array([[-np.inf, -np.inf], [0.0, -np.inf]])
    with np.errstate(all="raise"):
        O, l, m = flash1_step(np.zeros((2, 3)), np.zeros(2), np.full(2, -np.inf), S, v[:2])
    assert np.all(O[0] == 0) and l[0] == 0 and np.isneginf(m[0])
    np.testing.assert_allclose(O[1], v[0], rtol=TOL, atol=TOL)


# ---------------------------------------------------------------- backward
@settings(max_examples=80, deadline=None)
@given(problem=problems(max_n=11), causal=st.booleans())
def test_backward_equals_naive_backward(problem, causal):
    q, k, v, sram_size = problem
    do = np.random.default_rng(1).normal(size=q.shape[:-1] + v.shape[-1:])
    o, m, l = flash1_forward(q, k, v, sram_size, causal=causal)
    got = flash1_backward(q, k, v, o, m, l, do, sram_size, causal=causal)
    expected = attention_backward(q, k, v, do, causal=causal)
    for name, g, e in zip(("dq", "dk", "dv"), got, expected):
        np.testing.assert_allclose(g, e, rtol=TOL, atol=TOL, err_msg=name)


@settings(max_examples=30, deadline=None)
@given(problem=problems(max_n=8, max_d=4), causal=st.booleans())
def test_backward_matches_torch_autograd(problem, causal):
    q, k, v, sram_size = problem
    if causal and q.shape[-2] > k.shape[-2]:
        q = q[..., : k.shape[-2], :]  # torch gives NaN for rows that see no key
    do = np.random.default_rng(2).normal(size=q.shape[:-1] + v.shape[-1:])
    qt, kt, vt = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    mask = torch.tensor(causal_mask(q.shape[-2], k.shape[-2])) if causal else None
    torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask).backward(torch.tensor(do))
    o, m, l = flash1_forward(q, k, v, sram_size, causal=causal)
    got = flash1_backward(q, k, v, o, m, l, do, sram_size, causal=causal)
    for name, g, t in zip(("dq", "dk", "dv"), got, (qt, kt, vt)):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=TOL, atol=TOL, err_msg=name)


# ---------------------------------------------------------------- counts
def test_causal_skips_about_half_the_tiles():
    computed, skipped = flash1_block_counts(1024, 1024, 64, 32768, causal=True)
    Tr, Tc = 1024 // 64, 1024 // 128
    assert computed + skipped == Tr * Tc == 128
    assert skipped == sum(2 * j for j in range(Tc)) == 56  # Q blocks 0..2j-1 end before K_j's first key 128j
    assert flash1_block_counts(1024, 1024, 64, 32768) == (128, 0)


def test_flops_without_and_with_recomputation():
    """Non-causal: forward 4 N^2 d, standard backward 8 N^2 d, flash backward 10 N^2 d (one
    extra Q K^T), whatever the block sizes and however ragged the last blocks are."""
    for n, d, sram_size in [(1024, 64, 32768), (1000, 64, 1000), (37, 5, 20)]:
        f = flash1_flops(n, n, d, sram_size, batch=3)
        assert f == {"forward": 12 * n * n * d, "backward_standard": 24 * n * n * d, "backward_flash": 30 * n * n * d}
    causal = flash1_flops(1024, 1024, 64, 32768, causal=True)
    assert causal["backward_flash"] < 10 * 1024**2 * 64 and causal["backward_standard"] == 8 * 1024**2 * 64
    assert math.isclose(causal["forward"] / causal["backward_flash"], 4 / 10)
