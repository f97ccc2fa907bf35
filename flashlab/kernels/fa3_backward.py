"""FlashAttention-3 backward (Shah et al. 2024, §3 and Appendix B.1) in Gluon, for Hopper (sm_90).

One program per key block j of Bc = 128 keys of one (batch, head) loops over the query blocks
i of Br = 64 rows that see it (FlashAttention-2's backward, Algorithm 2, one pass), with FA3's
division of labour:

    producer    1 warp, few registers:   TMA-loads K_j, V_j once, then Q_i and dO_i into a ring
                                          of STAGES shared-memory slots (full/empty mbarriers)
    consumer 0  4 warps (a warpgroup):    keys [0, 64) of the block
    consumer 1  4 warps (a warpgroup):    keys [64, 128) of the block

Each consumer w keeps dK_w and dV_w (64, d) in registers for the whole loop and, per query block:

    S_ij^T  = K_w Q_i^T                      (64, Br)   wgmma, both operands in shared memory
    dP_ij^T = V_w dO_i^T                     (64, Br)   wgmma, issued behind S^T
    P_ij^T  = exp2(S^T * scale log2 e - L_i) (64, Br)   recomputed from the saved lse  (line 11)
    dS_ij^T = P^T * (dP^T - D_i)             (64, Br)                                  (line 14)
    dV_w   += P^T dO_i                       (64, d)    wgmma, P^T from registers       (line 12)
    dK_w   += dS^T Q_i                       (64, d)    wgmma, dS^T from registers      (line 16)
    dQ_i   += dS_ij K_j                      (Br, d)    both halves of dS^T through shared
                                                        memory; added to an fp32 buffer in HBM by
                                                        TMA's reduce-add (line 15)

dQ is split between the consumers: at d = 128 each computes 64 of its columns, at d = 64 they
take query blocks in turn. Its tile goes from registers to shared memory, and TMA adds it to HBM
(two bulk reduce-adds, one per 32 columns, the width of the 128-byte swizzle) while the warpgroup
goes on; the adds happen in L2, so its bits depend on the order in which programs arrive
(``deterministic=False`` in :func:`flashlab.kernels.flash_attention`).
P^T and dS^T need no trip through shared memory for dV and dK: S^T's accumulator, computed with
the keys as rows, is already laid out as wgmma's register operand A. The scale is applied once at
the end: dK = scale dS^T Q, dQ = scale dS K.

Glossary: D_i = rowsum(dO_i * O_i); L_i = lse in log2 units; dS = gradient of the scores (打分的
梯度); Br = BLOCK_M, Bc = 2 * BLOCK_M (keys per program).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from ._common import LOG2E
from .fa3 import (_GL_DTYPES, DTYPES, _stamp, _tma_add, _tma_load, check_build, check_shapes,
                  compile_for_sm90, stamp_args, tensor_descriptor_type)

__all__ = ["BLOCK_M", "HEAD_DIMS", "STAMP_PARTS", "STAMP_PHASES", "backward", "compile_sm90", "config", "finish",
           "prepare", "supported"]

# d = 256 is not among them: a consumer's dK and dV accumulators, (Br, d) fp32 each, would take
# 2 * 64 * 256 / 128 = 256 registers a thread by themselves
HEAD_DIMS = (64, 128)
BLOCK_M = 64  # Br: query rows per block; also the keys each consumer warpgroup owns (Bc = 2 Br)
NUM_WARPS = 4  # the default partition: consumer 0
MAXNREG = 168  # as in the forward (flashlab.kernels.fa3): consumers 240 registers, producer 24
CONSUMER_REGS = gl.constexpr(240)
PRODUCER_REGS = gl.constexpr(24)
# Time stamps (STAMPS=True; flashlab.lab.experiments.fa3_backward_timeline): each consumer notes
# when it begins each phase of step t, in this order: wait for Q_i and dO_i, issue S^T, issue
# dP^T, wait for S^T, P^T = exp2(...), issue dV, wait for dP^T, dS^T, wait for a free dS slot,
# dS^T to shared memory, wait for the other half of dS, issue dQ, issue dK, wait for dV and dQ,
# wait for TMA to have read the last dQ tile, dQ to shared memory and TMA's add issued, wait for
# dK; "done" closes the step.
STAMP_PHASES = ("wait_q", "issue_s", "issue_dp", "wait_s", "exp", "issue_dv", "wait_dp", "ds", "wait_ds_free",
                "store_ds", "wait_ds_ready", "issue_dq", "issue_dk", "wait_dq", "wait_dq_read", "store_dq", "wait_dk",
                "done")
(_WAIT_Q, _ISSUE_S, _ISSUE_DP, _WAIT_S, _EXP, _ISSUE_DV, _WAIT_DP, _DS, _WAIT_DS_FREE, _STORE_DS, _WAIT_DS_READY,
 _ISSUE_DQ, _ISSUE_DK, _WAIT_DQ, _WAIT_DQ_READ, _STORE_DQ, _WAIT_DK, _DONE) = (gl.constexpr(p)
                                                                            for p in range(len(STAMP_PHASES)))
STAMP_SLOTS = gl.constexpr(len(STAMP_PHASES))
STAMP_PARTS = ("consumer 0", "consumer 1")
# The fp32 dQ tile (1, Br, 64) in shared memory, in the layout TMA reads it with (128-byte swizzle):
# each store from the wgmma accumulator costs at most one shared-memory wavefront beyond the fewest.
DQ_BLOCK = [1, BLOCK_M, 64]  # one warpgroup's dQ tile: (head, Br rows, 64 columns) of (B * H, N_q, d)
DQ_SMEM_LAYOUT = gl.NVMMASharedLayout.get_default_for(DQ_BLOCK, gl.float32)
# L_i and D_i arrive by TMA as rows of Br floats, unswizzled
ROW_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)


def config(d: int) -> dict:
    """Ring depth for head dimension ``d``. Shared memory per CTA: K_j and V_j 2 * 2 Br d and the
    ring STAGES * 2 Br d (Q_i, dO_i) in 2-byte elements, L_i and D_i STAGES * 2 Br floats, each
    consumer's dQ tile Br 64 (4 bytes), and two slots of dS^T 2 Br Br (2 bytes); d = 128 with
    2 stages is 193 KB of the 227 KB a CTA may use, d = 64 with 3 stages 146 KB."""
    return {"BLOCK_M": BLOCK_M, "HEAD_D": d, "STAGES": 2 if d == 128 else 3}


@gluon.jit
def _first_query_block(j0, N_Q, N_K, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr):
    """The first query block that sees a key of [j0, j0 + 2 Br): causal (bottom-right), query i
    sees key j iff j <= i + N_k - N_q, so rows below j0 - (N_k - N_q) see none of them."""
    lo = 0
    if CAUSAL:
        lo = gl.maximum(j0 - (N_K - N_Q), 0) // BLOCK_M
    return lo


@gluon.jit
def _producer(desc_q, desc_do, desc_k, desc_v, desc_lse, desc_delta, k_smem, v_smem, q_smem, do_smem, lse_smem,
              delta_smem, bars, N_Q, N_K, N_PAD, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr,
              STAGES: gl.constexpr):
    """Load K_j, V_j once, then Q_i, dO_i, L_i and D_i of every query block into the ring."""
    kv_full, q_full, q_empty = bars
    bh = gl.program_id(1)
    j0 = gl.program_id(0) * 2 * BLOCK_M
    mbarrier.expect(kv_full, 2 * desc_k.block_type.nbytes)
    _tma_load(desc_k, [bh * N_K + j0, 0], kv_full, k_smem)
    _tma_load(desc_v, [bh * N_K + j0, 0], kv_full, v_smem)
    lo = _first_query_block(j0, N_Q, N_K, CAUSAL, BLOCK_M)
    hi = gl.cdiv(N_Q, BLOCK_M)
    for t in range(hi - lo):
        i0 = (lo + t) * BLOCK_M
        stage = t % STAGES
        mbarrier.wait(q_empty.index(stage), ((t // STAGES) & 1) ^ 1)  # both consumers are done with it
        mbarrier.expect(q_full.index(stage), 2 * desc_q.block_type.nbytes + 2 * desc_lse.block_type.nbytes)
        _tma_load(desc_q, [bh * N_Q + i0, 0], q_full.index(stage), q_smem.index(stage))
        _tma_load(desc_do, [bh * N_Q + i0, 0], q_full.index(stage), do_smem.index(stage))
        _tma_load(desc_lse, [(bh * N_PAD + i0) // BLOCK_M, 0], q_full.index(stage), lse_smem.index(stage))
        _tma_load(desc_delta, [(bh * N_PAD + i0) // BLOCK_M, 0], q_full.index(stage), delta_smem.index(stage))


@gluon.jit
def _note(STAMP, here, t, WG: gl.constexpr, PHASE: gl.constexpr, STAMPS: gl.constexpr):
    """STAMPS: consumer WG begins phase PHASE (:data:`STAMP_PHASES`) of step t now (in the
    program where ``here`` holds); the forward's :func:`~flashlab.kernels.fa3._stamp` with this
    kernel's slots."""
    _stamp(STAMP, here, WG, PHASE, t, STAMPS, STAMP_SLOTS, 2)


@gluon.jit
def _adds_dq(t, WG: gl.constexpr, HEAD_D: gl.constexpr):
    """Whether consumer WG computes and adds a part of dQ_i on step t: at d = 128 both do (64
    columns each), at d = 64 they take the steps in turn."""
    if HEAD_D == 128:
        return True
    else:
        return t % 2 == WG


@gluon.jit
def _step(t, lo, dk, dv, desc_dq, smem, q_full, q_empty, ds_bars, bh, j0, N_Q, N_K, qk_scale,
          masked, CAUSAL: gl.constexpr, WG: gl.constexpr, BLOCK_M: gl.constexpr,
          HEAD_D: gl.constexpr, STAGES: gl.constexpr, STAMP, here, STAMPS: gl.constexpr):
    """Step t of consumer WG: query block i0 = (lo + t) Br. Returns dK_w, dV_w (Br, d) updated.
    STAMPS: the program where ``here`` holds notes when each phase begins (:data:`STAMP_PHASES`)."""
    k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, ds_smem, dq_smem = smem
    ds_ready, ds_free = ds_bars
    st_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, BLOCK_M, 16])
    DQ_D: gl.constexpr = HEAD_D // 2 if HEAD_D == 128 else HEAD_D  # dQ_i's columns this warpgroup computes
    dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, DQ_D, 16])
    query_of: gl.constexpr = gl.SliceLayout(0, st_layout)  # along S^T's columns: query rows
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_D, 16])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)  # P^T, dS^T
    dtype: gl.constexpr = q_smem.dtype
    i0 = (lo + t) * BLOCK_M
    stage = t % STAGES
    buf = t % 2
    k_w = k_smem.slice(WG * BLOCK_M, BLOCK_M, dim=0)  # K_w (Br, d)
    v_w = v_smem.slice(WG * BLOCK_M, BLOCK_M, dim=0)  # V_w (Br, d)
    q = q_smem.index(stage)  # Q_i (Br, d)
    do = do_smem.index(stage)  # dO_i (Br, d)
    _note(STAMP, here, t, WG, _WAIT_Q, STAMPS)
    mbarrier.wait(q_full.index(stage), (t // STAGES) & 1)
    _note(STAMP, here, t, WG, _ISSUE_S, STAMPS)
    zero_st = gl.zeros([BLOCK_M, BLOCK_M], gl.float32, st_layout)
    st_tok = warpgroup_mma(k_w, q.permute((1, 0)), zero_st, use_acc=False, is_async=True)  # S^T = K_w Q_i^T
    _note(STAMP, here, t, WG, _ISSUE_DP, STAMPS)
    dpt_tok = warpgroup_mma(v_w, do.permute((1, 0)), zero_st, use_acc=False, is_async=True)  # dP^T = V_w dO_i^T
    _note(STAMP, here, t, WG, _WAIT_S, STAMPS)
    s_t = warpgroup_mma_wait(1, deps=(st_tok,))  # S^T is done; dP^T may still run
    _note(STAMP, here, t, WG, _EXP, STAMPS)
    # L_i of a padded row (and of a row that saw no key) is +inf: its P is 0
    lse = lse_smem.index(stage).reshape([BLOCK_M]).load(query_of)
    p_t = gl.exp2(s_t * qk_scale - lse[None, :])  # P^T = exp2(S^T - L_i) (line 11)
    if masked:  # keys past N_k, and (causal, bottom-right) key j > query i + N_k - N_q
        keys = j0 + WG * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, st_layout))
        visible = keys[:, None] < N_K
        if CAUSAL:
            queries = i0 + gl.arange(0, BLOCK_M, layout=query_of)
            visible = visible & (keys[:, None] <= queries[None, :] + (N_K - N_Q))
        p_t = gl.where(visible, p_t, 0.0)
    _note(STAMP, here, t, WG, _ISSUE_DV, STAMPS)
    # S^T's accumulator is already laid out as wgmma's register operand A: P^T stays in registers
    dv_tok = warpgroup_mma(gl.convert_layout(p_t.to(dtype), a_layout), do, dv,
                           is_async=True)  # dV_w += P^T dO_i (line 12)
    _note(STAMP, here, t, WG, _WAIT_DP, STAMPS)
    dp_t = warpgroup_mma_wait(1, deps=(dpt_tok,))  # dP^T is done; dV may still run
    _note(STAMP, here, t, WG, _DS, STAMPS)
    delta = delta_smem.index(stage).reshape([BLOCK_M]).load(query_of)
    ds_h = (p_t * (dp_t - delta[None, :])).to(dtype)  # dS^T = P^T * (dP^T - D_i) (line 14)
    # this warpgroup's half of dS^T into shared memory, for dQ in both warpgroups; the slot was
    # freed two steps ago
    _note(STAMP, here, t, WG, _WAIT_DS_FREE, STAMPS)
    mbarrier.wait(ds_free.index(buf), ((t // 2) & 1) ^ 1)
    _note(STAMP, here, t, WG, _STORE_DS, STAMPS)
    ds_w = ds_smem.index(buf).slice(WG * BLOCK_M, BLOCK_M, dim=0)  # dS_w^T (Br, Br)
    ds_w.store(ds_h)
    fence_async_shared()
    mbarrier.arrive(ds_ready.index(buf), count=1)
    _note(STAMP, here, t, WG, _WAIT_DS_READY, STAMPS)
    mbarrier.wait(ds_ready.index(buf), (t // 2) & 1)  # the other warpgroup's half is there
    ds = ds_smem.index(buf).permute((1, 0))  # dS_ij (Br, 2 Br)
    _note(STAMP, here, t, WG, _ISSUE_DQ, STAMPS)
    # dQ is issued before dK, so that its tile goes out to HBM while the tensor cores compute dK
    if _adds_dq(t, WG, HEAD_D):
        if HEAD_D == 128:  # dQ_i[:, WG d/2 + [0, d/2)] = dS_ij K_j[:, WG d/2 + [0, d/2)] (line 15)
            k_cols = k_smem.slice(WG * DQ_D, DQ_D, dim=1)
        else:  # d = 64: dQ_i = dS_ij K_j, the warpgroups taking query blocks in turn
            k_cols = k_smem
        zero_dq = gl.zeros([BLOCK_M, DQ_D], gl.float32, dq_layout)
        dq_tok = warpgroup_mma(ds, k_cols, zero_dq, use_acc=False, is_async=True)
        _note(STAMP, here, t, WG, _ISSUE_DK, STAMPS)
        dk_tok = warpgroup_mma(gl.convert_layout(ds_h, a_layout), q, dk, is_async=True)  # dK_w += dS^T Q_i (line 16)
        _note(STAMP, here, t, WG, _WAIT_DQ, STAMPS)
        dv, dq = warpgroup_mma_wait(1, deps=(dv_tok, dq_tok))  # dV and dQ are done; dK may still run
        mbarrier.arrive(ds_free.index(buf), count=1)  # this slot of dS has been read here
        _note(STAMP, here, t, WG, _WAIT_DQ_READ, STAMPS)
        dq_w = dq_smem.index(WG)  # (1, Br, DQ_D)
        tma.store_wait(0)  # TMA has read the tile this warpgroup added last time
        _note(STAMP, here, t, WG, _STORE_DQ, STAMPS)
        dq_w.reshape([BLOCK_M, DQ_D]).store(dq)
        fence_async_shared()
        # dQ[bh, i0 + [0, Br), col0 + [0, DQ_D)] += dq: TMA skips rows past N_q
        _tma_add(desc_dq, [bh, i0, WG * DQ_D if HEAD_D == 128 else 0], dq_w)
    else:
        mbarrier.arrive(ds_free.index(buf), count=1)  # the other warpgroup computes dQ_i
        _note(STAMP, here, t, WG, _ISSUE_DK, STAMPS)
        dk_tok = warpgroup_mma(gl.convert_layout(ds_h, a_layout), q, dk, is_async=True)  # dK_w += dS^T Q_i (line 16)
        _note(STAMP, here, t, WG, _WAIT_DQ, STAMPS)
        dv = warpgroup_mma_wait(1, deps=(dv_tok,))
        _note(STAMP, here, t, WG, _WAIT_DQ_READ, STAMPS)
        _note(STAMP, here, t, WG, _STORE_DQ, STAMPS)
    _note(STAMP, here, t, WG, _WAIT_DK, STAMPS)
    dk = warpgroup_mma_wait(0, deps=(dk_tok,))
    mbarrier.arrive(q_empty.index(stage), count=1)  # Q_i and dO_i are no longer needed here
    _note(STAMP, here, t, WG, _DONE, STAMPS)
    return dk, dv


@gluon.jit
def _consumer(DK, DV, desc_dq, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, ds_smem, dq_smem, bars,
              ds_bars, N_Q, N_K, qk_scale, scale, CAUSAL: gl.constexpr, WG: gl.constexpr,
              BLOCK_M: gl.constexpr, HEAD_D: gl.constexpr, STAGES: gl.constexpr,
              STAMP=None, STAMP_AT: gl.constexpr = 0, STAMPS: gl.constexpr = False):
    """Consumer warpgroup WG: keys j0 + WG Br + [0, Br) of the program's key block. STAMPS:
    program STAMP_AT (key block + batch-head * key blocks per head) notes its phases."""
    kv_full, q_full, q_empty = bars
    # wgmma accumulators over the warpgroup's 128 threads: dK, dV (Br, d)
    kv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                        instr_shape=[16, HEAD_D, 16])
    bh = gl.program_id(1)
    j0 = gl.program_id(0) * 2 * BLOCK_M
    lo = _first_query_block(j0, N_Q, N_K, CAUSAL, BLOCK_M)
    n = gl.cdiv(N_Q, BLOCK_M) - lo  # query blocks to visit
    # the first n_masked of them hold a (key, query) pair that must not count: keys past N_k
    # (every step, when the block is the ragged last one), or the diagonal crossing the block
    n_masked = 0
    if CAUSAL:  # query block i0 sees all the block's keys iff j0 + 2 Br - 1 <= i0 + N_k - N_q
        n_masked = gl.minimum(gl.maximum(gl.cdiv(j0 + 2 * BLOCK_M - 1 - (N_K - N_Q), BLOCK_M) - lo, 0), n)
    if j0 + 2 * BLOCK_M > N_K:
        n_masked = n
    smem = (k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, ds_smem, dq_smem)
    here = gl.program_id(0) + bh * gl.num_programs(0) == STAMP_AT
    dk = gl.zeros([BLOCK_M, HEAD_D], gl.float32, kv_layout)
    dv = gl.zeros([BLOCK_M, HEAD_D], gl.float32, kv_layout)
    mbarrier.wait(kv_full, 0)
    for t in range(n):
        dk, dv = _step(t, lo, dk, dv, desc_dq, smem, q_full, q_empty, ds_bars, bh, j0, N_Q, N_K, qk_scale,
                       t < n_masked, CAUSAL, WG, BLOCK_M, HEAD_D, STAGES, STAMP, here, STAMPS)
    tma.store_wait(0)  # the last dQ tile has been read before the program ends

    # "write dK_j, dV_j to HBM": rows past N_k belong to the next head and are left alone
    krows = j0 + WG * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, kv_layout))
    kcols = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, kv_layout))
    at = (bh * N_K + krows[:, None]).to(gl.int64) * HEAD_D + kcols[None, :]
    gl.store(DK + at, (dk * scale).to(DK.dtype.element_ty), mask=(krows < N_K)[:, None])
    gl.store(DV + at, dv.to(DV.dtype.element_ty), mask=(krows < N_K)[:, None])


@gluon.jit(do_not_specialize=["N_Q", "N_K", "N_PAD"])
def _fa3_backward_kernel(desc_q, desc_do, desc_k, desc_v, desc_lse, desc_delta, desc_dq, DK, DV, N_Q, N_K, N_PAD,
                         qk_scale, scale, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr,
                         HEAD_D: gl.constexpr, STAGES: gl.constexpr,
                         STAMP=None, STAMP_AT: gl.constexpr = 0, STAMPS: gl.constexpr = False):
    """Grid (key blocks of 2 Br, B * H). Q, dO, K and V come as 2-D views (B * H * N, d) in
    blocks of Br rows (Q, dO) and 2 Br rows (K, V); rows past a head's N belong to the next head
    (or are zero past the end) and are masked. L and D (desc_lse, desc_delta) are (B * H, N_PAD)
    with N_PAD a multiple of Br, +inf and 0 on the padding. desc_dq is over an fp32 (B * H, N_q, d)
    buffer that starts at zero, in blocks (1, Br, 64)."""
    dtype: gl.constexpr = desc_q.dtype
    k_smem = gl.allocate_shared_memory(dtype, desc_k.block_type.shape, desc_k.layout)  # K_j (2 Br, d)
    v_smem = gl.allocate_shared_memory(dtype, desc_v.block_type.shape, desc_v.layout)  # V_j (2 Br, d)
    q_smem = gl.allocate_shared_memory(dtype, [STAGES] + desc_q.block_type.shape, desc_q.layout)
    do_smem = gl.allocate_shared_memory(dtype, [STAGES] + desc_do.block_type.shape, desc_do.layout)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([2 * BLOCK_M, BLOCK_M], dtype)
    ds_smem = gl.allocate_shared_memory(dtype, [2, 2 * BLOCK_M, BLOCK_M], ds_layout)
    lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES] + desc_lse.block_type.shape, desc_lse.layout)
    delta_smem = gl.allocate_shared_memory(gl.float32, [STAGES] + desc_delta.block_type.shape, desc_delta.layout)
    dq_smem = gl.allocate_shared_memory(gl.float32, [2] + desc_dq.block_type.shape,  # each consumer's dQ
                                        desc_dq.layout)
    kv_full = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    ds_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    ds_free = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_full, count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(q_full.index(s), count=1)  # the producer's expect + the TMA bytes
        mbarrier.init(q_empty.index(s), count=2)  # both consumers release a slot
    for b in gl.static_range(2):
        mbarrier.init(ds_ready.index(b), count=2)  # both halves of dS^T are written
        mbarrier.init(ds_free.index(b), count=2)  # both consumers' dQ GEMMs have read it
    bars = (kv_full, q_full, q_empty)
    ds_bars = (ds_ready, ds_free)
    gl.warp_specialize([
        (_consumer, (DK, DV, desc_dq, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, ds_smem,
                     dq_smem, bars, ds_bars, N_Q, N_K, qk_scale, scale, CAUSAL, 0, BLOCK_M, HEAD_D,
                     STAGES, STAMP, STAMP_AT, STAMPS)),
        (_consumer, (DK, DV, desc_dq, k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, ds_smem,
                     dq_smem, bars, ds_bars, N_Q, N_K, qk_scale, scale, CAUSAL, 1, BLOCK_M, HEAD_D,
                     STAGES, STAMP, STAMP_AT, STAMPS)),
        (_producer, (desc_q, desc_do, desc_k, desc_v, desc_lse, desc_delta, k_smem, v_smem, q_smem, do_smem,
                     lse_smem, delta_smem, bars, N_Q, N_K, N_PAD, CAUSAL, BLOCK_M, STAGES)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


@triton.jit
def _prepare_kernel(O, DO, LSE2, DELTA, LSE, DQ, N_Q, N_PAD, HEAD_D: tl.constexpr, BLOCK_M: tl.constexpr):
    """Rows i0 + [0, BLOCK_M) of batch-head bh: D_i = rowsum(dO_i * O_i), L_i with +inf for a row
    that saw no key, both padded to N_PAD (D = 0, L = +inf), and dQ_i's fp32 accumulator zeroed.
    O, DO, DQ (B * H, N_Q, d) and LSE2 (B * H, N_Q) contiguous; DELTA, LSE (B * H, N_PAD)."""
    i0 = tl.program_id(0) * BLOCK_M
    bh = tl.program_id(1).to(tl.int64)
    rows = i0 + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
    real = rows < N_Q
    at = (bh * N_Q + rows[:, None]) * HEAD_D + tl.arange(0, HEAD_D)[None, :]  # (BLOCK_M, d)
    o = tl.load(O + at, mask=real[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + at, mask=real[:, None], other=0.0).to(tl.float32)
    tl.store(DELTA + bh * N_PAD + rows, tl.sum(o * do, axis=1))  # D_i = rowsum(dO_i * O_i); 0 on padding
    lse2 = tl.load(LSE2 + bh * N_Q + rows, mask=real, other=float("-inf"))
    tl.store(LSE + bh * N_PAD + rows, tl.where(lse2 == float("-inf"), float("inf"), lse2))  # exp2(S - L) = 0
    tl.store(DQ + at, tl.zeros([BLOCK_M, HEAD_D], tl.float32), mask=real[:, None])


@triton.jit
def _finish_kernel(DQ_ACC, DQ, numel, scale, BLOCK: tl.constexpr):
    """dQ = scale * dQ_acc in dQ's precision, BLOCK elements a program."""
    at = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    acc = tl.load(DQ_ACC + at, mask=at < numel)
    tl.store(DQ + at, (acc * scale).to(DQ.dtype.element_ty), mask=at < numel)


def prepare(do: torch.Tensor, o: torch.Tensor, lse2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the kernel reads besides Q, K, V and dO, in one pass over dO and O: D (B * H, N_pad)
    = rowsum(dO * O), L (B * H, N_pad) = lse2 with +inf for -inf, N_pad = N_q rounded up to Br
    (D = 0 and L = +inf on the padding, so P = 0 there), and dQ's fp32 accumulator (B, H, N_q, d)
    zeroed. do, o (B, H, N_q, d) and lse2 (B, H, N_q) contiguous."""
    if do.shape != o.shape or lse2.shape != o.shape[:3] or not (do.is_contiguous() and o.is_contiguous()):
        raise ValueError(f"do and o must be contiguous (B, H, N_q, d) and lse2 (B, H, N_q); got "
                         f"{tuple(do.shape)}, {tuple(o.shape)}, {tuple(lse2.shape)}")
    if o.shape[3] not in HEAD_DIMS or lse2.dtype != torch.float32:
        raise ValueError(f"d must be one of {HEAD_DIMS} and lse2 float32; got d = {o.shape[3]}, {lse2.dtype}")
    B, H, N_Q, D = o.shape
    lse2 = lse2.contiguous()
    n_pad = triton.cdiv(N_Q, BLOCK_M) * BLOCK_M
    delta = torch.empty((B * H, n_pad), device=o.device, dtype=torch.float32)
    lse = torch.empty((B * H, n_pad), device=o.device, dtype=torch.float32)
    dq_acc = torch.empty(o.shape, device=o.device, dtype=torch.float32)
    _prepare_kernel[(n_pad // BLOCK_M, B * H)](o, do, lse2, delta, lse, dq_acc, N_Q, n_pad, HEAD_D=D,
                                               BLOCK_M=BLOCK_M)
    return delta, lse, dq_acc


def finish(dq_acc: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """dQ = scale * dQ_acc (any shape, fp32, contiguous) in ``dtype``, in one pass."""
    dq = torch.empty(dq_acc.shape, device=dq_acc.device, dtype=dtype)
    block = 4096
    _finish_kernel[(triton.cdiv(dq_acc.numel(), block),)](dq_acc, dq, dq_acc.numel(), scale, BLOCK=block)
    return dq


def _check(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
           lse2: torch.Tensor) -> None:
    for name, t in (("q", q), ("do", do), ("k", k), ("v", v), ("o", o)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 4-D tensor (B, H, N, d); got {got}")
        if t.dtype not in DTYPES or t.dtype != q.dtype:
            raise ValueError(f"{name} must be bfloat16 or float16, like q ({q.dtype}); got {t.dtype}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (B, H, N, d); got strides {t.stride()}")
    if do.shape != q.shape or o.shape != q.shape:
        raise ValueError(f"do and o must have q's shape {tuple(q.shape)}; got {tuple(do.shape)}, {tuple(o.shape)}")
    check_shapes(q, k, v, HEAD_DIMS)
    if lse2.shape != q.shape[:3] or lse2.dtype != torch.float32:
        raise ValueError(f"lse2 must be a float32 tensor of shape {tuple(q.shape[:3])}; "
                         f"got {lse2.dtype} {tuple(lse2.shape)}")
    if not (q.is_cuda and all(t.device == q.device for t in (do, k, v, o, lse2))):
        raise ValueError("do, q, k, v, o and lse2 must be on one CUDA device")
    if torch.cuda.get_device_capability(q.device)[0] != 9:
        major, minor = torch.cuda.get_device_capability(q.device)
        raise ValueError(f"the FlashAttention-3 backward needs a Hopper GPU (sm_90: H100, H200); got sm_{major}{minor}")


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether :func:`backward` takes these inputs once they are contiguous: (B, H, N, d) on a
    Hopper GPU, bfloat16/float16, d in HEAD_DIMS, as many K/V heads as query heads."""
    tensors = (q, k, v)
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 and t.is_cuda for t in tensors):
        return False
    return (q.dtype in DTYPES and q.dtype == k.dtype == v.dtype and k.shape == v.shape
            and q.shape[:2] == k.shape[:2] and q.shape[3] == k.shape[3] and q.shape[3] in HEAD_DIMS
            and torch.cuda.get_device_capability(q.device)[0] == 9)


def _descriptors(q, do, k, v, lse, delta, dq) -> tuple[TensorDescriptor, ...]:
    """TMA descriptors over the 2-D views (B * H * N, d): Br-row blocks (Q, dO), 2 Br-row blocks (K, V);
    over L, D (B * H, N_pad) viewed as rows of Br, one row a block; and over the fp32 dQ buffer
    (B * H, N_q, d) in blocks (1, Br, 64), so that a block's rows past N_q fall outside its head."""
    d = q.shape[3]
    gl_dtype = _GL_DTYPES[q.dtype]
    rows = gl.NVMMASharedLayout.get_default_for([BLOCK_M, d], gl_dtype)
    keys = gl.NVMMASharedLayout.get_default_for([2 * BLOCK_M, d], gl_dtype)
    return (TensorDescriptor.from_tensor(q.view(-1, d), [BLOCK_M, d], rows),
            TensorDescriptor.from_tensor(do.view(-1, d), [BLOCK_M, d], rows),
            TensorDescriptor.from_tensor(k.view(-1, d), [2 * BLOCK_M, d], keys),
            TensorDescriptor.from_tensor(v.view(-1, d), [2 * BLOCK_M, d], keys),
            TensorDescriptor.from_tensor(lse.view(-1, BLOCK_M), [1, BLOCK_M], ROW_LAYOUT),
            TensorDescriptor.from_tensor(delta.view(-1, BLOCK_M), [1, BLOCK_M], ROW_LAYOUT),
            TensorDescriptor.from_tensor(dq.view(-1, q.shape[2], d), DQ_BLOCK, DQ_SMEM_LAYOUT))


def backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
             lse2: torch.Tensor, causal: bool, scale: float, *, stamps: torch.Tensor | None = None,
             stamp_at: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) of o = attention(q, k, v) from do, as
    :func:`flashlab.kernels.backward.backward` returns them.

    do, q, o (B, H, N_q, d) and k, v (B, H, N_k, d): contiguous, bf16 or fp16, d in HEAD_DIMS, on
    sm_90; lse2 (B, H, N_q) float32, the forward's log-sum-exp in log2 units (-inf for a row that
    saw no key). Causal is aligned bottom-right. dq is summed by atomic adds: not bit-reproducible.
    ``stamps``: build with time stamps and let program ``stamp_at`` (key block + batch-head * key
    blocks per head) write them into this int64 (query blocks, len(STAMP_PHASES), 2, 2) buffer:
    (%globaltimer ns, %clock64 cycles) where each consumer began each phase of step t."""
    _check(do, q, k, v, o, lse2)
    B, H, N_Q, D = q.shape
    N_K = k.shape[2]
    delta, lse, dq_acc = prepare(do, o, lse2)
    n_pad = lse.shape[1]
    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    grid = (triton.cdiv(N_K, 2 * BLOCK_M), B * H)
    stamping = stamp_args(stamps, stamp_at, (n_pad // BLOCK_M, len(STAMP_PHASES), 2, 2), q.device)
    if stamping and not 0 <= stamp_at < grid[0] * grid[1]:
        raise ValueError(f"stamp_at must name one of the {grid[0] * grid[1]} programs; got {stamp_at}")
    _fa3_backward_kernel[grid](*_descriptors(q, do, k, v, lse, delta, dq_acc), dk, dv, N_Q, N_K, n_pad,
                               scale * LOG2E, scale, CAUSAL=bool(causal), **config(D), **stamping,
                               num_warps=NUM_WARPS, maxnreg=MAXNREG)
    return finish(dq_acc, scale, q.dtype), dk, dv


def compile_sm90(dtype: torch.dtype = torch.bfloat16, d: int = 128, causal: bool = False, stamps: bool = False):
    """Compile the kernel for sm_90 without a GPU, with the argument types :func:`backward`
    launches it with (``stamps``: the build with time stamps); returns Triton's CompiledKernel."""
    check_build(dtype, d, HEAD_DIMS)
    c = config(d)
    g = _GL_DTYPES[dtype]
    constexprs = dict(CAUSAL=bool(causal), **c, STAMP_AT=0, STAMPS=bool(stamps)) | ({} if stamps else dict(STAMP=None))
    signature = {"desc_q": tensor_descriptor_type(g, [BLOCK_M, d]), "desc_do": tensor_descriptor_type(g, [BLOCK_M, d]),
                 "desc_k": tensor_descriptor_type(g, [2 * BLOCK_M, d]),
                 "desc_v": tensor_descriptor_type(g, [2 * BLOCK_M, d]),
                 "desc_lse": f"tensordesc<fp32[1, {BLOCK_M}],{ROW_LAYOUT!r}>",
                 "desc_delta": f"tensordesc<fp32[1, {BLOCK_M}],{ROW_LAYOUT!r}>",
                 "desc_dq": f"tensordesc<fp32{DQ_BLOCK},{DQ_SMEM_LAYOUT!r}>",
                 "DK": f"*{g}", "DV": f"*{g}",
                 "N_Q": "i32", "N_K": "i32", "N_PAD": "i32", "qk_scale": "fp32", "scale": "fp32",
                 **{k: "constexpr" for k in constexprs}} | ({"STAMP": "*i64"} if stamps else {})
    names = ("DK", "DV") + (("STAMP",) if stamps else ())
    pointers = tuple(_fa3_backward_kernel.arg_names.index(n) for n in names)
    return compile_for_sm90(_fa3_backward_kernel, signature, constexprs, pointers, NUM_WARPS, MAXNREG)
