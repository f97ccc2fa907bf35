"""Ring attention (context parallelism): one sequence cut across P devices, exact.

Hao Liu, Matei Zaharia, Pieter Abbeel, "Ring Attention with Blockwise Transformers for
Near-Infinite Context", 2023. The N tokens of one sequence are shared out among P ranks
(devices); rank r keeps its own N/P queries, keys and values. Attention needs every query
to meet every key, so the K/V blocks travel: at step s = 0, 1, ..., P-1 rank r holds the
K/V block of rank

    src = (r - s) mod P                                                     (ring order)

computes the partial attention of its queries to those keys, and passes the block on to
rank r + 1 (receiving the next one from rank r - 1). Each partial result is a normalised
output and a log-sum-exp, (o_s, lse_s), and the partials of disjoint key sets merge exactly
by the rule of chapter 2 (equation (4) of :mod:`.softmax`) in the (o, lse) form of
split-KV decoding (:func:`.beyond.combine`, chapter 9):

    lse = log(exp(lse_a) + exp(lse_b)),   o = exp(lse_a - lse) o_a + exp(lse_b - lse) o_b   (C)

Nothing is approximated, and the order in which the blocks arrive does not matter.

Causal attention and load balance. With the plain layout (rank r holds tokens
[r N/P, (r+1) N/P)), rank r's queries see only the blocks of ranks 0..r: rank 0 works at
one step, rank P-1 at all P, and every step lasts as long as its busiest rank. The zig-zag
layout cuts the sequence into 2P chunks of C = N/2P tokens and gives rank r chunks r and
2P-1-r, one early and one late. Then at every step s > 0 each rank does the same work:

    src < r: all 2C queries see the first chunk of src's keys (the second is in their future)
    src > r: only the late chunk 2P-1-r of queries sees keys, but it sees both of src's chunks

2C x C = C x 2C visible pairs either way, and at s = 0 every rank does the same causal
block. The triangle of visible (query, key) pairs is split into P equal parts
(:func:`ring_work` counts them).

Backward. dQ of a rank's queries sums over all key blocks, so it accumulates locally;
dK and dV of a block sum over all ranks' queries, so the accumulators travel around the
ring with their K/V block and come home after P steps. Each partial gradient comes from
FlashAttention-2's backward (:func:`.flash2.flash2_backward`) given the *final* o and lse
of the rows: P = exp(S - lse) is then the true probability, not a block-local one.

Each (rank, step) is a short list of :class:`Piece` s: which local query rows meet which
rows of the visiting K/V block, and whether the piece has the causal diagonal in it. The
torch.distributed implementation (:mod:`flashlab.parallel.ring`) runs the same pieces.

Glossary: P = number of ranks (设备数); rank = one process/device (进程); ring = rank r sends
to r + 1 and receives from r - 1 (环); step = one round of compute + transfer (步); C = chunk
length N/2P (块长); layout = which tokens a rank holds (划分); zig-zag = chunks r and 2P-1-r
(之字形划分); lse = log-sum-exp (对数和指数).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._validate import as_float_array, positive_int
from .beyond import combine
from .common import _check_output_like, _check_qkv, _scale
from .flash2 import flash2_backward, flash2_forward

__all__ = [
    "LAYOUTS",
    "Piece",
    "shard_positions",
    "shard",
    "unshard",
    "step_pieces",
    "ring_attention",
    "ring_attention_backward",
    "ring_work",
]

LAYOUTS = ("plain", "zigzag")


@dataclass(frozen=True)
class Piece:
    """One kernel call of one ring step: local query rows ``q`` meet rows ``k`` of the
    visiting K/V block; ``causal`` when the piece holds the diagonal (same positions on
    both sides, so the usual causal mask of the square piece is the global one)."""

    q: slice
    k: slice
    causal: bool


def _check_layout(layout: object) -> str:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}; got {layout!r}")
    return str(layout)


def shard_positions(n: int, P: int, layout: str = "zigzag") -> list[np.ndarray]:
    """The global token positions each rank holds, in the order it stores them.

    plain:  rank r holds [r n/P, (r+1) n/P)              (n divisible by P)
    zigzag: rank r holds chunks r and 2P-1-r of C = n/2P  (n divisible by 2P)
    """
    n, P, layout = positive_int("n", n), positive_int("P", P), _check_layout(layout)
    parts = P if layout == "plain" else 2 * P
    if n % parts:
        raise ValueError(f"the {layout} layout needs n divisible by {parts} ({'P' if parts == P else '2P'}, "
                         f"P = {P}); got n = {n}")
    c = n // parts  # tokens per chunk
    chunk = lambda i: np.arange(i * c, (i + 1) * c)  # noqa: E731
    if layout == "plain":
        return [chunk(r) for r in range(P)]
    return [np.concatenate([chunk(r), chunk(2 * P - 1 - r)]) for r in range(P)]


def shard(x, P: int, layout: str = "zigzag") -> list[np.ndarray]:
    """x (..., N, d) -> P arrays (..., N/P, d): the rows each rank holds."""
    x = np.asarray(x)
    return [x[..., pos, :] for pos in shard_positions(x.shape[-2], P, layout)]


def unshard(parts: list[np.ndarray], layout: str = "zigzag") -> np.ndarray:
    """The inverse of :func:`shard`: P arrays (..., N/P, d) back to (..., N, d) in sequence
    order (for a per-row array such as lse (..., N/P), add a trailing axis first)."""
    P = len(parts)
    n = sum(p.shape[-2] for p in parts)
    out = np.empty(parts[0].shape[:-2] + (n,) + parts[0].shape[-1:], dtype=parts[0].dtype)
    for pos, part in zip(shard_positions(n, P, layout), parts):
        out[..., pos, :] = part
    return out


def step_pieces(rank: int, src: int, P: int, n_local: int, causal: bool, layout: str = "zigzag") -> list[Piece]:
    """What rank ``rank`` computes when it holds the K/V block of rank ``src``.

    Non-causal: every query meets every key, one piece. Causal (positions from
    :func:`shard_positions`):

    ======  ==========================  ===========================================
    src     plain                       zigzag (chunks r, 2P-1-r; C = n_local / 2)
    ======  ==========================  ===========================================
    == r    all x all, causal           all x all, causal (the order is preserved)
    <  r    all x all                   all queries x src's first chunk
    >  r    nothing (all in the future)  rank's second chunk x all of src's keys
    ======  ==========================  ===========================================
    """
    everything = slice(0, n_local)
    if not causal:
        return [Piece(everything, everything, False)]
    if src == rank:
        return [Piece(everything, everything, True)]
    if _check_layout(layout) == "plain":
        return [Piece(everything, everything, False)] if src < rank else []
    c = n_local // 2
    if src < rank:
        return [Piece(everything, slice(0, c), False)]
    return [Piece(slice(c, n_local), everything, False)]


def _check_ring(q, k, v, P: int, layout: str):
    q, k, v = _check_qkv(q, k, v, np.float64)
    if q.shape[-2] != k.shape[-2]:
        raise ValueError(f"ring attention cuts one sequence: q and k must have the same length N; "
                         f"got q.shape={q.shape}, k.shape={k.shape}")
    P = positive_int("P", P)
    shard_positions(q.shape[-2], P, layout)  # checks the layout and that N divides
    return q, k, v, P


def _pass_on(held: list) -> list:
    """One ring transfer: rank r sends what it holds to r + 1, receives from r - 1."""
    return [held[(r - 1) % len(held)] for r in range(len(held))]


def ring_attention(q, k, v, P: int, causal: bool = False, layout: str = "zigzag",
                   scale: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Attention of one sequence computed by P simulated ranks passing K/V around a ring.

    Parameters
    ----------
    q, k : arrays (..., N, d); v : array (..., N, d_v); N divisible by P (plain) or 2P (zigzag)
    P : the number of ranks
    causal : each query sees the keys at or before its position
    layout : "zigzag" (balanced for causal) or "plain" (contiguous blocks)
    scale : tau; default 1/sqrt(d)

    Returns
    -------
    o : array (..., N, d_v), equal to ``attention(q, k, v, causal, scale)``
    lse : array (..., N), the log-sum-exp of each row of scores
    """
    q, k, v, P = _check_ring(q, k, v, P, layout)
    tau = _scale(scale, q.shape[-1])
    qs = shard(q, P, layout)  # rank r's queries stay put   P x (..., n, d)
    n = qs[0].shape[-2]
    o = [np.zeros(q.shape[:-2] + (n, v.shape[-1])) for _ in range(P)]  # empty states: o = 0,
    lse = [np.full(q.shape[:-2] + (n,), -np.inf) for _ in range(P)]  # lse = -inf
    held = list(zip(range(P), shard(k, P, layout), shard(v, P, layout)))  # (src, K, V) per rank
    for step in range(P):
        for r in range(P):  # the ranks work at the same time
            src, K, V = held[r]  # src = (r - step) mod P
            for pc in step_pieces(r, src, P, n, causal, layout):
                Q_p, K_p, V_p = qs[r][..., pc.q, :], K[..., pc.k, :], V[..., pc.k, :]
                o_s, lse_s = flash2_forward(Q_p, K_p, V_p, Q_p.shape[-2], K_p.shape[-2],
                                            pc.causal, tau)  # the partial (o_s, lse_s)
                o_r, lse_r = o[r][..., pc.q, :], lse[r][..., pc.q]  # the rows' running state
                o[r][..., pc.q, :], lse[r][..., pc.q] = combine(
                    np.stack([o_r, o_s]), np.stack([lse_r, lse_s]))  # (C)
        held = _pass_on(held)
    return unshard(o, layout), unshard([x[..., None] for x in lse], layout)[..., 0]


def ring_attention_backward(q, k, v, o, lse, do, P: int, causal: bool = False, layout: str = "zigzag",
                            scale: float | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of ring attention: dQ stays on its rank, dK and dV travel with their block.

    Parameters
    ----------
    q, k, v, P, causal, layout, scale : as for :func:`ring_attention`
    o, lse : arrays (..., N, d_v), (..., N): the forward's output and log-sum-exp
    do : array (..., N, d_v), dLoss/dO

    Returns
    -------
    (dq, dk, dv) with the shapes of (q, k, v), equal to ``attention_backward``.
    """
    q, k, v, P = _check_ring(q, k, v, P, layout)
    (o, do) = _check_output_like(q, v, o=o, do=do)
    lse = as_float_array("lse", lse, np.float64, min_ndim=1, allow_neg_inf=True)
    if lse.shape != q.shape[:-1]:
        raise ValueError(f"lse must have shape {q.shape[:-1]} (one number per query row); got lse.shape={lse.shape}")
    tau = _scale(scale, q.shape[-1])
    qs, os_, dos = shard(q, P, layout), shard(o, P, layout), shard(do, P, layout)
    lses = [x[..., 0] for x in shard(lse[..., None], P, layout)]
    n = qs[0].shape[-2]
    dq = [np.zeros_like(x) for x in qs]  # stays on rank r
    held = [(r, K, V, np.zeros_like(K), np.zeros_like(V))  # (src, K, V, dK, dV) travel together
            for r, (K, V) in enumerate(zip(shard(k, P, layout), shard(v, P, layout)))]
    for step in range(P):
        for r in range(P):
            src, K, V, dK, dV = held[r]
            for pc in step_pieces(r, src, P, n, causal, layout):
                Q_p, K_p, V_p = qs[r][..., pc.q, :], K[..., pc.k, :], V[..., pc.k, :]
                O_p, lse_p, dO_p = os_[r][..., pc.q, :], lses[r][..., pc.q], dos[r][..., pc.q, :]
                dq_p, dk_p, dv_p = flash2_backward(Q_p, K_p, V_p, O_p, lse_p, dO_p, Q_p.shape[-2], K_p.shape[-2],
                                                   pc.causal, tau)  # P = exp(S - lse) with the final lse
                dq[r][..., pc.q, :] += dq_p  # dQ_r += dS K
                dK[..., pc.k, :] += dk_p  # dK_src += dS^T Q_r, carried on
                dV[..., pc.k, :] += dv_p  # dV_src += P^T dO_r
        held = _pass_on(held)  # after P transfers every block is home: held[r][0] == r
    assert all(h[0] == r for r, h in enumerate(held))
    return unshard(dq, layout), unshard([h[3] for h in held], layout), unshard([h[4] for h in held], layout)


def ring_work(n: int, P: int, causal: bool = False, layout: str = "zigzag") -> np.ndarray:
    """Visible (query, key) pairs each rank computes at each step: array (P steps, P ranks).

    The attention FLOPs of a piece are proportional to its pairs (4 d per pair, forward).
    A causal piece of m x m rows counts m (m + 1) / 2. Every step lasts as long as its
    busiest rank, so ``work.max(axis=1).sum()`` is the ring's time in pair units and
    ``work.sum()`` the useful work: plain causal leaves ranks idle, zig-zag does not.
    """
    positions = shard_positions(n, P, layout)
    n_local = len(positions[0])
    work = np.zeros((P, P), dtype=np.int64)
    for step in range(P):
        for r in range(P):
            for pc in step_pieces(r, (r - step) % P, P, n_local, causal, layout):
                m_q, m_k = pc.q.stop - pc.q.start, pc.k.stop - pc.k.start
                work[step, r] += m_q * (m_q + 1) // 2 if pc.causal else m_q * m_k
    return work
