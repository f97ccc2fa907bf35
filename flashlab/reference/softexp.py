"""Software exp2: 2^x from additions, multiplications and integer bit tricks.

FlashAttention-4 (Zadouri et al., 2026, §3.1) computes part of the
softmax exponentials on the FMA units instead of the special-function unit (MUFU),
whose throughput did not grow from Hopper to Blackwell. The recipe is Cody-Waite
range reduction followed by a short polynomial:

    x = n + f,            n = floor(x),  0 <= f < 1          (range reduction)
    2^x = 2^n * 2^f
    2^f ~= p(f) = c_0 + f (c_1 + f (c_2 + f c_3))            (Horner, 3 FMAs)
    2^n * p(f):  add n << 23 to the float32 bits of p(f)      (bit insertion)

The last line works because a float32 is sign | 8 exponent bits | 23 mantissa bits:
adding n to the exponent field multiplies the number by 2^n, and the exponent field
starts at bit 23. No multiplication by 2^n ever happens.

Accuracy: p is fitted on [0, 1), so the relative error of exp2 is the relative
error of p on [0, 1) for every n (bit insertion is exact). The seed quotes a max
relative error of 8.77e-5 for the cubic in fp32 against 1.41e-7 for the hardware
ex2; after P is rounded to bf16 (8 significant bits, relative half-ulp 2^-8 =
3.9e-3) the two are 3.90e-3 and 3.89e-3.

Glossary: n = integer part (整数部分); f = fractional part (小数部分); Horner's rule
= 秦九韶算法; minimax = smallest maximum error (最佳一致逼近); ulp = unit in the last
place (末位单位); bf16 = bfloat16, 8 exponent bits and 7 stored mantissa bits.
"""

from __future__ import annotations

import numpy as np

from .._validate import as_float_array, positive_int

__all__ = [
    "exp2",
    "range_reduce",
    "horner",
    "insert_exponent",
    "fit_coefficients",
    "round_to_bf16",
    "relative_error",
    "max_relative_error",
    "fraction_grid",
    "EXP2_MIN",
    "EXP2_MAX",
    "FA4_COEFFICIENTS",
]

MANTISSA_BITS = 23  # float32: the exponent field starts at bit 23
EXP2_MIN = -126.0  # smallest exponent of a normal float32; below it exp2 returns 0 (flush to zero)
EXP2_MAX = 128.0  # 2^128 overflows float32; from here exp2 returns inf


def range_reduce(x) -> tuple[np.ndarray, np.ndarray]:
    """Cody-Waite range reduction x = n + f with n = floor(x) and 0 <= f <= 1.

    f = x - floor(x) is exact in float32 except for -1/2 < x < 0: there f = x + 1 lies in
    (1/2, 1), whose spacing 2^-24 is coarser than x's, so f is rounded (by at most 2^-25)
    and a tiny negative x gives f = 1. The polynomial is fitted on the closed [0, 1], so
    :func:`exp2` stays within its error there too.

    Parameters
    ----------
    x : array (...,), float32 (converted)

    Returns
    -------
    n : int32 array (...,)   integer part
    f : float32 array (...,) fractional part
    """
    x = np.asarray(x, dtype=np.float32)
    n = np.floor(x)  # (...,) float32, exact
    f = x - n  # (...,) f >= 0: its spacing is no finer than x's unless -1/2 < x < 0
    return n.astype(np.int32), f


def horner(f, coefficients) -> np.ndarray:
    """p(f) = c_0 + f (c_1 + f (c_2 + ...)) in float32, one fused multiply-add per degree.

    Each step p <- p * f + c is evaluated as a fused multiply-add: the product and
    sum are formed in float64 (a float32 x float32 product is exact there) and
    rounded to float32 once, as the GPU's fma.rn.f32 does (up to rare double rounding).

    Parameters
    ----------
    f : array (...,), float32
    coefficients : sequence (degree + 1,), ascending: c_0, c_1, ..., c_degree
    """
    c = np.asarray(coefficients, dtype=np.float32)  # (degree + 1,)
    f64 = np.asarray(f, dtype=np.float32).astype(np.float64)
    p = np.full(f64.shape, c[-1], dtype=np.float32)
    for c_k in c[-2::-1]:
        p = (p.astype(np.float64) * f64 + np.float64(c_k)).astype(np.float32)  # one FMA
    return p


def insert_exponent(p, n) -> np.ndarray:
    """2^n * p computed by adding n to the exponent field of p's float32 bits.

    Valid while the result is a normal float32 (the caller clamps n). If the sum
    reaches the all-ones exponent 255 with a zero mantissa the bits read as +inf,
    which is the right answer for an overflow.
    """
    bits = np.asarray(p, dtype=np.float32).view(np.int32)  # (...,) same bytes, read as int32
    shifted = np.asarray(n, dtype=np.int32) << MANTISSA_BITS  # n into bits 23..30
    return (bits + shifted).view(np.float32)


def fraction_grid(points: int = 1 << 20) -> np.ndarray:
    """The float32 grid f = k / points, k = 0 .. points - 1, on [0, 1) (exact for points a power of 2)."""
    points = positive_int("points", points)
    return (np.arange(points, dtype=np.float64) / points).astype(np.float32)


def fit_coefficients(degree: int = 3, method: str = "minimax", points: int = 4097,
                     iterations: int = 400) -> np.ndarray:
    """Coefficients c_0..c_degree (ascending, float64) of a polynomial p ~= 2^f on [0, 1].

    The constraint p(0) = c_0 = 1 is imposed, so that exp2 is exact at every integer
    and the steps between [n, n+1) pieces are at most the fit error.

    method="lstsq": least squares on the *relative* error (p(f) - 2^f) / 2^f over a
    uniform grid of ``points`` on [0, 1].

    method="minimax": Lawson's algorithm (1961), an iteratively reweighted least
    squares. Start from equal weights w_i; solve the weighted least-squares problem;
    multiply each weight by that point's |relative error| and renormalise; repeat.
    Weight piles up where the error is largest, and the fit converges to the
    polynomial with the smallest *maximum* relative error (the minimax polynomial,
    whose error equioscillates).

    Parameters
    ----------
    degree : int >= 1
    method : "minimax" or "lstsq"
    points : grid size on [0, 1]
    iterations : Lawson iterations (minimax only)

    Returns
    -------
    coefficients : float64 array (degree + 1,), coefficients[0] == 1
    """
    degree = positive_int("degree", degree)
    if method not in ("minimax", "lstsq"):
        raise ValueError(f"method must be 'minimax' or 'lstsq'; got {method!r}")
    f = np.linspace(0.0, 1.0, positive_int("points", points))  # (P,)
    target = np.exp2(f)  # (P,) float64 truth
    # relative error of p = 1 + sum_{k>=1} c_k f^k is (A c - b) with
    A = np.stack([f**k / target for k in range(1, degree + 1)], axis=1)  # (P, degree)
    b = 1.0 - 1.0 / target  # (P,)
    w = np.full(f.shape, 1.0 / f.size)  # (P,) weights
    for _ in range(1 if method == "lstsq" else positive_int("iterations", iterations)):
        sw = np.sqrt(w)[:, None]
        c, *_ = np.linalg.lstsq(A * sw, b * sw[:, 0], rcond=None)  # (degree,)
        err = np.abs(A @ c - b)  # (P,) |relative error|
        w = w * err  # Lawson's update
        w = w / w.sum()
    return np.concatenate([[1.0], c])


def exp2(x, degree: int = 3, coefficients=None) -> np.ndarray:
    """2^x in float32 by range reduction, a Horner polynomial and bit insertion.

    Parameters
    ----------
    x : array-like (...,), converted to float32. -inf (a masked score) gives 0.
    degree : degree of the polynomial fitted by ``fit_coefficients(degree)`` when
        ``coefficients`` is None.
    coefficients : optional (degree + 1,) ascending coefficients of p ~= 2^f on [0, 1).

    Returns
    -------
    float32 array (...,). Range: x < -126 returns 0.0 (results below the smallest
    normal float32 are flushed to zero, as the GPU's ftz mode does); x >= 128
    returns +inf.
    """
    x = as_float_array("x", x, np.float32, min_ndim=0, allow_neg_inf=True)
    if coefficients is None:
        coefficients = _cached_fit(positive_int("degree", degree))
    coefficients = np.asarray(coefficients, dtype=np.float64)
    if coefficients.ndim != 1 or coefficients.size < 2:
        raise ValueError(f"coefficients must be a 1-D sequence c_0..c_degree of length >= 2; "
                         f"got shape {coefficients.shape}")
    top = np.nextafter(np.float32(EXP2_MAX), np.float32(0))  # largest float32 below 128
    xc = np.clip(x, np.float32(EXP2_MIN), top)  # keep the bit trick inside the normal range
    n, f = range_reduce(xc)  # x = n + f, 0 <= f < 1
    p = horner(f, coefficients)  # p(f) ~= 2^f, in [1, 2]
    y = insert_exponent(p, n)  # 2^n * p(f)
    y = np.where(x < EXP2_MIN, np.float32(0.0), y)  # underflow: flush to zero
    return np.where(x >= EXP2_MAX, np.float32(np.inf), y).astype(np.float32)


# The cubic shipped with FlashAttention-4: Dao-AILab/flash-attention, flash_attn/cute/utils.py,
# POLY_EX2[3], "obtained from sollya: fpminimax(exp(x * log(2.0)), 3, [|1,24...|], [0;1], relative)",
# i.e. the best relative-error cubic with c_0 = 1 and float32 coefficients.
FA4_COEFFICIENTS = (1.0, 0.695146143436431884765625, 0.227564394474029541015625, 0.077119089663028717041015625)

_FITS: dict[int, np.ndarray] = {}


def _cached_fit(degree: int) -> np.ndarray:
    if degree not in _FITS:
        _FITS[degree] = fit_coefficients(degree, "minimax")
    return _FITS[degree]


def round_to_bf16(x) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 (ties to even), returned as float32.

    bf16 keeps the top 16 bits of a float32. Round to nearest even on the bits:
    add 0x7FFF plus the lowest kept bit (bit 16), then clear the low 16 bits. A
    carry out of the mantissa correctly bumps the exponent. NaN is kept as NaN.
    """
    x = np.asarray(x, dtype=np.float32)
    bits = x.view(np.uint32).astype(np.uint64)  # (...,) widen so the add cannot wrap
    lsb = (bits >> 16) & 1  # lowest bit that survives
    rounded = ((bits + 0x7FFF + lsb) & 0xFFFF0000).astype(np.uint32)
    out = rounded.view(np.float32)
    return np.where(np.isnan(x), x, out)


def relative_error(approx, exact) -> np.ndarray:
    """|approx - exact| / |exact|, elementwise, in float64."""
    approx = np.asarray(approx, dtype=np.float64)
    exact = np.asarray(exact, dtype=np.float64)
    if approx.shape != exact.shape:
        raise ValueError(f"approx and exact must have the same shape; got {approx.shape} and {exact.shape}")
    if np.any(exact == 0):
        raise ValueError("exact must be nonzero everywhere for a relative error")
    return np.abs(approx - exact) / np.abs(exact)


def max_relative_error(method: str = "poly", degree: int = 3, bf16: bool = False,
                       points: int = 1 << 20, coefficients=None) -> float:
    """Largest relative error of a float32 exp2 on the grid ``fraction_grid(points)`` of [0, 1).

    The error on [0, 1) is the error everywhere in the normal range: 2^n is exact.

    Parameters
    ----------
    method : "poly" (this module's exp2) or "library" (np.exp2 in float32)
    degree, coefficients : passed to :func:`exp2` for method="poly"
    bf16 : round the float32 result to bf16 first, as FlashAttention does with P
    points : grid size
    """
    if method not in ("poly", "library"):
        raise ValueError(f"method must be 'poly' or 'library'; got {method!r}")
    f = fraction_grid(points)  # (points,) float32
    y = exp2(f, degree, coefficients) if method == "poly" else np.exp2(f)  # float32
    if bf16:
        y = round_to_bf16(y)
    return float(np.max(relative_error(y, np.exp2(f.astype(np.float64)))))
