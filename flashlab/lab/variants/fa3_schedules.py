"""FlashAttention-3's forward (:mod:`flashlab.kernels.fa3`) with its ideas switched off one at a
time, for the ablation of chapter 6 (:mod:`flashlab.lab.experiments.fa3`, FA3 §4.3):

- ``complete``: the teaching kernel as it is: producer warp, two consumer warpgroups taking turns
  (ping-pong), S_next issued before this block's softmax (intra-warpgroup overlap);
- ``no_pingpong``: the consumers issue their GEMMs whenever they are ready (``pingpong=False``);
- ``no_overlap``: each consumer waits for S_j (and the P V issued beside it) before its softmax,
  so the softmax never runs under its own GEMMs (``overlap=False``), ping-pong kept;
- ``no_warp_specialization``: no producer and no partitions. One program of two warpgroups
  (8 warps, 2 Br = 128 query rows) runs one instruction stream: it issues the TMA loads of
  K_{j+1} and V_{j+1} itself, a block ahead, into a two-slot ring, and waits for them in line;
  the intra-warpgroup overlap (S_{j} issued before P_{j-1} V_{j-1}, waited for first) is kept,
  as in the paper's row "GEMM-softmax pipelining, no warp specialization". With no partitions
  there are no turns to take and no registers to move (no setmaxnreg).

The first three launch the teaching kernel with its constexprs, persistent (one program per SM,
O stored by TMA); the fourth reuses its functions (``_softmax_step``, ``_needs_mask``,
``_tile_rows``, ``_key_blocks``, ``_write_tile``) with one program per tile, as the teaching kernel
was when chapter 6's ablation was recorded; only the loop that loads and consumes is its own.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from flashlab.kernels import fa3
from flashlab.kernels._common import LOG2E

__all__ = ["SCHEDULES", "SIMULATED", "compile_sm90", "forward"]

SCHEDULES = ("complete", "no_pingpong", "no_overlap", "no_warp_specialization")
# The chapter-6 simulator's schedule (flashlab.sim.events) closest to each: (name, builder flags).
# Two consumers and a producer unless said; the simulator's "no producer" loads each block after
# the last GEMM of the block before, with no prefetch, which this kernel does not do.
SIMULATED = {
    "complete": ("pingpong_intra", dict(consumers=2, intra=True, producer=True, barrier=True)),
    "no_pingpong": ("two consumers, intra, no barrier", dict(consumers=2, intra=True, producer=True, barrier=False)),
    "no_overlap": ("pingpong", dict(consumers=2, intra=False, producer=True, barrier=True)),
    "no_warp_specialization": ("two warpgroups, intra, no producer",
                               dict(consumers=2, intra=True, producer=False, barrier=False)),
}
NO_WS_WARPS = 8  # two warpgroups in one partition
NO_WS_STAGES = 2  # K and V slots: block j + 1 is loaded while block j is consumed

# A barrier of the whole program: triton 3.6 names it thread_barrier, later versions barrier
_cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
_tma_load = fa3._tma_load


@gluon.jit
def _load_k(desc_k, k_smem, k_full, kv_row0, j, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """TMA-load K_j into slot j % STAGES; k_full of that slot completes when its bytes arrive."""
    mbarrier.expect(k_full.index(j % STAGES), desc_k.block_type.nbytes)
    _tma_load(desc_k, [kv_row0 + j * BLOCK_N, 0], k_full.index(j % STAGES), k_smem.index(j % STAGES))


@gluon.jit
def _fa3_no_ws_kernel(desc_q, desc_k, desc_v, O, LSE, N_Q, N_K, qk_scale,
                      CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
                      STAGES: gl.constexpr):
    """Grid (query tiles of BLOCK_M = 2 Br rows, B * H); 8 warps, no warp specialisation."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[8, 1],
                                                       instr_shape=[16, HEAD_D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    dtype: gl.constexpr = desc_q.dtype

    bh = gl.program_id(1)
    m0 = fa3._tile_rows(CAUSAL, BLOCK_M)
    n_blocks = fa3._key_blocks(m0, N_Q, N_K, BLOCK_M, BLOCK_N, CAUSAL)
    o_row0 = bh * N_Q
    kv_row0 = bh * N_K
    q_smem = gl.allocate_shared_memory(dtype, desc_q.block_type.shape, desc_q.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES] + desc_k.block_type.shape, desc_k.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES] + desc_v.block_type.shape, desc_v.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_full.index(i), count=1)
        mbarrier.init(v_full.index(i), count=1)

    # prologue: Q, and blocks 0 and 1, into the two slots
    mbarrier.expect(q_bar, desc_q.block_type.nbytes)
    _tma_load(desc_q, [o_row0 + m0, 0], q_bar, q_smem)
    for j in gl.static_range(STAGES):
        if j < n_blocks:
            _load_k(desc_k, k_smem, k_full, kv_row0, j, BLOCK_N, STAGES)
            mbarrier.expect(v_full.index(j), desc_v.block_type.nbytes)
            _tma_load(desc_v, [kv_row0 + j * BLOCK_N, 0], v_full.index(j), v_smem.index(j))

    causal_offset = N_K - N_Q
    first_row_keys = m0 + causal_offset + 1
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, s_layout))
    o = gl.zeros([BLOCK_M, HEAD_D], gl.float32, o_layout)

    mbarrier.wait(q_bar, 0)
    mbarrier.wait(k_full.index(0), 0)
    s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s_tok,))
    p, m_i, l_i, alpha = fa3._softmax_step(s, m_i, l_i, m0, 0, N_K, causal_offset, qk_scale,
                                           fa3._needs_mask(0, N_K, first_row_keys, BLOCK_N, CAUSAL), CAUSAL)
    p = gl.convert_layout(p.to(dtype), p_layout)

    for j in range(1, n_blocks):
        stage = j % STAGES
        prev = (j - 1) % STAGES
        if j >= STAGES - 1 and j + 1 < n_blocks:
            # K_{j-1}'s slot is free once every warp has waited for S_{j-1}: load K_{j+1} there
            _cta_barrier()
            _load_k(desc_k, k_smem, k_full, kv_row0, j + 1, BLOCK_N, STAGES)
        mbarrier.wait(k_full.index(stage), (j // STAGES) & 1)
        s_tok = warpgroup_mma(q_smem, k_smem.index(stage).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        o = o * gl.convert_layout(alpha, row_o)[:, None]
        mbarrier.wait(v_full.index(prev), ((j - 1) // STAGES) & 1)
        o_tok = warpgroup_mma(p, v_smem.index(prev), o, is_async=True)
        s = warpgroup_mma_wait(1, deps=(s_tok,))
        start_n = j * BLOCK_N
        p_next, m_i, l_i, alpha = fa3._softmax_step(
            s, m_i, l_i, m0, start_n, N_K, causal_offset, qk_scale,
            fa3._needs_mask(start_n, N_K, first_row_keys, BLOCK_N, CAUSAL), CAUSAL)
        o, p = warpgroup_mma_wait(0, deps=(o_tok, p))
        if j >= STAGES - 1 and j + 1 < n_blocks:
            # V_{j-1}'s slot is free once every warp has waited for P_{j-1} V_{j-1}: load V_{j+1}
            _cta_barrier()
            mbarrier.expect(v_full.index(prev), desc_v.block_type.nbytes)
            _tma_load(desc_v, [kv_row0 + (j + 1) * BLOCK_N, 0], v_full.index(prev), v_smem.index(prev))
        p = gl.convert_layout(p_next.to(dtype), p_layout)

    last = (n_blocks - 1) % STAGES
    o = o * gl.convert_layout(alpha, row_o)[:, None]
    mbarrier.wait(v_full.index(last), ((n_blocks - 1) // STAGES) & 1)
    o_tok = warpgroup_mma(p, v_smem.index(last), o, is_async=True)
    o, p = warpgroup_mma_wait(0, deps=(o_tok, p))
    fa3._write_tile(O, LSE, o, m_i, l_i, m0, o_row0, N_Q, o_layout, BLOCK_M, HEAD_D)


def _no_ws_config(d: int) -> dict:
    c = fa3.config(d)
    return {"BLOCK_M": 2 * c["BLOCK_M"], "BLOCK_N": c["BLOCK_N"], "HEAD_D": d, "STAGES": NO_WS_STAGES}


def _forward_no_ws(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None,
                   out: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    scale = fa3._check(q, k, v, scale)
    B, H, N_Q, D = q.shape
    N_K = k.shape[2]
    o = torch.empty_like(q) if out is None else out
    lse2 = torch.empty((B, H, N_Q), device=q.device, dtype=torch.float32)
    c = _no_ws_config(D)
    gl_dtype = fa3._GL_DTYPES[q.dtype]
    q_layout = gl.NVMMASharedLayout.get_default_for([c["BLOCK_M"], D], gl_dtype)
    kv_layout = gl.NVMMASharedLayout.get_default_for([c["BLOCK_N"], D], gl_dtype)
    descs = (TensorDescriptor.from_tensor(q.view(-1, D), [c["BLOCK_M"], D], q_layout),
             TensorDescriptor.from_tensor(k.view(-1, D), [c["BLOCK_N"], D], kv_layout),
             TensorDescriptor.from_tensor(v.view(-1, D), [c["BLOCK_N"], D], kv_layout))
    grid = (triton.cdiv(N_Q, c["BLOCK_M"]), B * H)
    _fa3_no_ws_kernel[grid](*descs, o, lse2, N_Q, N_K, scale * LOG2E, CAUSAL=bool(causal), **c,
                            num_warps=NO_WS_WARPS)
    return o, lse2


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None = None, *,
            schedule: str = "complete", out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`flashlab.kernels.fa3.forward` on one of :data:`SCHEDULES`; returns (o, lse2), lse2
    in log2 units, as the teaching kernel does."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}; got {schedule!r}")
    if schedule == "no_warp_specialization":
        return _forward_no_ws(q, k, v, causal, scale, out)
    return fa3.forward(q, k, v, causal, scale, pingpong=schedule != "no_pingpong",
                       overlap=schedule != "no_overlap", out=out)


def compile_sm90(schedule: str = "complete", dtype: torch.dtype = torch.bfloat16, d: int = 128,
                 causal: bool = False):
    """Compile a schedule's kernel for sm_90 without a GPU (see :func:`flashlab.kernels.fa3.compile_sm90`)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}; got {schedule!r}")
    if schedule != "no_warp_specialization":
        return fa3.compile_sm90(dtype, d, causal, pingpong=schedule != "no_pingpong", overlap=schedule != "no_overlap")
    c = _no_ws_config(d)
    gl_dtype = fa3._GL_DTYPES[dtype]
    constexprs = dict(CAUSAL=bool(causal), **c)
    signature = {"desc_q": fa3.tensor_descriptor_type(gl_dtype, [c["BLOCK_M"], d]),
                 "desc_k": fa3.tensor_descriptor_type(gl_dtype, [c["BLOCK_N"], d]),
                 "desc_v": fa3.tensor_descriptor_type(gl_dtype, [c["BLOCK_N"], d]),
                 "O": f"*{gl_dtype}", "LSE": "*fp32", "N_Q": "i32", "N_K": "i32", "qk_scale": "fp32",
                 **{k: "constexpr" for k in constexprs}}
    return fa3.compile_for_sm90(_fa3_no_ws_kernel, signature, constexprs, (3, 4), NO_WS_WARPS, None)
