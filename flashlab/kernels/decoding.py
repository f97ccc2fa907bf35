"""Decoding with a KV cache: split-KV (Flash-Decoding; Dao, Haziza, Massa, Sizov 2023) and paged
KV (PagedAttention; Kwon et al. 2023), in Triton.

Each decoding step brings n_q new query tokens per sequence (1, or a few with speculative
decoding); there is no query block to parallelise over, so the keys are split instead:

    split kernel    grid (num_splits, B·H_kv, row blocks). Program s streams key chunk C_s of
                    one sequence and K/V head through the online softmax of forward.py and
                    writes o_s = softmax(S[:, C_s]) V[C_s] and lse_s = log2 sum_{j in C_s} 2^{S_j}
    combine         lse = log2 sum_s 2^{lse_s}                                     (eq. C1)
                    o   = sum_s 2^{lse_s - lse} o_s                                (eq. C2)

The combine is exact: 2^{lse_s - lse} is chunk s's share of the softmax mass. GQA packs the
GROUP query heads of a K/V head into one tile, so K and V are read once per group.

Glossary: n_q = new query tokens per sequence (新词元数); seqlen = valid cache length
(缓存有效长度); split = chunk of keys handled by one program (切分); GROUP = query
heads per K/V head (分组); page = fixed-size block of the cache pool (页); block_table =
logical page -> physical page (页表); lse = log-sum-exp, here in log2 units.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from .._validate import positive_int
from ._common import (INTERPRET, LN2, LOG2E, check_head_dim, check_runnable, check_scale, check_tensors, dot_precision,
                      load_kv_tiles)
from .forward import online_softmax_step

__all__ = ["flash_decode", "combine_splits", "choose_num_splits", "DEFAULT_NUM_SMS", "MAX_SPLITS"]

DEFAULT_NUM_SMS = 132  # H100 / H200 SXM: the split count targets these when no CUDA device is present
MAX_SPLITS = 128  # more splits than this only adds combine work (flash-attn uses the same cap)


# --------------------------------------------------------------------------- split kernel
@triton.jit
def _attend_chunk(
    acc, l_i, m_i, q,  # running state (BLOCK_M, BLOCK_D), (BLOCK_M,), (BLOCK_M,); the packed query tile
    K, V, BT_ROW, off_b,  # K, V point at this K/V head; BT_ROW at block_table[b] (paged only)
    k_strides, v_strides,  # (batch or page, head, slot, d): see _split_kernel
    offs_i, offs_n, offs_d, lo, hi, end, causal_offset, qk_scale,
    D_HEAD: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PAGED: tl.constexpr,
    PAGE_SIZE: tl.constexpr, MASKED: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Fold key blocks [lo, hi) into (acc, l_i, m_i) — the recurrence of forward.py. MASKED
    blocks check the chunk end and the causal diagonal; unmasked ones are fully visible."""
    stride_k0, _, stride_kn, stride_kd = k_strides
    stride_v0, _, stride_vn, stride_vd = v_strides
    d_ok = offs_d < D_HEAD
    for start_n in range(lo, hi, BLOCK_N):
        n = start_n + offs_n  # (BLOCK_N,) logical key positions in the sequence
        n_ok = n < end
        if PAGED:  # key n lives in physical page block_table[b, n // page_size], slot n % page_size
            page = tl.load(BT_ROW + n // PAGE_SIZE, mask=n_ok, other=0).to(tl.int64)
            k_rows = page * stride_k0 + (n % PAGE_SIZE) * stride_kn  # (BLOCK_N,) element offsets
            v_rows = page * stride_v0 + (n % PAGE_SIZE) * stride_vn
        else:
            k_rows = off_b * stride_k0 + n * stride_kn
            v_rows = off_b * stride_v0 + n * stride_vn
        k_ptrs = K + k_rows[None, :] + offs_d[:, None] * stride_kd  # (BLOCK_D, BLOCK_N) = K_j^T
        v_ptrs = V + v_rows[:, None] + offs_d[None, :] * stride_vd  # (BLOCK_N, BLOCK_D) = V_j
        k, v = load_kv_tiles(k_ptrs, v_ptrs, n_ok, d_ok, MASKED, BLOCK_D != D_HEAD, UPCAST)  # as forward.py
        qk = tl.dot(q, k, input_precision=DOT_PRECISION)  # Q K_j^T (BLOCK_M, BLOCK_N), unscaled
        if MASKED:  # token i sees key n iff n <= seqlen - n_q + i (and n is inside this chunk)
            visible = n_ok[None, :] & (n[None, :] <= offs_i[:, None] + causal_offset)
            qk = tl.where(visible, qk, float("-inf"))
        acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, qk, v, qk_scale, MASKED, DOT_PRECISION)  # as forward.py
    return acc, l_i, m_i


@triton.jit
def _split_kernel(
    Q, K, V, SEQLENS, BLOCK_TABLE, O_PART, LSE_PART, O, LSE, LOCKS,  # O, LSE, LOCKS: fused combine only
    q_strides,  # Q (B, H, n_q, d)
    k_strides, v_strides,  # contiguous: (b, h_kv, n, d); paged: (page, h_kv, slot, d)
    stride_bt,  # block_table's row stride
    part_strides,  # O_PART (B, H, splits, n_q, d) and LSE_PART (B, H, splits, n_q)
    o_strides,  # O (B, H, n_q, d); LSE is (B, H, n_q) contiguous
    H_KV, GROUP, N_Q, NUM_SPLITS, qk_scale,
    D_HEAD: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGED: tl.constexpr, PAGE_SIZE: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
    FUSE: tl.constexpr,
):
    """Program (split s, sequence b and K/V head, row block): the partial result of key chunk
    C_s for BLOCK_M packed rows. With FUSE, the last of a tile's splits to finish merges them
    (see flash_decode's fuse_combine)."""
    stride_qb, stride_qh, stride_qi, stride_qd = q_strides
    stride_kh = k_strides[1]
    stride_vh = v_strides[1]
    o_part_strides, lse_part_strides = part_strides
    stride_ob, stride_oh, stride_os, stride_oi, stride_od = o_part_strides
    stride_lb, stride_lh, stride_ls, stride_li = lse_part_strides
    stride_fb, stride_fh, stride_fi, stride_fd = o_strides
    split = tl.program_id(0)
    off_bkv = tl.program_id(1)
    off_b = off_bkv // H_KV
    off_hkv = off_bkv % H_KV
    seqlen = tl.load(SEQLENS + off_b)

    # Rows r = g·n_q + i: head g of the group, new token i (GQA packing), padded to BLOCK_M.
    offs_r = tl.program_id(2) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_g = offs_r // N_Q
    offs_i = offs_r % N_Q
    row_ok = offs_r < GROUP * N_Q
    offs_h = off_hkv * GROUP + offs_g  # (BLOCK_M,) query head of each row
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)  # head dim padded to a power of two; loads masked to D_HEAD
    d_ok = offs_d < D_HEAD

    q_ptrs = Q + off_b * stride_qb + offs_h[:, None] * stride_qh + offs_i[:, None] * stride_qi + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # (BLOCK_M, BLOCK_D), stays on chip
    if UPCAST:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # m = -inf
    l_i = tl.zeros([BLOCK_M], tl.float32)  # l = 0
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)  # O = 0

    # This program's chunk of whole key blocks: the sequence's cdiv(seqlen, BLOCK_N) blocks are
    # dealt out in runs of equal length, so splits of a short sequence may be empty (start >= end).
    blocks_per_split = tl.cdiv(tl.cdiv(seqlen, BLOCK_N), NUM_SPLITS)
    start = split * blocks_per_split * BLOCK_N
    end = tl.minimum(start + blocks_per_split * BLOCK_N, seqlen)
    # Causal among the new tokens: token i sits at cache position seqlen - n_q + i (the new keys are
    # already appended), so it sees key j iff j <= seqlen - n_q + i (bottom-right alignment).
    # Keys [0, full) lie in blocks every row sees whole (j <= seqlen - n_q): no mask needed there.
    causal_offset = seqlen - N_Q
    full = (tl.maximum(causal_offset + 1, 0) // BLOCK_N) * BLOCK_N
    mid = tl.minimum(tl.maximum(full, start), end)

    off_b64 = off_b.to(tl.int64)  # a whole cache can exceed 2^31 elements
    K += off_hkv * stride_kh
    V += off_hkv * stride_vh
    BT_ROW = BLOCK_TABLE
    if PAGED:
        BT_ROW += off_b * stride_bt  # block_table[b]
    acc, l_i, m_i = _attend_chunk(acc, l_i, m_i, q, K, V, BT_ROW, off_b64, k_strides, v_strides,
                                  offs_i, offs_n, offs_d, start, mid, end, causal_offset, qk_scale,
                                  D_HEAD, BLOCK_D, BLOCK_N, PAGED, PAGE_SIZE, False, UPCAST, DOT_PRECISION)
    acc, l_i, m_i = _attend_chunk(acc, l_i, m_i, q, K, V, BT_ROW, off_b64, k_strides, v_strides,
                                  offs_i, offs_n, offs_d, mid, end, end, causal_offset, qk_scale,
                                  D_HEAD, BLOCK_D, BLOCK_N, PAGED, PAGE_SIZE, True, UPCAST, DOT_PRECISION)

    # Partial result over this chunk; a row with no visible key here has l = 0: o_s = 0, lse_s = -inf.
    seen = l_i > 0
    l_safe = tl.where(seen, l_i, 1.0)
    acc = acc / l_safe[:, None]  # o_s = O / l
    lse = tl.where(seen, m_i + tl.math.log2(l_safe), float("-inf"))  # lse_s = m + log2(l)
    row_base = off_b * stride_lb + offs_h * stride_lh + split * stride_ls + offs_i * stride_li
    tl.store(LSE_PART + row_base, lse, mask=row_ok)
    o_ptrs = (O_PART + off_b * stride_ob + offs_h[:, None] * stride_oh + split * stride_os
              + offs_i[:, None] * stride_oi + offs_d[None, :] * stride_od)
    tl.store(o_ptrs, acc.to(O_PART.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])

    # Fused combine: each program counts itself in on its tile's counter; the one that arrives last
    # (it reads NUM_SPLITS - 1) merges every split's partial and resets the counter for the next call.
    # The atomic's acquire-release order makes all partials visible to that last program.
    if FUSE:
        tl.debug_barrier()  # every thread's partial is written before the arrival is counted
        lock = LOCKS + off_bkv * tl.num_programs(2) + tl.program_id(2)
        arrived = tl.atomic_add(lock, 1, sem="acq_rel")  # release our partial, acquire the others'
        if arrived == NUM_SPLITS - 1:
            tl.atomic_xchg(lock, 0)  # reset: the next call starts from 0
            lse_rows = LSE_PART + off_b * stride_lb + offs_h * stride_lh + offs_i * stride_li  # (BLOCK_M,)
            o_rows = O_PART + off_b * stride_ob + offs_h[:, None] * stride_oh + offs_i[:, None] * stride_oi + offs_d[None, :] * stride_od
            out, lse = _merge_splits(lse_rows, o_rows, stride_ls, stride_os, row_ok, d_ok, NUM_SPLITS, BLOCK_M, BLOCK_D)
            tl.store(LSE + (off_b * H_KV * GROUP + offs_h) * N_Q + offs_i, lse, mask=row_ok)
            f_ptrs = O + off_b * stride_fb + offs_h[:, None] * stride_fh + offs_i[:, None] * stride_fi + offs_d[None, :] * stride_fd
            tl.store(f_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


# --------------------------------------------------------------------------- combine
@triton.jit
def _merge_splits(lse_rows, o_rows, stride_ls, stride_os, row_ok, d_ok, NUM_SPLITS,
                  BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """Merge the splits' partial results of BLOCK_R output rows: lse_rows (BLOCK_R,) points at
    split 0's lse_s of each row, o_rows (BLOCK_R, BLOCK_D) at its o_s; split s lies stride_ls
    (stride_os) further on. Returns (o, lse), lse in log2 units, -inf (and o = 0) for a row whose
    every split is empty. Loads bypass L1 (.cg): in the fused combine other SMs wrote them."""
    # (C1) lse = log2 sum_s 2^{lse_s}, as an online maximum and sum over the splits
    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_R], tl.float32)
    for s in range(0, NUM_SPLITS):
        lse_s = tl.load(lse_rows + s * stride_ls, mask=row_ok, other=float("-inf"), cache_modifier=".cg")
        m_new = tl.maximum(m, lse_s)
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # no split has seen a key yet: no NaN
        total = total * tl.math.exp2(m - m_ref) + tl.math.exp2(lse_s - m_ref)
        m = m_new
    seen = total > 0
    lse = tl.where(seen, m + tl.math.log2(tl.where(seen, total, 1.0)), float("-inf"))
    lse_ref = tl.where(seen, lse, 0.0)
    # (C2) o = sum_s 2^{lse_s - lse} o_s
    out = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
    for s in range(0, NUM_SPLITS):
        weight = tl.math.exp2(tl.load(lse_rows + s * stride_ls, mask=row_ok, other=float("-inf"),
                                      cache_modifier=".cg") - lse_ref)
        o_s = tl.load(o_rows + s * stride_os, mask=row_ok[:, None] & d_ok[None, :], other=0.0, cache_modifier=".cg")
        out += weight[:, None] * o_s
    return out, lse


@triton.jit
def _combine_kernel(
    O_PART, LSE_PART, O, LSE,
    part_strides,  # O_PART (B, H, splits, n_q, d) and LSE_PART (B, H, splits, n_q)
    o_strides,  # O (B, H, n_q, d)
    ROWS, H, N_Q, NUM_SPLITS,
    D_HEAD: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
):
    """The separate combine: each program merges BLOCK_R of the B·H·n_q output rows (b, h, i)."""
    o_part_strides, lse_part_strides = part_strides
    stride_pb, stride_ph, stride_ps, stride_pi, stride_pd = o_part_strides
    stride_lb, stride_lh, stride_ls, stride_li = lse_part_strides
    stride_ob, stride_oh, stride_oi, stride_od = o_strides
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < ROWS
    off_i = rows % N_Q
    off_h = rows // N_Q % H
    off_b = rows // N_Q // H
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D_HEAD
    lse_rows = LSE_PART + off_b * stride_lb + off_h * stride_lh + off_i * stride_li
    o_rows = O_PART + off_b[:, None] * stride_pb + off_h[:, None] * stride_ph + off_i[:, None] * stride_pi + offs_d[None, :] * stride_pd
    out, lse = _merge_splits(lse_rows, o_rows, stride_ls, stride_ps, row_ok, d_ok, NUM_SPLITS, BLOCK_R, BLOCK_D)
    tl.store(LSE + rows, lse, mask=row_ok)  # LSE (B, H, n_q) contiguous: row (b, h, i) is element b·H·n_q + h·n_q + i
    o_ptrs = O + off_b[:, None] * stride_ob + off_h[:, None] * stride_oh + off_i[:, None] * stride_oi + offs_d[None, :] * stride_od
    tl.store(o_ptrs, out.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def _combine_into(o_parts: torch.Tensor, lse2_parts: torch.Tensor, o: torch.Tensor, lse2: torch.Tensor) -> None:
    B, H, S, N_Q, D = o_parts.shape
    rows, block_r = B * H * N_Q, 16  # 16 output rows per program
    _combine_kernel[(-(-rows // block_r),)](
        o_parts, lse2_parts, o, lse2, (o_parts.stride(), lse2_parts.stride()), o.stride(),
        rows, H, N_Q, S, D_HEAD=D, BLOCK_D=_pow2(D), BLOCK_R=block_r,
    )


def combine_splits(o_parts: torch.Tensor, lse2_parts: torch.Tensor,
                   dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge per-chunk attention results exactly (the combine kernel alone).

    Parameters
    ----------
    o_parts : (B, H, n_s, n_q, d) float32, each of the n_s chunks' output normalised over that chunk
    lse2_parts : (B, H, n_s, n_q) float32, each chunk's log-sum-exp in log2 units (-inf: empty chunk)
    dtype : dtype of the returned output

    Returns
    -------
    o : (B, H, n_q, d) in ``dtype``, o = sum_s 2^{lse_s - lse} o_s (0 where every chunk is empty)
    lse2 : (B, H, n_q) float32, lse = log2 sum_s 2^{lse_s}
    """
    if o_parts.dim() != 5 or o_parts.dtype != torch.float32:
        raise ValueError(f"o_parts must be a 5-D float32 tensor (B, H, n_s, n_q, d); got shape {tuple(o_parts.shape)}, dtype {o_parts.dtype}")
    if lse2_parts.shape != o_parts.shape[:4] or lse2_parts.dtype != torch.float32:
        raise ValueError(f"lse2_parts must be float32 of shape {tuple(o_parts.shape[:4])} (o_parts without d); "
                         f"got shape {tuple(lse2_parts.shape)}, dtype {lse2_parts.dtype}")
    if lse2_parts.device != o_parts.device:
        raise ValueError(f"o_parts and lse2_parts must be on the same device; got {o_parts.device} and {lse2_parts.device}")
    check_runnable(o_parts.device)
    B, H, _, N_Q, D = o_parts.shape
    o = torch.empty((B, H, N_Q, D), device=o_parts.device, dtype=dtype)
    lse2 = torch.empty((B, H, N_Q), device=o_parts.device, dtype=torch.float32)
    _combine_into(o_parts, lse2_parts, o, lse2)
    return o, lse2


# --------------------------------------------------------------------------- launch choices
def _pow2(n: int) -> int:
    """The smallest power of two >= n (triton.next_power_of_2 without its per-call cost on
    the host, which a decoding step pays on every token)."""
    return 1 << (n - 1).bit_length()


def _launch_config(rows: int, block_d: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages) for n_q·GROUP packed rows. Decoding is
    memory-bound, so BLOCK_M is as small as the tensor cores allow (16) unless the group is
    larger; BLOCK_N = 64 keys (32 at d = 256, to fit shared memory) with 3 stages in flight.
    Under the interpreter BLOCK_N = 16, so small test caches cross many blocks."""
    block_m = min(max(16, _pow2(rows)), 64 if block_d <= 128 else 32)
    if INTERPRET:
        return block_m, 16, 4, 1
    return block_m, (64 if block_d <= 128 else 32), 4, 3


def choose_num_splits(programs: int, key_blocks: int, num_sms: int = DEFAULT_NUM_SMS) -> int:
    """Split count for Flash-Decoding: enough programs to fill the GPU in whole waves.

    ``programs`` = B·H_kv·(row blocks) is the grid without splitting, ``key_blocks`` =
    cdiv(cache capacity, BLOCK_N). A wave is ``slots`` = 2·num_sms programs: the split
    kernel's tiles are small, so two programs share an SM and hide each other's memory
    latency (as in flash-attn, which passes 2·SMs too). If the grid already fills >= 80 %
    of a wave, do not split. Otherwise pick, among 1 <= s <= min(key_blocks, MAX_SPLITS)
    (each split keeps at least one key block), the smallest s whose wave efficiency

        eff(s) = (programs·s / slots) / ceil(programs·s / slots)

    is within 85 % of the best — flash-attn's ``num_splits_heuristic`` (flash_api.cpp): few
    splits (less combine work) unless more of them fill the last wave much better.
    Example: B = 4, H_kv = 8, n_q·GROUP <= 64 on 132 SMs: 32 programs, s = 8 -> 256 programs.
    Chapter 9 times the choice against 1 to 128 splits at four shapes.
    """
    programs, key_blocks, num_sms = (positive_int(n, x) for n, x in
                                     (("programs", programs), ("key_blocks", key_blocks), ("num_sms", num_sms)))
    return _num_splits(programs, key_blocks, num_sms)


@functools.lru_cache(maxsize=1024)
def _num_splits(programs: int, key_blocks: int, num_sms: int) -> int:
    """choose_num_splits after its checks, cached: a decoding loop asks the same question every
    step, and the search over split counts costs as much host time as launching a kernel."""
    slots = 2 * num_sms
    if programs >= 0.8 * slots:
        return 1
    candidates = range(1, min(key_blocks, MAX_SPLITS) + 1)
    eff = {s: (programs * s / slots) / math.ceil(programs * s / slots) for s in candidates}
    best = max(eff.values())
    return min(s for s in candidates if eff[s] >= 0.85 * best)


_LOCKS: dict[tuple, torch.Tensor] = {}


def _locks(device: torch.device, n: int) -> torch.Tensor:
    """A zeroed int32 buffer of at least ``n`` arrival counters for the fused combine, one per
    (device, stream), kept between calls: each call leaves it zeroed again (the last program
    of every tile resets its counter), so no per-call memset is needed. Per stream, because two
    calls running at once on different streams must not count into the same counters. A CUDA
    graph keeps the buffer it was captured with: replay one such graph on one stream at a time."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (device.type, device.index, stream)
    buf = _LOCKS.get(key)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, 1024), device=device, dtype=torch.int32)
        _LOCKS[key] = buf
    return buf


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return DEFAULT_NUM_SMS


# --------------------------------------------------------------------------- input checks
def _check(q, k_cache, v_cache, cache_seqlens, block_table, page_size, num_splits, scale, validate) -> float:
    """Validate the arguments of :func:`flash_decode` (the values of cache_seqlens and block_table
    only if ``validate``); return the scale."""
    if (block_table is None) != (page_size is None):
        raise ValueError(f"block_table and page_size must be given together (paged cache) or both left out (contiguous cache); "
                         f"got block_table={'a tensor' if block_table is not None else None}, page_size={page_size!r}")
    paged = block_table is not None
    layout = "(num_pages, page_size, H_kv, d)" if paged else "(B, H_kv, N_max, d)"
    check_tensors(q, "(B, H, n_q, d)", k_cache=(k_cache, layout), v_cache=(v_cache, layout))
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have the same shape; got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    B, H, n_q, d = q.shape
    h_kv = k_cache.shape[2] if paged else k_cache.shape[1]
    if k_cache.shape[3] != d:
        raise ValueError(f"q and k_cache must have the same head dimension d; got q.shape={tuple(q.shape)}, k_cache.shape={tuple(k_cache.shape)}")
    check_head_dim(d)
    if n_q < 1:
        raise ValueError(f"q must hold at least one new token (n_q >= 1); got q.shape={tuple(q.shape)}")
    if h_kv < 1 or H % h_kv != 0:
        raise ValueError(f"the number of K/V heads must divide the number of query heads (GQA/MQA); "
                         f"got {H} query heads and {h_kv} K/V heads (k_cache layout {layout})")
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dtype != torch.int32 or cache_seqlens.shape != (B,):
        got = (f"shape {tuple(cache_seqlens.shape)}, dtype {cache_seqlens.dtype}" if isinstance(cache_seqlens, torch.Tensor)
               else type(cache_seqlens).__name__)
        raise ValueError(f"cache_seqlens must be an int32 tensor of shape (B,) = ({B},); got {got}")
    if cache_seqlens.device != q.device:
        raise ValueError(f"q and cache_seqlens must be on the same device; got q on {q.device}, cache_seqlens on {cache_seqlens.device}")
    if paged:
        page_size = positive_int("page_size", page_size)
        if k_cache.shape[1] != page_size:
            raise ValueError(f"a paged k_cache is (num_pages, page_size, H_kv, d); got page_size={page_size} but k_cache.shape={tuple(k_cache.shape)}")
        if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.shape[0] != B:
            got = (f"shape {tuple(block_table.shape)}, dtype {block_table.dtype}" if isinstance(block_table, torch.Tensor)
                   else type(block_table).__name__)
            raise ValueError(f"block_table must be an int32 tensor (B, max_pages) with B = {B}; got {got}")
        if block_table.device != q.device:
            raise ValueError(f"q and block_table must be on the same device; got q on {q.device}, block_table on {block_table.device}")
        capacity, where = block_table.shape[1] * page_size, f"max_pages * page_size = {block_table.shape[1]} * {page_size}"
    else:
        if k_cache.shape[0] != B:
            raise ValueError(f"q and k_cache must have the same batch size; got q.shape={tuple(q.shape)}, k_cache.shape={tuple(k_cache.shape)}")
        capacity, where = k_cache.shape[2], "N_max = k_cache.shape[2]"
    if validate:  # reading the values is a device sync
        lo, hi = int(cache_seqlens.min()), int(cache_seqlens.max())
        if lo < 0 or hi > capacity:
            raise ValueError(f"cache_seqlens must lie in [0, {capacity}] ({where}); got values from {lo} to {hi}")
        if paged:
            used = torch.arange(block_table.shape[1], device=q.device)[None, :] < (cache_seqlens[:, None] + page_size - 1) // page_size
            bad = used & ((block_table < 0) | (block_table >= k_cache.shape[0]))
            if bool(bad.any()):
                b, p = (int(x) for x in bad.nonzero()[0])
                raise ValueError(f"block_table entries for pages in use must lie in [0, num_pages = {k_cache.shape[0]}); "
                                 f"got block_table[{b}, {p}] = {int(block_table[b, p])}")
    if num_splits is not None:
        positive_int("num_splits", num_splits)
    scale = check_scale(scale, d)
    check_runnable(q.device)
    return scale


# --------------------------------------------------------------------------- entry point
def flash_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    num_splits: int | None = None,
    scale: float | None = None,
    block_table: torch.Tensor | None = None,
    page_size: int | None = None,
    return_lse: bool = False,
    validate: bool = True,
    fuse_combine: bool = True,
):
    """Attention of a few new tokens to a KV cache, by Flash-Decoding (split-KV + combine).

    Parameters
    ----------
    q : (B, H, n_q, d) float16, bfloat16 or float32 — the new tokens' queries; n_q is small
        (1 for classic decoding, up to ~16 for speculative decoding). Token i sees cache
        positions j <= cache_seqlens[b] - n_q + i (its own key is already in the cache).
    k_cache, v_cache : contiguous (B, H_kv, N_max, d), sequence b using positions [0, seqlen_b); or
        paged (num_pages, page_size, H_kv, d) when ``block_table`` is given: a pool of pages shared
        by all sequences (vLLM's layout), key j of sequence b at
        k_cache[block_table[b, j // page_size], j % page_size]. Same dtype and device as q;
        H_kv divides H (GQA/MQA).
    cache_seqlens : (B,) int32, valid cache length of each sequence, 0 <= seqlen <= capacity.
    num_splits : key chunks per (sequence, K/V head); default :func:`choose_num_splits`.
    scale : multiplies q k^T; default 1/sqrt(d).
    block_table : (B, max_pages) int32, physical page of logical page p of sequence b.
    page_size : keys per page; must be given with ``block_table`` and equal k_cache.shape[1].
    return_lse : also return the row log-sum-exp (B, H, n_q), float32, natural log.
    validate : check the *values* of cache_seqlens (within the cache) and of the block_table
        entries in use (valid pages). That reads them on the host, a device sync: about 0.1 ms
        per call on an H200, as long as the kernels at B = 4, H = 32, a 32k cache. A decoding
        loop (or a CUDA graph) that guarantees them passes False; shapes, dtypes and devices
        are always checked.
    fuse_combine : merge the splits inside the split kernel (one launch; default: the last
        program of each tile merges them) or in a separate combine kernel, 16 output rows per
        program (two launches, :func:`combine_splits`). One launch matters where the host's
        launch cost is as long as the kernels, as at B = 1 with a 64k cache.

    Returns
    -------
    o : (B, H, n_q, d) in q's dtype (0 for a token that sees no key), or ``(o, lse)``.
    """
    scale = _check(q, k_cache, v_cache, cache_seqlens, block_table, page_size, num_splits, scale, validate)
    paged = block_table is not None
    B, H, N_Q, D = q.shape
    H_KV = k_cache.shape[2] if paged else k_cache.shape[1]
    capacity = block_table.shape[1] * page_size if paged else k_cache.shape[2]
    group = H // H_KV
    block_d = max(16, _pow2(D))
    block_m, block_n, warps, stages = _launch_config(group * N_Q, block_d)
    row_blocks = -(-group * N_Q // block_m)
    if num_splits is None:
        num_splits = choose_num_splits(B * H_KV * row_blocks, max(1, -(-capacity // block_n)), _num_sms(q.device))

    o = torch.empty((B, H, N_Q, D), device=q.device, dtype=q.dtype)
    lse2 = torch.empty((B, H, N_Q), device=q.device, dtype=torch.float32)
    fuse = num_splits > 1 and bool(fuse_combine)
    if num_splits == 1:  # the single chunk's partial is the answer: write it straight to o (split stride 0)
        o_parts, lse2_parts = o.unsqueeze(2), lse2.unsqueeze(2)  # (B, H, 1, n_q, d), (B, H, 1, n_q)
    else:
        o_parts = torch.empty((B, H, num_splits, N_Q, D), device=q.device, dtype=torch.float32)
        lse2_parts = torch.empty((B, H, num_splits, N_Q), device=q.device, dtype=torch.float32)
    locks = _locks(q.device, B * H_KV * row_blocks) if fuse else lse2  # unused placeholder unless fused
    # Strides of dim 1 of the paged pool (page_size) and dim 2 (H_kv) swap roles with the contiguous cache.
    k_strides = (k_cache.stride(0), k_cache.stride(2), k_cache.stride(1), k_cache.stride(3)) if paged else k_cache.stride()
    v_strides = (v_cache.stride(0), v_cache.stride(2), v_cache.stride(1), v_cache.stride(3)) if paged else v_cache.stride()
    _split_kernel[(num_splits, B * H_KV, row_blocks)](
        q, k_cache, v_cache, cache_seqlens, block_table, o_parts, lse2_parts, o, lse2, locks,
        q.stride(), k_strides, v_strides, block_table.stride(0) if paged else 0,
        (o_parts.stride(), lse2_parts.stride()), o.stride(),
        H_KV, group, N_Q, num_splits, scale * LOG2E,  # scale * log2(e): exp -> exp2
        D_HEAD=D, BLOCK_D=block_d, BLOCK_M=block_m, BLOCK_N=block_n, PAGED=paged, PAGE_SIZE=page_size if paged else 1,
        UPCAST=INTERPRET, DOT_PRECISION=dot_precision(q.dtype), FUSE=fuse, num_warps=warps, num_stages=stages,
    )
    if num_splits > 1 and not fuse:
        _combine_into(o_parts, lse2_parts, o, lse2)
    if return_lse:
        return o, lse2 * LN2  # log2 units -> natural log
    return o
