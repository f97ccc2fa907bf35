"""Tests for FP8 emulation, block scaling and the Hadamard rotation (flashlab.reference.fp8).

Rounding is checked bit for bit against ml_dtypes (float8_e4m3fn, float8_e5m2) on float32
inputs within range; beyond the largest finite value we saturate on purpose (ml_dtypes
returns NaN or inf). Rotation identities are float64 sums of d terms: 1e-12, the float64
tolerance of every reference test. FP8 attention is judged by RMSE against the per-tensor baseline, never allclose.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from flashlab.reference import attention
from flashlab.reference.fp8 import (FORMATS, dequantize, fp8_grid, hadamard_transform, outlier_rmse_experiment,
                                    quantize, random_orthogonal, round_to_fp8)

ML = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
TOL = 1e-12


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_grid_is_every_code(fmt) -> None:
    values = np.arange(256, dtype=np.uint8).view(ML[fmt]).astype(np.float64)   # all 256 codes
    finite = values[np.isfinite(values)]
    assert np.array_equal(fp8_grid(fmt), np.unique(np.abs(finite)))
    assert np.array_equal(round_to_fp8(finite, fmt), finite)                   # fixed points, signs kept
    assert fp8_grid(fmt)[-1] == FORMATS[fmt].max


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_ties_round_to_even_like_ml_dtypes(fmt) -> None:
    g = fp8_grid(fmt)
    mid = (g[1:] + g[:-1]) / 2                                                 # exact halfway points
    x = np.concatenate([mid, -mid, np.nextafter(mid, 0), np.nextafter(mid, np.inf)]).astype(np.float32)
    assert np.array_equal(round_to_fp8(x, fmt), x.astype(ML[fmt]).astype(np.float64))


@settings(max_examples=200, deadline=None)
@given(fmt=st.sampled_from(["e4m3", "e5m2"]),
       x=hnp.arrays(np.float32, st.integers(1, 64), elements=st.floats(-448, 448, width=32)))
def test_random_inputs_match_ml_dtypes(fmt, x) -> None:
    assert np.array_equal(round_to_fp8(x, fmt), x.astype(ML[fmt]).astype(np.float64))


def test_out_of_range_saturates() -> None:
    x = np.array([500.0, -1e6, 448.0])
    assert np.array_equal(round_to_fp8(x, "e4m3"), [448.0, -448.0, 448.0])
    assert np.isnan(np.float32(500).astype(ML["e4m3"]).astype(np.float32))    # what we chose not to do
    assert round_to_fp8(np.array([1e9]), "e5m2")[0] == 57344.0


@pytest.mark.parametrize("block", [None, 1, 4, 7])
def test_quantize_roundtrip_and_scale_shapes(block) -> None:
    x = np.random.default_rng(0).normal(size=(2, 10, 8)) * 3
    values, scale = quantize(x, "e4m3", block)
    assert values.dtype == np.float32 and np.abs(values).max() <= 448
    assert np.array_equal(round_to_fp8(values), values)                       # already on the grid
    assert scale.shape == (() if block is None else (2, -(-10 // block), 1))
    err = np.abs(dequantize(values, scale, block) - x)
    assert np.all(err <= np.abs(x) * 2.0**-4 + 1e-300 + scale.max() * 2.0**-9)  # half an ulp (3 bits), or subnormal
    with pytest.raises(ValueError, match="fmt must be one of"):
        quantize(x, "e3m4")


def test_block_scales_follow_each_block() -> None:
    x = np.ones((4, 2))
    x[3, 0] = 100.0                                        # one outlier, in block 1 of 2
    _, per_tensor = quantize(x)
    _, per_block = quantize(x, block=2)
    assert per_tensor == 100 / 448
    assert np.allclose(per_block[:, 0], [1 / 448, 100 / 448])


def test_hadamard_matches_sylvester_and_is_orthogonal() -> None:
    h = np.array([[1.0]])
    for _ in range(5):
        h = np.block([[h, h], [h, -h]])                    # H_32 by Sylvester's construction
    x = np.random.default_rng(1).normal(size=(3, 32))
    np.testing.assert_allclose(hadamard_transform(x), x @ h / np.sqrt(32), atol=TOL)
    np.testing.assert_allclose(hadamard_transform(hadamard_transform(x)), x, atol=TOL)
    with pytest.raises(ValueError, match="power of two"):
        hadamard_transform(np.ones(12))


@pytest.mark.parametrize("d", [1, 2, 64, 128])
def test_random_orthogonal_preserves_scores(d) -> None:
    m = random_orthogonal(d, seed=3)
    np.testing.assert_allclose(m.matrix @ m.matrix.T, np.eye(d), atol=TOL)
    rng = np.random.default_rng(4)
    q, k = rng.normal(size=(16, d)), rng.normal(size=(20, d))
    np.testing.assert_allclose(m(q) @ m(k).T, q @ k.T, atol=TOL)             # (QM)(KM)^T = QK^T
    assert not np.allclose(m.matrix, random_orthogonal(d, seed=5).matrix) or d <= 2


def test_incoherent_processing_beats_per_tensor() -> None:
    r = outlier_rmse_experiment(n=256, d=64, seeds=(0, 1), block=32)
    base = r["per_tensor"].mean()
    assert 1e-3 < base < 1e-1
    assert r["per_block"].mean() <= base
    assert r["per_block_incoherent"].mean() < 0.85 * base


def test_fp8_attention_without_outliers_is_close() -> None:
    from flashlab.reference.fp8 import fp8_attention
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(64, 32)) for _ in range(3))
    err = np.sqrt(np.mean((fp8_attention(q, k, v) - attention(q, k, v)) ** 2))
    assert err < 0.05                                      # e4m3: 3 mantissa bits, ~3 % per entry


# ------------------------------------------------------------------ property tests
fp8_formats = st.sampled_from(["e4m3", "e5m2"])


@st.composite
def row_blocks(draw):
    """(x, block): x (..., N, d) with magnitudes from 1e-3 to 1e3, block None or 1..N+1 rows."""
    lead = draw(st.sampled_from([(), (2,)]))
    n, d = draw(st.integers(1, 12)), draw(st.integers(1, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.normal(size=lead + (n, d)) * 10.0 ** draw(st.integers(-3, 3))
    return x, draw(st.none() | st.integers(1, n + 1))


@settings(max_examples=150, deadline=None)
@given(drawn=row_blocks(), fmt=fp8_formats)
def test_quantize_dequantize_round_trip(drawn, fmt) -> None:
    """values lie on the FP8 grid, within +-max, and values * scale is x to half an FP8 ulp
    (relative 2^-(m+1)), or to half the subnormal spacing scale * 2^(1-bias-m-1) near zero."""
    x, block = drawn
    f = FORMATS[fmt]
    values, scale = quantize(x, fmt, block)
    assert np.array_equal(round_to_fp8(values, fmt), values) and np.abs(values).max() <= f.max
    per_row = np.broadcast_to(scale, ()) if block is None else np.repeat(scale, block, axis=-2)[..., : x.shape[-2], :]
    half_ulp = np.abs(x) * 2.0 ** -(f.mantissa_bits + 1)
    half_subnormal = per_row * f.min_normal * 2.0 ** -(f.mantissa_bits + 1)
    err = np.abs(dequantize(values, scale, block) - x)
    assert np.all(err <= (half_ulp + half_subnormal) * (1 + 1e-12))


@settings(max_examples=60, deadline=None)
@given(log_d=st.integers(0, 7), rows=st.integers(1, 5), seed=st.integers(0, 2**32 - 1))
def test_hadamard_is_an_orthogonal_involution(log_d, rows, seed) -> None:
    d = 2**log_d
    x = np.random.default_rng(seed).normal(size=(rows, d))
    y = hadamard_transform(x)
    np.testing.assert_allclose(hadamard_transform(y), x, atol=TOL)                           # H H = I
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), rtol=TOL)  # |x H| = |x|


@settings(max_examples=60, deadline=None)
@given(n_q=st.integers(1, 8), n_k=st.integers(1, 8), d=st.integers(1, 6), seed=st.integers(0, 2**32 - 1))
def test_fp8_attention_is_attention_on_fp8_numbers(n_q, n_k, d, seed) -> None:
    """Inputs that are already e4m3 numbers with amax = 448 get scale 1 and survive quantisation
    exactly, so FP8 attention (P~ unrounded) equals float64 attention on them."""
    from flashlab.reference.fp8 import fp8_attention
    rng = np.random.default_rng(seed)
    grid = fp8_grid("e4m3") / 64                                            # entries up to 7 keep exp() tame
    q, k, v = (rng.choice([-1, 1], size=shape) * rng.choice(grid, size=shape) for shape in ((n_q, d), (n_k, d), (n_k, d)))
    for a in (q, k, v):
        a.flat[0] = 448.0 / 64                                              # amax = 448 / 64: scale 1 / 64, exact
    np.testing.assert_allclose(fp8_attention(q, k, v), attention(q, k, v), rtol=TOL, atol=TOL)
