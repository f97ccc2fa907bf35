"""Chapter 7 (FlashAttention-4): the tile-cycle model, software exp2, conditional rescaling.

Numbers checked against the seed book (§5.2, §5.3, §5.4, §5.6) are exact where the
model is exact (cycle counts are ratios of integers) and to the quoted digits where
they are measured errors. Conditional-rescaling attention runs in float64 and is
compared with the reference at 1e-12, the float64 tolerance of every reference test: the algorithm is
exact, so only a few ulps of rounding separate the two.
"""

from __future__ import annotations

import math
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from flashlab import cycles
from flashlab.course.figures import FIGURES, get
from flashlab.hardware import B200, B300, H100
from flashlab.reference import attention as reference_attention, rescale, softexp
from flashlab.reference.fp8 import round_to_fp8

TOL = 1e-12


# ------------------------------------------------------------------ cycle model
@pytest.mark.parametrize("gpu, mma, exp", [(H100, 2048, 1024), (B200, 1024, 1024), (B300, 1024, 512)])
def test_forward_tile_cycles_match_seed(gpu, mma, exp):
    c = cycles.forward_tile_cycles(gpu)
    assert (c["mma"], c["exp"]) == (mma, exp)
    assert c["flops"] == 2 * 2 * 128**3 and c["exps"] == 128 * 128


def test_backward_tile_cycles_match_seed():
    one = cycles.backward_tile_cycles(B200)
    two = cycles.backward_tile_cycles(B200, two_cta=True)
    assert one["mma"] == 2560 and one["smem"] == 3328 and one["bound"] == "smem"
    assert two["smem"] == 2688 and two["mma"] == 2560
    assert two["smem"] / two["mma"] == pytest.approx(1.05)  # seed §5.6: "only 5% more than MMA"
    assert one["smem"] / one["mma"] == pytest.approx(1.3)  # seed §5.2: "30% more"


def test_cycles_come_from_the_operand_table():
    """Totals are sums over matmuls of bytes / rate, not typed-in constants."""
    mm = cycles.backward_matmuls()
    assert len(mm) == 5 and all(m.b_from == "smem" for m in mm)
    assert sum(m.smem_bytes() for m in mm) / B200.smem_bytes_per_cycle == 3328
    half = cycles.backward_tile_cycles(B200, 64, 64, 64)  # every term scales with the tile
    assert half["mma"] == 2560 / 8 and half["smem"] == 3328 / 4
    with pytest.raises(ValueError, match="two_cta"):
        cycles.backward_tile_cycles(H100, two_cta=True)
    with pytest.raises(ValueError, match="Br"):
        cycles.forward_tile_cycles(B200, Br=0)


def test_exp_split():
    assert cycles.exp_split_cycles(B200, 0.0)["exp"] == 1024
    s = cycles.exp_split_cycles(B200, 0.25)
    # FA4's ex2_emulation: 3 fp32 adds + 3 FMAs on the FMA pipe; shift + integer add on the ALU pipe
    assert s["mufu"] == 768 and s["fma"] == 0.25 * 16384 * 6 / 128 and s["alu"] == 0.25 * 16384 * 2 / 64
    everything = cycles.exp_split_cycles(B200, 1.0, fma_ops=7, alu_ops=3)
    assert everything["mufu"] == 0 and everything["exp"] == max(16384 * 7 / 128, 16384 * 3 / 64)
    assert cycles.exp_split_cycles(B200, 0.5, alu_ops=0)["alu"] == 0
    with pytest.raises(ValueError, match="fraction"):
        cycles.exp_split_cycles(B200, 1.5)
    with pytest.raises(ValueError, match="alu_ops"):
        cycles.exp_split_cycles(B200, 0.5, alu_ops=-1)


# ------------------------------------------------------------------ software exp2
def test_seed_accuracy_numbers():
    """Seed §5.3: cubic 8.77e-5 in fp32; 3.90e-3 vs 3.89e-3 after bf16 rounding."""
    fa4 = softexp.FA4_COEFFICIENTS
    assert f"{softexp.max_relative_error('poly', coefficients=fa4):.2e}" == "8.77e-05"
    assert f"{softexp.max_relative_error('poly', coefficients=fa4, bf16=True):.2e}" == "3.90e-03"
    assert f"{softexp.max_relative_error('library', bf16=True):.2e}" == "3.89e-03"
    # np.exp2 on this CPU is better than the GPU's ex2.approx (seed: 1.41e-7)
    assert softexp.max_relative_error("library") < 1.5e-7
    # our own Lawson fit is a touch better than the shipped coefficients
    assert 8.4e-5 < softexp.max_relative_error("poly", degree=3) < 8.77e-5


def test_degrees_and_methods():
    errs = [softexp.max_relative_error("poly", degree=k, points=1 << 14) for k in (2, 3, 4)]
    assert errs[0] > 1e-3 and 5e-5 < errs[1] < 1e-4 and errs[2] < 5e-6
    lstsq = softexp.fit_coefficients(3, "lstsq")
    assert softexp.max_relative_error("poly", coefficients=lstsq, points=1 << 14) > 1.5 * errs[1]
    assert softexp.fit_coefficients(3)[0] == 1.0
    with pytest.raises(ValueError, match="method"):
        softexp.fit_coefficients(3, "chebyshev")


def test_exp2_range_and_bits():
    x = np.array([-np.inf, -200, -126.5, -126, 0, 1, 5, 127.5, 128, 1e6], dtype=np.float32)
    y = softexp.exp2(x)
    assert y.dtype == np.float32
    assert np.all(y[:3] == 0) and y[3] == np.float32(2.0**-126)
    assert y[4] == 1 and y[5] == 2 and y[6] == 32  # p(0) = 1 makes integers exact
    assert softexp.relative_error(y[7], 2.0**127.5) < 9e-5 and np.all(np.isinf(y[8:]))
    n, f = softexp.range_reduce(np.float32(-3.3))
    assert n == -4 and f == pytest.approx(0.7, abs=1e-6)
    assert softexp.insert_exponent(np.float32(1.5), -3) == 1.5 / 8
    with pytest.raises(ValueError, match="x must be"):
        softexp.exp2([np.nan])


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float32, 64, elements=st.floats(-125, 127, width=32)))
def test_exp2_relative_error_everywhere(x):
    err = softexp.relative_error(softexp.exp2(x), np.exp2(x.astype(np.float64)))
    assert np.max(err) < 9e-5


def test_round_to_bf16_ties_go_to_even():
    ties = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3 * 2**-9], dtype=np.float32)
    expected = np.array([1.0, 1 + 2**-6, -1.0, 3 * 2**-9], dtype=np.float32)
    assert np.array_equal(softexp.round_to_bf16(ties), expected)
    assert np.array_equal(expected, torch.from_numpy(ties).bfloat16().float().numpy())


@settings(max_examples=40, deadline=None)
@given(hnp.arrays(np.float32, 256, elements=st.floats(width=32, allow_nan=False, allow_infinity=False)))
def test_round_to_bf16_matches_torch(x):
    assert np.array_equal(softexp.round_to_bf16(x), torch.from_numpy(x).bfloat16().float().numpy())


# ------------------------------------------------------------------ conditional rescaling
def test_staircase_row_nine_to_one():
    from flashlab.reference.rescale import staircase_row

    row = staircase_row()  # block maxima 0, 1, ..., 9
    assert rescale.running_max_changes(row, 4) == 9
    assert rescale.rescales(row, 8.0, 4) == 1
    t = rescale.trace_row(row, 8.0, 4)
    assert np.flatnonzero(t.rescaled).tolist() == [9]  # only the block 9 above the reference


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 3), st.integers(1, 40), st.integers(1, 40), st.integers(1, 9),
    st.sampled_from([0.0, 1.0, 8.0, 30.0]), st.booleans(), st.integers(0, 2**31 - 1),
)
def test_conditional_attention_is_exact(batch, n_q, n_k, block_size, theta, causal, seed):
    rng = np.random.default_rng(seed)
    q, k = rng.normal(size=(batch, n_q, 8)), 4 * rng.normal(size=(batch, n_k, 8))
    v = rng.normal(size=(batch, n_k, 5))
    res = rescale.conditional_attention(q, k, v, theta, block_size, causal)
    expected = reference_attention(q, k, v, causal=causal)
    assert np.max(np.abs(res.o - expected)) < TOL
    assert res.max_p <= 2.0**theta * (1 + 1e-12)  # every intermediate 2^(s - m_ref) <= 2^theta
    assert res.rescales.shape == (batch, n_q)


def test_rescale_counts_on_random_rows():
    rng = np.random.default_rng(7)
    rows = [np.cumsum(rng.normal(0.3, 1.0, size=256)) for _ in range(50)]
    eager = [rescale.running_max_changes(r, 16) for r in rows]
    lazy = [rescale.rescales(r, 8.0, 16) for r in rows]
    assert all(a <= b for a, b in zip(lazy, eager)) and sum(lazy) < sum(eager) / 2
    for r in rows[:5]:
        assert rescale.rescales(r, 0.0, 16) == rescale.running_max_changes(r, 16)
        assert rescale.rescales(r, np.inf, 16) == 0


@st.composite
def log2_rows(draw):
    """(row, block_size): a 1-D row of scores in log2 units, a random walk (so the running max
    rises now and then), some entries masked with -inf; blocks of 1..9 entries."""
    n = draw(st.integers(1, 60))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    row = np.cumsum(rng.normal(draw(st.sampled_from([0.0, 0.5, 2.0])), 1.5, size=n))
    row[rng.random(n) < draw(st.sampled_from([0.0, 0.3]))] = -np.inf
    return row, draw(st.integers(1, 9))


def _running_max_rises(row, block_size):
    """By definition: blocks after the first finite one whose max exceeds every earlier score."""
    best, rises = -np.inf, 0
    for j in range(0, row.size, block_size):
        top = np.max(row[j:j + block_size])
        rises += best > -np.inf and top > best
        best = max(best, top)
    return rises


@settings(max_examples=100, deadline=None)
@given(drawn=log2_rows(), theta=st.sampled_from([0.0, 1.0, 8.0]))
def test_reference_max_trails_the_running_max_by_at_most_theta(drawn, theta):
    row, block_size = drawn
    t = rescale.trace_row(row, theta, block_size)
    seen = t.running_max > -np.inf
    gap = t.running_max[seen] - t.m_ref[seen]
    assert np.all(gap >= 0) and np.all(gap <= theta)  # so every 2^(s - m_ref) <= 2^theta
    assert rescale.running_max_changes(row, block_size) == _running_max_rises(row, block_size)
    assert rescale.rescales(row, theta, block_size) <= rescale.running_max_changes(row, block_size)


@settings(max_examples=40, deadline=None)
@given(drawn=log2_rows(), theta=st.sampled_from([0.0, 8.0]), d_v=st.integers(1, 4))
def test_conditional_attention_counts_what_trace_row_counts(drawn, theta, d_v):
    """One query row whose scores are the finite entries of ``row`` (q = 1, k = row, scale =
    ln 2 turns them into log2 units): the attention's rescale count is trace_row's, and its
    output is softmax(row ln 2) v."""
    row, block_size = drawn
    scores = row[np.isfinite(row)]
    assume(scores.size > 0)
    q, k = np.ones((1, 1)), scores[:, None]
    v = np.random.default_rng(scores.size).normal(size=(scores.size, d_v))
    result = rescale.conditional_attention(q, k, v, theta, block_size, scale=math.log(2.0))
    assert result.rescales[0] == rescale.rescales(scores, theta, block_size)
    np.testing.assert_allclose(result.o, reference_attention(q, k, v, scale=math.log(2.0)), atol=TOL)


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float32, 64, elements=st.floats(-1e6, 1e6, width=32)))
def test_range_reduction_is_exact_outside_minus_half_to_zero(x):
    n, f = softexp.range_reduce(x)
    assert np.all((f >= 0) & (f <= 1)) and np.array_equal(n, np.floor(x))
    err = np.abs(n.astype(np.float64) + f.astype(np.float64) - x.astype(np.float64))
    rounded = (x > -0.5) & (x < 0)  # f = x + 1 rounded to float32's 2^-24 spacing
    assert np.all(err[~rounded] == 0) and np.all(err[rounded] <= 2.0**-25)


def test_attention_entry_point_and_errors():
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(6, 4)), rng.normal(size=(9, 4)), rng.normal(size=(9, 3))
    o, count = rescale.attention(q, k, v, threshold=8.0, block_size=2)
    assert np.max(np.abs(o - reference_attention(q, k, v))) < TOL and count.dtype.kind == "i"
    with pytest.raises(ValueError, match="threshold"):
        rescale.attention(q, k, v, threshold=-1)
    with pytest.raises(ValueError, match="block_size"):
        rescale.attention(q, k, v, block_size=0)


# ------------------------------------------------------------------ figures
@pytest.mark.parametrize("stem", ["cycles_per_tile", "software_exp2", "conditional_rescaling"])
def test_fa4_figures_draw(stem):
    assert FIGURES[stem].startswith("fa4:")
    fig = get(stem)()
    assert fig.axes
    plt.close(fig)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 2), st.integers(1, 40), st.integers(1, 40), st.integers(1, 9), st.integers(1, 12),
    st.sampled_from([0.0, 1.0, 2.0, 8.0]), st.booleans(), st.integers(0, 2**31 - 1),
)
def test_rows_deciding_together_stay_exact(batch, n_q, n_k, block_size, row_group, theta, causal, seed):
    """row_group > 1 (a warpgroup's rows share one decision, as in the Gluon FP8 kernel): still
    softmax(q k^T) v, every 2^(s - m_ref) <= 2^theta; without the mask the rows of a group
    rescale together, so they count the same rescales."""
    rng = np.random.default_rng(seed)
    q, k = rng.normal(size=(batch, n_q, 8)), 4 * rng.normal(size=(batch, n_k, 8))
    v = rng.normal(size=(batch, n_k, 5))
    res = rescale.conditional_attention(q, k, v, theta, block_size, causal, row_group=row_group)
    assert np.max(np.abs(res.o - reference_attention(q, k, v, causal=causal))) < TOL
    assert res.max_p <= 2.0**theta * (1 + 1e-12)
    if not causal:
        for g in range(0, n_q, row_group):
            assert np.all(res.rescales[:, g:g + row_group] == res.rescales[:, g:g + 1])
    alone = rescale.conditional_attention(q, k, v, theta, block_size, causal)
    assert np.array_equal(rescale.conditional_attention(q, k, v, theta, block_size, causal, row_group=1).rescales,
                          alone.rescales)


def test_row_group_checked():
    x = np.ones((2, 4))
    with pytest.raises(ValueError, match="row_group"):
        rescale.conditional_attention(x, x, x, row_group=0)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 40), st.integers(1, 60), st.integers(1, 9), st.integers(1, 8),
    st.sampled_from([0.0, 2.0, 8.0]), st.booleans(), st.integers(0, 2**31 - 1),
)
def test_p_rounded_to_fp8_stays_within_its_rounding(n_q, n_k, block_size, row_group, theta, causal, seed):
    """P rounded to e4m3 at scale 2^(8 - theta), as the Gluon FP8 kernel casts it: each P moves
    by at most 2^-4 of itself (3 mantissa bits) or half the subnormal step 2^-10 / 2^(8 - theta),
    and l >= 1 (the key at the running max has P >= 1), so each output moves by at most
    (2^-4 + N_k 2^-10 / 2^(8 - theta)) max|v|."""
    rng = np.random.default_rng(seed)
    q, k, v = rng.normal(size=(n_q, 8)), 4 * rng.normal(size=(n_k, 8)), rng.normal(size=(n_k, 5))
    kw = dict(causal=causal, row_group=row_group)
    exact = rescale.conditional_attention(q, k, v, theta, block_size, **kw).o
    shift = 8.0 - theta
    fp8 = rescale.conditional_attention(q, k, v, theta, block_size, **kw, p_format="e4m3", p_shift=shift).o
    bound = (2.0**-4 + n_k * 2.0**-10 / 2.0**shift) * np.abs(v).max()
    assert np.max(np.abs(fp8 - exact)) <= bound * (1 + 1e-9)


def test_p_rounded_to_fp8_moves_the_output():
    """The rounding is applied. (Not a property: where every block's largest P is the only one
    a row sees, e.g. one key a block with a rising maximum, every P is exactly 2^8 and nothing
    rounds.)"""
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(4, 8)), 4 * rng.normal(size=(64, 8)), rng.normal(size=(64, 5))
    for theta in (0.0, 2.0):
        exact = rescale.conditional_attention(q, k, v, theta, 8).o
        fp8 = rescale.conditional_attention(q, k, v, theta, 8, p_format="e4m3", p_shift=8.0 - theta).o
        assert np.max(np.abs(fp8 - exact)) > 1e-6


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 30), st.integers(1, 40), st.sampled_from([0.0, 2.0, 8.0]), st.booleans(),
       st.sampled_from(["e4m3", "e5m2"]), st.booleans(), st.integers(0, 2**31 - 1))
def test_p_rounded_in_one_block_is_the_closed_form(n_q, n_k, theta, causal, fmt, l_rounded, seed):
    """One key block: m_ref is the row max, so O = round(2^s P) 2^-s V / sum(P) with P =
    exp2(S - rowmax(S)) and s = 8 - theta, written here without the online loop; with
    l_of_rounded_p the denominator sums the rounded P instead."""
    rng = np.random.default_rng(seed)
    q, k, v = rng.normal(size=(n_q, 8)), 4 * rng.normal(size=(n_k, 8)), rng.normal(size=(n_k, 5))
    shift = 8.0 - theta
    got = rescale.conditional_attention(q, k, v, theta, n_k, causal, p_format=fmt, p_shift=shift,
                                        l_of_rounded_p=l_rounded).o
    s = q @ k.T / math.sqrt(8) * rescale.LOG2E                       # (N_q, N_k), log2 units
    if causal:
        s = np.where(np.arange(n_k)[None, :] <= np.arange(n_q)[:, None] + n_k - n_q, s, -np.inf)
    m = np.max(s, axis=1, keepdims=True)
    seen = np.isfinite(m)
    p = np.exp2(s - np.where(seen, m, 0.0))                           # exact P, <= 1
    rounded = round_to_fp8(p * 2.0**shift, fmt) * 2.0**-shift
    l = (rounded if l_rounded else p).sum(axis=1, keepdims=True)
    want = np.where(seen, rounded @ v / np.where(seen, l, 1.0), 0.0)
    assert np.max(np.abs(got - want)) < TOL


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12), st.integers(1, 12), st.integers(1, 4), st.integers(1, 8),
       st.sampled_from([0.0, 2.0, 8.0]), st.booleans(), st.integers(0, 2**31 - 1))
def test_l_of_rounded_p_gives_a_weighted_mean(n_q, n_k, block_size, row_group, theta, causal, seed):
    """With l summing the same rounded P that P V multiplies, every output of a row that sees a key
    is a weighted mean of V's rows over many blocks and rescales: each entry lies between its
    column's smallest and largest value (with the exact P in l it need not: a rounded-up P can
    carry a row past its largest value); a row that sees no key gives 0. Short rows, where no
    rounding averages out."""
    rng = np.random.default_rng(seed)
    q, k, v = rng.normal(size=(n_q, 8)), 4 * rng.normal(size=(n_k, 8)), rng.uniform(0.5, 1.0, size=(n_k, 5))
    o = rescale.conditional_attention(q, k, v, theta, block_size, causal, row_group=row_group, p_format="e4m3",
                                      p_shift=8.0 - theta, l_of_rounded_p=True).o
    seen = np.arange(n_q) + n_k - n_q >= 0 if causal else np.ones(n_q, dtype=bool)  # bottom-right causal
    slack = 1e-12
    assert np.all(o[seen] <= v.max(axis=0) + slack) and np.all(o[seen] >= v.min(axis=0) - slack)
    assert np.all(o[~seen] == 0.0)


def test_l_of_rounded_p_is_checked():
    x = np.ones((2, 4))
    with pytest.raises(TypeError, match="l_of_rounded_p must be True or False; got 'yes'"):
        rescale.conditional_attention(x, x, x, l_of_rounded_p="yes")


def test_p_rounding_checked():
    x = np.ones((2, 4))
    with pytest.raises(ValueError, match="p_format"):
        rescale.conditional_attention(x, x, x, p_shift=8.0)
    with pytest.raises(ValueError, match="p_shift"):
        rescale.conditional_attention(x, x, x, p_format="e4m3", p_shift=float("nan"))
    with pytest.raises(ValueError, match="p_format must be None or one of .* got 'e3m4'"):
        rescale.conditional_attention(x, x, x, p_format="e3m4")
    with pytest.raises(ValueError, match="p_shift"):
        rescale.conditional_attention(x, x, x, p_format="e4m3", p_shift=True)
    assert np.array_equal(rescale.conditional_attention(x, x, x, p_format="e4m3", p_shift=np.float32(6)).o,
                          rescale.conditional_attention(x, x, x, p_format="e4m3", p_shift=6).o)
