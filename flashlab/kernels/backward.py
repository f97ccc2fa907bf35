"""FlashAttention-2 backward (Dao 2023, Algorithm 2 and §3.1) in Triton: three kernels.

    preprocess   D_i = rowsum(dO_i * O_i)                                     (Alg. 2 line 4)
    dK, dV       one program per key block j (and K/V head), looping over query blocks i:
                     P_ij  = exp2(S_ij - L_i)       recomputed from the saved lse  (line 11)
                     dV_j += P_ij^T dO_i                                            (line 12)
                     dP_ij = dO_i V_j^T                                             (line 13)
                     dS_ij = P_ij * (dP_ij - D_i)                                   (line 14)
                     dK_j += dS_ij^T Q_i * scale                                    (line 16)
    dQ           one program per query block i, looping over key blocks j:
                     dQ_i += dS_ij K_j * scale                                      (line 15)

Two ways to get dQ. The paper's single loop (``deterministic=False`` here) adds each
dQ_i contribution to an fp32 buffer in HBM with an atomic add from the dK/dV program
(line 15 inside the key-block loop); floating-point addition is not associative and the
order in which programs arrive changes from run to run, so the bits of dQ do too.
The deterministic path (default) splits the work into a key-block pass (dK, dV) and a
query-block pass (dQ): S and P are recomputed twice, but no atomics are needed and every
program writes only its own rows, in a fixed order. For GQA, the dK/dV program of a K/V
head loops over the GROUP query heads that share it, so their contributions are summed
on chip, again without atomics.

Glossary: D = rowsum(dO * O) (= rowsum(P * dP)); L = lse in log2 units; dS = gradient
of the scores (打分的梯度).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import (
    AUTOTUNE_OPTIONS,
    INTERPRET,
    LOG2E,
    Candidate,
    configs,
    dot_precision,
    launch_options,
    pruner,
    sequence_bounds,
    strides_of,
    visible_range_tl,
    window_bounds,
)

# (BLOCK_M, BLOCK_N, warps, stages) candidates for sm_90. dK/dV programs own BLOCK_N keys and
# stream BLOCK_M query rows; dQ programs own BLOCK_M rows and stream BLOCK_N keys. The WIDE
# lists serve d = 256, whose tiles must be smaller to fit shared memory.
DKDV_CANDIDATES: list[Candidate] = [(32, 128, 4, 3), (64, 128, 8, 2), (32, 64, 4, 3), (64, 64, 4, 3)]
DKDV_WIDE_CANDIDATES: list[Candidate] = [(32, 64, 4, 2), (16, 64, 4, 2)]
DQ_CANDIDATES: list[Candidate] = [(128, 32, 4, 3), (128, 64, 8, 2), (64, 64, 4, 3), (64, 32, 4, 3)]
DQ_WIDE_CANDIDATES: list[Candidate] = [(64, 32, 4, 2), (32, 32, 4, 2)]
_DKDV_CONFIGS = configs(DKDV_CANDIDATES, DKDV_WIDE_CANDIDATES, interpret_config={"BLOCK_M": 16, "BLOCK_N": 16})
_DQ_CONFIGS = configs(DQ_CANDIDATES, DQ_WIDE_CANDIDATES, interpret_config={"BLOCK_M": 16, "BLOCK_N": 16})


@triton.jit
def _preprocess_kernel(O, DO, DELTA, o_strides, do_strides, H, N_Q,
                       D_HEAD: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr):
    """D_i = rowsum(dO_i * O_i) for BLOCK_M rows of one head; o_strides, do_strides: (batch, head, row, d)."""
    stride_oz, stride_oh, stride_om, stride_od = o_strides
    stride_dz, stride_dh, stride_dm, stride_dd = do_strides
    start_m = tl.program_id(0)
    off_zh = tl.program_id(1)
    off_z, off_h = off_zh // H, off_zh % H
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m[:, None] < N_Q) & (offs_d[None, :] < D_HEAD)
    o = tl.load(O + off_z * stride_oz + off_h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od, mask=mask, other=0.0)
    do = tl.load(DO + off_z * stride_dz + off_h * stride_dh + offs_m[:, None] * stride_dm + offs_d[None, :] * stride_dd, mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), axis=1)  # D_i = rowsum(dO_i * O_i)
    tl.store(DELTA + off_zh * N_Q + offs_m, delta, mask=offs_m < N_Q)


@triton.jit
def _dkdv_over_query_blocks(
    dk, dv, k, v, Q, DO, LSE, DELTA, DQ, stride_qm, stride_dm, stride_dqm, N_Q,
    offs_n, offs_d, lo, hi, qk_scale, scale, N_K, diag_lo, diag_hi,
    D_HEAD: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    MASKED: tl.constexpr, ATOMIC_DQ: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """Accumulate the contributions of query blocks [lo, hi) of one head to dK_j, dV_j (and, with
    ATOMIC_DQ, add each block's dS_ij K_j to dQ_i in HBM). Q, DO, LSE, DELTA, DQ point at this
    head's row 0. Works on transposed tiles (keys along rows) so dK_j, dV_j stay (BLOCK_N, BLOCK_D)."""
    offs_m = tl.arange(0, BLOCK_M)
    d_ok = offs_d < D_HEAD
    for start_m in range(lo, hi, BLOCK_M):
        m = start_m + offs_m  # (BLOCK_M,) query rows
        if MASKED or BLOCK_D != D_HEAD:
            row_ok = m < N_Q
            q_t = tl.load(Q + m[None, :] * stride_qm + offs_d[:, None], mask=row_ok[None, :] & d_ok[:, None], other=0.0)  # Q_i^T
            do = tl.load(DO + m[:, None] * stride_dm + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        else:
            q_t = tl.load(Q + m[None, :] * stride_qm + offs_d[:, None])  # (BLOCK_D, BLOCK_M)
            do = tl.load(DO + m[:, None] * stride_dm + offs_d[None, :])  # (BLOCK_M, BLOCK_D)
        if MASKED:
            lse = tl.load(LSE + m, mask=m < N_Q, other=0.0)
            delta = tl.load(DELTA + m, mask=m < N_Q, other=0.0)
            lse = tl.where(lse == float("-inf"), 0.0, lse)  # a row that saw no key: its P is masked to 0 below
        else:
            lse = tl.load(LSE + m)
            delta = tl.load(DELTA + m)
        if UPCAST:
            q_t = q_t.to(tl.float32)
            do = do.to(tl.float32)
        qk_t = tl.dot(k, q_t, input_precision=DOT_PRECISION)  # (Q_i K_j^T)^T (BLOCK_N, BLOCK_M)
        p_t = tl.math.exp2(qk_t * qk_scale - lse[None, :])  # P_ij^T = exp2(S_ij - L_i): recomputed (line 11)
        if MASKED:
            diag = offs_n[:, None] - m[None, :]  # j - i
            visible = (m[None, :] < N_Q) & (offs_n[:, None] < N_K) & (diag >= diag_lo) & (diag <= diag_hi)
            p_t = tl.where(visible, p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv, input_precision=DOT_PRECISION)  # dV_j += P_ij^T dO_i (line 12)
        dp_t = tl.dot(v, tl.trans(do), input_precision=DOT_PRECISION)  # dP_ij^T = V_j dO_i^T (line 13)
        ds_t = p_t * (dp_t - delta[None, :])  # dS_ij^T = P^T * (dP^T - D_i) (line 14)
        dk = tl.dot(ds_t.to(q_t.dtype), tl.trans(q_t), dk, input_precision=DOT_PRECISION)  # dK_j += dS^T Q_i (line 16)
        if ATOMIC_DQ:  # line 15 as the paper writes it: dQ_i += dS_ij K_j, added to HBM atomically
            dq = tl.dot(tl.trans(ds_t.to(k.dtype)), k, input_precision=DOT_PRECISION)
            tl.atomic_add(DQ + m[:, None] * stride_dqm + offs_d[None, :], dq * scale,
                          mask=(m[:, None] < N_Q) & d_ok[None, :], sem="relaxed")
    return dk, dv


@triton.autotune(configs=_DKDV_CONFIGS,
                 key=["N_Q", "N_K", "BLOCK_D", "CAUSAL", "WINDOW", "VARLEN", "ATOMIC_DQ", "DOT_PRECISION", "GROUP"],
                 prune_configs_by={"early_config_prune": pruner(DKDV_WIDE_CANDIDATES)}, **AUTOTUNE_OPTIONS,
                 restore_value=["DQ"])  # tuning runs add into DQ: give the real run zeros back
@triton.jit
def _dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV, DQ, CU_Q, CU_K,
    strides,  # (batch, head, row) strides of Q, K, V, DO, DK, DV, DQ, then (batch, head) of LSE and DELTA
    H, GROUP, N_Q, N_K, qk_scale, scale,
    band,  # (left, right): row i sees key j iff -left <= j - i - (N_K - N_Q) <= right (window_bounds)
    D_HEAD: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
    VARLEN: tl.constexpr, ATOMIC_DQ: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Grid (key blocks, Z * H_kv): dK_j and dV_j of one key block of one K/V head. CAUSAL and
    WINDOW are folded into ``band`` by the host; they only key the autotuner."""
    q_strides, k_strides, v_strides, do_strides, dk_strides, dv_strides, dq_strides, lse_strides = strides
    stride_qz, stride_qh, stride_qm = q_strides
    stride_kz, stride_kh, stride_kn = k_strides
    stride_vz, stride_vh, stride_vn = v_strides
    stride_dz, stride_dh, stride_dm = do_strides
    stride_dkz, stride_dkh, stride_dkn = dk_strides
    stride_dvz, stride_dvh, stride_dvn = dv_strides
    stride_dqz, stride_dqh, stride_dqm = dq_strides
    stride_lz, stride_lh = lse_strides
    win_left, win_right = band
    start_n = tl.program_id(0)
    off_zhkv = tl.program_id(1)
    H_KV = H // GROUP
    off_z, off_hkv = off_zhkv // H_KV, off_zhkv % H_KV
    q_start, k_start, N_Q, N_K = sequence_bounds(CU_Q, CU_K, off_z, N_Q, N_K, VARLEN)  # varlen: this sequence
    if start_n * BLOCK_N < N_K:
        causal_offset = N_K - N_Q
        diag_lo = causal_offset - win_left  # row i sees key j iff diag_lo <= j - i <= diag_hi
        diag_hi = causal_offset + win_right
        offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        kv_mask = (offs_n[:, None] < N_K) & (offs_d[None, :] < D_HEAD)
        k_rows = k_start + offs_n[:, None]
        k = tl.load(K + off_z * stride_kz + off_hkv * stride_kh + k_rows * stride_kn + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(V + off_z * stride_vz + off_hkv * stride_vh + k_rows * stride_vn + offs_d[None, :], mask=kv_mask, other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)

        # Query blocks that see this key block (_common.visible_range, keys fixed): masked
        # [q_lo, in_lo) and [in_hi, q_hi) (diagonal, window edges, ragged tail), unmasked [in_lo, in_hi).
        q_lo, in_lo, in_hi, q_hi = visible_range_tl(start_n * BLOCK_N, BLOCK_N, N_K, -diag_hi, -diag_lo, N_Q, BLOCK_M)
        if start_n * BLOCK_N + BLOCK_N > N_K:
            # A ragged key block: its padding keys (K = 0, so S = 0) must be masked in every query
            # block, or P = exp2(0 - L_i) can overflow and the atomic dQ_i += dS K_j gets inf * 0.
            in_lo = q_hi
            in_hi = q_hi
        for g in range(0, GROUP):  # GQA: the query heads that share this K/V head
            off_h = off_hkv * GROUP + g
            q_base = Q + off_z * stride_qz + off_h * stride_qh + q_start * stride_qm
            do_base = DO + off_z * stride_dz + off_h * stride_dh + q_start * stride_dm
            dq_base = DQ + off_z * stride_dqz + off_h * stride_dqh + q_start * stride_dqm
            lse_base = LSE + off_z * stride_lz + off_h * stride_lh + q_start
            delta_base = DELTA + off_z * stride_lz + off_h * stride_lh + q_start
            dk, dv = _dkdv_over_query_blocks(
                dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, stride_qm, stride_dm, stride_dqm, N_Q,
                offs_n, offs_d, q_lo, in_lo, qk_scale, scale, N_K, diag_lo, diag_hi,
                D_HEAD, BLOCK_D, BLOCK_M, True, ATOMIC_DQ, UPCAST, DOT_PRECISION)
            dk, dv = _dkdv_over_query_blocks(
                dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, stride_qm, stride_dm, stride_dqm, N_Q,
                offs_n, offs_d, in_lo, in_hi, qk_scale, scale, N_K, diag_lo, diag_hi,
                D_HEAD, BLOCK_D, BLOCK_M, False, ATOMIC_DQ, UPCAST, DOT_PRECISION)
            dk, dv = _dkdv_over_query_blocks(
                dk, dv, k, v, q_base, do_base, lse_base, delta_base, dq_base, stride_qm, stride_dm, stride_dqm, N_Q,
                offs_n, offs_d, in_hi, q_hi, qk_scale, scale, N_K, diag_lo, diag_hi,
                D_HEAD, BLOCK_D, BLOCK_M, True, ATOMIC_DQ, UPCAST, DOT_PRECISION)
        dk = dk * scale  # the scale of S = scale * Q K^T, applied once (line 16)
        tl.store(DK + off_z * stride_dkz + off_hkv * stride_dkh + k_rows * stride_dkn + offs_d[None, :], dk.to(DK.dtype.element_ty), mask=kv_mask)
        tl.store(DV + off_z * stride_dvz + off_hkv * stride_dvh + k_rows * stride_dvn + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _dq_over_key_blocks(dq, q, do, lse, delta, K, V, stride_kn, stride_vn, offs_m, offs_d, lo, hi, qk_scale, N_K,
                        diag_lo, diag_hi, D_HEAD: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                        MASKED: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """Accumulate the contributions of key blocks [lo, hi) to dQ_i."""
    offs_n = tl.arange(0, BLOCK_N)
    d_ok = offs_d < D_HEAD
    for start_n in range(lo, hi, BLOCK_N):
        n = start_n + offs_n
        if MASKED or BLOCK_D != D_HEAD:
            k_t = tl.load(K + n[None, :] * stride_kn + offs_d[:, None], mask=(n[None, :] < N_K) & d_ok[:, None], other=0.0)  # K_j^T
            v_t = tl.load(V + n[None, :] * stride_vn + offs_d[:, None], mask=(n[None, :] < N_K) & d_ok[:, None], other=0.0)  # V_j^T
        else:
            k_t = tl.load(K + n[None, :] * stride_kn + offs_d[:, None])  # (BLOCK_D, BLOCK_N)
            v_t = tl.load(V + n[None, :] * stride_vn + offs_d[:, None])
        if UPCAST:
            k_t = k_t.to(tl.float32)
            v_t = v_t.to(tl.float32)
        qk = tl.dot(q, k_t, input_precision=DOT_PRECISION)  # Q_i K_j^T (BLOCK_M, BLOCK_N)
        dp = tl.dot(do, v_t, input_precision=DOT_PRECISION)  # dP_ij = dO_i V_j^T (line 13)
        p = tl.math.exp2(qk * qk_scale - lse[:, None])  # P_ij = exp2(S_ij - L_i) recomputed (line 11)
        if MASKED:
            diag = n[None, :] - offs_m[:, None]  # j - i
            visible = (n[None, :] < N_K) & (diag >= diag_lo) & (diag <= diag_hi)
            p = tl.where(visible, p, 0.0)
        ds = p * (dp - delta[:, None])  # dS_ij = P_ij * (dP_ij - D_i) (line 14)
        dq = tl.dot(ds.to(k_t.dtype), tl.trans(k_t), dq, input_precision=DOT_PRECISION)  # dQ_i += dS_ij K_j (line 15)
    return dq


@triton.autotune(configs=_DQ_CONFIGS, key=["N_Q", "N_K", "BLOCK_D", "CAUSAL", "WINDOW", "VARLEN", "DOT_PRECISION"],
                 prune_configs_by={"early_config_prune": pruner(DQ_WIDE_CANDIDATES)}, **AUTOTUNE_OPTIONS)
@triton.jit
def _dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ, CU_Q, CU_K,
    strides,  # (batch, head, row) strides of Q, K, V, DO, DQ, then (batch, head) of LSE and DELTA
    H, GROUP, N_Q, N_K, qk_scale, scale, band,  # as in _dkdv_kernel
    D_HEAD: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, WINDOW: tl.constexpr,
    VARLEN: tl.constexpr, UPCAST: tl.constexpr, DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Grid (query blocks, Z * H): dQ_i of one query block of one head, visiting the key blocks
    the forward pass visited."""
    q_strides, k_strides, v_strides, do_strides, dq_strides, lse_strides = strides
    stride_qz, stride_qh, stride_qm = q_strides
    stride_kz, stride_kh, stride_kn = k_strides
    stride_vz, stride_vh, stride_vn = v_strides
    stride_dz, stride_dh, stride_dm = do_strides
    stride_dqz, stride_dqh, stride_dqm = dq_strides
    stride_lz, stride_lh = lse_strides
    win_left, win_right = band
    start_m = tl.program_id(0)
    off_zh = tl.program_id(1)
    off_z, off_h = off_zh // H, off_zh % H
    off_hkv = off_h // GROUP
    q_start, k_start, N_Q, N_K = sequence_bounds(CU_Q, CU_K, off_z, N_Q, N_K, VARLEN)  # varlen: this sequence
    if start_m * BLOCK_M < N_Q:
        causal_offset = N_K - N_Q
        diag_lo = causal_offset - win_left
        diag_hi = causal_offset + win_right
        offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        row_ok = offs_m < N_Q
        mask = row_ok[:, None] & (offs_d[None, :] < D_HEAD)
        rows = q_start + offs_m[:, None]
        q = tl.load(Q + off_z * stride_qz + off_h * stride_qh + rows * stride_qm + offs_d[None, :], mask=mask, other=0.0)
        do = tl.load(DO + off_z * stride_dz + off_h * stride_dh + rows * stride_dm + offs_d[None, :], mask=mask, other=0.0)
        lse_base = off_z * stride_lz + off_h * stride_lh + q_start
        lse = tl.load(LSE + lse_base + offs_m, mask=row_ok, other=0.0)
        delta = tl.load(DELTA + lse_base + offs_m, mask=row_ok, other=0.0)
        # a row that saw no key has lse = -inf; its P is 0 everywhere (masked), keep exp2 finite
        lse = tl.where(lse == float("-inf"), 0.0, lse)
        if UPCAST:
            q = q.to(tl.float32)
            do = do.to(tl.float32)
        dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        k_base = K + off_z * stride_kz + off_hkv * stride_kh + k_start * stride_kn
        v_base = V + off_z * stride_vz + off_hkv * stride_vh + k_start * stride_vn
        # the same key ranges as the forward pass
        k_lo, full_lo, full_hi, k_hi = visible_range_tl(start_m * BLOCK_M, BLOCK_M, N_Q, diag_lo, diag_hi, N_K, BLOCK_N)
        if WINDOW:
            dq = _dq_over_key_blocks(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d,
                                     k_lo, full_lo, qk_scale, N_K, diag_lo, diag_hi,
                                     D_HEAD, BLOCK_D, BLOCK_N, True, UPCAST, DOT_PRECISION)
        dq = _dq_over_key_blocks(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d,
                                 full_lo, full_hi, qk_scale, N_K, diag_lo, diag_hi,
                                 D_HEAD, BLOCK_D, BLOCK_N, False, UPCAST, DOT_PRECISION)
        dq = _dq_over_key_blocks(dq, q, do, lse, delta, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d,
                                 full_hi, k_hi, qk_scale, N_K, diag_lo, diag_hi,
                                 D_HEAD, BLOCK_D, BLOCK_N, True, UPCAST, DOT_PRECISION)
        dq = dq * scale
        tl.store(DQ + off_z * stride_dqz + off_h * stride_dqh + rows * stride_dqm + offs_d[None, :], dq.to(DQ.dtype.element_ty), mask=mask)


def backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
             lse2: torch.Tensor, causal: bool, scale: float,
             configs_: tuple[Candidate, Candidate] | None = None, *, window: tuple[int, int] | None = None,
             deterministic: bool = True,
             cu_seqlens: tuple[torch.Tensor, torch.Tensor, int, int] | None = None,
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) from dO. All tensors have a unit stride on the last axis
    (the caller makes them so). lse2 is the forward's log2-unit log-sum-exp.

    - ``configs_`` = (dK/dV config, dQ config) bypasses autotuning (tests use it);
    - ``window``, ``cu_seqlens``: as in :func:`flashlab.kernels.forward.forward`;
    - ``deterministic=False``: dQ by atomic adds inside the dK/dV kernel (the paper's single loop)."""
    Z, H, N_Q, D = q.shape
    H_KV, N_K = k.shape[1], k.shape[2]
    block_d = max(16, triton.next_power_of_2(D))
    delta = torch.empty_like(lse2)
    # D = rowsum(dO * O); for varlen lse2 is (H, total_q) and the packed view (1, H, total_q, d) fits as is
    _preprocess_kernel[(triton.cdiv(N_Q, 64), Z * H)](
        o, do, delta, o.stride(), do.stride(), H, N_Q, D_HEAD=D, BLOCK_D=block_d, BLOCK_M=64
    )
    varlen = cu_seqlens is not None
    if varlen:
        cu_q, cu_k, n_q, n_k = cu_seqlens
        seqs = cu_q.numel() - 1
        lse_strides = (0, lse2.stride(0))
    else:
        cu_q = cu_k = lse2  # unused placeholders
        seqs, n_q, n_k = Z, N_Q, N_K
        lse_strides = lse2.stride()[:2]
    rows = lambda *ts: tuple(strides_of(t, varlen, dims=3) for t in ts)  # noqa: E731  (batch, head, row) of each
    band = window_bounds(causal, window, n_q, n_k)
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    atomic = not deterministic
    # fp32 accumulator for the atomic adds (a one-element placeholder when unused)
    dq_acc = torch.zeros(q.shape if atomic else (1, 1, 1, 1), device=q.device, dtype=torch.float32)
    dkdv_config, dq_config = configs_ if configs_ is not None else (None, None)
    dkdv_kernel = _dkdv_kernel if dkdv_config is None else _dkdv_kernel.fn
    dq_kernel = _dq_kernel if dq_config is None else _dq_kernel.fn
    flags = dict(D_HEAD=D, BLOCK_D=block_d, CAUSAL=causal, WINDOW=window is not None, VARLEN=varlen,
                 UPCAST=INTERPRET, DOT_PRECISION=dot_precision(q.dtype))
    qk_scale = scale * LOG2E
    dkdv_kernel[lambda meta: (triton.cdiv(n_k, meta["BLOCK_N"]), seqs * H_KV)](
        q, k, v, do, lse2, delta, dk, dv, dq_acc, cu_q, cu_k, (*rows(q, k, v, do, dk, dv, dq_acc), lse_strides),
        H, H // H_KV, n_q, n_k, qk_scale, scale, band, ATOMIC_DQ=atomic, **flags, **launch_options(dkdv_config),
    )
    if atomic:
        return dq_acc.to(q.dtype), dk, dv
    dq = torch.empty_like(q)
    dq_kernel[lambda meta: (triton.cdiv(n_q, meta["BLOCK_M"]), seqs * H)](
        q, k, v, do, lse2, delta, dq, cu_q, cu_k, (*rows(q, k, v, do, dq), lse_strides),
        H, H // H_KV, n_q, n_k, qk_scale, scale, band, **flags, **launch_options(dq_config),
    )
    return dq, dk, dv
