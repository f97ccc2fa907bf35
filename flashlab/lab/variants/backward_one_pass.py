"""FlashAttention-2's backward in one pass over the keys, with what Hopper adds (sm_90): a lab
variant, measured against the teaching backward and found slower (see below).

The teaching backward (:mod:`flashlab.kernels.backward`) recomputes S and P twice when it is
deterministic: once in the dK/dV program, once in the dQ program. Per (query block, key
block) pair that is 7 matrix products instead of the paper's 5. This variant does the
paper's 5, in one program per key block j (FA2 Algorithm 2, with dQ accumulated as FA3 does):

    S_ij^T = K_j Q_i^T                                   (BLOCK_N, BLOCK_M)   (Alg. 2 line 10)
    P_ij^T = exp2(S_ij^T * scale * log2 e - L_i)         recomputed from lse  (line 11)
    dV_j  += P_ij^T dO_i                                 (BLOCK_N, d)         (line 12)
    dP_ij^T = V_j dO_i^T                                 (BLOCK_N, BLOCK_M)   (line 13)
    dS_ij^T = P_ij^T * (dP_ij^T - D_i)                                        (line 14)
    dK_j  += dS_ij^T Q_i                                 (BLOCK_N, d)         (line 16)
    dQ_i  += dS_ij K_j * scale      added to an fp32 buffer in HBM            (line 15)

Two Hopper units do the moving:

- Q_i and dO_i arrive through **TMA** (the tensor memory accelerator, 张量内存加速器): one
  thread asks for a whole (BLOCK_M, d) tile and the copy engine fills shared memory, while
  the warps compute on the previous tile (Triton pipelines the loop ``num_stages`` deep).
- dQ_i's contribution leaves through a **TMA reduce-add** (``cp.reduce.async.bulk.tensor``):
  the (BLOCK_M, d) fp32 tile is written to shared memory once and the copy engine adds it
  into HBM, instead of 32 atomic instructions per thread. Many key blocks add into the same
  dQ_i in an order that changes from run to run, so dQ's bits do too; dK and dV are
  bit-identical from run to run.

A last elementwise step casts the fp32 dQ buffer to the inputs' dtype.

What it takes: fp16 or bf16, contiguous (Z, H, N, d) tensors with d = 64 or 128 (a TMA tile
row must be a power of two of 16-byte multiples, and d = 256 does not fit shared memory),
causal or not, any N_q and N_k, GQA; no sliding window or varlen (:func:`eligible`).

What was measured (H200, Triton 3.6, results/backward_speed_h200.csv, where its rows are
named "hopper"): the backward alone is 3-14 % *slower* than the teaching two-kernel backward,
although it does 5/7 of the matrix work (d = 128, N = 16k: 17.0 against 14.9 ms), and within
a few per cent of the teaching atomic path: its products run at about 60 % of the two
kernels' rate. The likely reason, not yet measured on the GPU: with dK_j, dV_j, S, dP and dQ
live at once the compiler runs out of registers (compiled for sm_90, Triton 3.6 spills 16
bytes per thread even at d = 64, Triton 3.9 112 bytes at d = 128), and each step waits for
its dQ tile to leave shared memory. results/backward_one_pass/README.md has the numbers.

Glossary: D = rowsum(dO * O); L = lse in log2 units; reduce-add = 归约加.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from flashlab.kernels._common import (AUTOTUNE_OPTIONS, INTERPRET, LOG2E, Candidate, configs, launch_options,
                                      visible_range_tl, window_bounds)

__all__ = ["CANDIDATES", "eligible", "backward"]

# (BLOCK_M query rows per step, BLOCK_N keys per program, warps, stages) for sm_90. A program
# keeps dK_j and dV_j, (BLOCK_N, d) fp32 each, in registers for its whole life.
CANDIDATES: list[Candidate] = [(64, 128, 8, 2), (64, 128, 8, 3), (32, 128, 8, 2), (64, 64, 4, 2), (128, 128, 8, 2)]


def _set_block_shapes(nargs: dict) -> None:
    """Autotune pre-hook: the descriptors' tiles follow the configuration's BLOCK_M."""
    for name in ("DESC_Q", "DESC_DO", "DESC_DQ"):
        nargs[name].block_shape = [1, nargs["BLOCK_M"], nargs["BLOCK_D"]]


_CONFIGS = configs(CANDIDATES, [], interpret_config={"BLOCK_M": 16, "BLOCK_N": 16}, pre_hook=_set_block_shapes)


@triton.jit
def _over_query_blocks(dk, dv, k, v, DESC_Q, DESC_DO, DESC_DQ, DQ_ACC, LSE, DELTA, head, lo, hi,
                       offs_n, qk_scale, scale, N_Q, N_K, diag_lo, diag_hi,
                       BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, MASKED: tl.constexpr,
                       INTERPRET: tl.constexpr):
    """Add query blocks [lo, hi) of one head to dK_j, dV_j, and their dS_ij K_j to dQ_i.

    k, v: K_j, V_j (BLOCK_N, d); head: the (batch, query head) index into the (Z * H, N_q, d)
    views the descriptors read, whose tiles end at the head's last row; LSE, DELTA point at the
    head's row 0."""
    offs_m = tl.arange(0, BLOCK_M)
    for start_m in range(lo, hi, BLOCK_M):
        m = start_m + offs_m  # (BLOCK_M,) query rows of this head
        q = DESC_Q.load([head, start_m, 0]).reshape(BLOCK_M, BLOCK_D)  # Q_i, by TMA; rows past N_q: 0
        do = DESC_DO.load([head, start_m, 0]).reshape(BLOCK_M, BLOCK_D)  # dO_i
        if MASKED:
            lse = tl.load(LSE + m, mask=m < N_Q, other=0.0)
            delta = tl.load(DELTA + m, mask=m < N_Q, other=0.0)
        else:
            lse = tl.load(LSE + m)
            delta = tl.load(DELTA + m)
        s_t = tl.dot(k, tl.trans(q))  # S_ij^T (BLOCK_N, BLOCK_M)                       (line 10)
        p_t = tl.math.exp2(s_t * qk_scale - lse[None, :])  # P_ij^T, recomputed       (line 11)
        if MASKED:  # rows past N_q, keys past N_k, the band
            diag = offs_n[:, None] - m[None, :]  # j - i
            visible = (m[None, :] < N_Q) & (offs_n[:, None] < N_K) & (diag >= diag_lo) & (diag <= diag_hi)
            p_t = tl.where(visible, p_t, 0.0)
        dv = tl.dot(p_t.to(do.dtype), do, dv)  # dV_j += P_ij^T dO_i                       (line 12)
        dp_t = tl.dot(v, tl.trans(do))  # dP_ij^T = V_j dO_i^T                             (line 13)
        ds_t = (p_t * (dp_t - delta[None, :])).to(q.dtype)  # dS_ij^T                      (line 14)
        dk = tl.dot(ds_t, q, dk)  # dK_j += dS_ij^T Q_i                                    (line 16)
        dq = tl.dot(tl.trans(ds_t), k) * scale  # dS_ij K_j (BLOCK_M, d)                   (line 15)
        if INTERPRET:  # the interpreter has no TMA reduce: the same sum by atomic adds
            at = (head * N_Q + m)[:, None] * BLOCK_D + tl.arange(0, BLOCK_D)[None, :]
            tl.atomic_add(DQ_ACC + at, dq, mask=m[:, None] < N_Q)
        else:  # dQ_i += ..., by TMA reduce-add; rows past N_q are dropped by the copy engine
            DESC_DQ.atomic_add([head, start_m, 0], dq.reshape(1, BLOCK_M, BLOCK_D))
    return dk, dv


@triton.autotune(configs=_CONFIGS, key=["N_Q", "N_K", "BLOCK_D", "CAUSAL", "GROUP"], **AUTOTUNE_OPTIONS,
                 restore_value=["DQ_ACC"])  # tuning runs add into dQ: give the real run zeros back
@triton.jit
def _backward_kernel(K, V, DK, DV, LSE, DELTA, DQ_ACC, DESC_Q, DESC_DO, DESC_DQ,
                     H, GROUP, N_Q, N_K, qk_scale, scale, band,
                     BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, INTERPRET: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Grid (key blocks, Z * H_kv): dK_j, dV_j of one key block of one K/V head, and its share of
    dQ. K, V, DK, DV: contiguous (Z, H_kv, N_k, d); LSE, DELTA: (Z, H, N_q) fp32; DQ_ACC is the
    fp32 buffer behind DESC_DQ (named for the autotuner, which zeroes it)."""
    start_n = tl.program_id(0)
    off_zhkv = tl.program_id(1)
    H_KV = H // GROUP
    off_z = off_zhkv // H_KV
    win_left, win_right = band
    diag_lo = N_K - N_Q - win_left  # row i sees key j iff diag_lo <= j - i <= diag_hi
    diag_hi = N_K - N_Q + win_right
    offs_n = start_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    kv = off_zhkv.to(tl.int64) * N_K * BLOCK_D + offs_n[:, None] * BLOCK_D + offs_d[None, :]
    k = tl.load(K + kv, mask=offs_n[:, None] < N_K, other=0.0)  # K_j (BLOCK_N, d), read once
    v = tl.load(V + kv, mask=offs_n[:, None] < N_K, other=0.0)  # V_j
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    # the query blocks that see this key block: masked [q_lo, in_lo), whole [in_lo, in_hi),
    # masked [in_hi, q_hi) (the diagonal and the ragged tail; _common.visible_range)
    q_lo, in_lo, in_hi, q_hi = visible_range_tl(start_n * BLOCK_N, BLOCK_N, N_K, -diag_hi, -diag_lo, N_Q, BLOCK_M)
    if start_n * BLOCK_N + BLOCK_N > N_K:  # a ragged key block: its padding keys are masked everywhere
        in_lo = q_hi
        in_hi = q_hi
    for g in range(0, GROUP):  # GQA: the query heads that share this K/V head
        head = off_z * H + (off_zhkv % H_KV) * GROUP + g  # (batch, query head) as one index
        lse = LSE + head.to(tl.int64) * N_Q
        delta = DELTA + head.to(tl.int64) * N_Q
        dk, dv = _over_query_blocks(dk, dv, k, v, DESC_Q, DESC_DO, DESC_DQ, DQ_ACC, lse, delta, head, q_lo, in_lo,
                                    offs_n, qk_scale, scale, N_Q, N_K, diag_lo, diag_hi, BLOCK_M, BLOCK_D, True, INTERPRET)
        dk, dv = _over_query_blocks(dk, dv, k, v, DESC_Q, DESC_DO, DESC_DQ, DQ_ACC, lse, delta, head, in_lo, in_hi,
                                    offs_n, qk_scale, scale, N_Q, N_K, diag_lo, diag_hi, BLOCK_M, BLOCK_D, False, INTERPRET)
        dk, dv = _over_query_blocks(dk, dv, k, v, DESC_Q, DESC_DO, DESC_DQ, DQ_ACC, lse, delta, head, in_hi, q_hi,
                                    offs_n, qk_scale, scale, N_Q, N_K, diag_lo, diag_hi, BLOCK_M, BLOCK_D, True, INTERPRET)
    tl.store(DK + kv, (dk * scale).to(DK.dtype.element_ty), mask=offs_n[:, None] < N_K)  # (line 16's scale)
    tl.store(DV + kv, dv.to(DV.dtype.element_ty), mask=offs_n[:, None] < N_K)


@triton.jit
def _preprocess_kernel(O, DO, DELTA, N_ROWS, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr):
    """D_i = rowsum(dO_i * O_i) over the contiguous (rows, d) views of O and dO (Alg. 2 line 4)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    at = rows.to(tl.int64)[:, None] * BLOCK_D + tl.arange(0, BLOCK_D)[None, :]
    o = tl.load(O + at, mask=rows[:, None] < N_ROWS, other=0.0).to(tl.float32)
    do = tl.load(DO + at, mask=rows[:, None] < N_ROWS, other=0.0).to(tl.float32)
    tl.store(DELTA + rows, tl.sum(o * do, axis=1), mask=rows < N_ROWS)


def eligible(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: tuple[int, int] | None,
             varlen: bool) -> bool:
    """Whether :func:`backward` takes these inputs: a Hopper-or-newer GPU, fp16 or bf16,
    d = 64 or 128, contiguous q, k, v (so dq, dk, dv come back in their layout), no window,
    no varlen."""
    return (q.is_cuda and torch.cuda.get_device_capability(q.device)[0] >= 9
            and q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] in (64, 128)
            and all(t.is_contiguous() for t in (q, k, v)) and window is None and not varlen)


def backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
             lse2: torch.Tensor, causal: bool, scale: float, config: Candidate | None = None,
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) from dO. q, o, do (Z, H, N_q, d); k, v (Z, H_kv, N_k, d); lse2
    (Z, H, N_q) fp32, the forward's log-sum-exp in log2 units. Inputs as :func:`eligible`
    says; ``config`` = (BLOCK_M, BLOCK_N, warps, stages) bypasses autotuning."""
    Z, H, N_Q, D = q.shape
    H_KV, N_K = k.shape[1], k.shape[2]
    q, k, v, o, do = (t.contiguous() for t in (q, k, v, o, do))
    lse2 = lse2.contiguous()
    delta = torch.empty_like(lse2)
    _preprocess_kernel[(triton.cdiv(Z * H * N_Q, 64),)](o, do, delta, Z * H * N_Q, BLOCK_D=D, BLOCK_M=64)
    dq_acc = torch.zeros((Z * H * N_Q, D), device=q.device, dtype=torch.float32)
    bm = config[0] if config is not None else 16  # the pre-hook sets it per configuration
    # (Z * H, N_q, d) views: a tile never crosses into the next head (the copy engine reads
    # zeros past N_q and drops additions there)
    desc_q = TensorDescriptor.from_tensor(q.view(Z * H, N_Q, D), [1, bm, D])
    desc_do = TensorDescriptor.from_tensor(do.view(Z * H, N_Q, D), [1, bm, D])
    desc_dq = TensorDescriptor.from_tensor(dq_acc.view(Z * H, N_Q, D), [1, bm, D])
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    kernel = _backward_kernel if config is None else _backward_kernel.fn
    kernel[lambda meta: (triton.cdiv(N_K, meta["BLOCK_N"]), Z * H_KV)](
        k, v, dk, dv, lse2, delta, dq_acc, desc_q, desc_do, desc_dq, H, H // H_KV, N_Q, N_K,
        scale * LOG2E, scale, window_bounds(causal, None, N_Q, N_K),
        BLOCK_D=D, CAUSAL=causal, INTERPRET=INTERPRET, **launch_options(config))
    return dq_acc.view(q.shape).to(q.dtype), dk, dv
