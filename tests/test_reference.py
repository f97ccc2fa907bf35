"""Property tests for the NumPy references against straightforward definitions.

Tolerance: everything here runs in float64, where a handful of sums and exps
carry a relative error of a few 1e-16; 1e-12, the float64 tolerance of every
reference test, leaves three orders of magnitude of room and still catches any
algorithmic mistake (a missing rescale is off by O(1)).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import strategies

from flashlab.reference import (
    OnlineSoftmaxState,
    attention,
    attention_backward,
    attention_flops,
    causal_mask,
    naive_softmax,
    online_attention,
    online_softmax,
    softmax,
)

TOL = 1e-12

finite = st.floats(-50, 50, allow_nan=False, allow_infinity=False, width=64)
logits = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False, width=64)


def softmax_by_definition(x: np.ndarray) -> np.ndarray:
    """exp(x_k - max) / sum: the definition, row by row, with Python's math."""
    out = np.empty_like(x, dtype=np.float64)
    for idx in np.ndindex(x.shape[:-1]):
        row = x[idx]
        m = max(row)
        e = [math.exp(v - m) for v in row]
        total = math.fsum(e)
        out[idx] = [v / total for v in e]
    return out


def attention_by_torch(q, k, v, causal=False, scale=None):
    qt, kt, vt = (torch.tensor(a, dtype=torch.float64) for a in (q, k, v))
    mask = torch.tensor(causal_mask(q.shape[-2], k.shape[-2])) if causal else None
    return torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, scale=scale).numpy()


def qkv_strategy(max_n=9, max_d=6):
    return strategies.qkv(max_n, max_d).map(lambda drawn: drawn[:3])


# ---------------------------------------------------------------- softmax
@settings(max_examples=200, deadline=None)
@given(x=hnp.arrays(np.float64, hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=9), elements=logits))
def test_softmax_matches_definition(x):
    np.testing.assert_allclose(softmax(x), softmax_by_definition(x), rtol=TOL, atol=TOL)


@settings(max_examples=300, deadline=None)
@given(
    x=hnp.arrays(np.float64, hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=12), elements=logits),
    block_size=st.integers(1, 20),
)
def test_online_softmax_equals_softmax_for_every_block_size(x, block_size):
    """Block sizes from 1 to beyond N (one block), huge and tiny logits."""
    np.testing.assert_allclose(online_softmax(x, block_size), softmax(x), rtol=TOL, atol=TOL)


def test_seed_worked_example():
    """[1, 3, 2, 5] in blocks [1, 3] and [2, 5]: l = 1.135 after the first block (seed book §2.2).
    After the second the seed prints 1.204; the exact value is 1.20344, which rounds to 1.203
    (the seed's last digit is a rounding slip, discussed in chapter 2)."""
    state = OnlineSoftmaxState.empty().update([1.0, 3.0])
    assert state.m == 3.0 and round(float(state.l), 3) == 1.135
    state = state.update([2.0, 5.0])
    assert state.m == 5.0 and abs(float(state.l) - 1.20344) < 1e-5
    assert abs(state.l - sum(math.exp(s - 5) for s in (1, 3, 2, 5))) < TOL


def test_fp16_overflow_and_its_cure():
    x = np.array([0.0, 11.1], dtype=np.float16)  # e^11.1 > 65504
    assert not np.all(np.isfinite(naive_softmax(x)))
    np.testing.assert_allclose(softmax(x.astype(np.float64)), softmax_by_definition(x.astype(np.float64)), rtol=TOL)


@settings(max_examples=150, deadline=None)
@given(
    x=hnp.arrays(np.float64, hnp.array_shapes(min_dims=1, max_dims=2, min_side=1, max_side=10),
                 elements=st.one_of(logits, st.just(-np.inf))),
    block_size=st.integers(1, 12),
)
def test_online_softmax_with_masked_entries(x, block_size):
    np.testing.assert_allclose(online_softmax(x, block_size), softmax(x), rtol=TOL, atol=TOL)


@settings(max_examples=150, deadline=None)
@given(qkv=qkv_strategy(max_n=10), split=st.integers(0, 10), causal=st.booleans())
def test_merge_of_two_key_sets_equals_attention(qkv, split, causal):
    """Split the keys at any point (either part may be empty), summarise each part, merge in
    either order: the output is attention over all keys (equation (4))."""
    q, k, v = qkv
    s = (q @ np.swapaxes(k, -1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        s = np.where(causal_mask(q.shape[-2], k.shape[-2]), s, -np.inf)
    split = min(split, k.shape[-2])
    parts = [
        OnlineSoftmaxState.empty(s.shape[:-1], v.shape[-1]).update(s[..., a:b], v[..., a:b, :])
        for a, b in ((0, split), (split, k.shape[-2]))
    ]
    expected = attention(q, k, v, causal=causal)
    for first, second in (parts, parts[::-1]):
        np.testing.assert_allclose(first.merge(second).output(), expected, rtol=1e-10, atol=TOL)


def test_softmax_masked_rows():
    x = np.array([[-np.inf, -np.inf], [0.0, -np.inf]])
    np.testing.assert_array_equal(softmax(x), [[0.0, 0.0], [1.0, 0.0]])


# ---------------------------------------------------------------- attention
@settings(max_examples=150, deadline=None)
@given(qkv=qkv_strategy(), causal=st.booleans(), scale=st.sampled_from([None, 0.3, 2.0]))
def test_attention_matches_torch(qkv, causal, scale):
    q, k, v = qkv
    expected = attention_by_torch(q, k, v, causal, scale)
    got = attention(q, k, v, causal=causal, scale=scale)
    if causal and q.shape[-2] > k.shape[-2]:
        # rows that see no key: flashlab defines them as 0; torch gives NaN
        visible = causal_mask(q.shape[-2], k.shape[-2]).any(axis=-1)
        np.testing.assert_array_equal(got[..., ~visible, :], 0.0)
        got, expected = got[..., visible, :], expected[..., visible, :]
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=TOL)


@settings(max_examples=150, deadline=None)
@given(qkv=qkv_strategy(), causal=st.booleans(), block_size=st.integers(1, 12))
def test_online_attention_equals_attention(qkv, causal, block_size):
    q, k, v = qkv
    np.testing.assert_allclose(
        online_attention(q, k, v, block_size, causal=causal), attention(q, k, v, causal=causal), rtol=1e-10, atol=TOL
    )


@settings(max_examples=60, deadline=None)
@given(qkv=qkv_strategy(max_n=7), block_size=st.integers(1, 8))
def test_online_state_lse_matches_attention_lse(qkv, block_size):
    q, k, v = qkv
    _, lse = attention(q, k, v, return_lse=True)
    s = (q @ np.swapaxes(k, -1, -2)) / math.sqrt(q.shape[-1])
    state = OnlineSoftmaxState.empty(s.shape[:-1])
    for start in range(0, s.shape[-1], block_size):
        state = state.update(s[..., start : start + block_size])
    np.testing.assert_allclose(state.lse, lse, rtol=TOL, atol=TOL)


def test_attention_rows_sum_and_convexity():
    """Each output row is a convex combination of value rows."""
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=(2, 5, 4))
    v = rng.normal(size=(5, 3))
    o = attention(q, k, v)
    assert np.all(o <= v.max(axis=0) + TOL) and np.all(o >= v.min(axis=0) - TOL)


def test_causal_mask_bottom_right():
    np.testing.assert_array_equal(causal_mask(2, 4), [[1, 1, 1, 0], [1, 1, 1, 1]])
    np.testing.assert_array_equal(causal_mask(3, 3), np.tril(np.ones((3, 3))))


@settings(max_examples=60, deadline=None)
@given(qkv=qkv_strategy(max_n=6, max_d=4), causal=st.booleans())
def test_backward_matches_torch_autograd(qkv, causal):
    q, k, v = qkv
    if causal and q.shape[-2] > k.shape[-2]:
        q = q[..., : k.shape[-2], :]  # keep every row with at least one visible key (torch gives NaN otherwise)
    rng = np.random.default_rng(1)
    do = rng.normal(size=q.shape[:-1] + v.shape[-1:])
    qt, kt, vt = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    mask = torch.tensor(causal_mask(q.shape[-2], k.shape[-2])) if causal else None
    o = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask)
    o.backward(torch.tensor(do))
    for got, ref in zip(attention_backward(q, k, v, do, causal=causal), (qt.grad, kt.grad, vt.grad)):
        np.testing.assert_allclose(got, ref.numpy(), rtol=1e-9, atol=1e-11)


def test_backward_matches_finite_differences():
    rng = np.random.default_rng(2)
    q, k, v = rng.normal(size=(3, 4, 3))
    do = rng.normal(size=(4, 3))
    dq, dk, dv = attention_backward(q, k, v, do)
    eps = 1e-6
    for x, grad in ((q, dq), (k, dk), (v, dv)):
        for idx in [(0, 0), (2, 1), (3, 2)]:
            x[idx] += eps
            plus = np.sum(attention(q, k, v) * do)
            x[idx] -= 2 * eps
            minus = np.sum(attention(q, k, v) * do)
            x[idx] += eps
            assert abs((plus - minus) / (2 * eps) - grad[idx]) < 1e-7


def test_attention_flops():
    assert attention_flops(1024, 1024, 64) == 4 * 1024**2 * 64
    assert attention_flops(1024, 1024, 64, causal=True, batch=2) == 4 * 1024**2 * 64


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: attention(np.ones((4, 8)), np.ones((4, 4)), np.ones((4, 8))), ["q and k", "head dimension", "(4, 8)", "(4, 4)"]),
        (lambda: attention(np.ones((4, 8)), np.ones((5, 8)), np.ones((4, 8))), ["k and v", "N_k", "(5, 8)", "(4, 8)"]),
        (lambda: attention(np.ones((2, 4, 8)), np.ones((3, 4, 8)), np.ones((3, 4, 8))), ["leading"]),
        (lambda: attention(np.ones(8), np.ones((4, 8)), np.ones((4, 8))), ["q must have at least 2"]),
        (lambda: attention(np.array([[np.nan, 1.0]]), np.ones((1, 2)), np.ones((1, 2))), ["q must be finite", "nan"]),
        (lambda: attention(np.ones((1, 2)), np.ones((1, 2)), np.ones((1, 2)), scale=0), ["scale", "positive"]),
        (lambda: online_softmax(np.ones(4), 0), ["block_size", ">= 1", "got 0"]),
        (lambda: online_softmax(np.ones(4), 1.5), ["block_size", "integer", "1.5"]),
        (lambda: online_softmax(np.array([1.0, np.inf]), 2), ["x must be finite or -inf", "inf", "(1,)"]),
        (lambda: online_softmax(np.array([[1.0, np.nan]]), 2), ["x must be finite or -inf", "nan", "(0, 1)"]),
        (lambda: online_softmax(np.array(["a"]), 1), ["x must hold real numbers"]),
        (lambda: online_attention(np.ones((2, 3)), np.ones((2, 3)), np.ones((2, 3)), 0), ["block_size"]),
        (lambda: attention_backward(np.ones((4, 3)), np.ones((4, 3)), np.ones((4, 2)), np.ones((4, 3))), ["do", "(4, 2)", "(4, 3)"]),
        (lambda: OnlineSoftmaxState.empty((2,)).update(np.ones((3, 2))), ["s_block", "(2,)", "(3, 2)"]),
        (lambda: OnlineSoftmaxState.empty((2,), d_v=3).update(np.ones((2, 4))), ["v_block must be given"]),
        (lambda: OnlineSoftmaxState.empty((2,), d_v=3).update(np.ones((2, 4)), np.ones((5, 3))), ["v_block", "(5, 3)"]),
        (lambda: softmax(np.array([0.0, np.nan])), ["NaN"]),
    ],
)
def test_bad_input_names_argument_expected_and_received(call, words):
    with pytest.raises(ValueError) as info:
        call()
    for word in words:
        assert word in str(info.value), f"{word!r} missing from: {info.value}"
