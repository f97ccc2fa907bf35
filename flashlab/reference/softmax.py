"""Softmax, its numerically safe form, and online softmax (the (m, l, o_tilde) recurrence).

Softmax of a row s_1..s_N is p_k = exp(s_k) / sum_t exp(s_t). Computing exp(s_k)
directly overflows in fp16 as soon as s_k > 11.09 (e^11.1 > 65504, the largest fp16),
so every real implementation subtracts the row maximum m first:

    m = max_t s_t,    l = sum_t exp(s_t - m),    p_k = exp(s_k - m) / l.       (safe softmax)

Online softmax (Milakov & Gimelshein, 2018; FlashAttention §3.1) reads the row in
blocks and keeps a running state: the max m seen so far, the sum l of exp(s - m)
relative to that max and, when values v come with the scores, the unnormalised
output o_tilde = sum exp(s - m) v. When a block raises the max from m to m_new,
the old state is moved to the new reference point by one multiply:

    m_new       = max(m, max_k s_k)                                           (1)
    l_new       = exp(m - m_new) * l       + sum_k exp(s_k - m_new)           (2)
    o_tilde_new = exp(m - m_new) * o_tilde + sum_k exp(s_k - m_new) v_k       (3)

and at the end o = o_tilde / l. Nothing is approximated: exp(s - m_new) equals
exp(s - m) * exp(m - m_new) exactly, so the state after any sequence of blocks is
the state the whole row would have produced.

Two states built from disjoint parts of the same row combine the same way
(``OnlineSoftmaxState.merge``), in either order:

    m = max(m_1, m_2),   l = exp(m_1 - m) l_1 + exp(m_2 - m) l_2,
    o_tilde = exp(m_1 - m) o_tilde_1 + exp(m_2 - m) o_tilde_2                  (4)

``update`` is the special case where the second state is one block's alone; split-KV
decoding (flash-decoding) uses (4) to join partial results computed in parallel.

Glossary: m = running max (当前最大值); l = running denominator (分母, 指数和);
o_tilde = unnormalised output (未归一化输出); block = a chunk of the row read at once (块).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._validate import as_float_array, positive_int
from .common import _check_qkv, _scale, block_ranges, causal_mask

__all__ = ["softmax", "naive_softmax", "online_softmax", "OnlineSoftmaxState", "online_attention"]


def naive_softmax(x, axis: int = -1) -> np.ndarray:
    """p = exp(x) / sum exp(x), with no max subtraction: overflows for large x.

    It exists to show the failure; use :func:`softmax`. Works in x's own floating dtype
    so that fp16 overflow can be seen."""
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        e = np.exp(x)
        return e / np.sum(e, axis=axis, keepdims=True)


def softmax(x, axis: int = -1) -> np.ndarray:
    """Safe softmax along ``axis``: exp(x - max) / sum exp(x - max).

    ``x`` may contain -inf (masked entries); a slice that is entirely -inf gives
    all zeros rather than NaN. +inf and NaN are rejected."""
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float64)
    if np.any(np.isnan(x)) or np.any(np.isposinf(x)):
        raise ValueError("x must not contain NaN or +inf (use -inf to mask an entry)")
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isneginf(m), 0.0, m)  # fully masked slice: exp(-inf - 0) = 0
    e = np.exp(x - m)
    l = np.sum(e, axis=axis, keepdims=True)
    return np.divide(e, l, out=np.zeros_like(e), where=l > 0)


@dataclass(frozen=True)
class OnlineSoftmaxState:
    """The running state of online softmax for a batch of rows.

    Attributes
    ----------
    m : array (...,)         running max of the scores seen so far (-inf before any)
    l : array (...,)         running sum of exp(s - m)
    o_tilde : array (..., d_v) or None
        running sum of exp(s - m) * v, the output before division by l; None when
        only the softmax denominator is tracked.
    """

    m: np.ndarray
    l: np.ndarray
    o_tilde: np.ndarray | None = None

    @classmethod
    def empty(cls, rows: tuple[int, ...] = (), d_v: int | None = None, dtype=np.float64) -> "OnlineSoftmaxState":
        """The state before any block: m = -inf, l = 0, o_tilde = 0 (shape rows + (d_v,))."""
        m = np.full(rows, -np.inf, dtype=dtype)
        l = np.zeros(rows, dtype=dtype)
        o = None if d_v is None else np.zeros(rows + (d_v,), dtype=dtype)
        return cls(m, l, o)

    def update(self, s_block, v_block=None) -> "OnlineSoftmaxState":
        """Fold one block of scores (and values) into the state; returns a new state.

        Parameters
        ----------
        s_block : array (..., B)      scores of this block; -inf marks a masked key.
        v_block : array (..., B, d_v) values of this block, shared by the rows whose
            scores share its leading dimensions (for attention: s_block (..., N_q, B)
            and v_block (..., B, d_v)); required iff o_tilde is tracked.
        """
        s = np.asarray(s_block, dtype=self.l.dtype)
        if s.shape[:-1] != self.m.shape:
            raise ValueError(f"s_block must have shape {self.m.shape} + (B,); got {s.shape}")
        if (v_block is None) != (self.o_tilde is None):
            raise ValueError("v_block must be given exactly when the state tracks o_tilde")
        if s.shape[-1] == 0:  # an empty block changes nothing
            return self
        m_new = np.maximum(self.m, np.max(s, axis=-1))  # (1)
        m_new_finite = np.where(np.isneginf(m_new), 0.0, m_new)  # all masked so far: keep exp() at 0, not NaN
        alpha = np.exp(self.m - m_new_finite)  # exp(m - m_new): the one rescale factor per row
        p = np.exp(s - m_new_finite[..., None])  # (..., B) exp(s_k - m_new)
        l_new = alpha * self.l + np.sum(p, axis=-1)  # (2)
        if self.o_tilde is None:
            return OnlineSoftmaxState(m_new, l_new)
        v = np.asarray(v_block, dtype=self.l.dtype)
        if v.ndim < 2 or v.shape[-2] != s.shape[-1] or v.shape[-1] != self.o_tilde.shape[-1]:
            raise ValueError(
                f"v_block must have shape (..., {s.shape[-1]}, {self.o_tilde.shape[-1]}) "
                f"(block length, d_v); got {v.shape}"
            )
        o_new = alpha[..., None] * self.o_tilde + p @ v  # (3)  (..., d_v)
        return OnlineSoftmaxState(m_new, l_new, o_new)

    def merge(self, other: "OnlineSoftmaxState") -> "OnlineSoftmaxState":
        """Combine this state with one built from a disjoint set of keys (equation (4)).

        If ``self`` summarises the keys of set A and ``other`` those of set B (same rows),
        the result is the state of A and B together, equal (up to rounding) to folding all
        their blocks through :meth:`update` in any order. Either state may be empty.

        Parameters
        ----------
        other : OnlineSoftmaxState with the same row shape (and d_v, if values are tracked).
        """
        if self.m.shape != other.m.shape:
            raise ValueError(f"states must cover the same rows; got m shapes {self.m.shape} and {other.m.shape}")
        if (self.o_tilde is None) != (other.o_tilde is None):
            raise ValueError("both states must track o_tilde, or neither")
        if self.o_tilde is not None and self.o_tilde.shape != other.o_tilde.shape:
            raise ValueError(
                f"o_tilde shapes must match; got {self.o_tilde.shape} and {other.o_tilde.shape}"
            )
        m = np.maximum(self.m, other.m)  # (4)  (...,)
        m_finite = np.where(np.isneginf(m), 0.0, m)  # both empty: keep exp() at 0, not NaN
        alpha_1 = np.exp(self.m - m_finite)  # exp(m_1 - m)
        alpha_2 = np.exp(other.m - m_finite)  # exp(m_2 - m)
        l = alpha_1 * self.l + alpha_2 * other.l  # (4)
        if self.o_tilde is None:
            return OnlineSoftmaxState(m, l)
        o = alpha_1[..., None] * self.o_tilde + alpha_2[..., None] * other.o_tilde  # (4)  (..., d_v)
        return OnlineSoftmaxState(m, l, o)

    def output(self) -> np.ndarray:
        """o = o_tilde / l, shape (..., d_v); rows that saw only masked keys give 0."""
        if self.o_tilde is None:
            raise ValueError("this state tracks no values (o_tilde is None); nothing to output")
        l = self.l[..., None]
        return np.divide(self.o_tilde, l, out=np.zeros_like(self.o_tilde), where=l > 0)

    @property
    def lse(self) -> np.ndarray:
        """log-sum-exp of all scores seen: m + log(l) (-inf for an empty row)."""
        with np.errstate(divide="ignore"):
            return np.where(self.l > 0, self.m + np.log(self.l), -np.inf)


def online_softmax(x, block_size: int) -> np.ndarray:
    """Softmax over the last axis, reading each row ``block_size`` entries at a time.

    Pass 1 runs the recurrence (1)-(2) over the blocks to get (m, l) for every row;
    pass 2 writes p = exp(x - m) / l. Equal to :func:`softmax` for every block size
    (a block larger than the row is one block).

    Parameters
    ----------
    x : array (..., N); -inf marks a masked entry (a fully masked row gives zeros,
        as in :func:`softmax`); NaN and +inf are rejected.
    block_size : int >= 1
    """
    block_size = positive_int("block_size", block_size)
    x = as_float_array("x", x, np.float64, min_ndim=1, allow_neg_inf=True)
    state = OnlineSoftmaxState.empty(x.shape[:-1])
    for start, stop in block_ranges(x.shape[-1], block_size):
        state = state.update(x[..., start:stop])  # pass 1: (1)-(2)
    m = np.where(np.isneginf(state.m), 0.0, state.m)[..., None]  # (..., 1)
    l = state.l[..., None]  # (..., 1)
    return np.divide(np.exp(x - m), l, out=np.zeros_like(x), where=l > 0)  # pass 2


def online_attention(q, k, v, block_size: int, causal: bool = False, scale: float | None = None) -> np.ndarray:
    """Attention computed by streaming K and V in blocks of ``block_size`` keys through
    the (m, l, o_tilde) recurrence: every query row is handled at once, S is never
    formed beyond one (N_q, block_size) block. Equal to :func:`~flashlab.reference.attention`.

    q (..., N_q, d), k (..., N_k, d), v (..., N_k, d_v) -> o (..., N_q, d_v)
    """

    block_size = positive_int("block_size", block_size)
    q, k, v = _check_qkv(q, k, v, np.float64)
    n_q, n_k = q.shape[-2], k.shape[-2]
    tau = _scale(scale, q.shape[-1])
    state = OnlineSoftmaxState.empty(q.shape[:-1], v.shape[-1])
    for start, stop in block_ranges(n_k, block_size):
        s = (q @ np.swapaxes(k[..., start:stop, :], -1, -2)) * tau  # (..., N_q, B)
        if causal:
            s = np.where(causal_mask(n_q, n_k)[:, start:stop], s, -np.inf)
        state = state.update(s, v[..., start:stop, :])
    return state.output()
