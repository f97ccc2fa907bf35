"""Standard ("naive") attention: the three steps of the textbook, S and P materialised.

    S = Q K^T * scale          (N_q, N_k)   scores
    P = softmax(S)             (N_q, N_k)   probabilities, rows sum to 1
    O = P V                    (N_q, d_v)   output

This is the specification every faster algorithm in the book is checked against.
It computes in float64 by default, so its rounding error (about 1e-16 relative)
is far below any tolerance a test uses.

Glossary: q, k, v = query, key, value (查询, 键, 值); S = scores (打分); P = attention
probabilities (注意力权重); lse = log-sum-exp of a row of S (对数和指数); scale = 1/sqrt(d)
(缩放因子); causal = a query may not look at later keys (因果掩码).

Causal masking follows flash-attn's convention when N_q != N_k: the mask is aligned
to the bottom-right corner, so query i may see key j when j <= i + (N_k - N_q).
A query row that can see no key at all gets output 0 and lse = -inf.
"""

from __future__ import annotations


import numpy as np

from .._validate import as_float_array
from .common import _check_head_dim, _check_output_like, _check_qkv, _scale, causal_mask
from .softmax import softmax

__all__ = ["attention", "attention_backward", "scores", "causal_mask", "attention_flops"]


def scores(q, k, causal: bool = False, scale: float | None = None, dtype=np.float64) -> np.ndarray:
    """S = Q K^T * scale, shape (..., N_q, N_k); masked entries are -inf."""
    q = as_float_array("q", q, dtype, min_ndim=2)
    k = as_float_array("k", k, dtype, min_ndim=2)
    _check_head_dim(q, k)
    s = (q @ np.swapaxes(k, -1, -2)) * _scale(scale, q.shape[-1])  # (..., N_q, N_k)
    if causal:
        s = np.where(causal_mask(q.shape[-2], k.shape[-2]), s, -np.inf)
    return s


def attention(
    q,
    k,
    v,
    causal: bool = False,
    scale: float | None = None,
    *,
    return_lse: bool = False,
    dtype=np.float64,
):
    """Exact attention O = softmax(Q K^T * scale) V, materialising S and P.

    Parameters
    ----------
    q : array (..., N_q, d)
    k : array (..., N_k, d)
    v : array (..., N_k, d_v)
    causal : mask out keys after the query (bottom-right aligned when N_q != N_k).
    scale : multiplies the scores; default 1/sqrt(d).
    return_lse : also return lse = log sum_j exp(S_ij), shape (..., N_q).
    dtype : the floating type to compute in (float64 by default).

    Returns
    -------
    o : array (..., N_q, d_v), or ``(o, lse)`` when ``return_lse``.
    """
    q, k, v = _check_qkv(q, k, v, dtype)
    s = scores(q, k, causal, scale, dtype)  # (..., N_q, N_k)  step 1
    p = softmax(s, axis=-1)  # (..., N_q, N_k)                    step 2
    o = p @ v  # (..., N_q, d_v)                                  step 3
    if not return_lse:
        return o
    with np.errstate(divide="ignore"):
        m = np.max(s, axis=-1)  # (..., N_q)
        m_safe = np.where(np.isneginf(m), 0.0, m)
        lse = m_safe + np.log(np.sum(np.exp(s - m_safe[..., None]), axis=-1))
    return o, lse


def attention_backward(
    q,
    k,
    v,
    do,
    causal: bool = False,
    scale: float | None = None,
    *,
    dtype=np.float64,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of L with respect to q, k, v, given dO = dL/dO.

    The chain rule through the three steps (FlashAttention paper, Appendix B.2):

        dV = P^T dO                              (..., N_k, d_v)
        dP = dO V^T                              (..., N_q, N_k)
        D  = rowsum(dO * O)                      (..., N_q)      = rowsum(P * dP)
        dS = P * (dP - D)                        softmax Jacobian, row by row
        dQ = dS K * scale,  dK = dS^T Q * scale

    Returns
    -------
    (dq, dk, dv) with the shapes of (q, k, v).
    """
    q, k, v = _check_qkv(q, k, v, dtype)
    (do,) = _check_output_like(q, v, dtype, do=do)
    tau = _scale(scale, q.shape[-1])
    p = softmax(scores(q, k, causal, tau, dtype), axis=-1)  # (..., N_q, N_k)
    o = p @ v  # (..., N_q, d_v)
    dv = np.swapaxes(p, -1, -2) @ do  # (..., N_k, d_v)
    dp = do @ np.swapaxes(v, -1, -2)  # (..., N_q, N_k)
    D = np.sum(do * o, axis=-1, keepdims=True)  # (..., N_q, 1)
    ds = p * (dp - D)  # (..., N_q, N_k)
    dq = (ds @ k) * tau  # (..., N_q, d)
    dk = (np.swapaxes(ds, -1, -2) @ q) * tau  # (..., N_k, d)
    return dq, dk, dv


def attention_flops(n_q: int, n_k: int, d: int, d_v: int | None = None, causal: bool = False, batch: int = 1) -> float:
    """Matmul FLOPs of one forward pass: 2*N_q*N_k*d for Q K^T plus 2*N_q*N_k*d_v for P V,
    times ``batch`` (batch x heads). Causal halves it (the convention of the FlashAttention
    benchmarks, exact as N grows)."""
    d_v = d if d_v is None else d_v
    flops = 2.0 * n_q * n_k * (d + d_v) * batch
    return flops / 2 if causal else flops
