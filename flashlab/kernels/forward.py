"""FlashAttention-2 forward (Dao 2023, Algorithm 1 and §3.1-3.2) in Triton.

One program computes one block of BLOCK_M query rows of one (batch, head) and streams the key
blocks through it, keeping the running max m, sum l and unnormalised output on chip:

    S_ij = Q_i K_j^T · scale · log2(e);  m = max(m, rowmax S_ij);  P_ij = exp2(S_ij - m)
    l = exp2(m_old - m) · l + rowsum P_ij;  O = exp2(m_old - m) · O + P_ij V_j     (lines 8-10)
    O_i = O / l;  lse_i = m + log2(l)                                               (lines 12-13)

The grid is (query blocks, batch x heads), FlashAttention-2's parallelism over the sequence
(§3.2). Causal masks and sliding windows skip key blocks no row sees; GQA maps query heads to
shared K/V heads; varlen reads each packed sequence's bounds from cu_seqlens.

Glossary: BLOCK_M = B_r (query rows per program, 行块); BLOCK_N = B_c (keys per step, 列块);
m = running max (当前最大值); l = running sum (分母); acc = unnormalised O (累加器);
lse = log-sum-exp (对数和指数), here in log2 units.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ._common import (
    AUTOTUNE_OPTIONS,
    INTERPRET,
    LOG2E,
    Candidate,
    configs,
    dot_precision,
    has_tma,
    launch_options,
    load_kv_tiles,
    pruner,
    sequence_bounds,
    strides_of,
    visible_range_tl,
    window_bounds,
)

# (BLOCK_M, BLOCK_N, warps, stages) candidates for sm_90; autotune picks per shape.
CANDIDATES: list[Candidate] = [(128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 4, 3), (128, 64, 4, 4),
                               (128, 128, 4, 3), (128, 128, 8, 2), (64, 64, 4, 4)]
WIDE_CANDIDATES: list[Candidate] = [(64, 32, 4, 2), (64, 64, 8, 2)]  # d = 256: Q, K, V tiles of 256 columns
# tma=None reads K and V through TMA from this many keys on. Below it a program has few key
# tiles to pipeline, and encoding two descriptors per launch costs more than TMA saves
# (chapter 6 shows the measurements).
TMA_MIN_KEYS = 1024


def _set_descriptor_block_shape(nargs: dict) -> None:
    """Autotune pre-hook: a TMA descriptor's block shape follows the configuration's BLOCK_N."""
    for name in ("DESC_K", "DESC_V"):
        if isinstance(nargs[name], TensorDescriptor):
            nargs[name].block_shape = [nargs["BLOCK_N"], nargs["BLOCK_D"]]


_CONFIGS = configs(CANDIDATES, WIDE_CANDIDATES, interpret_config={"BLOCK_M": 16, "BLOCK_N": 16},
                   pre_hook=_set_descriptor_block_shape)


@triton.jit
def online_softmax_step(acc, l_i, m_i, qk, v, qk_scale, MASKED: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Fold one block into the running state (FA2 Alg. 1 lines 9-10), in log2 units.

    qk: raw scores Q_i K_j^T (BLOCK_M, BLOCK_N), masked entries already -inf; v: V_j
    (BLOCK_N, BLOCK_D). Shared by the forward kernel and the decoding kernel."""
    # S_ij = qk * qk_scale in log2 units; the scale is applied inside the max and the
    # exponent (one fused multiply-add per score) rather than as a separate pass.
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)  # m_new = max(m, rowmax(S_ij))
    m_ref = m_new
    if MASKED:
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen nothing: exp2 -> 0, not NaN
    alpha = tl.math.exp2(m_i - m_ref)  # exp2(m - m_new): the rescale factor
    p = tl.math.exp2(qk * qk_scale - m_ref[:, None])  # P_ij = exp2(S_ij - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)  # l = alpha l + rowsum(P_ij)
    acc = acc * alpha[:, None]  # O = alpha O ...
    acc = tl.dot(p.to(v.dtype), v, acc, input_precision=DOT_PRECISION)  # ... + P_ij V_j
    return acc, l_i, m_new


@triton.jit
def _attend_block(
    acc, l_i, m_i, q,  # running state (BLOCK_M, BLOCK_D), (BLOCK_M,), (BLOCK_M,); the query tile
    k_ptrs, v_ptrs, desc_k, desc_v, kv_row0, start_n,
    offs_m, offs_n, d_ok, qk_scale, N_K, diag_lo, diag_hi,
    D_HEAD: tl.constexpr, BLOCK_D: tl.constexpr,
    MASKED: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, TMA: tl.constexpr,
):
    """Fold key block j = [start_n, start_n + BLOCK_N) into (acc, l_i, m_i). TMA loads K_j, V_j
    through tensor descriptors (Hopper's bulk copy engine) from row kv_row0 + start_n of the
    (rows, d) view; rows past N_K belong to the next head (or are zero-filled past the tensor's
    end) and are masked out of S like any ragged tail."""
    n = start_n + offs_n  # (BLOCK_N,) key indices
    if TMA:
        k = desc_k.load([kv_row0 + start_n, 0]).T  # (BLOCK_D, BLOCK_N) = K_j^T
        v = desc_v.load([kv_row0 + start_n, 0])  # (BLOCK_N, BLOCK_D) = V_j
        if MASKED:  # rows past N_K hold the next head's values: zero them, so even an inf there adds 0 * 0
            v = tl.where((n < N_K)[:, None], v, 0.0)
        if UPCAST:  # the interpreter computes bf16 dots wrongly: work in fp32 there
            k = k.to(tl.float32)
            v = v.to(tl.float32)
    else:  # K_j^T (BLOCK_D, BLOCK_N), V_j (BLOCK_N, BLOCK_D), masked where needed
        k, v = load_kv_tiles(k_ptrs, v_ptrs, n < N_K, d_ok, MASKED, BLOCK_D != D_HEAD, UPCAST)
    qk = tl.dot(q, k, input_precision=DOT_PRECISION)  # Q_i K_j^T (BLOCK_M, BLOCK_N), unscaled (line 8)
    if MASKED:
        diag = n[None, :] - offs_m[:, None]  # j - i
        visible = (n[None, :] < N_K) & (diag >= diag_lo) & (diag <= diag_hi)
        qk = tl.where(visible, qk, float("-inf"))
    return online_softmax_step(acc, l_i, m_i, qk, v, qk_scale, MASKED, DOT_PRECISION)  # lines 9-10


@triton.jit
def _attend(
    acc, l_i, m_i, q,  # running state (BLOCK_M, BLOCK_D), (BLOCK_M,), (BLOCK_M,); the query tile
    k_ptrs, v_ptrs, stride_kn, stride_vn, desc_k, desc_v, kv_row0,
    offs_m, offs_n, offs_d, lo, hi, qk_scale, N_K, diag_lo, diag_hi,
    D_HEAD: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, TMA: tl.constexpr,
):
    """Fold key blocks [lo, hi) into (acc, l_i, m_i). MASKED blocks check key bounds and the
    band diag_lo <= j - i <= diag_hi (causal: diag_hi = N_K - N_Q); unmasked ones are known
    to be fully visible."""
    k_ptrs += lo * stride_kn
    v_ptrs += lo * stride_vn
    d_ok = offs_d < D_HEAD
    for start_n in tl.range(lo, hi, BLOCK_N):
        acc, l_i, m_i = _attend_block(acc, l_i, m_i, q, k_ptrs, v_ptrs, desc_k, desc_v, kv_row0, start_n,
                                      offs_m, offs_n, d_ok, qk_scale, N_K, diag_lo, diag_hi,
                                      D_HEAD, BLOCK_D, MASKED, UPCAST, DOT_PRECISION, TMA)
        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn
    return acc, l_i, m_i


@triton.jit
def _forward_block(
    start_m, off_z, off_h, off_hkv, Q, K, V, O, LSE, DESC_K, DESC_V, kv_row0,
    q_strides, k_strides, v_strides, o_strides, lse_strides,  # as in _forward_kernel
    bounds, qk_scale, band,  # bounds: (q_start, k_start, N_Q, N_K) of this sequence (sequence_bounds)
    D_HEAD: tl.constexpr, BLOCK_D: tl.constexpr, WINDOW: tl.constexpr, UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr, TMA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Query block ``start_m`` of head (off_z, off_h): FA2 Algorithm 1, lines 4-13.
    q_start/k_start: first row of this sequence (varlen; 0 otherwise)."""
    q_start, k_start, N_Q, N_K = bounds
    stride_qz, stride_qh, stride_qm, stride_qd = q_strides
    stride_kz, stride_kh, stride_kn, stride_kd = k_strides
    stride_vz, stride_vh, stride_vn, stride_vd = v_strides
    stride_oz, stride_oh, stride_om, stride_od = o_strides
    stride_lz, stride_lh = lse_strides
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)  # row indices within the sequence
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)  # head dim padded to a power of two; loads masked to D_HEAD
    d_ok = offs_d < D_HEAD
    row_ok = offs_m < N_Q

    q_ptrs = Q + off_z * stride_qz + off_h * stride_qh + (q_start + offs_m[:, None]) * stride_qm + offs_d[None, :] * stride_qd
    k_ptrs = K + off_z * stride_kz + off_hkv * stride_kh + (k_start + offs_n[None, :]) * stride_kn + offs_d[:, None] * stride_kd
    v_ptrs = V + off_z * stride_vz + off_hkv * stride_vh + (k_start + offs_n[:, None]) * stride_vn + offs_d[None, :] * stride_vd

    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # Q_i stays on chip (Alg. 1 line 4)
    if UPCAST:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # line 5: m = -inf
    l_i = tl.zeros([BLOCK_M], tl.float32)  # line 5: l = 0
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)  # line 5: O = 0

    # Which key blocks to visit (_common.visible_range): row i sees key j iff
    # diag_lo <= j - i <= diag_hi (causal: right = 0; no mask: both sides unbounded).
    win_left, win_right = band
    causal_offset = N_K - N_Q  # bottom-right alignment
    diag_lo = causal_offset - win_left
    diag_hi = causal_offset + win_right
    k_lo, full_lo, full_hi, k_hi = visible_range_tl(start_m * BLOCK_M, BLOCK_M, N_Q, diag_lo, diag_hi, N_K, BLOCK_N)
    if WINDOW:  # a sliding window's left edge: partly visible blocks before the interior
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, DESC_K, DESC_V, kv_row0,
                                offs_m, offs_n, offs_d, k_lo, full_lo, qk_scale, N_K, diag_lo, diag_hi,
                                D_HEAD, BLOCK_D, BLOCK_N, True, UPCAST, DOT_PRECISION, TMA)
    acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, DESC_K, DESC_V, kv_row0,
                            offs_m, offs_n, offs_d, full_lo, full_hi, qk_scale, N_K, diag_lo, diag_hi,
                            D_HEAD, BLOCK_D, BLOCK_N, False, UPCAST, DOT_PRECISION, TMA)
    acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn, DESC_K, DESC_V, kv_row0,
                            offs_m, offs_n, offs_d, full_hi, k_hi, qk_scale, N_K, diag_lo, diag_hi,
                            D_HEAD, BLOCK_D, BLOCK_N, True, UPCAST, DOT_PRECISION, TMA)

    # Rows that saw no key (causal with N_Q > N_K, or a window) have l = 0: output 0, lse = -inf.
    seen = l_i > 0
    l_safe = tl.where(seen, l_i, 1.0)
    acc = acc / l_safe[:, None]  # line 12: O = diag(l)^-1 O, once
    lse = tl.where(seen, m_i + tl.math.log2(l_safe), float("-inf"))  # line 13: L = m + log2(l)
    tl.store(LSE + off_z * stride_lz + off_h * stride_lh + q_start + offs_m, lse, mask=row_ok)
    o_ptrs = O + off_z * stride_oz + off_h * stride_oh + (q_start + offs_m[:, None]) * stride_om + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


@triton.autotune(configs=_CONFIGS, key=["N_Q", "N_K", "BLOCK_D", "CAUSAL", "WINDOW", "VARLEN", "DOT_PRECISION", "TMA"],
                 prune_configs_by={"early_config_prune": pruner(WIDE_CANDIDATES)}, **AUTOTUNE_OPTIONS)
@triton.jit
def _forward_kernel(
    Q, K, V, O, LSE,  # O like Q; LSE fp32, log2 units: (Z, H, N_Q), or (H, total_q) for varlen
    CU_Q, CU_K,  # varlen: (Z + 1,) int32 cumulative sequence starts; unused otherwise
    DESC_K, DESC_V,  # TMA: tensor descriptors of K and V as (Z * H_kv * N_K, d); unused otherwise
    q_strides, k_strides, v_strides, o_strides,  # (batch, head, row, d) strides; batch 0 for varlen
    lse_strides,  # (batch, head)
    H, GROUP, N_Q, N_K, qk_scale,  # qk_scale = scale * log2(e)
    band,  # (left, right): row i sees key j iff -left <= j - i - (N_K - N_Q) <= right (window_bounds)
    D_HEAD: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
    VARLEN: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr, TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Grid (query blocks, Z * H): FlashAttention-2's partitioning (§3.2). CAUSAL is folded
    into ``band`` by the host; it only keys the autotuner."""
    off_zh = tl.program_id(1)
    off_z = off_zh // H  # batch index (the sequence index for varlen)
    off_h = off_zh % H
    off_hkv = off_h // GROUP  # GQA: GROUP query heads share one K/V head
    # packed sequences (VARLEN): this sequence's first rows and lengths, from cu_seqlens
    bounds = sequence_bounds(CU_Q, CU_K, off_z, N_Q, N_K, VARLEN)
    q_start, k_start, N_Q, N_K = bounds
    kv_row0 = (off_z * (H // GROUP) + off_hkv) * N_K  # TMA: this K/V head's first row
    start_m = tl.program_id(0)
    if start_m * BLOCK_M < N_Q:  # varlen: programs past a short sequence's end do nothing
        _forward_block(start_m, off_z, off_h, off_hkv, Q, K, V, O, LSE, DESC_K, DESC_V, kv_row0,
                       q_strides, k_strides, v_strides, o_strides, lse_strides, bounds, qk_scale, band,
                       D_HEAD, BLOCK_D, WINDOW, UPCAST, DOT_PRECISION, TMA, BLOCK_M, BLOCK_N)


def tma_eligible(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether K and V can be read through 2-D tensor descriptors: a Hopper-or-newer GPU (or
    Triton's interpreter, which emulates them), 16-bit K and V, contiguous, and a power-of-two
    head dimension >= 16 (rows of 16-byte multiples, no padded columns). float32, the teaching
    path, keeps pointer loads: its tiles are twice as large, two of its autotuning candidates
    with 128-key tiles fail through TMA (tests/test_kernels.py, test_every_autotune_candidate),
    and its speed is not the point of it."""
    d = k.shape[-1]
    return (has_tma(k) and k.dtype in (torch.float16, torch.bfloat16) and k.is_contiguous() and v.is_contiguous()
            and d >= 16 and d & (d - 1) == 0)


def kernel_arguments(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
                     config: Candidate | None, window: tuple[int, int] | None, tma: bool | None,
                     cu_seqlens: tuple[torch.Tensor, torch.Tensor, int, int] | None) -> tuple[tuple, dict, tuple]:
    """What :func:`forward` launches ``_forward_kernel`` with: (positional arguments, constexpr
    keywords, (query-block bound n_q, programs along the grid's second axis, o, lse2)). Also
    used by the lab's kernel variants, which launch kernels of the same signature."""
    Z, H, N_Q, D = q.shape
    H_KV, N_K = k.shape[1], k.shape[2]
    varlen = cu_seqlens is not None
    o = torch.empty_like(q)
    block_d = max(16, triton.next_power_of_2(D))
    if varlen:
        cu_q, cu_k, n_q, n_k = cu_seqlens  # bounds for the grid and the autotuner's key; the kernel reads the real ones
        seqs = cu_q.numel() - 1
        lse2 = torch.empty((H, N_Q), device=q.device, dtype=torch.float32)
        lse_strides = (0, lse2.stride(0))
    else:
        cu_q = cu_k = q  # unused placeholders
        seqs, n_q, n_k = Z, N_Q, N_K
        lse2 = torch.empty((Z, H, N_Q), device=q.device, dtype=torch.float32)
        lse_strides = lse2.stride()[:2]
    eligible = not varlen and tma_eligible(q, k, v)
    if tma and not eligible:
        raise ValueError("tma=True needs a Hopper GPU, fp16 or bf16, contiguous K and V, a power-of-two head dimension "
                         f"and no varlen; got device {k.device}, dtype {k.dtype}, "
                         f"contiguous {k.is_contiguous() and v.is_contiguous()}, d = {D}")
    use_tma = (eligible and n_k >= TMA_MIN_KEYS) if tma is None else bool(tma)
    desc_k, desc_v = k, v  # unused placeholders unless TMA
    if use_tma:  # 2-D views (Z * H_kv * N_k, d); the block shape is set per configuration
        bn = config[1] if config is not None else 16
        desc_k = TensorDescriptor.from_tensor(k.view(-1, D), [bn, block_d])
        desc_v = TensorDescriptor.from_tensor(v.view(-1, D), [bn, block_d])
    args = (q, k, v, o, lse2, cu_q, cu_k, desc_k, desc_v,
            *(strides_of(t, varlen, dims=4) for t in (q, k, v, o)), lse_strides,
            H, H // H_KV, n_q, n_k, scale * LOG2E, window_bounds(causal, window, n_q, n_k))
    constexprs = dict(D_HEAD=D, BLOCK_D=block_d, CAUSAL=causal, WINDOW=window is not None, VARLEN=varlen,
                      UPCAST=INTERPRET, DOT_PRECISION=dot_precision(q.dtype), TMA=use_tma)
    return args, constexprs, (n_q, seqs * H, o, lse2)


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
            config: Candidate | None = None, *, window: tuple[int, int] | None = None, tma: bool | None = None,
            cu_seqlens: tuple[torch.Tensor, torch.Tensor, int, int] | None = None,
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward kernel. q (Z, H, N_q, d), k and v (Z, H_kv, N_k, d), checked by the caller.

    - ``config`` = (BLOCK_M, BLOCK_N, warps, stages) bypasses autotuning (tests, experiments);
    - ``window`` = (left, right) sliding window, -1 = unbounded (flash-attn's convention);
    - ``tma`` = load K and V through tensor descriptors (True: required; None, the default:
      when :func:`tma_eligible` and N_k >= TMA_MIN_KEYS; False: pointer loads);
    - ``cu_seqlens`` = (cu_q, cu_k, max_seqlen_q, max_seqlen_k) for packed varlen input: then q is
      (1, H, total_q, d) and k, v (1, H_kv, total_k, d) views of (total, heads, d) tensors.

    Returns o like q and lse2 float32, the row log-sum-exp in log2 units (lse2 = lse / ln 2):
    (Z, H, N_q), or (H, total_q) for varlen."""
    args, constexprs, (n_q, heads, o, lse2) = kernel_arguments(q, k, v, causal, scale, config, window, tma, cu_seqlens)
    kernel = _forward_kernel if config is None else _forward_kernel.fn
    kernel[lambda meta: (triton.cdiv(n_q, meta["BLOCK_M"]), heads)](*args, **constexprs, **launch_options(config))
    return o, lse2
