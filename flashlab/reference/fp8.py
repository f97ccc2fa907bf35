"""FP8 emulation, block scaling and incoherent processing (FlashAttention-3 §3.3, §4.3).

An FP8 number is sign x 2^e x 1.m with few bits. Two formats (OCP 8-bit floating point
specification, 2023; NVIDIA Hopper):

    e4m3 (e4m3fn)  4 exponent bits, bias 7, 3 mantissa bits; max 448; no inf
    e5m2           5 exponent bits, bias 15, 2 mantissa bits; max 57344; has inf

:func:`round_to_fp8` rounds to the nearest representable value, ties to even, with
subnormals (below 2^(1-bias) the spacing stays 2^(1-bias-m)). Values beyond the
largest finite number *saturate* to +-max. This is a choice: ml_dtypes' cast (and
IEEE rounding) turns them into NaN (e4m3fn has no inf) or inf (e5m2); the hardware
conversion with ``.satfinite`` clamps. After scaling by amax / max no input is out
of range, so the two agree wherever :func:`quantize` uses them.

Scaling (§3.3): x ~ scale * round(x / scale) with scale = amax(|x|) / max, one scale
per tensor, or one per block of ``block`` rows (FA3 quantises per tile of Br or Bc rows).

Incoherent processing (§3.3): multiply Q and K by the same random orthogonal M.
Because M M^T = I, (Q M)(K M)^T = Q K^T, but an outlier in one coordinate is spread
over all d coordinates, so amax shrinks and the FP8 grid fits the data better.
M = D H: D a random +-1 diagonal, H the normalised Hadamard matrix, applied by the
fast Walsh-Hadamard transform in O(d log d).

Glossary: amax = largest |x| (绝对值最大值); scale = 缩放因子; block = rows sharing one
scale (分块量化); outlier = 离群值; incoherent processing = 非相干处理.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._validate import as_float_array, positive_int
from .naive import attention

__all__ = ["FP8Format", "FORMATS", "fp8_grid", "round_to_fp8", "quantize", "dequantize",
           "hadamard_transform", "RandomOrthogonal", "random_orthogonal", "fp8_attention",
           "outlier_inputs", "rmse", "outlier_rmse_experiment"]


@dataclass(frozen=True)
class FP8Format:
    """An 8-bit float: 1 sign bit, ``exponent_bits``, ``mantissa_bits``, ``bias``, largest finite ``max``."""

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    max: float

    @property
    def min_normal(self) -> float:
        """2^(1 - bias): below it the numbers are subnormal, evenly spaced."""
        return 2.0 ** (1 - self.bias)


FORMATS = {
    "e4m3": FP8Format("e4m3fn", 4, 3, 7, 448.0),     # 1.75 x 2^8; S.1111.111 is NaN, no inf
    "e5m2": FP8Format("e5m2", 5, 2, 15, 57344.0),    # 1.75 x 2^15; exponent 11111 is inf/NaN
}


def _format(fmt: str) -> FP8Format:
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {sorted(FORMATS)}; got {fmt!r}")
    return FORMATS[fmt]


def fp8_grid(fmt: str = "e4m3") -> np.ndarray:
    """Every finite non-negative value of the format, ascending (float64)."""
    f = _format(fmt)
    step = f.min_normal * 2.0 ** -f.mantissa_bits
    sub = np.arange(2**f.mantissa_bits) * step                                 # 0 and subnormals
    e = np.arange(1 - f.bias, math.floor(math.log2(f.max)) + 1)
    normal = (2.0 ** e[:, None] * (1 + np.arange(2**f.mantissa_bits) / 2**f.mantissa_bits)).ravel()
    return np.concatenate([sub, normal[normal <= f.max]])


def round_to_fp8(x: np.ndarray, fmt: str = "e4m3") -> np.ndarray:
    """Round to the nearest FP8 value (ties to even), saturating at +-max. Same shape, float64."""
    f = _format(fmt)
    x = as_float_array("x", x, np.float64, min_ndim=0)
    mag = np.abs(x)
    # exponent of the binade of |x|, never below the subnormal range's 1 - bias
    e = np.floor(np.log2(np.maximum(mag, f.min_normal)))
    quantum = 2.0 ** (e - f.mantissa_bits)                 # spacing of the grid in that binade
    r = np.round(mag / quantum) * quantum                  # np.round: half to even; exact (power-of-2 quantum)
    return np.copysign(np.minimum(r, f.max), x)            # saturate, keep the sign (and -0)


def _padded_row_blocks(x: np.ndarray, block: int) -> np.ndarray:
    """Pad rows (axis -2) to a multiple of ``block`` and expose them: (..., n_blocks, block, d)."""
    n, d = x.shape[-2:]
    pad = -n % block
    x = np.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, pad), (0, 0)])
    return x.reshape(*x.shape[:-2], (n + pad) // block, block, d)     # (..., nb, block, d)


def quantize(x: np.ndarray, fmt: str = "e4m3", block: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Scale and round ``x`` to FP8: ``x ~ values * scale``.

    Parameters
    ----------
    x : (..., N, d) array.
    fmt : "e4m3" or "e5m2".
    block : None for one scale per tensor, else one scale per ``block`` rows of the N axis.

    Returns
    -------
    values : float32, same shape as x, every entry an FP8 number (|values| <= max).
    scale : amax / max; shape () per tensor, (..., ceil(N / block), 1) per block.
        A block of zeros gets scale 1.
    """
    f = _format(fmt)
    x = as_float_array("x", x, np.float64, min_ndim=2)
    if block is None:
        amax = np.max(np.abs(x))
        scale = np.asarray(amax / f.max if amax > 0 else 1.0)
        return round_to_fp8(x / scale, fmt).astype(np.float32), scale
    block = positive_int("block", block)
    amax = np.abs(_padded_row_blocks(x, block)).max(axis=(-2, -1))[..., None]          # (..., nb, 1)
    scale = np.where(amax > 0, amax / f.max, 1.0)
    return round_to_fp8(x / _expand(scale, block, x.shape[-2]), fmt).astype(np.float32), scale


def _expand(scale: np.ndarray, block: int, n: int) -> np.ndarray:
    """Per-block scales (..., nb, 1) -> per-row scales (..., n, 1)."""
    return np.repeat(scale, block, axis=-2)[..., :n, :]


def dequantize(values: np.ndarray, scale: np.ndarray, block: int | None = None) -> np.ndarray:
    """``values * scale`` in float64, the scale broadcast over its rows (see :func:`quantize`)."""
    values = np.asarray(values, dtype=np.float64)
    scale = np.asarray(scale, dtype=np.float64)
    if block is None:
        if scale.ndim:
            raise ValueError(f"scale must be a scalar when block is None; got shape {scale.shape}")
        return values * scale
    return values * _expand(scale, positive_int("block", block), values.shape[-2])


def hadamard_transform(x: np.ndarray) -> np.ndarray:
    """x H / sqrt(d) along the last axis by the fast Walsh-Hadamard transform, O(d log d).

    H is the Sylvester Hadamard matrix (H_1 = [1]; H_2n = [[H_n, H_n], [H_n, -H_n]]);
    dividing by sqrt(d) makes it orthogonal and symmetric, so applying it twice is the identity.
    """
    x = as_float_array("x", x, np.float64, min_ndim=1)
    d = x.shape[-1]
    if d & (d - 1):
        raise ValueError(f"x's last axis must be a power of two; got d={d}")
    y = x.copy()
    h = 1
    while h < d:                                          # log2(d) butterfly stages of d operations
        y = y.reshape(*x.shape[:-1], d // (2 * h), 2, h)  # (..., pairs, 2, h)
        a, b = y[..., 0, :], y[..., 1, :]
        y = np.stack([a + b, a - b], axis=-2)             # [[H, H], [H, -H]] one level up
        h *= 2
    return y.reshape(x.shape) / math.sqrt(d)


@dataclass(frozen=True)
class RandomOrthogonal:
    """M = D H / sqrt(d): a random +-1 diagonal D (``signs``) then the Hadamard transform."""

    signs: np.ndarray   # (d,) of +-1

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """x M for rows x of shape (..., d), in O(d log d) per row."""
        return hadamard_transform(np.asarray(x, dtype=np.float64) * self.signs)

    @property
    def matrix(self) -> np.ndarray:
        """M as a dense (d, d) array (for checking; never needed to apply it)."""
        return self(np.eye(len(self.signs)))


def random_orthogonal(d: int, seed: int = 0) -> RandomOrthogonal:
    """A random orthogonal M = D H of size d (a power of two), reproducible from ``seed``."""
    d = positive_int("d", d)
    if d & (d - 1):
        raise ValueError(f"d must be a power of two; got {d}")
    return RandomOrthogonal(np.random.default_rng(seed).choice([-1.0, 1.0], size=d))


def fp8_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, fmt: str = "e4m3", block: int | None = None,
                  incoherent: bool = False, quantize_p: bool = False, seed: int = 0) -> np.ndarray:
    """Attention with Q, K, V rounded to FP8, the arithmetic in float64.

    Parameters
    ----------
    q, k, v : (..., N, d) arrays.
    block : rows per scale (None: one scale per tensor).
    incoherent : rotate Q and K by the same :func:`random_orthogonal` (from ``seed``) first.
    quantize_p : also round P~ = exp(S - rowmax) to FP8 (scale 1, its entries lie in (0, 1])
        before P~ V, as an FP8 kernel does; the row sums use the unrounded P~.
    """
    q, k, v = (as_float_array(n, a, np.float64, min_ndim=2) for n, a in (("q", q), ("k", k), ("v", v)))
    if incoherent:
        m = random_orthogonal(q.shape[-1], seed)
        q, k = m(q), m(k)                                   # (Q M)(K M)^T = Q K^T
    q8, k8, v8 = (dequantize(*quantize(a, fmt, block), block) for a in (q, k, v))
    if not quantize_p:
        return attention(q8, k8, v8)
    s = q8 @ np.swapaxes(k8, -1, -2) / math.sqrt(q.shape[-1])           # (..., N, N)
    p = np.exp(s - s.max(axis=-1, keepdims=True))                      # P~, entries in (0, 1]
    return round_to_fp8(p, fmt) @ v8 / p.sum(axis=-1, keepdims=True)


def outlier_inputs(n: int, d: int, seed: int, outlier_std: float = 10.0,
                   outlier_rate: float = 1e-3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q, K, V (n, d) with entries N(0, 1) + N(0, outlier_std^2) x Bernoulli(outlier_rate).

    FA3 §4.3 writes N(0, 100); read as a variance, that is outlier_std = 10 (our default).
    """
    rng = np.random.default_rng(seed)
    def one() -> np.ndarray:
        return rng.normal(size=(n, d)) + rng.normal(scale=outlier_std, size=(n, d)) * (rng.random((n, d)) < outlier_rate)
    return one(), one(), one()


def rmse(a: np.ndarray, b: np.ndarray) -> float:
    """Root-mean-square error sqrt(mean((a - b)^2))."""
    return float(np.sqrt(np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2)))


def outlier_rmse_experiment(n: int = 1024, d: int = 128, seeds: tuple[int, ...] = (0, 1, 2), block: int = 64,
                            fmt: str = "e4m3", quantize_p: bool = False, **inputs: float) -> dict[str, np.ndarray]:
    """RMSE of FP8 attention against exact float64 attention on outlier inputs, per seed.

    Returns {"per_tensor", "per_block", "incoherent", "per_block_incoherent"} -> (len(seeds),) arrays.
    """
    methods = {"per_tensor": (None, False), "per_block": (block, False),
               "incoherent": (None, True), "per_block_incoherent": (block, True)}
    out = {name: np.empty(len(seeds)) for name in methods}
    for i, seed in enumerate(seeds):
        q, k, v = outlier_inputs(n, d, seed, **inputs)
        exact = attention(q, k, v)                                     # (n, d)
        for name, (blk, inc) in methods.items():
            out[name][i] = rmse(fp8_attention(q, k, v, fmt, blk, inc, quantize_p, seed), exact)
    return out
