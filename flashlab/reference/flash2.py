"""FlashAttention-2: the same exact attention, with the loops swapped and the division deferred.

Tri Dao, "FlashAttention-2: Faster Attention with Better Parallelism and Work
Partitioning", 2023. Forward: §3.1.1, Algorithm 1. Backward: §3.1.2, Algorithm 2.
As in chapter 3, the arrays q, k, v, o, lse play the part of HBM and the slices taken
inside the loops (Q_i, K_j, V_j, ...) the part of on-chip SRAM. Algorithm 1 (forward),
with the softmax scale tau and the causal mask added:

    1-2  split Q, O, L into Tr = ceil(N_q / Br) row blocks; K, V into Tc = ceil(N_k / Bc)
    3    for i = 1..Tr:                                  outer loop: Q blocks (one GPU program each)
    4        load Q_i
    5        o_tilde = 0 (Br x d),  l = 0 (Br),  m = -inf (Br)                 on chip
    6        for j = 1..Tc:                              inner loop: K/V blocks
    7            load K_j, V_j
    8            S_ij = tau Q_i K_j^T                                           (Br, Bc)
    9            m_new = max(m, rowmax(S_ij));  P~_ij = exp(S_ij - m_new)
                 l = e^(m - m_new) l + rowsum(P~_ij)
    10           o_tilde = diag(e^(m - m_new)) o_tilde + P~_ij V_j               no division
    12       O_i = diag(l)^-1 o_tilde                                          divide once
    13       L_i = m + log(l)                                                  the logsumexp
    14-15    write O_i and L_i to HBM

Two differences from v1 (chapter 3). The loop order: each query block is finished
by one program, which keeps its state on chip and writes O_i once; different query
blocks are independent, so they can run on different SMs (§3.2). The normalisation:
o_tilde is divided by l once, after the last key block, instead of after every one
(§3.1.1), and the backward pass receives one number per row, L = m + log l, instead
of m and l, because exp(S - L) = diag(l)^-1 exp(S - m) is already P.

Algorithm 2 (backward) keeps the v1 loop order, K/V blocks outside:

    1-2  split Q, O, dO, L into Tr = ceil(N_q / Br) row blocks; K, V into Tc = ceil(N_k / Bc)
    3    dQ = 0 in HBM
    4    D = rowsum(dO * O)                                    once, before the loops
    5    for j = 1..Tc:                                        outer loop: K/V blocks
    6        load K_j, V_j
    7        dK_j = 0, dV_j = 0                                on chip
    8        for i = 1..Tr:                                    inner loop: Q blocks
    9            load Q_i, O_i, dO_i, dQ_i, L_i, D_i
    10           S_ij = tau Q_i K_j^T
    11           P_ij = exp(S_ij - L_i)
    12           dV_j += P_ij^T dO_i
    13           dP_ij = dO_i V_j^T
    14           dS_ij = P_ij * (dP_ij - D_i)
    15           dQ_i += tau dS_ij K_j        read-modify-write of HBM: an atomic add on the GPU
    16           dK_j += tau dS_ij^T Q_i
    18       write dK_j, dV_j

Line 15 is the one place where programs working on different K/V blocks write the
same rows of HBM; the paper uses atomic adds there. flashlab's Triton backward
(flashlab/kernels/backward.py) avoids the atomics with a second kernel that loops
over K/V blocks for each query block.

Causal masking is bottom-right aligned as in :mod:`.naive`; a tile in which no query
sees any key is skipped, and a query row that sees no key ends with o = 0, L = -inf.

Glossary: Br, Bc = block_q, block_k, rows of a Q block and of a K/V block (行块, 列块);
Tr, Tc = numbers of those blocks; m = running row max (当前最大值); l = running sum of
exp(S - m) (分母); o_tilde = unnormalised output (未归一化输出); lse = L = m + log l,
the row's log-sum-exp (对数和指数); D = rowsum(dO * O); tau = softmax scale (缩放因子);
atomic add = a read-modify-write that the hardware makes indivisible (原子加).
"""

from __future__ import annotations

import numpy as np

from .._validate import as_float_array, positive_int
from .common import _check_output_like, _check_qkv, _scale, block_ranges, causal_tile_mask, tile_fully_masked

__all__ = ["flash2_forward", "flash2_backward"]


def _tiling(q: np.ndarray, k: np.ndarray, block_q: int, block_k: int):
    """Row blocks of Q (Tr of them), column blocks of K/V (Tc), and the causal offset N_k - N_q."""
    Br = positive_int("block_q", block_q)
    Bc = positive_int("block_k", block_k)
    n_q, n_k = q.shape[-2], k.shape[-2]
    return block_ranges(n_q, Br), block_ranges(n_k, Bc), n_k - n_q


def flash2_forward(
    q, k, v, block_q: int, block_k: int, causal: bool = False, scale: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Exact attention by Algorithm 1 of FlashAttention-2: O = softmax(tau Q K^T) V.

    Parameters
    ----------
    q : array (..., N_q, d)
    k : array (..., N_k, d)
    v : array (..., N_k, d_v)
    block_q : Br, query rows per block (the outer loop).
    block_k : Bc, keys per block (the inner loop).
    causal : mask keys after the query (bottom-right aligned when N_q != N_k).
    scale : tau; default 1/sqrt(d).

    Returns
    -------
    o : array (..., N_q, d_v)   equal to ``attention(q, k, v, causal, scale)``
    lse : array (..., N_q)      L = m + log(l), the log-sum-exp of each row of scores
                                (-inf for a row that sees no key)
    """
    q, k, v = _check_qkv(q, k, v, np.float64)
    tau = _scale(scale, q.shape[-1])
    row_blocks, col_blocks, offset = _tiling(q, k, block_q, block_k)  # lines 1-2: Tr, Tc blocks
    lead, d_v = q.shape[:-2], v.shape[-1]
    o = np.zeros(lead + (q.shape[-2], d_v))  # O in HBM   (..., N_q, d_v)
    lse = np.zeros(lead + (q.shape[-2],))  # L in HBM     (..., N_q)

    for rows in row_blocks:  # line 3: for i = 1..Tr (each i is an independent program)
        r = slice(*rows)
        Q_i = q[..., r, :]  # line 4: load Q_i  (..., Br, d)
        o_tilde = np.zeros(lead + (rows[1] - rows[0], d_v))  # line 5: o_tilde = 0 on chip  (..., Br, d_v)
        l = np.zeros(lead + (rows[1] - rows[0],))  # line 5: l = 0  (..., Br)
        m = np.full(lead + (rows[1] - rows[0],), -np.inf)  # line 5: m = -inf  (..., Br)
        for cols in col_blocks:  # line 6: for j = 1..Tc
            if causal and tile_fully_masked(rows, cols, offset):
                continue  # no query of Q_i sees a key of K_j (and none later): nothing to add
            K_j, V_j = k[..., slice(*cols), :], v[..., slice(*cols), :]  # line 7: load K_j, V_j  (..., Bc, d), (..., Bc, d_v)
            S_ij = tau * (Q_i @ np.swapaxes(K_j, -1, -2))  # line 8: S_ij = tau Q_i K_j^T  (..., Br, Bc)
            if causal:
                S_ij = np.where(causal_tile_mask(rows, cols, offset), S_ij, -np.inf)  # causal: -inf after the diagonal
            m_new = np.maximum(m, np.max(S_ij, axis=-1))  # line 9: m_new = max(m, rowmax(S_ij))
            m_new_finite = np.where(np.isneginf(m_new), 0.0, m_new)  # row saw no key yet: exp(-inf) = 0, not NaN
            P_tilde = np.exp(S_ij - m_new_finite[..., None])  # line 9: P~_ij = exp(S_ij - m_new)  (..., Br, Bc)
            alpha = np.exp(m - m_new_finite)  # e^(m - m_new): rescales the old state  (..., Br)
            l = alpha * l + np.sum(P_tilde, axis=-1)  # line 9: l = e^(m - m_new) l + rowsum(P~_ij)
            o_tilde = alpha[..., None] * o_tilde + P_tilde @ V_j  # line 10: o_tilde = diag(e^(m - m_new)) o_tilde + P~_ij V_j
            m = m_new
        seen = l > 0  # False only for a causal row that sees no key at all
        o[..., r, :] = np.divide(  # line 12: O_i = diag(l)^-1 o_tilde, the one division
            o_tilde, l[..., None], out=np.zeros_like(o_tilde), where=seen[..., None]
        )
        with np.errstate(divide="ignore"):
            lse[..., r] = np.where(seen, m + np.log(l), -np.inf)  # line 13: L_i = m + log(l)
    return o, lse


def flash2_backward(
    q, k, v, o, lse, do, block_q: int, block_k: int, causal: bool = False, scale: float | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of attention by Algorithm 2 of FlashAttention-2, rebuilding P from L.

    Parameters
    ----------
    q, k, v : arrays (..., N_q, d), (..., N_k, d), (..., N_k, d_v), as given to the forward.
    o : array (..., N_q, d_v), the forward's output.
    lse : array (..., N_q), the forward's L = m + log(l) (-inf for a row that sees no key).
    do : array (..., N_q, d_v), dLoss/dO.
    block_q, block_k, causal, scale : as for :func:`flash2_forward`.

    Returns
    -------
    (dq, dk, dv) with the shapes of (q, k, v).
    """
    q, k, v = _check_qkv(q, k, v, np.float64)
    o, do = _check_output_like(q, v, o=o, do=do)
    lse = as_float_array("lse", lse, np.float64, min_ndim=1, allow_neg_inf=True)
    if lse.shape != q.shape[:-1]:
        raise ValueError(f"lse must have shape {q.shape[:-1]} (one number per query row); got lse.shape={lse.shape}")
    tau = _scale(scale, q.shape[-1])
    row_blocks, col_blocks, offset = _tiling(q, k, block_q, block_k)  # lines 1-2: Tr, Tc blocks
    L = np.where(np.isneginf(lse), 0.0, lse)  # a row that saw no key: all its P are masked to 0 anyway

    D = np.sum(do * o, axis=-1)  # line 4: D = rowsum(dO * O), once  (..., N_q)
    dq = np.zeros_like(q)  # line 3: dQ = 0 in HBM  (..., N_q, d)
    dk = np.zeros_like(k)  # (..., N_k, d)
    dv = np.zeros_like(v)  # (..., N_k, d_v)
    for cols in col_blocks:  # line 5: for j = 1..Tc (each j is an independent program)
        c = slice(*cols)
        K_j, V_j = k[..., c, :], v[..., c, :]  # line 6: load K_j, V_j  (..., Bc, d), (..., Bc, d_v)
        dK_j, dV_j = np.zeros_like(K_j), np.zeros_like(V_j)  # line 7: dK_j = 0, dV_j = 0 on chip
        for rows in row_blocks:  # line 8: for i = 1..Tr
            if causal and tile_fully_masked(rows, cols, offset):
                continue  # P_ij = 0: the tile adds to no gradient
            r = slice(*rows)
            Q_i, dO_i, L_i, D_i = q[..., r, :], do[..., r, :], L[..., r], D[..., r]  # line 9: load Q_i, dO_i, L_i, D_i
            S_ij = tau * (Q_i @ np.swapaxes(K_j, -1, -2))  # line 10: S_ij = tau Q_i K_j^T  (..., Br, Bc)
            if causal:
                S_ij = np.where(causal_tile_mask(rows, cols, offset), S_ij, -np.inf)  # causal: -inf after the diagonal
            P_ij = np.exp(S_ij - L_i[..., None])  # line 11: P_ij = exp(S_ij - L_i), already normalised
            dV_j += np.swapaxes(P_ij, -1, -2) @ dO_i  # line 12: dV_j += P_ij^T dO_i  (..., Bc, d_v)
            dP_ij = dO_i @ np.swapaxes(V_j, -1, -2)  # line 13: dP_ij = dO_i V_j^T  (..., Br, Bc)
            dS_ij = P_ij * (dP_ij - D_i[..., None])  # line 14: dS_ij = P_ij * (dP_ij - D_i)
            # line 15: dQ_i += tau dS_ij K_j. Programs for other K/V blocks update the same
            # rows at the same time; on the GPU this read-modify-write is one atomic add.
            dQ_i = dq[..., r, :]  # read dQ_i from HBM  (..., Br, d)
            dq[..., r, :] = dQ_i + tau * (dS_ij @ K_j)  # add this tile's part and write back
            dK_j += tau * (np.swapaxes(dS_ij, -1, -2) @ Q_i)  # line 16: dK_j += tau dS_ij^T Q_i  (..., Bc, d)
        dk[..., c, :], dv[..., c, :] = dK_j, dV_j  # line 18: write dK_j, dV_j once
    return dq, dk, dv
