"""What every reference algorithm shares: checks of its inputs, the scale, the causal mask,
and the cutting of a sequence into blocks.

``causal_mask(n_q, n_k)`` is bottom-right aligned, as in FlashAttention-2 and later:
query i may see key j iff ``j <= i + (n_k - n_q)``. The tile helpers apply the same rule
to one (Br, Bc) tile of rows [r0, r1) and columns [c0, c1), with ``offset = n_k - n_q``.
"""

from __future__ import annotations

import math

import numpy as np

from .._validate import as_float_array, positive_float

__all__ = ["LOG2E", "BlockRange", "block_ranges", "causal_mask", "causal_tile_mask", "tile_fully_masked"]

LOG2E = 1.0 / math.log(2.0)  # log2(e) = 1 / ln 2: e^s = 2^(s * log2 e)

BlockRange = tuple[int, int]  # (start, stop) of one block of rows or keys


def _check_head_dim(q: np.ndarray, k: np.ndarray) -> None:
    """Q K^T needs q (..., N_q, d) and k (..., N_k, d) to share d."""
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same head dimension d (last axis); got q.shape={q.shape}, k.shape={k.shape}"
        )


def _check_qkv(q, k, v, dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q (..., N_q, d), k (..., N_k, d), v (..., N_k, d_v) as float arrays of ``dtype``."""
    q = as_float_array("q", q, dtype, min_ndim=2)
    k = as_float_array("k", k, dtype, min_ndim=2)
    v = as_float_array("v", v, dtype, min_ndim=2)
    _check_head_dim(q, k)
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must have the same number of keys N_k (second-to-last axis); "
            f"got k.shape={k.shape}, v.shape={v.shape}"
        )
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError(
            f"q, k and v must have the same leading (batch, head) dimensions; "
            f"got q.shape={q.shape}, k.shape={k.shape}, v.shape={v.shape}"
        )
    return q, k, v


def _check_output_like(q: np.ndarray, v: np.ndarray, dtype=np.float64, **arrays) -> list[np.ndarray]:
    """Each named array (e.g. o=..., do=...) as a float array of the output's shape (..., N_q, d_v)."""
    expected = q.shape[:-1] + v.shape[-1:]
    checked = []
    for name, arr in arrays.items():
        arr = as_float_array(name, arr, dtype, min_ndim=2)
        if arr.shape != expected:
            raise ValueError(f"{name} must have the shape of the output {expected}; got {name}.shape={arr.shape}")
        checked.append(arr)
    return checked


def _scale(scale: float | None, d: int) -> float:
    """The softmax scale tau: ``scale`` if given (a positive number), else 1/sqrt(d)."""
    return 1.0 / math.sqrt(d) if scale is None else positive_float("scale", scale)


def block_ranges(n: int, size: int) -> list[BlockRange]:
    """[(start, stop), ...] covering range(n) in blocks of ``size``; the last may be shorter.

    ``block_ranges(N, Br)`` are the Tr = ceil(N / Br) row blocks of the papers' loops."""
    return [(start, min(start + size, n)) for start in range(0, n, size)]


def causal_mask(n_q: int, n_k: int) -> np.ndarray:
    """Boolean (n_q, n_k) mask, True where query i may attend to key j.

    Bottom-right aligned: allowed iff j <= i + (n_k - n_q)."""
    i = np.arange(n_q)[:, None]
    j = np.arange(n_k)[None, :]
    return j <= i + (n_k - n_q)


def causal_tile_mask(rows: BlockRange, cols: BlockRange, offset: int) -> np.ndarray:
    """The causal mask of one (Br, Bc) tile: True where query r may see key c, i.e. c <= r + offset.

    Equal to ``causal_mask(n_q, n_k)[r0:r1, c0:c1]`` for offset = n_k - n_q."""
    r = np.arange(*rows)[:, None]
    c = np.arange(*cols)[None, :]
    return c <= r + offset  # (Br, Bc)


def tile_fully_masked(rows: BlockRange, cols: BlockRange, offset: int) -> bool:
    """True if no query of the row block sees any key of the column block: even the last
    query (rows[1] - 1) is before the first key (cols[0])."""
    return cols[0] > rows[1] - 1 + offset
