"""Counting the non-matmul work of FlashAttention v1 and v2, by running it.

FlashAttention-2 §3.1: on an A100 a 16-bit matrix multiply runs at 312 TFLOP/s on
the tensor cores, everything else (exp, max, add, multiply, divide in fp32) at
19.5 TFLOP/s, so one non-matmul operation costs as much time as 312 / 19.5 = 16
matmul FLOPs. v2 therefore removes non-matmul work wherever the algorithm allows.

This module counts that work. :class:`Counted` is a NumPy array that records every
elementwise operation done on it; the inner-loop steps of v1 (FA1 Alg. 1, lines
9-12, FlashAttention) and v2 (FA2 Alg. 1, lines 8-13, FlashAttention-2), and
the recomputation of P in the two backward passes (FA1 Alg. 4 line 13, FA2 Alg. 2
line 11), are run on real numbers with :class:`Counted` inputs, tile by tile, over
the same loops as the references. The counts are what the code did, not a formula;
tests check them against closed forms and check that the counted code computes
attention.

Counting rules: an elementwise operation on n numbers counts n; a reduction over n
numbers (rowmax, rowsum) counts n; subtraction counts as "add"; a matrix product
counts 2abc "matmul_flops" and nothing else (on the GPU its accumulation happens
inside the tensor core).

Glossary: Br, Bc = rows of a Q block, of a K/V block; tile = one (Br x Bc) block of
scores; non-matmul = work not done by the tensor cores (非矩阵乘运算).
"""

from __future__ import annotations

from collections import Counter
from contextlib import contextmanager
from typing import Iterator

import numpy as np

from .. import hardware
from .._validate import positive_int
from .common import block_ranges

__all__ = ["Counted", "counting", "count_nonmatmul", "OPS", "matmul_equivalent", "nonmatmul_cost_ratio"]

OPS = ("exp", "log", "max", "add", "multiply", "divide")
_UFUNC_OP = {
    "exp": "exp", "log": "log", "maximum": "max", "add": "add", "subtract": "add",
    "multiply": "multiply", "divide": "divide", "true_divide": "divide",
}
_TALLY: list[Counter] = []  # the tallies of the active `counting()` blocks, innermost last


class Counted(np.ndarray):
    """An ndarray that adds each ufunc it takes part in to the active :func:`counting` tally."""

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        plain = [np.asarray(x) if isinstance(x, Counted) else x for x in inputs]
        if "out" in kwargs:
            kwargs["out"] = tuple(np.asarray(x) if isinstance(x, Counted) else x for x in kwargs["out"])
        result = getattr(ufunc, method)(*plain, **kwargs)
        if _TALLY:
            if ufunc is np.matmul:
                a, b = np.shape(plain[0]), np.shape(plain[1])
                batch = int(np.prod(np.broadcast_shapes(a[:-2], b[:-2]), dtype=np.int64))
                _TALLY[-1]["matmul_flops"] += 2 * batch * a[-2] * a[-1] * b[-1]  # 2abc
            elif ufunc.__name__ in _UFUNC_OP:
                n = np.size(plain[0]) if method == "reduce" else np.size(result)
                _TALLY[-1][_UFUNC_OP[ufunc.__name__]] += int(n)
        return result.view(Counted) if isinstance(result, np.ndarray) else result


@contextmanager
def counting() -> Iterator[Counter]:
    """``with counting() as tally:`` — operations on :class:`Counted` arrays inside the
    block are added to ``tally`` (a Counter keyed by :data:`OPS` and "matmul_flops")."""
    tally: Counter = Counter()
    _TALLY.append(tally)
    try:
        yield tally
    finally:
        _TALLY.pop()


def _counted(x: np.ndarray) -> Counted:
    """``x`` as a float64 :class:`Counted` array (a view, no copy when it is one already)."""
    return np.asarray(x, dtype=np.float64).view(Counted)


# ---------------------------------------------------------------- the counted steps
def _v1_tile(Q_i, K_j, V_j, O_i, l_i, m_i, tau):
    """FA1 Alg. 1, lines 9-12 (FlashAttention v1), for one tile; O_i stays normalised."""
    S = tau * (Q_i @ K_j.T)  # line 9: S_ij = tau Q_i K_j^T
    m_tilde = np.max(S, axis=-1)  # line 10: m~_ij = rowmax(S_ij)
    P_tilde = np.exp(S - m_tilde[:, None])  # line 10: P~_ij = exp(S_ij - m~_ij)
    l_tilde = np.sum(P_tilde, axis=-1)  # line 10: l~_ij = rowsum(P~_ij)
    m_new = np.maximum(m_i, m_tilde)  # line 11: m_new = max(m_i, m~_ij)
    alpha, beta = np.exp(m_i - m_new), np.exp(m_tilde - m_new)  # e^(m_i - m_new), e^(m~_ij - m_new)
    l_new = alpha * l_i + beta * l_tilde  # line 11: l_new = e^(m_i - m_new) l_i + e^(m~_ij - m_new) l~_ij
    O_i = ((l_i * alpha)[:, None] * O_i + beta[:, None] * (P_tilde @ V_j)) / l_new[:, None]  # line 12: O_i <- ...
    return O_i, l_new, m_new


def _v2_tile(Q_i, K_j, V_j, o_tilde, l, m, tau):
    """FA2 Alg. 1, lines 8-10 (FlashAttention-2), for one tile; o_tilde is not normalised."""
    S = tau * (Q_i @ K_j.T)  # line 8: S_ij = tau Q_i K_j^T
    m_new = np.maximum(m, np.max(S, axis=-1))  # line 9: m_new = max(m, rowmax(S_ij))
    P_tilde = np.exp(S - m_new[:, None])  # line 9: P~_ij = exp(S_ij - m_new)
    alpha = np.exp(m - m_new)  # e^(m - m_new), the one rescale factor
    l = alpha * l + np.sum(P_tilde, axis=-1)  # line 9: l = e^(m - m_new) l + rowsum(P~_ij)
    o_tilde = alpha[:, None] * o_tilde + P_tilde @ V_j  # line 10: o_tilde = ... + P~_ij V_j, no division
    return o_tilde, l, m_new


def _v2_finish(o_tilde, l, m):
    """FA2 Alg. 1, lines 12-13, once per query block."""
    return o_tilde / l[:, None], m + np.log(l)  # line 12: O_i = diag(l)^-1 o_tilde;  line 13: L_i = m + log l


def _v1_backward_P(Q_i, K_j, m_i, l_inv_i, tau):
    """FA1 Alg. 4, line 13: P = diag(l)^-1 exp(S - m), from two statistics."""
    S = tau * (Q_i @ K_j.T)  # line 11: S_ij = tau Q_i K_j^T
    return l_inv_i[:, None] * np.exp(S - m_i[:, None])  # line 13: P_ij = diag(l_i)^-1 exp(S_ij - m_i)


def _v2_backward_P(Q_i, K_j, L_i, tau):
    """FA2 Alg. 2, line 11: P = exp(S - L), from one statistic."""
    S = tau * (Q_i @ K_j.T)  # line 10: S_ij = tau Q_i K_j^T
    return np.exp(S - L_i[:, None])  # line 11: P_ij = exp(S_ij - L_i)


def _forward(version: int, q: Counted, k: Counted, v: Counted, Br: int, Bc: int, tau: float) -> Counted:
    """The forward loops of v1 or v2 over (N, d) counted arrays; returns O (N, d)."""
    N, d = q.shape
    rows, cols = block_ranges(N, Br), block_ranges(N, Bc)
    if version == 1:
        o, l, m = _counted(np.zeros((N, d))), _counted(np.zeros(N)), _counted(np.full(N, -np.inf))  # FA1 Alg. 1 line 2: O = 0 in HBM
        for c0, c1 in cols:  # v1: K/V blocks outside ...
            for r0, r1 in rows:  # ... Q blocks inside: O_i, l_i, m_i read and written every step
                o[r0:r1], l[r0:r1], m[r0:r1] = _v1_tile(
                    q[r0:r1], k[c0:c1], v[c0:c1], o[r0:r1], l[r0:r1], m[r0:r1], tau)
        return o
    o = _counted(np.zeros((N, d)))
    for r0, r1 in rows:  # v2: Q blocks outside ...
        o_tilde, l, m = _counted(np.zeros((r1 - r0, d))), _counted(np.zeros(r1 - r0)), _counted(np.full(r1 - r0, -np.inf))
        for c0, c1 in cols:  # ... K/V blocks inside: the state stays on chip
            o_tilde, l, m = _v2_tile(q[r0:r1], k[c0:c1], v[c0:c1], o_tilde, l, m, tau)
        o[r0:r1] = _v2_finish(o_tilde, l, m)[0]
    return o


def _backward_P(version: int, q: Counted, k: Counted, Br: int, Bc: int, tau: float) -> np.ndarray:
    """P (N, N) rebuilt tile by tile as v1's or v2's backward does, from the statistics of
    the forward pass (computed here uncounted: v1 keeps m and l, v2 keeps L = m + log l)."""
    N = q.shape[0]
    S = (np.asarray(q) @ np.asarray(k).T) * tau  # (N, N), the forward's scores
    m_plain = S.max(axis=-1)
    l_plain = np.exp(S - m_plain[:, None]).sum(axis=-1)
    m, l, L = _counted(m_plain), _counted(l_plain), _counted(m_plain + np.log(l_plain))
    if version == 1:
        l_inv = 1.0 / l  # diag(l)^-1, once per row
    P = np.zeros((N, N))
    for c0, c1 in block_ranges(N, Bc):  # both backwards: K/V blocks outside, Q blocks inside
        for r0, r1 in block_ranges(N, Br):
            if version == 1:
                P[r0:r1, c0:c1] = _v1_backward_P(q[r0:r1], k[c0:c1], m[r0:r1], l_inv[r0:r1], tau)
            else:
                P[r0:r1, c0:c1] = _v2_backward_P(q[r0:r1], k[c0:c1], L[r0:r1], tau)
    return P


def count_nonmatmul(
    version: int, N: int, d: int, Br: int, Bc: int, backward: bool = False, seed: int = 0
) -> dict[str, int]:
    """Run v1's or v2's loops on random (N, d) inputs with counted arrays; return the tally.

    Parameters
    ----------
    version : 1 (FlashAttention: normalise O_i after every tile, keep m and l) or
        2 (FlashAttention-2: divide once per query block, keep L = m + log l).
    N : sequence length (N_q = N_k, no mask); d : head dimension (d_v = d).
    Br, Bc : rows per Q block and per K/V block (any N, ragged last blocks allowed).
    backward : if True, count the recomputation of P in the backward pass (the part
        where the two versions differ: v1 rebuilds P from m and l, v2 from L) plus the
        preparation of the statistics (v1: 1/l per row; v2: nothing, L is stored).
    seed : seeds the random inputs (the counts do not depend on it).

    Returns
    -------
    dict with one key per :data:`OPS` entry, "nonmatmul" (their sum), "matmul_flops",
    "tiles" (Br x Bc tiles visited) and "stats_per_row" (numbers kept per query row
    for the backward: 2 for v1, 1 for v2).
    """
    if version not in (1, 2):
        raise ValueError(f"version must be 1 or 2; got {version!r}")
    N, d, Br, Bc = (positive_int(n, x) for n, x in (("N", N), ("d", d), ("Br", Br), ("Bc", Bc)))
    rng = np.random.default_rng(seed)
    q, k, v = (_counted(rng.normal(size=(N, d))) for _ in range(3))
    tau = 1.0 / np.sqrt(d)
    with counting() as tally:
        if backward:
            _backward_P(version, q, k, Br, Bc, tau)
        else:
            _forward(version, q, k, v, Br, Bc, tau)
        counts = {op: int(tally[op]) for op in OPS}
        counts["matmul_flops"] = int(tally["matmul_flops"])
    counts["nonmatmul"] = sum(counts[op] for op in OPS)
    counts["tiles"] = len(block_ranges(N, Br)) * len(block_ranges(N, Bc))
    counts["stats_per_row"] = 2 if version == 1 else 1
    return counts


def nonmatmul_cost_ratio(gpu: hardware.GPU = hardware.A100, dtype: str = "fp16") -> float:
    """How many matmul FLOPs take as long as one non-matmul op: tensor FLOP/s / fp32 FLOP/s
    (A100: 312 / 19.5 = 16)."""
    return gpu.peak_flops(dtype) / gpu.fp32_flops


def matmul_equivalent(counts: dict[str, int], gpu: hardware.GPU = hardware.A100, dtype: str = "fp16") -> dict[str, float]:
    """Time at peak rates of the counted work: matmul FLOPs on the tensor cores, the rest
    at the fp32 rate.

    Returns
    -------
    dict: "matmul_s", "nonmatmul_s" (seconds at peak), "nonmatmul_share_of_ops"
    (non-matmul ops / all ops) and "nonmatmul_share_of_time" (non-matmul seconds / all).
    """
    matmul_s = counts["matmul_flops"] / gpu.peak_flops(dtype)
    nonmatmul_s = counts["nonmatmul"] / gpu.fp32_flops
    return {
        "matmul_s": matmul_s,
        "nonmatmul_s": nonmatmul_s,
        "nonmatmul_share_of_ops": counts["nonmatmul"] / (counts["nonmatmul"] + counts["matmul_flops"]),
        "nonmatmul_share_of_time": nonmatmul_s / (matmul_s + nonmatmul_s),
    }
