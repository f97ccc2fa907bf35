"""Conditional rescaling: online softmax that moves its reference max only when it must.

Chapter 2's online softmax keeps (m, l, o_tilde) with m the running max, and every
time a block raises m it rescales l and o_tilde by 2^(m_old - m_new). FlashAttention-4
(Zadouri et al., 2026, §3.2) notices that m only has to be *close to*
the max: subtracting it exists to stop 2^(s - m) from overflowing. So the state keeps a
reference max m_ref and moves it only when a block's max exceeds it by more than a
threshold theta (log2 units; FA4 uses theta = 8, a factor 2^8 = 256):

    m_blk = max_k s_k                                   (block max, log2 units)
    if m_blk - m_ref > theta:                           (rare)
        m_new = max(m_ref, m_blk); alpha = 2^(m_ref - m_new)
        l <- alpha l,  o_tilde <- alpha o_tilde,  m_ref <- m_new      (rescale)
    p_k = 2^(s_k - m_ref)            <= 2^theta                         (bounded)
    l <- l + sum_k p_k,   o_tilde <- o_tilde + sum_k p_k v_k
    o = o_tilde / l                                                     (exact)

Exact for any m_ref: l = 2^(-m_ref) sum_k 2^(s_k) and o_tilde = 2^(-m_ref) sum_k 2^(s_k) v_k
carry the same factor 2^(-m_ref), which cancels in o_tilde / l. The threshold only
bounds the intermediates: every p_k <= 2^theta, far from float32 overflow.

Counting convention (same as chapter 2's count_rescales): the first block that holds
a finite score sets m_ref without any rescale (the state was empty); a rescale is a
later block that moves m_ref. With theta = 0 the count equals the number of times the
running max rises.

Glossary: m_ref = reference max (参考最大值); theta = threshold (阈值); alpha = rescale
factor (缩放因子); l = running sum (分母); o_tilde = unnormalised output (未归一化输出).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .._validate import as_float_array, positive_int
from .common import LOG2E, _check_qkv, _scale, causal_mask
from .fp8 import FORMATS as FP8_FORMATS, round_to_fp8

__all__ = ["attention", "conditional_attention", "ConditionalResult", "RowTrace", "trace_row",
           "rescales", "running_max_changes", "staircase_row", "LOG2E"]



def _threshold(threshold: object) -> float:
    try:
        theta = float(threshold)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"threshold must be a number >= 0 (log2 units); got {threshold!r}") from exc
    if math.isnan(theta) or theta < 0:
        raise ValueError(f"threshold must be a number >= 0 (log2 units); got {threshold!r}")
    return theta


@dataclass(frozen=True)
class RowTrace:
    """What happens to one row, block by block (T blocks).

    block_max : (T,)   max of each block
    running_max : (T,) max of all blocks so far (what chapter 2's m follows)
    m_ref : (T,)       reference max after each block (what FA4's state holds)
    rescaled : (T,)    True where the block moved m_ref after the first finite block
    """

    block_max: np.ndarray
    running_max: np.ndarray
    m_ref: np.ndarray
    rescaled: np.ndarray


def trace_row(row, threshold: float = 8.0, block_size: int = 1) -> RowTrace:
    """Follow the running max and the reference max of a 1-D row read in blocks.

    Parameters
    ----------
    row : array (N,) of scores in log2 units; -inf marks a masked score
    threshold : theta >= 0, in log2 units
    block_size : entries per block (the last block may be shorter)
    """
    row = as_float_array("row", row, np.float64, min_ndim=1, allow_neg_inf=True)
    if row.ndim != 1:
        raise ValueError(f"row must be 1-D (N,); got shape {row.shape}")
    theta, B = _threshold(threshold), positive_int("block_size", block_size)
    block_max = np.array([np.max(row[j:j + B]) for j in range(0, row.size, B)])  # (T,)
    running_max = np.maximum.accumulate(block_max)  # (T,)
    m_ref = np.empty_like(block_max)
    rescaled = np.zeros(block_max.shape, dtype=bool)
    reference = -np.inf  # m_ref while the blocks are read
    for j, m_blk in enumerate(block_max):
        if reference == -np.inf:
            reference = m_blk  # first finite block sets m_ref: nothing to rescale
        elif m_blk - reference > theta:
            reference, rescaled[j] = m_blk, True  # the block max exceeds m_ref by more than theta
        m_ref[j] = reference
    return RowTrace(block_max, running_max, m_ref, rescaled)


def running_max_changes(row, block_size: int = 1) -> int:
    """Blocks after the first finite one that raise the running max (chapter 2's rescale count)."""
    return rescales(row, 0.0, block_size)


def rescales(row, threshold: float = 8.0, block_size: int = 1) -> int:
    """Number of rescales of a 1-D row under conditional rescaling with threshold theta."""
    return int(np.sum(trace_row(row, threshold, block_size).rescaled))


@dataclass(frozen=True)
class ConditionalResult:
    """Output of :func:`conditional_attention`.

    o : (..., N_q, d_v)       attention output
    rescales : (..., N_q)     rescales per query row (int)
    m_ref : (..., N_q)        final reference max, log2 units (-inf for a fully masked row)
    l : (..., N_q)            final sum of 2^(s - m_ref)
    max_p : float             largest 2^(s - m_ref) ever formed; <= 2^threshold
    """

    o: np.ndarray
    rescales: np.ndarray
    m_ref: np.ndarray
    l: np.ndarray
    max_p: float


def staircase_row(steps: int = 10, rise: float = 1.0, block_size: int = 4, seed: int = 0) -> np.ndarray:
    """A row whose block maxima rise by ``rise`` (log2 units) in each of ``steps`` blocks.

    The running max changes steps - 1 times; with theta = 8 and rise = 1, only the last
    block (max 9 above the first) exceeds the reference by more than 8: one rescale.
    Shape (steps * block_size,); the other entries of each block lie below its max.
    """
    rng = np.random.default_rng(seed)
    blocks = []
    for j in range(steps):
        top = j * rise
        blocks.append(np.r_[top, top - 1.0 - 3.0 * rng.random(block_size - 1)])
    return np.concatenate(blocks)


def conditional_attention(q, k, v, threshold: float = 8.0, block_size: int = 64, causal: bool = False,
                          scale: float | None = None, dtype=np.float64, row_group: int = 1,
                          p_format: str | None = None, p_shift: float = 0.0,
                          l_of_rounded_p: bool = False) -> ConditionalResult:
    """Attention by online softmax over K/V blocks with conditional rescaling (FA4 §3.2).

    Parameters
    ----------
    q : (..., N_q, d);  k : (..., N_k, d);  v : (..., N_k, d_v)
    threshold : theta >= 0 in log2 units; m_ref moves only when a block max exceeds it by > theta
    block_size : B_c, keys per block
    causal, scale : as in :func:`flashlab.reference.attention`
    dtype : floating type of the computation (float64 by default)
    row_group : query rows that decide together (consecutive, the last group may be shorter):
        when one row of a group must move, every row of the group moves to its running max.
        1 (default) is FA4's rule, row by row; a GPU kernel whose rows share a warpgroup can skip
        the rescale only for all of them at once (flashlab.kernels.fa3_fp8: 64 rows).
    p_format, p_shift : None (default) multiplies the exact P into V. An FP8 format ("e4m3",
        "e5m2") rounds P where an FP8 kernel casts it: P V uses 2^-p_shift round(2^p_shift P),
        the row sums l the unrounded P. flashlab.kernels.fa3_fp8 casts P = 2^(8 - theta)
        exp2(S - m_ref) <= 2^8, so p_shift = 8 - theta emulates it (theta = 0: a kernel that
        rescales at every block).
    l_of_rounded_p : the row sums l add the rounded P that P V multiplies, not the exact P (a
        kernel whose tensor cores sum l from the same FP8 tile: flashlab.kernels.fa3_fp8's
        ``l_mma``); then o is a weighted mean of V's rows with exactly the weights P V used.
    """
    q, k, v = _check_qkv(q, k, v, dtype)
    theta, Bc = _threshold(threshold), positive_int("block_size", block_size)
    G = positive_int("row_group", row_group)
    if isinstance(p_shift, bool) or not (isinstance(p_shift, (int, float, np.floating)) and math.isfinite(p_shift)):
        raise ValueError(f"p_shift must be a finite number; got {p_shift!r}")
    if p_format is None and p_shift != 0:
        raise ValueError(f"p_shift scales P before its FP8 cast, so it needs p_format; got p_shift={p_shift!r} "
                         "with p_format=None")
    if p_format is not None and p_format not in FP8_FORMATS:
        raise ValueError(f"p_format must be None or one of {sorted(FP8_FORMATS)}; got {p_format!r}")
    if not isinstance(l_of_rounded_p, (bool, np.bool_)):
        raise TypeError(f"l_of_rounded_p must be True or False; got {l_of_rounded_p!r}")
    round_p = (lambda p: p) if p_format is None else _fp8_rounder(p_format, float(p_shift))
    N_q, N_k = q.shape[-2], k.shape[-2]
    s_log2 = (q @ np.swapaxes(k, -1, -2)) * (_scale(scale, q.shape[-1]) * LOG2E)  # (..., N_q, N_k) log2 units
    if causal:
        s_log2 = np.where(causal_mask(N_q, N_k), s_log2, -np.inf)
    rows = s_log2.shape[:-1]  # (..., N_q)
    m_ref = np.full(rows, -np.inf, dtype=dtype)
    l = np.zeros(rows, dtype=dtype)
    o_tilde = np.zeros(rows + (v.shape[-1],), dtype=dtype)  # (..., N_q, d_v)
    count = np.zeros(rows, dtype=np.int64)
    max_p = 0.0
    for j in range(0, N_k, Bc):
        s_blk = s_log2[..., j:j + Bc]  # (..., N_q, Bc)
        m_blk = np.max(s_blk, axis=-1)  # (..., N_q)
        empty = m_ref == -np.inf  # nothing seen yet (or only masked scores)
        m_old_finite = np.where(empty, 0.0, m_ref)  # finite stand-in, so -inf - -inf never occurs
        move = empty | (m_blk - m_old_finite > theta)  # rows whose reference must move
        if G > 1:  # rows deciding together (a GPU warpgroup): one row that must move moves them all
            move = empty | _any_in_group(move & (m_blk > -np.inf), G)
        count += move & ~empty  # moving an empty state is not a rescale
        m_new = np.where(move, np.maximum(m_ref, m_blk), m_ref)
        alpha = np.where(empty, 0.0, np.exp2(m_old_finite - np.where(empty, 0.0, m_new)))  # 2^(m_ref - m_new)
        l, o_tilde = alpha * l, alpha[..., None] * o_tilde  # rescale (rows that did not move: alpha = 1)
        m_ref = m_new
        m_ref_finite = np.where(m_ref == -np.inf, 0.0, m_ref)[..., None]  # all-masked rows: 2^(-inf) = 0
        p = np.exp2(s_blk - m_ref_finite)  # (..., N_q, Bc), each <= 2^theta
        if p.size:
            max_p = max(max_p, float(np.max(p)))
        p_mul = round_p(p)  # the P that P V multiplies
        l = l + np.sum(p_mul if l_of_rounded_p else p, axis=-1)  # l = alpha l + rowsum(P)
        o_tilde = o_tilde + p_mul @ v[..., j:j + Bc, :]  # (..., N_q, d_v)
    o = np.where(l[..., None] > 0, o_tilde / np.where(l > 0, l, 1.0)[..., None], 0.0)  # o = o_tilde / l
    return ConditionalResult(o, count, m_ref, l, max_p)


def _fp8_rounder(fmt: str, shift: float):
    """P -> 2^-shift round(2^shift P) in FP8 format ``fmt`` (an FP8 kernel's cast of scaled P)."""
    return lambda p: round_to_fp8(p * 2.0**shift, fmt) * 2.0**-shift


def _any_in_group(x: np.ndarray, G: int) -> np.ndarray:
    """For x (..., N) of bools: True at every position of a group of G consecutive entries (the
    last may be shorter) that holds a True."""
    starts = np.arange(0, x.shape[-1], G)  # first entry of each group
    return np.logical_or.reduceat(x, starts, axis=-1)[..., np.arange(x.shape[-1]) // G]


def attention(q, k, v, threshold: float = 8.0, block_size: int = 64, causal: bool = False,
              scale: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact attention with FA4's conditional rescaling; returns (o, number_of_rescales).

    Parameters
    ----------
    q : (..., N_q, d);  k : (..., N_k, d);  v : (..., N_k, d_v)
    threshold : theta >= 0 (log2 units); FA4 uses 8
    block_size : B_c, keys per K/V block
    causal, scale : as in :func:`flashlab.reference.attention`

    Returns
    -------
    o : (..., N_q, d_v), equal to softmax(q k^T scale) v
    number_of_rescales : int array (..., N_q), rescales per query row (sum it for a total)
    """
    result = conditional_attention(q, k, v, threshold, block_size, causal, scale)
    return result.o, result.rescales
