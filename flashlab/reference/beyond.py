"""Beyond the papers: the attention variants that serving systems run, as exact references.

Every function here computes the same softmax(tau Q K^T) V as :mod:`.naive`; what
changes is *which* keys a query may see, *where* K and V live, and *how the work is
cut up*. Each section names the idea, its source, and the equation the code follows.

1. Causal block skipping (FlashAttention-2 §3.1.1, "causal masking"). With the mask
   bottom-right aligned (query i sees key j iff j <= i + off, off = N_k - N_q), a
   (Br x Bc) tile whose keys all lie after its last query is never loaded; a tile cut
   by the diagonal is computed with the mask; the rest are computed as is. For
   N_q = N_k = N and Br = Bc = B dividing N, with T = N / B tiles a side:
   skipped = T (T - 1) / 2, diagonal = T, so skipped / total = (T - 1) / 2T -> 1/2.

2. Sliding window (Longformer, Beltagy et al. 2020; Mistral 7B, Jiang et al. 2023;
   flash-attn's ``window_size=(left, right)``). Query i sees key j iff

       i + off - left  <=  j  <=  i + off + right,       off = N_k - N_q,

   with left = -1 or right = -1 meaning "no bound on that side". (-1, 0) is causal,
   (-1, -1) is full attention. Tiles entirely outside the band are skipped, so the
   work grows like N * window instead of N^2.

3. Grouped-query and multi-query attention (GQA: Ainslie et al. 2023; MQA: Shazeer
   2019). H query heads share H_kv key/value heads, G = H / H_kv queries per group;
   query head h reads K/V head h // G. MQA is H_kv = 1, ordinary multi-head H_kv = H.
   The KV cache shrinks by G; the kernel indexes the shared head, it never copies it.

4. Variable length (FlashAttention-2 §3, flash-attn's ``flash_attn_varlen_func``).
   A batch of sequences of different lengths is packed end to end, q (total_q, H, d),
   and described by cumulative lengths cu_seqlens = [0, n_0, n_0 + n_1, ..., total]:
   sequence b owns rows cu[b]:cu[b + 1]. Each sequence attends only within itself (a
   block-diagonal mask), and no FLOP or byte is spent on padding.

5. Split-KV decoding (Flash-Decoding: Dao, Haziza, Massa, Sizov, "Flash-Decoding for
   long-context inference", 2023). In decoding N_q is 1 (or a few) and N_k is long, so
   one program per (batch, head) leaves most SMs idle. Cut the keys into n_s splits,
   let each produce its normalised output o_i and log-sum-exp lse_i, then combine:

       lse = log sum_i exp(lse_i),        o = sum_i exp(lse_i - lse) o_i.        (C)

   (C) is :meth:`OnlineSoftmaxState.merge` (equation (4) of :mod:`.softmax`) written
   for states that were already divided by l: (o_i, lse_i) is the state m = lse_i,
   l = 1, o_tilde = o_i. An empty split has lse_i = -inf and weight 0.

6. Paged KV cache (vLLM PagedAttention: Kwon et al., SOSP 2023). K and V live in a
   pool of fixed-size pages (page_size tokens each); a block table maps sequence b's
   logical page i to a physical page block_table[b, i], handed out from a free list
   in whatever order pages come free. Attention walks the block table, reading one
   page as one K/V block of the online-softmax recurrence.

Glossary: tau = softmax scale (缩放因子); off = N_k - N_q, the bottom-right alignment
offset; tile = one (Br x Bc) block of scores (块); window = (left, right) keys seen on
each side of the diagonal (滑动窗口); H, H_kv, G = query heads, K/V heads, queries per
K/V head (分组); cu_seqlens = cumulative sequence lengths (累积长度); split = a chunk of
keys handled by one program (切分); lse = log-sum-exp of a row (对数和指数); page = a
fixed-size block of the KV cache (页); block table = page table of one sequence (块表).
"""

from __future__ import annotations

import math

import numpy as np

from .._validate import as_float_array, positive_int
from .common import _check_head_dim, _check_qkv, _scale, block_ranges, causal_mask
from .naive import attention_flops
from .softmax import OnlineSoftmaxState

__all__ = [
    "attention_gqa",
    "kv_cache_bytes",
    "causal_block_counts",
    "window_mask",
    "attention_window",
    "window_block_counts",
    "attention_varlen",
    "pad_and_mask_cost",
    "decode_split_kv",
    "combine",
    "split_heuristic",
    "PagedKVCache",
    "attention_paged",
]

Window = tuple[int, int]


# ------------------------------------------------------------------ shared pieces
def _check_window(window: object) -> Window:
    """``window`` as a pair (left, right) of ints >= -1 (-1: unbounded on that side)."""
    ok = isinstance(window, (tuple, list)) and len(window) == 2
    ok = ok and all(isinstance(w, (int, np.integer)) and not isinstance(w, bool) for w in window)
    if not ok or min(window) < -1:
        raise ValueError(
            f"window must be a pair (left, right) of integers >= -1 (-1 = unbounded on that side); got {window!r}"
        )
    return int(window[0]), int(window[1])


def _band(n_q: int, n_k: int, window: Window) -> tuple[float, float]:
    """The allowed diagonals: query i sees key j iff lo <= j - i <= hi (bottom-right aligned)."""
    left, right = window
    off = n_k - n_q
    lo = -math.inf if left == -1 else off - left
    hi = math.inf if right == -1 else off + right
    return lo, hi


def _mask(n_q: int, n_k: int, causal: bool, window: Window | None) -> np.ndarray | None:
    """The (n_q, n_k) mask of causal and/or window (their intersection), or None for full attention."""
    if window is None:
        return causal_mask(n_q, n_k) if causal else None
    left, right = window
    if causal:  # causal caps the right side at the diagonal, as in flash-attn
        right = 0 if right == -1 else min(right, 0)
    return window_mask(n_q, n_k, (left, right))


def _masked_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, tau: float):
    """(o, lse) of softmax(tau q k^T, masked) v; leading axes broadcast (this is how GQA
    shares one K/V head among G query heads). Rows that see no key: o = 0, lse = -inf."""
    s = tau * (q @ np.swapaxes(k, -1, -2))  # (..., N_q, N_k)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    state = OnlineSoftmaxState.empty(s.shape[:-1], v.shape[-1]).update(s, v)  # one block: plain softmax
    return state.output(), state.lse  # (..., N_q, d_v), (..., N_q)


def _gqa_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, tau: float):
    """(o, lse) for checked q (..., H, N_q, d), k (..., H_kv, N_k, d), v (..., H_kv, N_k, d_v)."""
    *lead, H, n_q, d = q.shape
    H_kv = k.shape[-3]
    G = H // H_kv  # query heads per K/V head
    q_grouped = q.reshape(*lead, H_kv, G, n_q, d)  # (..., H_kv, G, N_q, d): head h = g_kv * G + g
    k_shared = k[..., :, None, :, :]  # (..., H_kv, 1, N_k, d)   a view: broadcast over G, never copied
    v_shared = v[..., :, None, :, :]  # (..., H_kv, 1, N_k, d_v)
    o, lse = _masked_attention(q_grouped, k_shared, v_shared, mask, tau)
    return o.reshape(*lead, H, n_q, v.shape[-1]), lse.reshape(*lead, H, n_q)  # (..., H, N_q, d_v), (..., H, N_q)


def _check_gqa(q, k, v) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """q (..., H, N_q, d), k (..., H_kv, N_k, d), v (..., H_kv, N_k, d_v) with H_kv dividing H."""
    q = as_float_array("q", q, np.float64, min_ndim=3)
    k = as_float_array("k", k, np.float64, min_ndim=3)
    v = as_float_array("v", v, np.float64, min_ndim=3)
    _check_head_dim(q, k)
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(
            f"k and v must agree on (..., H_kv, N_k) (all axes but the last); got k.shape={k.shape}, v.shape={v.shape}"
        )
    if q.shape[:-3] != k.shape[:-3]:
        raise ValueError(
            f"q, k and v must have the same leading (batch) dimensions before the head axis; "
            f"got q.shape={q.shape}, k.shape={k.shape}"
        )
    H, H_kv = q.shape[-3], k.shape[-3]
    if H_kv == 0 or H % H_kv != 0:
        raise ValueError(
            f"the number of K/V heads H_kv (axis -3 of k, v) must divide the number of query heads H "
            f"(axis -3 of q); got H={H}, H_kv={H_kv}"
        )
    return q, k, v


# ------------------------------------------------------------------ 3. GQA / MQA
def attention_gqa(
    q, k, v, causal: bool = False, scale: float | None = None, *, window: Window | None = None
) -> np.ndarray:
    """Grouped-query attention (Ainslie et al. 2023; MQA, Shazeer 2019, is H_kv = 1).

    Query head h attends with K/V head h // G, G = H / H_kv. Equal to :func:`attention`
    on K and V repeated G times along the head axis (``np.repeat(k, G, axis=-3)``).

    Parameters
    ----------
    q : array (..., H, N_q, d)
    k : array (..., H_kv, N_k, d), H_kv dividing H
    v : array (..., H_kv, N_k, d_v)
    causal : mask keys after the query (bottom-right aligned).
    scale : tau; default 1/sqrt(d).
    window : optional sliding window (left, right), see :func:`window_mask`.

    Returns
    -------
    o : array (..., H, N_q, d_v)
    """
    q, k, v = _check_gqa(q, k, v)
    window = None if window is None else _check_window(window)
    mask = _mask(q.shape[-2], k.shape[-2], causal, window)
    return _gqa_attention(q, k, v, mask, _scale(scale, q.shape[-1]))[0]


def kv_cache_bytes(
    batch: int, n_kv_heads: int, n: int, d: int, layers: int, bytes_per_element: int = 2
) -> int:
    """Bytes of the KV cache: K and V, for every layer, K/V head, token and sequence.

        bytes = 2 (K and V) * layers * batch * n_kv_heads * n * d * bytes_per_element

    GQA divides it by G = H / H_kv against multi-head attention. Example: Llama-2-7B
    (32 layers, 32 heads, d = 128, fp16) holds 2 * 32 * 32 * 128 * 2 B = 0.5 MiB per token.
    """
    named = {"batch": batch, "n_kv_heads": n_kv_heads, "n": n, "d": d, "layers": layers,
             "bytes_per_element": bytes_per_element}
    return 2 * math.prod(positive_int(name, value) for name, value in named.items())


# ------------------------------------------------------------------ 1-2. block skipping
def window_mask(n_q: int, n_k: int, window: Window) -> np.ndarray:
    """Boolean (n_q, n_k) mask of a sliding window, True where query i may see key j:

        i + off - left <= j <= i + off + right,     off = n_k - n_q  (bottom-right aligned)

    ``window = (left, right)``; -1 on a side means unbounded. (-1, 0) equals
    :func:`causal_mask`; (-1, -1) allows everything."""
    for name, value in (("n_q", n_q), ("n_k", n_k)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0; got {value!r}")
    lo, hi = _band(n_q, n_k, _check_window(window))
    diag = np.arange(n_k)[None, :] - np.arange(n_q)[:, None]  # (n_q, n_k)  j - i
    return (diag >= lo) & (diag <= hi)


def window_block_counts(n_q: int, n_k: int, block_q: int, block_k: int, window: Window) -> dict[str, int]:
    """Classify the (block_q x block_k) tiles of the score matrix under a sliding window.

    A tile with rows [r0, r1) and columns [c0, c1) covers exactly the diagonals
    j - i from c0 - (r1 - 1) to (c1 - 1) - r0. It is *skipped* when that range misses
    the allowed band [off - left, off + right] (no query sees any key: K_j, V_j are
    never loaded), *computed unmasked* when the range lies inside the band, and
    computed with the mask (a *diagonal* tile, cut by an edge of the band) otherwise.

    Returns
    -------
    dict with ``total`` = Tr * Tc tiles, ``computed``, ``skipped`` (computed + skipped =
    total) and ``diagonal`` (the computed tiles that need the mask).
    """
    n_q, n_k = positive_int("n_q", n_q), positive_int("n_k", n_k)
    Br, Bc = positive_int("block_q", block_q), positive_int("block_k", block_k)
    lo, hi = _band(n_q, n_k, _check_window(window))
    counts = {"total": 0, "computed": 0, "skipped": 0, "diagonal": 0}
    for r0, r1 in block_ranges(n_q, Br):  # Tr row blocks
        for c0, c1 in block_ranges(n_k, Bc):  # Tc column blocks
            first, last = c0 - (r1 - 1), (c1 - 1) - r0  # the tile's diagonals j - i
            counts["total"] += 1
            if last < lo or first > hi:
                counts["skipped"] += 1
                continue
            counts["computed"] += 1
            if first < lo or last > hi:  # some (i, j) of the tile lies outside the band
                counts["diagonal"] += 1
    return counts


def causal_block_counts(n_q: int, n_k: int, block_q: int, block_k: int) -> dict[str, int]:
    """Tiles of causal attention that are skipped, masked and computed (FlashAttention-2 §3.1.1).

    Causal is the window (-1, 0): a tile entirely above the bottom-right aligned diagonal
    is skipped, a tile the diagonal cuts is computed with the mask. For square N with
    B | N and T = N / B: skipped = T (T - 1) / 2, diagonal = T, skipped / total -> 1/2.

    Returns
    -------
    dict with ``total``, ``computed``, ``skipped``, ``diagonal``, as :func:`window_block_counts`.
    """
    return window_block_counts(n_q, n_k, block_q, block_k, (-1, 0))


def attention_window(q, k, v, window: Window, scale: float | None = None) -> np.ndarray:
    """Sliding-window attention (Longformer; Mistral 7B uses window (4096, 0) with causal).

    Parameters
    ----------
    q : array (..., N_q, d)
    k : array (..., N_k, d)
    v : array (..., N_k, d_v)
    window : (left, right), see :func:`window_mask`; -1 = unbounded side.
    scale : tau; default 1/sqrt(d).

    Returns
    -------
    o : array (..., N_q, d_v); a query that sees no key gets 0.
    """
    q, k, v = _check_qkv(q, k, v, np.float64)
    mask = window_mask(q.shape[-2], k.shape[-2], window)  # (N_q, N_k)
    return _masked_attention(q, k, v, mask, _scale(scale, q.shape[-1]))[0]


# ------------------------------------------------------------------ 4. variable length
def _check_cu_seqlens(name: str, cu: object, total: int) -> np.ndarray:
    """cu_seqlens as a 1-D int array [0, ..., total], non-decreasing."""
    arr = np.asarray(cu)
    if arr.ndim != 1 or arr.size < 2 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(
            f"{name} must be a 1-D integer array [0, n_0, n_0 + n_1, ..., total] with at least 2 entries; "
            f"got {arr.dtype} array of shape {arr.shape}"
        )
    if arr[0] != 0 or arr[-1] != total:
        raise ValueError(
            f"{name} must start at 0 and end at the number of packed tokens {total}; "
            f"got first={arr[0]}, last={arr[-1]}"
        )
    steps = np.diff(arr)
    if np.any(steps < 0):
        b = int(np.argmax(steps < 0))
        raise ValueError(
            f"{name} must be non-decreasing (sequence lengths >= 0); "
            f"got {name}[{b}]={arr[b]} > {name}[{b + 1}]={arr[b + 1]}"
        )
    return arr.astype(np.int64)


def attention_varlen(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    causal: bool = False,
    scale: float | None = None,
    window: Window | None = None,
) -> np.ndarray:
    """Attention over packed sequences of different lengths (flash-attn's varlen interface).

    Sequence b owns query rows cu_seqlens_q[b]:cu_seqlens_q[b + 1] and key rows
    cu_seqlens_k[b]:cu_seqlens_k[b + 1], and attends only within itself; causal and
    window are bottom-right aligned per sequence. GQA is allowed (H_kv divides H).
    Equal to running :func:`attention_gqa` (or :func:`attention`, when H_kv = H) on
    each sequence alone.

    Parameters
    ----------
    q : array (total_q, H, d)
    k : array (total_k, H_kv, d)
    v : array (total_k, H_kv, d_v)
    cu_seqlens_q : int array (B + 1,), [0, ..., total_q], non-decreasing
    cu_seqlens_k : int array (B + 1,), [0, ..., total_k], non-decreasing
    causal, scale, window : as for :func:`attention_gqa`.

    Returns
    -------
    o : array (total_q, H, d_v)
    """
    q = as_float_array("q", q, np.float64, min_ndim=3)
    k = as_float_array("k", k, np.float64, min_ndim=3)
    v = as_float_array("v", v, np.float64, min_ndim=3)
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise ValueError(
            f"q, k, v must be packed as (total_tokens, heads, d); got q.shape={q.shape}, k.shape={k.shape}, "
            f"v.shape={v.shape}"
        )
    if q.shape[2] != k.shape[2] or k.shape[:2] != v.shape[:2] or q.shape[1] % k.shape[1] != 0:
        raise ValueError(
            f"q (total_q, H, d), k (total_k, H_kv, d) and v (total_k, H_kv, d_v) need the same d in q and k, "
            f"the same (total_k, H_kv) in k and v, and H_kv dividing H; "
            f"got q.shape={q.shape}, k.shape={k.shape}, v.shape={v.shape}"
        )
    cu_q = _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0])
    cu_k = _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0])
    if cu_q.size != cu_k.size:
        raise ValueError(
            f"cu_seqlens_q and cu_seqlens_k must describe the same number of sequences; "
            f"got {cu_q.size - 1} and {cu_k.size - 1}"
        )
    heads_first = [np.swapaxes(x, 0, 1) for x in (q, k, v)]  # (H, total, d): the layout of attention_gqa
    q_h, k_h, v_h = _check_gqa(*heads_first)
    window = None if window is None else _check_window(window)
    tau = _scale(scale, q.shape[-1])
    o = np.zeros(q.shape[:2] + (v.shape[-1],))  # (total_q, H, d_v)
    for b in range(cu_q.size - 1):  # one program per (sequence, head, query block) on the GPU
        rq, rk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        n_q, n_k = rq.stop - rq.start, rk.stop - rk.start
        mask = _mask(n_q, n_k, causal, window)
        o_b, _ = _gqa_attention(q_h[:, rq], k_h[:, rk], v_h[:, rk], mask, tau)  # (H, n_q, d_v)
        o[rq] = np.swapaxes(o_b, 0, 1)  # (n_q, H, d_v)
    return o


def pad_and_mask_cost(
    seqlens, n_heads: int = 1, d: int = 64, bytes_per_element: int = 2, causal: bool = False
) -> dict[str, float]:
    """What padding a batch to its longest sequence costs, against packing it (varlen).

    Padded: B sequences of length max(n_b), the padding masked out but still computed.
    Packed: each sequence alone. Self-attention (N_q = N_k = n_b) of one layer, forward:

        flops = sum_b attention_flops(n_b, n_b, d, batch=n_heads)   (4 n^2 d per head; halved if causal)
        bytes = 4 (Q, K, V read, O written) * tokens * n_heads * d * bytes_per_element

    (the bytes a fused kernel moves at least). Returns a dict with ``padded_tokens``,
    ``packed_tokens``, ``padded_flops``, ``packed_flops``, ``padded_bytes``,
    ``packed_bytes`` and ``useful_fraction`` = packed_flops / padded_flops.
    """
    n = np.asarray(seqlens)
    if n.ndim != 1 or n.size == 0 or not np.issubdtype(n.dtype, np.integer) or np.any(n < 1):
        raise ValueError(f"seqlens must be a non-empty 1-D list of integers >= 1; got {seqlens!r}")
    n_heads, d = positive_int("n_heads", n_heads), positive_int("d", d)
    bytes_per_element = positive_int("bytes_per_element", bytes_per_element)

    def cost(lengths: np.ndarray) -> tuple[int, float, int]:
        tokens = int(lengths.sum())
        flops = sum(attention_flops(int(m), int(m), d, causal=causal, batch=n_heads) for m in lengths)
        return tokens, flops, 4 * tokens * n_heads * d * bytes_per_element

    padded = cost(np.full(n.size, n.max()))
    packed = cost(n)
    return {
        "padded_tokens": padded[0],
        "packed_tokens": packed[0],
        "padded_flops": padded[1],
        "packed_flops": packed[1],
        "padded_bytes": padded[2],
        "packed_bytes": packed[2],
        "useful_fraction": packed[1] / padded[1],
    }


# ------------------------------------------------------------------ 5. split-KV decoding
def combine(o_parts, lse_parts) -> tuple[np.ndarray, np.ndarray]:
    """Join partial results over disjoint key sets (Flash-Decoding's reduction step).

        lse = log sum_i exp(lse_i)                  (C1)  computed as M + log sum_i exp(lse_i - M)
        o   = sum_i exp(lse_i - lse) * o_i          (C2)  weights sum to 1

    with M = max_i lse_i for safety. A part with lse_i = -inf (an empty split, or a row
    that saw no key of it) has weight 0; if every part is empty, o = 0 and lse = -inf.
    The result does not depend on the order of the parts.

    Parameters
    ----------
    o_parts : array (n_s, ..., N_q, d_v)   each split's normalised output o_i (n_s splits)
    lse_parts : array (n_s, ..., N_q)      each split's log-sum-exp lse_i (-inf allowed)

    Returns
    -------
    o : array (..., N_q, d_v)
    lse : array (..., N_q)
    """
    o_parts = as_float_array("o_parts", o_parts, np.float64, min_ndim=3)
    lse_parts = as_float_array("lse_parts", lse_parts, np.float64, min_ndim=2, allow_neg_inf=True)
    if lse_parts.shape != o_parts.shape[:-1] or o_parts.shape[0] == 0:
        raise ValueError(
            f"o_parts must be (n_s, ..., N_q, d_v) and lse_parts (n_s, ..., N_q) with n_s >= 1 splits and the same leading axes; "
            f"got o_parts.shape={o_parts.shape}, lse_parts.shape={lse_parts.shape}"
        )
    M = np.max(lse_parts, axis=0)  # (..., N_q)
    M = np.where(np.isneginf(M), 0.0, M)  # every part empty: keep exp() at 0, not NaN
    w = np.exp(lse_parts - M)  # (n_s, ..., N_q)  exp(lse_i - M)
    total = np.sum(w, axis=0)  # (..., N_q)
    with np.errstate(divide="ignore"):
        lse = np.where(total > 0, M + np.log(total), -np.inf)  # (C1)
    weight = np.divide(w, total, out=np.zeros_like(w), where=total > 0)  # exp(lse_i - lse)  (n_s, ..., N_q)
    o = np.sum(weight[..., None] * o_parts, axis=0)  # (C2)  (..., N_q, d_v)
    return o, lse


def decode_split_kv(
    q, k, v, num_splits: int, scale: float | None = None, *, causal: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Split-KV attention (Flash-Decoding, Dao et al. 2023): exact, in two steps.

    Step 1 (one program per split, in parallel on the GPU): the keys are cut into
    ``num_splits`` consecutive chunks of ceil(N_k / num_splits) keys (the last ones
    shorter or empty); each chunk runs the online-softmax recurrence on its own and
    writes its normalised o_i and lse_i. Step 2: :func:`combine`.

    Parameters
    ----------
    q : array (..., N_q, d), N_q small (1 for plain decoding)
    k : array (..., N_k, d), the long KV cache
    v : array (..., N_k, d_v)
    num_splits : n_s >= 1; more splits than keys leaves some empty (lse_i = -inf).
    scale : tau; default 1/sqrt(d).
    causal : keyword only; bottom-right aligned (the N_q new tokens are the last keys).

    Returns
    -------
    o : array (..., N_q, d_v)   equal to ``attention(q, k, v, causal, scale)``
    lse : array (..., N_q)
    """
    q, k, v = _check_qkv(q, k, v, np.float64)
    n_s = positive_int("num_splits", num_splits)
    tau = _scale(scale, q.shape[-1])
    n_q, n_k = q.shape[-2], k.shape[-2]
    chunk = -(-n_k // n_s)  # ceil(N_k / n_s) keys per split
    mask = causal_mask(n_q, n_k) if causal else np.ones((n_q, n_k), dtype=bool)  # (N_q, N_k)
    o_parts, lse_parts = [], []
    for i in range(n_s):  # step 1: independent programs
        c = slice(min(i * chunk, n_k), min((i + 1) * chunk, n_k))
        s_i = tau * (q @ np.swapaxes(k[..., c, :], -1, -2))  # (..., N_q, chunk)
        s_i = np.where(mask[:, c], s_i, -np.inf)
        state = OnlineSoftmaxState.empty(q.shape[:-1], v.shape[-1]).update(s_i, v[..., c, :])
        o_parts.append(state.output())  # o_i = o_tilde / l     (..., N_q, d_v)
        lse_parts.append(state.lse)  # lse_i = m + log l          (..., N_q), -inf if empty
    return combine(np.stack(o_parts), np.stack(lse_parts))  # step 2


def split_heuristic(batch: int, heads: int, n_k: int, num_sms: int, block_n: int = 128) -> int:
    """A number of KV splits that fills the GPU, by the rule

        n_s = min( ceil(num_sms / (batch * heads)),  ceil(n_k / block_n) )

    i.e. the smallest n_s with batch * heads * n_s >= num_sms (one program per SM in the
    first wave), capped so that every split gets at least one block of ``block_n``
    keys. n_s = 1 when batch * heads already covers the SMs.

    flash-attn (``num_splits_heuristic``) refines this: no split when batch * heads *
    query-blocks >= 0.8 num_sms, otherwise the smallest n_s whose wave efficiency
    (waves / ceil(waves)) is within 85 % of the best n_s, skipping n_s that change no
    split's size. Both aim at the same thing: enough programs to occupy every SM, and
    no more, since every extra split writes one more (o_i, lse_i) to HBM.
    """
    batch, heads = positive_int("batch", batch), positive_int("heads", heads)
    n_k, num_sms = positive_int("n_k", n_k), positive_int("num_sms", num_sms)
    block_n = positive_int("block_n", block_n)
    programs = batch * heads  # one query block per (sequence, head) when decoding
    n_blocks = -(-n_k // block_n)  # ceil(n_k / block_n)
    return max(1, min(-(-num_sms // programs), n_blocks))


# ------------------------------------------------------------------ 6. paged KV cache
class PagedKVCache:
    """A paged KV cache (vLLM PagedAttention, Kwon et al., SOSP 2023), for ``batch`` sequences.

    Storage: a pool of ``num_pages`` pages, each holding ``page_size`` tokens,
    ``k_pages`` (num_pages, page_size, H_kv, d) and ``v_pages`` (num_pages, page_size,
    H_kv, d_v). Sequence b's token t lives in page ``block_table[b, t // page_size]``
    at slot t % page_size; ``seq_lens[b]`` tokens are valid; unused table entries are
    -1. Pages come from a free list (a stack, so freed pages are reused first and a
    sequence's pages need not be consecutive or in order).

    Parameters
    ----------
    batch : number of sequences.
    num_pages : pages in the pool (shared by all sequences).
    page_size : tokens per page.
    n_kv_heads, d : K/V heads and head dimension; ``d_v`` defaults to d.
    """

    def __init__(self, batch: int, num_pages: int, page_size: int, n_kv_heads: int, d: int, d_v: int | None = None):
        self.batch = positive_int("batch", batch)
        self.num_pages = positive_int("num_pages", num_pages)
        self.page_size = positive_int("page_size", page_size)
        H_kv, d = positive_int("n_kv_heads", n_kv_heads), positive_int("d", d)
        d_v = d if d_v is None else positive_int("d_v", d_v)
        self.k_pages = np.zeros((self.num_pages, self.page_size, H_kv, d))  # (num_pages, page_size, H_kv, d)
        self.v_pages = np.zeros((self.num_pages, self.page_size, H_kv, d_v))  # (num_pages, page_size, H_kv, d_v)
        self.block_table = np.full((self.batch, self.num_pages), -1, dtype=np.int64)  # (batch, max pages)
        self.seq_lens = np.zeros(self.batch, dtype=np.int64)  # (batch,)
        self.free_pages: list[int] = list(range(self.num_pages - 1, -1, -1))  # pop() hands out page 0 first

    def _check_seq(self, b: object) -> int:
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)) or not 0 <= b < self.batch:
            raise ValueError(f"b must be a sequence index in [0, {self.batch}); got {b!r}")
        return int(b)

    def pages_of(self, b: int) -> np.ndarray:
        """Physical pages of sequence b, in logical order: shape (ceil(seq_lens[b] / page_size),)."""
        b = self._check_seq(b)
        return self.block_table[b, : -(-int(self.seq_lens[b]) // self.page_size)]

    def append(self, b: int, k_new, v_new) -> None:
        """Append n_new tokens to sequence b, taking new pages from the free list as needed.

        Parameters
        ----------
        b : sequence index.
        k_new : array (n_new, H_kv, d)
        v_new : array (n_new, H_kv, d_v)

        Raises ValueError (and changes nothing) if the pool has too few free pages.
        """
        b = self._check_seq(b)
        k_new = as_float_array("k_new", k_new, np.float64, min_ndim=3)
        v_new = as_float_array("v_new", v_new, np.float64, min_ndim=3)
        if k_new.shape[1:] != self.k_pages.shape[2:] or v_new.shape != k_new.shape[:1] + self.v_pages.shape[2:]:
            raise ValueError(
                f"k_new must be (n_new, {', '.join(map(str, self.k_pages.shape[2:]))}) and v_new "
                f"(n_new, {', '.join(map(str, self.v_pages.shape[2:]))}); "
                f"got k_new.shape={k_new.shape}, v_new.shape={v_new.shape}"
            )
        n_old = int(self.seq_lens[b])
        n_new = n_old + k_new.shape[0]
        have = -(-n_old // self.page_size)  # pages already owned by b
        need = -(-n_new // self.page_size) - have  # pages to allocate
        if need > len(self.free_pages):
            raise ValueError(
                f"the page pool is exhausted: appending {k_new.shape[0]} tokens to sequence {b} needs {need} new "
                f"page(s) of {self.page_size} tokens, but only {len(self.free_pages)} of {self.num_pages} are free"
            )
        for i in range(have, have + need):
            self.block_table[b, i] = self.free_pages.pop()  # logical page i -> physical page
        t = np.arange(n_old, n_new)  # positions of the new tokens in the sequence
        page, slot = self.block_table[b, t // self.page_size], t % self.page_size  # (n_new,), (n_new,)
        self.k_pages[page, slot] = k_new  # scatter: (n_new, H_kv, d)
        self.v_pages[page, slot] = v_new
        self.seq_lens[b] = n_new

    def free(self, b: int) -> None:
        """Sequence b is finished: return its pages to the free list and empty it."""
        b = self._check_seq(b)
        for page in self.pages_of(b):
            self.free_pages.append(int(page))
        self.block_table[b] = -1
        self.seq_lens[b] = 0

    def gather(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """Sequence b's keys and values as contiguous arrays (n, H_kv, d), (n, H_kv, d_v)."""
        b = self._check_seq(b)
        n, pages = int(self.seq_lens[b]), self.pages_of(b)
        k = self.k_pages[pages].reshape((-1,) + self.k_pages.shape[2:])[:n]  # (pages * page_size, H_kv, d)[:n]
        v = self.v_pages[pages].reshape((-1,) + self.v_pages.shape[2:])[:n]  # (n, H_kv, d_v)
        return k, v


def attention_paged(q, cache: PagedKVCache, causal: bool = False, scale: float | None = None) -> np.ndarray:
    """Decoding attention against a paged KV cache (PagedAttention, Kwon et al. 2023).

    For each sequence b, the block table is walked page by page; each page is one
    K/V block of the online-softmax recurrence (equations (1)-(3) of :mod:`.softmax`),
    read from wherever it lies in the pool. GQA: query head h reads K/V head h // G.
    Equal to :func:`attention_gqa` on the gathered cache (``cache.gather(b)``).

    Parameters
    ----------
    q : array (B, H, N_q, d), B = cache.batch, H a multiple of the cache's H_kv
    cache : PagedKVCache
    causal : bottom-right aligned: the N_q queries are the last N_q tokens of the cache.
    scale : tau; default 1/sqrt(d).

    Returns
    -------
    o : array (B, H, N_q, d_v); a sequence with no (visible) key gets 0.
    """
    q = as_float_array("q", q, np.float64, min_ndim=4)
    H_kv, d_k, d_v = cache.k_pages.shape[2], cache.k_pages.shape[3], cache.v_pages.shape[3]
    if q.ndim != 4 or q.shape[0] != cache.batch or q.shape[3] != d_k or q.shape[1] % H_kv != 0:
        raise ValueError(
            f"q must be (B={cache.batch}, H, N_q, d={d_k}) with H a multiple of H_kv={H_kv}; got q.shape={q.shape}"
        )
    B, H, n_q, d = q.shape
    tau = _scale(scale, d)
    G, P = H // H_kv, cache.page_size
    o = np.zeros((B, H, n_q, d_v))
    for b in range(B):  # one program per (sequence, head) on the GPU
        n = int(cache.seq_lens[b])
        mask = causal_mask(n_q, n) if causal else np.ones((n_q, n), dtype=bool)  # (N_q, n)
        q_b = q[b].reshape(H_kv, G, n_q, d)  # (H_kv, G, N_q, d)
        state = OnlineSoftmaxState.empty((H_kv, G, n_q), d_v)
        for i, page in enumerate(cache.pages_of(b)):  # logical page i, physical page `page`
            valid = min(P, n - i * P)  # tokens used in this page (the last may be partly filled)
            K_i = np.swapaxes(cache.k_pages[page, :valid], 0, 1)[:, None]  # (H_kv, 1, valid, d)
            V_i = np.swapaxes(cache.v_pages[page, :valid], 0, 1)[:, None]  # (H_kv, 1, valid, d_v)
            s = tau * (q_b @ np.swapaxes(K_i, -1, -2))  # (H_kv, G, N_q, valid)
            s = np.where(mask[:, i * P : i * P + valid], s, -np.inf)
            state = state.update(s, V_i)  # (1)-(3)
        o[b] = state.output().reshape(H, n_q, d_v)  # (H, N_q, d_v)
    return o
