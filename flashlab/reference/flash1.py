"""FlashAttention (v1): tiling + online softmax in one fused pass, backward by recomputation.

Dao, Fu, Ermon, Rudra & Ré, "FlashAttention: Fast and Memory-Efficient Exact Attention
with IO-Awareness", NeurIPS 2022. Forward: §3.1, Algorithm 1 (with the softmax scale
tau and the mask placed as in Algorithm 2). Backward: Appendix B.4, Algorithm 4.

The arrays q, k, v, o, l, m play the part of HBM (the GPU's large, slow memory); the
slices Q_i, K_j, V_j, O_i, l_i, m_i taken inside the loops play the part of SRAM (the
small, fast on-chip memory of M = ``sram_size`` numbers). Algorithm 1, as the paper
writes it:

    1   Bc = ceil(M / 4d),  Br = min(ceil(M / 4d), d)
    2   O = 0 (N x d),  l = 0 (N),  m = -inf (N)                       in HBM
    3-4 split Q, O, l, m into Tr = ceil(N / Br) row blocks; K, V into Tc = ceil(N / Bc)
    5   for j = 1..Tc:                                   outer loop: K/V blocks
    6       load K_j, V_j
    7       for i = 1..Tr:                               inner loop: Q blocks
    8           load Q_i, O_i, l_i, m_i
    9           S_ij = tau Q_i K_j^T                                        (Br, Bc)
    10          m~_ij = rowmax(S_ij);  P~_ij = exp(S_ij - m~_ij);  l~_ij = rowsum(P~_ij)
    11          m_new = max(m_i, m~_ij)
                l_new = e^(m_i - m_new) l_i + e^(m~_ij - m_new) l~_ij
    12          O_i <- diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~_ij - m_new) P~_ij V_j)
    13          l_i <- l_new,  m_i <- m_new                                 written to HBM

:func:`flash1_step` is lines 10-13 for one tile; :func:`flash1_forward` runs it inside the
two loops, and so does the simulated memory of chapter 4 (:mod:`flashlab.memory`).

Note the loop order (K/V outside, Q inside) and line 12: v1 keeps O_i *normalised*
after every step, so each step reads O_i, l_i, m_i from HBM and writes them back.
FlashAttention-2 (chapter 5) swaps the loops and divides by l once at the end.

The backward pass (Algorithm 4) never stores P. It keeps O and the per-row
statistics m, l from the forward pass (2N numbers instead of N^2) and rebuilds each
block P_ij = diag(l_i)^-1 exp(S_ij - m_i) when it needs it.

Causal masking is bottom-right aligned as in :mod:`.naive`: query i sees key j iff
j <= i + (N_k - N_q). A block (i, j) in which no query sees any key is skipped
entirely (it would contribute nothing). A query row that sees no key at all ends
with o = 0, m = -inf, l = 0.

Glossary: Br, Bc = rows of a Q block, rows of a K/V block (行块大小, 列块大小);
Tr, Tc = number of Q blocks, of K/V blocks (块数); M = sram_size, numbers that fit in
SRAM (片上存储容量); m = row max (行最大值); l = row sum of exp(s - m) (指数和, 分母);
o_tilde / P~ = unnormalised output / probabilities (未归一化); tau = softmax scale
(缩放因子); recomputation = rebuilding P in the backward pass instead of storing it (重计算).
"""

from __future__ import annotations

import math

import numpy as np

from .._validate import positive_int
from .common import _check_output_like, _check_qkv, _scale, block_ranges, causal_tile_mask, tile_fully_masked

__all__ = ["block_sizes", "flash1_step", "flash1_forward", "flash1_backward", "flash1_block_counts", "flash1_flops"]


def block_sizes(sram_size: int, d: int) -> tuple[int, int]:
    """Block sizes of Algorithm 1, line 1: Bc = ceil(M / 4d), Br = min(ceil(M / 4d), d).

    The 4d in the denominator leaves room in SRAM for four blocks of about
    M / 4d rows of d numbers each: Q_i, K_j, V_j and O_i. Capping Br at d keeps
    the score tile S_ij (Br x Bc numbers) within M / 4, no larger than K_j; the
    rule does not count that tile (nor l_i, m_i), so it sizes the blocks up to a
    constant factor rather than promising that a whole step fits in M.

    Parameters
    ----------
    sram_size : M, the number of floating-point numbers SRAM holds (not bytes).
    d : head dimension.

    Returns
    -------
    (Br, Bc) : rows per Q block, rows per K/V block.
    """
    M = positive_int("sram_size", sram_size)
    d = positive_int("d", d)
    if M < 4 * d:
        raise ValueError(
            f"sram_size M must hold at least one row each of Q_i, K_j, V_j and O_i, "
            f"i.e. M >= 4d = {4 * d} numbers for d = {d}; got sram_size={M}"
        )
    Bc = math.ceil(M / (4 * d))
    Br = min(Bc, d)
    return Br, Bc


def flash1_block_counts(n_q: int, n_k: int, d: int, sram_size: int, causal: bool = False) -> tuple[int, int]:
    """How many (i, j) tiles Algorithm 1 computes and how many it skips as fully masked.

    Returns
    -------
    (computed, skipped) : computed + skipped = Tr * Tc; skipped is 0 unless ``causal``.
    """
    n_q, n_k = positive_int("n_q", n_q), positive_int("n_k", n_k)
    Br, Bc = block_sizes(sram_size, d)
    offset = n_k - n_q
    tiles = [(r, c) for c in block_ranges(n_k, Bc) for r in block_ranges(n_q, Br)]
    skipped = sum(causal and tile_fully_masked(r, c, offset) for r, c in tiles)
    return len(tiles) - skipped, skipped


def flash1_step(
    O_i: np.ndarray, l_i: np.ndarray, m_i: np.ndarray, S_ij: np.ndarray, V_j: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One inner step of Algorithm 1, lines 10-13: fold one tile of scores into a query block's state.

    v1 stores the state normalised: O_i = o_tilde / l_i (chapter 2's unnormalised
    output divided by the row sum). The step

        m~_ij = rowmax(S_ij),  P~_ij = exp(S_ij - m~_ij),  l~_ij = rowsum(P~_ij)      line 10
        m_new = max(m_i, m~_ij),  l_new = e^(m_i - m_new) l_i + e^(m~_ij - m_new) l~_ij  line 11
        O_new = diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~_ij - m_new) P~_ij V_j)  line 12

    returns (O_new, l_new, m_new), which line 13 (and line 12 for O) writes back to HBM.
    A row whose scores are all -inf so far keeps O = 0, l = 0, m = -inf (no NaN).

    Parameters
    ----------
    O_i : array (..., Br, d_v)   the stored, normalised output of the query block
    l_i, m_i : arrays (..., Br)  the stored row sums and row maxima (0 and -inf before the first tile)
    S_ij : array (..., Br, Bc)   the tile of scores, already scaled by tau (and masked with -inf)
    V_j : array (..., Bc, d_v)   the value block of the tile

    Returns
    -------
    (O_new, l_new, m_new) with the shapes of (O_i, l_i, m_i).
    """
    m_tilde = np.max(S_ij, axis=-1)  # line 10: m~_ij = rowmax(S_ij)  (..., Br)
    m_tilde_finite = np.where(np.isneginf(m_tilde), 0.0, m_tilde)  # masked row: exp(-inf - 0) = 0, not NaN
    P_tilde = np.exp(S_ij - m_tilde_finite[..., None])  # line 10: P~_ij = exp(S_ij - m~_ij)  (..., Br, Bc)
    l_tilde = np.sum(P_tilde, axis=-1)  # line 10: l~_ij = rowsum(P~_ij)  (..., Br)
    m_new = np.maximum(m_i, m_tilde)  # line 11: m_new = max(m_i, m~_ij)
    m_new_finite = np.where(np.isneginf(m_new), 0.0, m_new)  # no key seen yet: keep factors at 0
    alpha = np.exp(m_i - m_new_finite)  # e^(m_i - m_new), rescales the old state
    beta = np.exp(m_tilde - m_new_finite)  # e^(m~_ij - m_new), rescales this tile
    l_new = alpha * l_i + beta * l_tilde  # line 11: l_new = e^(m_i - m_new) l_i + e^(m~_ij - m_new) l~_ij
    numerator = (l_i * alpha)[..., None] * O_i + beta[..., None] * (P_tilde @ V_j)  # (..., Br, d_v)
    O_new = np.divide(  # line 12: O_i <- diag(l_new)^-1 (numerator)
        numerator, l_new[..., None], out=np.zeros_like(numerator), where=l_new[..., None] > 0
    )
    return O_new, l_new, m_new  # line 13: l_i <- l_new, m_i <- m_new


def flash1_forward(
    q, k, v, sram_size: int, causal: bool = False, scale: float | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact attention by Algorithm 1 of FlashAttention: O = softmax(tau Q K^T) V.

    Parameters
    ----------
    q : array (..., N_q, d)
    k : array (..., N_k, d)
    v : array (..., N_k, d_v)
    sram_size : M, numbers that fit in SRAM; fixes (Br, Bc) through :func:`block_sizes`.
    causal : mask keys after the query (bottom-right aligned when N_q != N_k).
    scale : tau; default 1/sqrt(d).

    Returns
    -------
    o : array (..., N_q, d_v)   the output, equal to ``attention(q, k, v, causal, scale)``
    m : array (..., N_q)        row max of the scores (-inf for a row that sees no key)
    l : array (..., N_q)        row sum of exp(S - m) (0 for a row that sees no key);
                                m + log(l) is the row's log-sum-exp.
    """
    q, k, v = _check_qkv(q, k, v, np.float64)
    tau = _scale(scale, q.shape[-1])
    n_q, n_k, lead = q.shape[-2], k.shape[-2], q.shape[:-2]
    Br, Bc = block_sizes(sram_size, q.shape[-1])  # line 1: Bc = ceil(M / 4d), Br = min(ceil(M / 4d), d)
    row_blocks = block_ranges(n_q, Br)  # lines 3-4: Tr = ceil(N_q / Br) blocks of Q, O, l, m
    col_blocks = block_ranges(n_k, Bc)  # lines 3-4: Tc = ceil(N_k / Bc) blocks of K, V
    offset = n_k - n_q  # causal: query i sees key j iff j <= i + offset
    o = np.zeros(lead + (n_q, v.shape[-1]))  # line 2: O = 0 in HBM   (..., N_q, d_v)
    l = np.zeros(lead + (n_q,))  # line 2: l = 0                      (..., N_q)
    m = np.full(lead + (n_q,), -np.inf)  # line 2: m = -inf           (..., N_q)

    for cols in col_blocks:  # line 5: for j = 1..Tc
        K_j, V_j = k[..., slice(*cols), :], v[..., slice(*cols), :]  # line 6: load K_j, V_j  (..., Bc, d), (..., Bc, d_v)
        for rows in row_blocks:  # line 7: for i = 1..Tr
            if causal and tile_fully_masked(rows, cols, offset):
                continue  # no query of Q_i sees any key of K_j: the tile adds nothing
            r = slice(*rows)
            Q_i, O_i, l_i, m_i = q[..., r, :], o[..., r, :], l[..., r], m[..., r]  # line 8: load Q_i, O_i, l_i, m_i
            S_ij = tau * (Q_i @ np.swapaxes(K_j, -1, -2))  # line 9: S_ij = tau Q_i K_j^T  (..., Br, Bc)
            if causal:
                S_ij = np.where(causal_tile_mask(rows, cols, offset), S_ij, -np.inf)  # mask(S_ij), as in Algorithm 2
            o[..., r, :], l[..., r], m[..., r] = flash1_step(O_i, l_i, m_i, S_ij, V_j)  # lines 10-13, to HBM
    return o, m, l


def flash1_backward(
    q, k, v, o, m, l, do, sram_size: int, causal: bool = False, scale: float | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of attention by Algorithm 4 of FlashAttention (Appendix B.4), recomputing P.

    The chain rule (derived in chapter 3), applied tile by tile. Algorithm 4 as the paper
    writes it, without dropout (its lines 1, 14, 15 and 18):

        2   Bc = ceil(M / 4d),  Br = min(ceil(M / 4d), d)
        3-4 split Q, O, dO, l, m into Tr row blocks; K, V into Tc blocks
        5   dQ = 0, dK = 0, dV = 0                                       in HBM
        6   for j = 1..Tc:                                   outer loop: K/V blocks
        7       load K_j, V_j
        8       dK~_j = 0, dV~_j = 0                                     on chip
        9       for i = 1..Tr:                               inner loop: Q blocks
        10          load Q_i, O_i, dO_i, dQ_i, l_i, m_i
        11          S_ij = tau Q_i K_j^T                                       (Br, Bc)
        12          S^masked_ij = MASK(S_ij)
        13          P_ij = diag(l_i)^-1 exp(S^masked_ij - m_i)                 recomputed
        16          dV~_j += P_ij^T dO_i
        17          dP_ij = dO_i V_j^T
        19          D_i = rowsum(dO_i * O_i)                     (= rowsum(P_i * dP_i), whole row)
        20          dS_ij = P_ij * (dP_ij - D_i)
        21          dQ_i <- dQ_i + tau dS_ij K_j                 read-modify-write in HBM
        22          dK~_j += tau dS_ij^T Q_i
        24      write dK_j <- dK~_j, dV_j <- dV~_j to HBM

    Parameters
    ----------
    q, k, v : arrays (..., N_q, d), (..., N_k, d), (..., N_k, d_v), as given to the forward.
    o, m, l : the forward's outputs, shapes (..., N_q, d_v), (..., N_q), (..., N_q).
    do : array (..., N_q, d_v), dL/dO.
    sram_size, causal, scale : as for :func:`flash1_forward`.

    Returns
    -------
    (dq, dk, dv) with the shapes of (q, k, v).
    """
    q, k, v = _check_qkv(q, k, v, np.float64)
    o, do = _check_output_like(q, v, o=o, do=do)
    m = np.asarray(m, dtype=np.float64)
    l = np.asarray(l, dtype=np.float64)
    for name, arr in (("m", m), ("l", l)):
        if arr.shape != q.shape[:-1]:
            raise ValueError(f"{name} must have shape {q.shape[:-1]} (one number per query row); got {arr.shape}")
    tau = _scale(scale, q.shape[-1])
    n_q, n_k = q.shape[-2], k.shape[-2]
    Br, Bc = block_sizes(sram_size, q.shape[-1])  # line 2: Bc = ceil(M / 4d), Br = min(ceil(M / 4d), d)
    row_blocks = block_ranges(n_q, Br)  # lines 3-4: Tr blocks of Q, O, dO, l, m
    col_blocks = block_ranges(n_k, Bc)  # lines 3-4: Tc blocks of K, V
    offset = n_k - n_q  # causal: query i sees key j iff j <= i + offset
    m_finite = np.where(np.isneginf(m), 0.0, m)  # rows that saw no key: exp(-inf - 0) = 0
    l_inv = np.divide(1.0, l, out=np.zeros_like(l), where=l > 0)  # diag(l)^-1; 0 for such rows

    dq = np.zeros_like(q)  # line 5: dQ = 0 in HBM   (..., N_q, d)
    dk = np.zeros_like(k)  # line 5: dK = 0           (..., N_k, d)
    dv = np.zeros_like(v)  # line 5: dV = 0           (..., N_k, d_v)
    for cols in col_blocks:  # line 6: for j = 1..Tc
        c = slice(*cols)
        K_j, V_j = k[..., c, :], v[..., c, :]  # line 7: load K_j, V_j
        dK_j = np.zeros_like(K_j)  # line 8: dK~_j = 0 on chip  (..., Bc, d)
        dV_j = np.zeros_like(V_j)  # line 8: dV~_j = 0 on chip  (..., Bc, d_v)
        for rows in row_blocks:  # line 9: for i = 1..Tr
            if causal and tile_fully_masked(rows, cols, offset):
                continue  # P_ij = 0: the tile contributes to no gradient
            r = slice(*rows)
            Q_i, O_i, dO_i = q[..., r, :], o[..., r, :], do[..., r, :]  # line 10: load Q_i, O_i, dO_i ...
            m_i, l_inv_i = m_finite[..., r], l_inv[..., r]  # line 10: load ... l_i, m_i
            S_ij = tau * (Q_i @ np.swapaxes(K_j, -1, -2))  # line 11: S_ij = tau Q_i K_j^T  (..., Br, Bc)
            if causal:
                S_ij = np.where(causal_tile_mask(rows, cols, offset), S_ij, -np.inf)  # line 12: S^masked_ij = MASK(S_ij)
            P_ij = l_inv_i[..., None] * np.exp(S_ij - m_i[..., None])  # line 13: P_ij = diag(l_i)^-1 exp(S^masked_ij - m_i)
            dV_j += np.swapaxes(P_ij, -1, -2) @ dO_i  # line 16: dV~_j += P_ij^T dO_i  (..., Bc, d_v)
            dP_ij = dO_i @ np.swapaxes(V_j, -1, -2)  # line 17: dP_ij = dO_i V_j^T  (..., Br, Bc)
            D_i = np.sum(dO_i * O_i, axis=-1)  # line 19: D_i = rowsum(dO_i * O_i)  (..., Br)
            dS_ij = P_ij * (dP_ij - D_i[..., None])  # line 20: dS_ij = P_ij * (dP_ij - D_i)
            dq[..., r, :] += tau * (dS_ij @ K_j)  # line 21: dQ_i <- dQ_i + tau dS_ij K_j, to HBM
            dK_j += tau * (np.swapaxes(dS_ij, -1, -2) @ Q_i)  # line 22: dK~_j += tau dS_ij^T Q_i
        dk[..., c, :], dv[..., c, :] = dK_j, dV_j  # line 24: write dK_j <- dK~_j, dV_j <- dV~_j to HBM
    return dq, dk, dv


def flash1_flops(
    n_q: int, n_k: int, d: int, sram_size: int, causal: bool = False, batch: int = 1
) -> dict[str, float]:
    """Matmul FLOPs of attention, counted tile by tile over Algorithm 1's and 4's loops.

    A product of an (a x b) and a (b x c) matrix costs 2abc FLOPs (one multiply and
    one add per term). Per computed tile (Br x Bc) with head dimension d (= d_v):

    - forward: S_ij = Q_i K_j^T and P~_ij V_j                      2 products
    - standard backward, P stored: dV, dP, dQ, dK                 4 products
    - FlashAttention backward: S_ij recomputed, then the same 4    5 products

    The standard backward is counted over all N_q x N_k scores (it uses the stored
    P); the flash counts are over the tiles the loops compute (fully masked causal
    tiles are skipped). Exponentials, max, sums and rescales are not counted: they
    are O(N^2) against the O(N^2 d) of the products.

    Returns
    -------
    dict with keys "forward", "backward_standard", "backward_flash", times ``batch``
    (batch x heads).
    """
    n_q, n_k, d, batch = (positive_int(name, x) for name, x in (("n_q", n_q), ("n_k", n_k), ("d", d), ("batch", batch)))
    Br, Bc = block_sizes(sram_size, d)
    offset = n_k - n_q
    computed = 0  # score entries in computed tiles
    for cols in block_ranges(n_k, Bc):
        for rows in block_ranges(n_q, Br):
            if not (causal and tile_fully_masked(rows, cols, offset)):
                computed += (rows[1] - rows[0]) * (cols[1] - cols[0])  # Br x Bc (smaller at ragged edges)
    product = 2.0 * d * batch  # FLOPs per score entry of one (.. x d) @ (d x ..) product
    return {
        "forward": 2 * product * computed,
        "backward_standard": 4 * product * n_q * n_k,
        "backward_flash": 5 * product * computed,
    }
