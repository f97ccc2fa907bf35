"""FlashAttention-2 forward kernel (Dao 2023, Algorithm 1) in Triton.

One program computes one block of BLOCK_M query rows of one (batch, head):

    for each key block j (K_j, V_j streamed from HBM):
        S_ij  = Q_i K_j^T * scale * log2(e)          scores in log2 units      (Alg. 1 line 8)
        m_new = max(m, rowmax(S_ij))                                            (line 9)
        P_ij  = exp2(S_ij - m_new)                                              (line 9)
        l     = exp2(m - m_new) * l + rowsum(P_ij)                              (line 9)
        O     = exp2(m - m_new) * O + P_ij V_j       unnormalised: no division   (line 10)
    O = O / l                                        divide once, at the end    (line 12)
    lse = m + log2(l)                                saved for the backward     (line 13)

Folding log2(e) into the scale turns every exp into the hardware's native exp2.
The grid is (query blocks, batch x heads): FlashAttention-2's parallelism over the
sequence (§3.2), so even one (batch, head) fills many SMs.

Glossary: BLOCK_M = B_r (query rows per program, 行块); BLOCK_N = B_c (keys per step,
列块); m = running max (当前最大值); l = running sum (分母); acc = unnormalised O (累加器);
lse = log-sum-exp (对数和指数), here in log2 units.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import INTERPRET, Candidate, configs, launch_options, pruner

# (BLOCK_M, BLOCK_N, warps, stages) candidates for sm_90; autotune picks per shape.
CANDIDATES: list[Candidate] = [(128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 4, 3), (128, 64, 4, 4),
                               (128, 128, 4, 3), (128, 128, 8, 2), (64, 64, 4, 4)]
WIDE_CANDIDATES: list[Candidate] = [(64, 32, 4, 2), (64, 64, 8, 2)]  # d = 256: Q, K, V tiles of 256 columns
_CONFIGS = configs(CANDIDATES, WIDE_CANDIDATES, interpret_config={"BLOCK_M": 16, "BLOCK_N": 16})


@triton.jit
def online_softmax_step(acc, l_i, m_i, qk, v, qk_scale, MASKED: tl.constexpr, IEEE: tl.constexpr):
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
    if IEEE:
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision="ieee")  # ... + P_ij V_j
    else:
        acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_new


@triton.jit
def _attend(
    acc, l_i, m_i, q,  # running state (BLOCK_M, BLOCK_D), (BLOCK_M,), (BLOCK_M,); the query tile
    k_ptrs, v_ptrs, stride_kn, stride_vn,
    offs_m, offs_n, offs_d, lo, hi, qk_scale, N_K, causal_offset,
    D_HEAD: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
):
    """Fold key blocks [lo, hi) into (acc, l_i, m_i). MASKED blocks check key bounds
    (and the causal diagonal); unmasked ones are known to be fully visible."""
    k_ptrs += lo * stride_kn
    v_ptrs += lo * stride_vn
    d_ok = offs_d < D_HEAD
    for start_n in range(lo, hi, BLOCK_N):
        n = start_n + offs_n  # (BLOCK_N,) key indices
        if MASKED:
            k = tl.load(k_ptrs, mask=(n[None, :] < N_K) & d_ok[:, None], other=0.0)  # (BLOCK_D, BLOCK_N) = K_j^T
            v = tl.load(v_ptrs, mask=(n[:, None] < N_K) & d_ok[None, :], other=0.0)  # (BLOCK_N, BLOCK_D)
        elif BLOCK_D != D_HEAD:
            k = tl.load(k_ptrs, mask=d_ok[:, None], other=0.0)
            v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        if UPCAST:  # the interpreter computes bf16 dots wrongly: work in fp32 there
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        if IEEE:
            qk = tl.dot(q, k, input_precision="ieee")  # Q_i K_j^T (BLOCK_M, BLOCK_N), unscaled
        else:
            qk = tl.dot(q, k)
        if MASKED:
            visible = n[None, :] < N_K
            if CAUSAL:
                visible = visible & (n[None, :] <= offs_m[:, None] + causal_offset)
            qk = tl.where(visible, qk, float("-inf"))
        acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, qk, v, qk_scale, MASKED, IEEE)
        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn
    return acc, l_i, m_i


@triton.autotune(configs=_CONFIGS, key=["N_Q", "N_K", "BLOCK_D", "CAUSAL", "IEEE"],
                 prune_configs_by={"early_config_prune": pruner(WIDE_CANDIDATES)})
@triton.jit
def _forward_kernel(
    Q, K, V, O, LSE,  # O (Z, H, N_Q, d) output; LSE (Z, H, N_Q) fp32, log2 units
    stride_qz, stride_qh, stride_qm, stride_qd,
    stride_kz, stride_kh, stride_kn, stride_kd,
    stride_vz, stride_vh, stride_vn, stride_vd,
    stride_oz, stride_oh, stride_om, stride_od,
    H, GROUP, N_Q, N_K, qk_scale,
    D_HEAD: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    start_m = tl.program_id(0)
    off_zh = tl.program_id(1)
    off_z = off_zh // H
    off_h = off_zh % H
    off_hkv = off_h // GROUP  # GQA: GROUP query heads share one K/V head
    causal_offset = N_K - N_Q  # bottom-right alignment

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)  # head dim padded to a power of two; loads masked to D_HEAD
    d_ok = offs_d < D_HEAD
    row_ok = offs_m < N_Q

    q_ptrs = Q + off_z * stride_qz + off_h * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd
    k_ptrs = K + off_z * stride_kz + off_hkv * stride_kh + offs_n[None, :] * stride_kn + offs_d[:, None] * stride_kd
    v_ptrs = V + off_z * stride_vz + off_hkv * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :] * stride_vd

    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)  # Q_i stays on chip (Alg. 1 line 4)
    if UPCAST:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # line 5: m = -inf
    l_i = tl.zeros([BLOCK_M], tl.float32)  # line 5: l = 0
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)  # line 5: O = 0

    # Which key blocks to visit (see _common): [0, lo) unmasked, [lo, hi) masked, [hi, N_K) skipped.
    full_n = (N_K // BLOCK_N) * BLOCK_N
    if CAUSAL:
        hi = tl.minimum(tl.maximum(start_m * BLOCK_M + BLOCK_M + causal_offset, 0), N_K)
        lo = tl.minimum((tl.maximum(start_m * BLOCK_M + causal_offset + 1, 0) // BLOCK_N) * BLOCK_N, full_n)
    else:
        hi = N_K
        lo = full_n
    acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn,
                            offs_m, offs_n, offs_d, 0, lo, qk_scale, N_K, causal_offset,
                            D_HEAD, BLOCK_D, BLOCK_N, False, CAUSAL, UPCAST, IEEE)
    acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_ptrs, v_ptrs, stride_kn, stride_vn,
                            offs_m, offs_n, offs_d, lo, hi, qk_scale, N_K, causal_offset,
                            D_HEAD, BLOCK_D, BLOCK_N, True, CAUSAL, UPCAST, IEEE)

    # Rows that saw no key (causal with N_Q > N_K) have l = 0: output 0, lse = -inf.
    seen = l_i > 0
    l_safe = tl.where(seen, l_i, 1.0)
    acc = acc / l_safe[:, None]  # line 12: O = diag(l)^-1 O, once
    lse = tl.where(seen, m_i + tl.math.log2(l_safe), float("-inf"))  # line 13: L = m + log2(l)
    tl.store(LSE + off_zh * N_Q + offs_m, lse, mask=row_ok)
    o_ptrs = O + off_z * stride_oz + off_h * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :] * stride_od
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
            config: Candidate | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward kernel. q (Z, H, N_q, d), k and v (Z, H_kv, N_k, d), checked by the caller.
    ``config`` = (BLOCK_M, BLOCK_N, warps, stages) bypasses autotuning (tests use it).

    Returns o (Z, H, N_q, d) in q's dtype and lse2 (Z, H, N_q) float32, the row
    log-sum-exp in log2 units (lse2 = lse / ln 2)."""
    Z, H, N_Q, D = q.shape
    H_KV, N_K = k.shape[1], k.shape[2]
    o = torch.empty_like(q)
    lse2 = torch.empty((Z, H, N_Q), device=q.device, dtype=torch.float32)
    block_d = max(16, triton.next_power_of_2(D))
    grid = lambda meta: (triton.cdiv(N_Q, meta["BLOCK_M"]), Z * H)  # noqa: E731
    kernel = _forward_kernel if config is None else _forward_kernel.fn
    kernel[grid](
        q, k, v, o, lse2,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        H, H // H_KV, N_Q, N_K, scale * 1.4426950408889634,  # scale * log2(e)
        D_HEAD=D, BLOCK_D=block_d, CAUSAL=causal, UPCAST=INTERPRET, IEEE=q.dtype == torch.float32,
        **launch_options(config),
    )
    return o, lse2
