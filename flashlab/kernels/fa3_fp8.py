"""FlashAttention-3's FP8 forward (Shah et al. 2024, §3.3) in Gluon, for Hopper (sm_90).

The program of :mod:`.fa3` (a producer warp and two or three consumer warpgroups, S_next issued
before this block's softmax; ping-pong's turns a switch, off by default: :data:`SWITCHES`), with
e4m3 operands in both GEMMs:

    S_ij = (Q8_i K8_j^T) * r_i * dk_j        fp8 x fp8 wgmma, fp32 accumulator; r_i = scale log2(e) dq_i
    P_ij = 2^8 exp2(S_ij - m_new)            in (0, 256]: e4m3's normal range starts at 2^-6
    O_i  = alpha O_i + fp8(P_ij) V8_j        P the A operand (registers or shared memory), V8_j the B
    O_i  = O_i * dv / l_i,  lse_i = m_i + log2(l_i) - 8      the 2^8 cancels in O / l

With ``rescale_threshold`` theta (FlashAttention-4's conditional rescaling, off by default:
:data:`RESCALE_THRESHOLD`), m_i moves, and O_i is rescaled, only when some row of the warpgroup
rose above it by more than theta; P then carries 2^(8 - theta) instead of 2^8.

Descales (float32, positive, as :func:`flashlab.kernels.fp8.quantize_fp8` makes them): Q per
block of ``q_block`` rows (a multiple of Br = 64: one scalar per warpgroup) or per head, K per
block of ``k_block`` rows (a multiple of 128: one or two scalars per key block, read beside
each S GEMM) or per head, V per head (one scalar, applied once in the epilogue).

V is laid out K-major. An FP8 wgmma reads its B operand from shared memory only with the
reduction dimension contiguous, and O = P V reduces over keys, so V must arrive as V^T, (d, N_k)
per head with keys contiguous. :func:`wgmma_v` writes it so, in one pass over V (N_k d bytes
read and written per head; 0.09 ms at B N = 16k tokens, H = 16, d = 128 on an H200, some 5 % of
the forward at N = 8k, counted in the forward's time; FlashAttention-3 instead
transposes V inside the kernel, in shared memory, in the producer warpgroup). The producer loads
V^T_j, (d, Bc), and the consumer hands its transpose view, (Bc, d) keys-contiguous, to wgmma.

Three builds (:func:`config`): two consumers with P in registers at Bc = 128; two consumers with
256-key blocks and P through shared memory (the default at d = 128); three consumers with P
through shared memory at Bc = 128 (the default at d = 64). With P in registers, the fp32
accumulator of S holds, in each thread, two
adjacent keys of every 8; wgmma's 8-bit A operand (a DotOperandLayout with k_width = 4) wants four
adjacent keys in each 32-bit register. Converting one layout into the other moves bytes between
the threads of a quad (byte permutes and warp shuffles, about 280 instructions per thread per key
block at Bc = 128). FlashAttention-3 avoids the move, and so does this kernel: P's registers are
used as they are, which amounts to reading P's columns in another order, k = pi(c) within every
16 keys (:func:`_as_operand`; ``assert_trivial`` makes the compiler check that no data moves),
and :func:`wgmma_v` stores V's keys in the same order, so that sum_c P[:, c] V[c] is unchanged.
Through shared memory, :func:`_p_to_shared` regroups the keys so that each thread stores 16 bytes
at a time, and :func:`wgmma_v` (``shared_block``) lays V out in that order. There, ``l_mma`` lets
the tensor cores sum l as well: L = fp8(P) 1, a narrow wgmma beside each P V (:data:`L_MMA`).

Glossary: e4m3 = 4 exponent bits, 3 mantissa bits, largest 448; descale = the factor an fp8
number is multiplied by to give the value it stands for; Br, Bc, m, l, lse as in :mod:`.fa3`.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                             warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from . import fa3
from ._common import LN2, LOG2E, check_rescale_threshold, check_scale

__all__ = ["GLUON_FP8_IMPL", "HEAD_DIMS", "L_MMA", "OUT_DTYPES", "RESCALE_THRESHOLD", "SWITCHES", "compile_sm90",
           "config", "fa3_fp8_forward", "forward", "key_order", "wgmma_v"]

GLUON_FP8_IMPL = "gluon"  # the name flash_attention_fp8(impl=...) can give this kernel
HEAD_DIMS = (64, 128)
OUT_DTYPES = (torch.bfloat16, torch.float16)
_GL_OUT = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}
FP8_DTYPE = torch.float8_e4m3fn
P_SHIFT = 8.0  # P = 2^8 exp2(S - m): FA3's Max_offset, as in flashlab.kernels.fp8
# (ping-pong, intra-warpgroup overlap) each head dimension runs by default, as fa3.SWITCHES is for
# bf16. FP8 halves the GEMMs' time and not the softmax's, and its softmax does more (descales,
# P's 2^8, the cast to e4m3): the exp side is the longer, so ping-pong's turns only add waits,
# and the overlap hides part of the softmax behind P V. Ping-pong off, overlap on was the
# fastest setting (results/fa3_backward/run15: +5-6 % at d = 128 without the mask, within the
# spread with it; up to +4 % at d = 64).
SWITCHES = {64: (False, True), 128: (False, True)}
# Conditional rescaling (FlashAttention-4; chapter 7), ``rescale_threshold`` theta: a warpgroup
# keeps its rows' reference maximum m while no row below N_q has a rowmax(S) past it by more than theta
# (log2 units), and then skips O's rescale. Exact for any m (O / l and lse carry the same m); P =
# 2^(8 - theta) exp2(S - m) <= 2^8 stays in e4m3's range, its smallest values losing theta bits,
# as in flashlab.lab.variants.fp8_schedules. The rule of
# flashlab.reference.rescale.conditional_attention with row_group = Br. None (the default):
# rescale at every block.
RESCALE_THRESHOLD = None
# FlashAttention-4's software exp2 (chapter 7), ``poly_fraction``: the share of P's exponentials
# computed by a cubic on the FMA pipes instead of the special-function unit, realised as 1/2^s
# (flashlab.kernels.fa4.poly_shift). 0 (the default): all on the special-function unit. Each
# software exp2 is nine instructions where MUFU.EX2 is one, and the special-function unit is not
# this kernel's limit: at d = 128 without the mask 1/8, 1/4 and 1/2 lost 2, 5-6 and 13-18 %
# (results/fa3_backward/run21).
POLY_FRACTION = {64: 0.0, 128: 0.0}
# P through shared memory (``p_smem``): Bc = 256 keys a block, P stored to shared memory as e4m3
# and read from there by the P V wgmma. With P in registers, Bc = 256 does not fit a consumer's
# 240 registers (S 128, O 64, P 32 and the rest: ptxas spills); through shared memory P's
# registers are free before the next S arrives. Per-block costs (the row statistics, O's rescale,
# the barriers, the address work) are then paid once per 256 keys: +3.7 to +7.5 % at d = 128 on an
# H200 with one K descale a head (results/fa3_backward/run26), +0.4 to +6.2 % on an H100 with the
# bench's K descale per 128 keys (run27), +2.6 to +9.6 % in run 28. The default at d = 128; at
# d = 64 mixed (+7.3, +0.2, +6.6, -6.1 %, run 28), where three consumers win (CONSUMERS).
P_SMEM = {64: False, 128: True}
P_SMEM_BLOCK_N = 256
# A stamped build (``stamps``) keeps Bc = 128 unless ``p_smem`` is given: at Bc = 256 the time
# stamps' registers make ptxas spill inside the key-block loop.
# Consumer warpgroups a program (``consumers``): 2, or 3 with P through shared memory at Bc = 128
# (a tile of 192 query rows; setmaxnreg gives consumers 1 and 2 160 registers a thread, consumer 0
# 168, as fa3.MAXNREG_3 explains). Three consumers' S (64 registers), O (64) and the rest fit 160
# without P's registers (compiled: no local memory in the key-block loop at d = 64 and at d = 128
# without the mask); ping-pong's turns are for two, so it is off. On an H100 with the bench's
# inputs (results/fa3_backward/run28): at d = 64 +25 % at 16k and +20 % at 4k without the mask,
# +9 % and +5 % with it, against two consumers with P from registers, so three is d = 64's
# default; at d = 128 it won without the mask and lost with it (the masked loops spill), and
# against p_smem's 256-key blocks it won at 16k and lost at 4k: an option there.
CONSUMERS = {64: 3, 128: 2}
# l = rowsum(P) on the tensor cores (``l_mma``, with P through shared memory): a second wgmma beside
# each P V, L = fp8(P) 1 with a (Bc, L_N) tile of ones, added to l in fp32 registers, instead of the
# softmax's row sums (some 130 FADD a thread per 256-key block, of about 850 instructions). l then
# sums the e4m3 P that P V multiplies, so O / l weighs V's rows exactly as P V did, and lse is that
# of the rounded P: in a row that sees few keys up to log2(1 + 2^-4) from the exact one (each P
# rounds by up to 2^-4). Off by default: not yet timed.
L_MMA = {64: False, 128: False}
L_N = gl.constexpr(8)  # the narrowest wgmma: every column of L holds l


def config(d: int, p_smem: bool | None = None, consumers: int | None = None) -> dict:
    """The kernel's tiles, ring depth and consumer count for head dimension d. Three builds, each
    with Br = 64 query rows per consumer warpgroup:

    - ``p_smem=False``: two consumers, P from registers, Bc = 128 keys, 3 stages. Shared memory
      per CTA: Q 2 * 64 * d + 3 * (K + V^T) 2 * 128 * d one byte an element, O 2 * 64 * d two
      bytes an element: 144 KB at d = 128.
    - ``p_smem=True``: two consumers, Bc = 256, 2 stages, and each consumer's P tile in shared
      memory, 2 * 64 * 256 bytes: 208 KB at d = 128.
    - ``consumers=3``: Bc = 128, 3 stages, P through shared memory, 3 * (64 * d + 64 * 128 +
      2 * 64 * d) + 3 * 2 * 128 * d bytes: 192 KB at d = 128.

    With neither argument given, d's defaults: :data:`CONSUMERS` first (three at d = 64), then
    :data:`P_SMEM` (the 256-key blocks at d = 128)."""
    if p_smem is not None and not isinstance(p_smem, bool):
        raise TypeError(f"p_smem must be None, True or False; got {p_smem!r}")
    if consumers is not None and (isinstance(consumers, bool) or not isinstance(consumers, int)
                                  or consumers not in (2, 3)):
        raise ValueError(f"consumers must be None, 2 or 3; got {consumers!r}")
    if consumers == 3 and p_smem is False:
        raise ValueError("consumers=3 takes P through shared memory: p_smem must be None or True; got False")
    # the default count holds only where p_smem is not given: p_smem=False asks for P from
    # registers, p_smem=True for the 256-key blocks, both with two consumers
    n = consumers or (CONSUMERS.get(d, 2) if p_smem is None else 2)
    if n == 3:
        return {"BLOCK_M": fa3.BLOCK_M, "BLOCK_N": fa3.BLOCK_N, "HEAD_D": d, "STAGES": 3, "P_SMEM": True,
                "CONSUMERS": 3}
    if P_SMEM.get(d, False) if p_smem is None else p_smem:
        return {"BLOCK_M": fa3.BLOCK_M, "BLOCK_N": P_SMEM_BLOCK_N, "HEAD_D": d, "STAGES": 2, "P_SMEM": True,
                "CONSUMERS": 2}
    return {"BLOCK_M": fa3.BLOCK_M, "BLOCK_N": fa3.BLOCK_N, "HEAD_D": d, "STAGES": 3, "P_SMEM": False,
            "CONSUMERS": 2}


def _registers(c: dict) -> int:
    """The kernel's maxnreg for a :func:`config`: two consumers or three (fa3.MAXNREG, MAXNREG_3)."""
    return fa3.MAXNREG_3 if c["CONSUMERS"] == 3 else fa3.MAXNREG


@gluon.jit
def _to_e4m3(p):
    """fp8(P) for P (Br, Bc) fp32 in wgmma's 8-bit A-operand layout: each four consecutive keys of
    a row a thread holds become one 32-bit register, two cvt.rn.satfinite.e4m3x2 (round to nearest
    even, saturate at 448) and one move, the register the wgmma reads. (``p.to(fp8)`` converts with
    the same instruction but splits each pair into bytes, which reach the wgmma of the next
    iteration one by one and are packed again there: about twelve byte moves more per four keys.)"""
    return gl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi;\n"
        "cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1;\n"  # key 1 to the upper byte, key 0 to the lower
        "cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3;\n"
        "mov.b32 $0, {lo, hi}; }",
        "=r,r,r,r,r", [p], dtype=gl.int8, is_pure=True, pack=4).to(gl.float8e4nv, bitcast=True)


@gluon.jit
def _p_operand(p, p_layout: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """fp8(P) (Br, Bc) as the A operand of O += P V: its columns in V's key order, in wgmma's
    8-bit A layout without moving data, and rounded to e4m3 where the wgmma reads it."""
    return _to_e4m3(gl.convert_layout(_as_operand(p, BLOCK_M, BLOCK_N), p_layout, assert_trivial=True))


@gluon.jit
def _p_to_shared(p, p_buf, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """fp8(P) (Br, Bc) into ``p_buf``, the A operand of O += P V from shared memory. Each thread's
    keys of a row are made contiguous, so that it stores them 16 bytes at a time: the accumulator
    gives a thread keys c = 8 g + 2 q + e (q its lane's column pair, g < Bc / 8, e < 2), and key c
    goes to column k = (Bc / 4) q + 2 g + e (:func:`key_order` with ``shared=True``)."""
    p = gl.reshape(p, [BLOCK_M, BLOCK_N // 8, 4, 2])  # (row, g, q, e)
    p = gl.permute(p, [0, 2, 1, 3])  # (row, q, g, e)
    p_buf.store(_to_e4m3(gl.reshape(p, [BLOCK_M, BLOCK_N])))
    fence_async_shared()  # the stores are visible to the wgmma that reads p_buf (Triton adds the
    # warpgroup barriers: before these stores, after the wgmma that last read p_buf, and after them)


@gluon.jit
def _pv_a(p, p_buf, p_layout: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, P_SMEM: gl.constexpr):
    """The A operand of O += P V, (Br, Bc) e4m3: ``p_buf`` (P_SMEM: P is there already), or P
    (Br, Bc) fp32 from registers, made e4m3 in wgmma's register layout (:func:`_p_operand`)."""
    if P_SMEM:
        a = p_buf
    else:
        a = _p_operand(p, p_layout, BLOCK_M, BLOCK_N)
    return a


@gluon.jit
def _as_operand(p, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """P (Br, Bc) with its columns reordered so that wgmma's 8-bit A-operand layout holds it in the
    registers where the accumulator layout left it: key c = 16 a + 8 c3 + 4 c2 + 2 c1 + c0 moves to
    column k = 16 a + 8 c2 + 4 c1 + 2 c3 + c0 (:func:`key_order` gives the same permutation)."""
    p = gl.reshape(p, [BLOCK_M, BLOCK_N // 16, 2, 2, 2, 2])  # (row, a, c3, c2, c1, c0)
    p = gl.permute(p, [0, 1, 3, 4, 2, 5])  # (row, a, c2, c1, c3, c0)
    return gl.reshape(p, [BLOCK_M, BLOCK_N])


@gluon.jit
def _fp8_softmax_step(s, m_i, l_i, row0, start_n, N_Q, N_K, causal_offset, qk_scale, masked, CAUSAL: gl.constexpr,
                      THETA: gl.constexpr, SHIFT: gl.constexpr, EXP_POLY: gl.constexpr = -1, qk_scale_hi=None,
                      HALVES: gl.constexpr = False, ROW_SUM: gl.constexpr = True):
    """:func:`.fa3._softmax_step` for the FP8 kernel: S (Br, Bc), m, l (Br,) in log2 units.
    Returns P = 2^SHIFT exp2(S * scale - m_new) (Br, Bc), m_new, l_new, alpha = exp2(m - m_new)
    (Br,) and whether O must be rescaled (a scalar; True when THETA < 0). THETA >= 0: conditional
    rescaling, m_new = m unless some row of the warpgroup rose above its m by more than THETA.
    Only rows below N_Q vote: past the last query the tile's rows are the next head's.
    EXP_POLY: P's exp2 in software on Bc / 2^EXP_POLY of the columns (:func:`.fa3._exp2_tile`).
    HALVES: keys [Bc/2, Bc) have their own K descale, so S's second half is scaled by
    ``qk_scale_hi`` (S = Q8 K8^T r dk, dk one per Bc/2 keys; :func:`.fa3._halves`, no data moves).
    ROW_SUM=False: l is not summed here (``l_mma``: the tensor cores sum it) and comes back as it came."""
    if HALVES:
        rows_of_s: gl.constexpr = gl.SliceLayout(1, s.type.layout)
        W: gl.constexpr = s.shape[1] // 2
        s_lo, s_hi = fa3._halves(s)
        s_lo, max_lo = fa3._masked_row_max(s_lo, row0, start_n, N_K, causal_offset, qk_scale, masked, CAUSAL)
        s_hi, max_hi = fa3._masked_row_max(s_hi, row0, start_n + W, N_K, causal_offset, qk_scale_hi, masked, CAUSAL)
        row_max = gl.maximum(gl.convert_layout(max_lo, rows_of_s, assert_trivial=True),
                             gl.convert_layout(max_hi, rows_of_s, assert_trivial=True))
    else:
        s, row_max = fa3._masked_row_max(s, row0, start_n, N_K, causal_offset, qk_scale, masked, CAUSAL)
    m_new = gl.maximum(m_i, row_max)  # m_new = max(m, rowmax(S))
    rescale = True
    if THETA >= 0:  # rise: how far the warpgroup's maxima passed m (a row's first key: +inf)
        rows = row0 + gl.arange(0, s.shape[0], layout=gl.SliceLayout(1, s.type.layout))  # (Br,) query indices
        rises = (m_new > m_i) & (rows < N_Q)
        rise = gl.reduce(gl.where(rises, m_new - m_i, 0.0), 0, fa3._maximum)  # over the Br rows
        rescale = rise > THETA
        m_new = gl.where(rescale, m_new, m_i)  # every row keeps its m, or every row moves
    if HALVES:  # each half as its own tile, l the sum of the two halves' row sums
        rows_lo: gl.constexpr = gl.SliceLayout(1, s_lo.type.layout)
        m_lo = gl.convert_layout(m_i, rows_lo, assert_trivial=True)
        m_new_lo = gl.convert_layout(m_new, rows_lo, assert_trivial=True)
        p_lo, l_lo, alpha = fa3._exp_step(s_lo, m_lo, m_new_lo, gl.convert_layout(l_i, rows_lo, assert_trivial=True),
                                          qk_scale, SHIFT, EXP_POLY, ROW_SUM)
        p_hi, l_hi, _ = fa3._exp_step(s_hi, m_lo, m_new_lo, gl.zeros([s.shape[0]], gl.float32, rows_lo), qk_scale_hi,
                                      SHIFT, EXP_POLY, ROW_SUM)
        p = fa3._join_halves(p_lo, p_hi, s)
        if ROW_SUM:
            l_i = gl.convert_layout(l_lo + l_hi, rows_of_s, assert_trivial=True)
        alpha = gl.convert_layout(alpha, rows_of_s, assert_trivial=True)
    else:
        p, l_i, alpha = fa3._exp_step(s, m_i, m_new, l_i, qk_scale, SHIFT, EXP_POLY, ROW_SUM)
    return p, m_new, l_i, alpha, rescale


@gluon.jit
def _rescale(o, alpha, rescale, row_o: gl.constexpr):
    """O = alpha O (Algorithm 1, line 10) for O (Br, d), alpha (Br,), unless ``rescale`` (from
    :func:`_fp8_softmax_step`: the constant True without conditional rescaling) is false."""
    if rescale:
        o = o * gl.convert_layout(alpha, row_o)[:, None]
    return o


@gluon.jit
def _descale_at(D, bh, n_blocks_per_head, row, BLOCK: gl.constexpr):
    """The descale of ``row`` in head ``bh`` of a (B, H, nb) descale tensor: one per BLOCK rows
    (BLOCK = 0: one per head). Rows past the last block (a ragged tail) take the last block's."""
    if BLOCK == 0:
        idx = bh
    else:
        idx = bh * n_blocks_per_head + gl.minimum(row // BLOCK, n_blocks_per_head - 1)
    return gl.load(D + idx)


@gluon.jit
def _consumer_fp8(desc_o, O, LSE, QD, KD, VD, NQB, NKB, q_smem, o_smem, k_smem, v_smem, p_smem, ones_smem, bars,
                  turn, N_Q, N_K, BH, DEAL, qk_scale,
                  CAUSAL: gl.constexpr, WG: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                  HEAD_D: gl.constexpr, STAGES: gl.constexpr, Q_SB: gl.constexpr, K_SB: gl.constexpr,
                  PINGPONG: gl.constexpr = True, OVERLAP: gl.constexpr = True, THETA: gl.constexpr = -1.0,
                  SHIFT: gl.constexpr = P_SHIFT, STAMP=None, STAMP_AT: gl.constexpr = 0,
                  STAMPS: gl.constexpr = False, EXP_POLY: gl.constexpr = -1, P_SMEM: gl.constexpr = False,
                  CONSUMERS: gl.constexpr = 2, L_MMA: gl.constexpr = False):
    """Algorithm 2 for FP8, consumer warpgroup WG (rows m0 + WG * Br + [0, Br) of each tile of the
    program); :func:`.fa3._consumer` with the descales, P's 2^8 and V^T, and the same two switches
    (PINGPONG: the turn barriers; OVERLAP=False: wait for both GEMMs before each softmax).
    STAMPS: time stamps of each phase of tile STAMP_AT, in :func:`.fa3._consumer`'s phases and
    order; P becomes e4m3 inside the P V issue, so "convert" only hands P_next over (near 0).
    P_SMEM: P goes to ``p_smem`` (this warpgroup's (Br, Bc) tile) once the P V before it is done,
    and the P V product reads both operands from shared memory (:func:`_p_to_shared`).
    L_MMA (with P_SMEM): each block's rowsum(P) by the tensor cores, beside its P V: L = fp8(P) 1,
    with 1 the (Bc, L_N) tile of ones in ``ones_smem`` (this warpgroup's), so every column of the
    (Br, L_N) result holds it; l, a (Br, L_N) fp32 tile in registers, is rescaled with O and adds
    L (l = alpha l + L), and the softmax adds no row sums."""
    q_full, q_empty, k_full, k_empty, v_full, v_empty = bars
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 32])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_D, 32])
    # 8-bit A operand from registers: four consecutive k per 32-bit register
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=4)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    # L_MMA: the (Br, L_N) accumulator of L = fp8(P) 1, rows laid out as O's
    l_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, L_N, 32])
    row_l: gl.constexpr = gl.SliceLayout(1, l_layout)
    HALVES: gl.constexpr = K_SB % BLOCK_N != 0  # a K descale per Bc/2 keys (K_SB a multiple of Bc/2)
    q = q_smem.index(WG)
    p_buf = p_smem.index(WG)  # P_SMEM: this warpgroup's P tile
    ones = ones_smem.index(WG)  # L_MMA: this warpgroup's (L_N, Bc) tile of ones, 1^T
    if L_MMA:
        ones_rows: gl.constexpr = gl.BlockedLayout([1, 16], [2, 16], [4, 1], [1, 0])
        ones.store(gl.full([L_N, BLOCK_N], 1.0, gl.float32, ones_rows).to(gl.float8e4nv))
        fence_async_shared()  # visible to the wgmma that reads it
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    zero_l = gl.zeros([BLOCK_M, L_N], gl.float32, l_layout)  # L_MMA: each block's L starts from 0
    causal_offset = N_K - N_Q
    c = 0  # ring position (key blocks consumed over all tiles)
    n = 0  # tiles done
    if PINGPONG:
        if WG == 1:  # consumer 0 goes first
            mbarrier.arrive(turn.index(0), count=1)

    for tj in range(fa3._tile_count(N_Q, BH, DEAL, BLOCK_M, CONSUMERS)):
        bh, m0, n_blocks, tile = fa3._tile(tj, N_Q, N_K, DEAL, CAUSAL, BLOCK_M, BLOCK_N, CONSUMERS)
        here = tile == STAMP_AT
        row0 = m0 + WG * BLOCK_M
        first_row_keys = row0 + causal_offset + 1
        # r = scale log2(e) dq: one scalar for the warpgroup's Br rows (Q_SB a multiple of Br)
        r = qk_scale * _descale_at(QD, bh, NQB, row0, Q_SB)
        if K_SB == 0:
            r = r * _descale_at(KD, bh, NKB, 0, 0)  # one dk for the head: folded in once
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
        l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, s_layout))
        o = gl.zeros([BLOCK_M, HEAD_D], gl.float32, o_layout)
        acc_l = gl.zeros([BLOCK_M, L_N], gl.float32, l_layout)  # L_MMA: l in every column, in fp32

        first = c % STAGES  # block 0's slot
        fa3._stamp(STAMP, here, WG, fa3._WAIT_K, 0, STAMPS)
        mbarrier.wait(q_full.index(WG), n & 1)
        mbarrier.wait(k_full.index(first), (c // STAGES) & 1)
        fa3._stamp(STAMP, here, WG, fa3._WAIT_TURN, 0, STAMPS)
        fa3._take_turn(turn, c + n, WG, PINGPONG)
        fa3._stamp(STAMP, here, WG, fa3._ISSUE_S, 0, STAMPS)
        s_tok = warpgroup_mma(q, k_smem.index(first).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        fa3._pass_turn(turn, WG, PINGPONG)
        f = r
        f_hi = r
        if K_SB != 0:
            f = r * _descale_at(KD, bh, NKB, 0, K_SB)  # S = (Q8 K8^T) r dk_0
            f_hi = r * _descale_at(KD, bh, NKB, BLOCK_N // 2, K_SB)  # keys [Bc/2, Bc) (HALVES)
        fa3._stamp(STAMP, here, WG, fa3._WAIT_S, 0, STAMPS)
        s = warpgroup_mma_wait(0, deps=(s_tok,))
        mbarrier.arrive(k_empty.index(first), count=1)
        fa3._stamp(STAMP, here, WG, fa3._SOFTMAX, 0, STAMPS)
        p, m_i, l_i, alpha, rescale = _fp8_softmax_step(s, m_i, l_i, row0, 0, N_Q, N_K, causal_offset, f,
                                                        fa3._needs_mask(0, N_K, first_row_keys, BLOCK_N, CAUSAL),
                                                        CAUSAL, THETA, SHIFT, EXP_POLY, f_hi, HALVES,
                                                        not L_MMA)
        fa3._stamp(STAMP, here, WG, fa3._CONVERT, 0, STAMPS)
        if P_SMEM:  # no P V is in flight: the last tile's final one was waited for
            _p_to_shared(p, p_buf, BLOCK_M, BLOCK_N)

        for j in range(1, n_blocks):
            stage = (c + j) % STAGES
            prev = (c + j - 1) % STAGES
            fa3._stamp(STAMP, here, WG, fa3._WAIT_K, j, STAMPS)
            mbarrier.wait(k_full.index(stage), ((c + j) // STAGES) & 1)
            fa3._stamp(STAMP, here, WG, fa3._WAIT_TURN, j, STAMPS)
            fa3._take_turn(turn, c + n + j, WG, PINGPONG)
            fa3._stamp(STAMP, here, WG, fa3._ISSUE_S, j, STAMPS)
            s_tok = warpgroup_mma(q, k_smem.index(stage).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            start_n = j * BLOCK_N
            f = r
            f_hi = r
            if K_SB != 0:
                f = r * _descale_at(KD, bh, NKB, start_n, K_SB)  # read while S_j is on the tensor cores
                f_hi = r * _descale_at(KD, bh, NKB, start_n + BLOCK_N // 2, K_SB)
            fa3._stamp(STAMP, here, WG, fa3._RESCALE, j - 1, STAMPS)
            o = _rescale(o, alpha, rescale, row_o)
            if L_MMA:
                acc_l = _rescale(acc_l, alpha, rescale, row_l)  # l = alpha l, with O (then + L_{j-1})
            fa3._stamp(STAMP, here, WG, fa3._WAIT_V, j - 1, STAMPS)
            mbarrier.wait(v_full.index(prev), ((c + j - 1) // STAGES) & 1)
            # O += fp8(P_{j-1}) V8_{j-1}: V^T_{j-1} (d, Bc) in shared memory, keys in P's column order
            fa3._stamp(STAMP, here, WG, fa3._ISSUE_PV, j - 1, STAMPS)
            o_tok = warpgroup_mma(_pv_a(p, p_buf, p_layout, BLOCK_M, BLOCK_N, P_SMEM),
                                  v_smem.index(prev).permute((1, 0)), o, is_async=True)
            if L_MMA:  # L_{j-1} = rowsum(fp8(P_{j-1})) on the tensor cores, behind P V; one block's
                # sum only: the FP8 accumulator adds with fewer bits than fp32, so l adds it in fp32
                l_tok = warpgroup_mma(p_buf, ones.permute((1, 0)), zero_l, use_acc=False, is_async=True)
            fa3._pass_turn(turn, WG, PINGPONG)
            fa3._stamp(STAMP, here, WG, fa3._WAIT_S, j, STAMPS)
            if OVERLAP and L_MMA:  # S_j is ready; P V and L may still run
                s = warpgroup_mma_wait(2, deps=(s_tok,))
            elif OVERLAP:  # S_j is ready; P_{j-1} V_{j-1} may still run
                s = warpgroup_mma_wait(1, deps=(s_tok,))
            elif L_MMA:  # all three done before the softmax
                o, s, l_blk = warpgroup_mma_wait(0, deps=(o_tok, s_tok, l_tok))
                acc_l = acc_l + l_blk  # l = alpha l + rowsum(P_{j-1})
            else:  # both GEMMs done before the softmax
                o, s = warpgroup_mma_wait(0, deps=(o_tok, s_tok))
            mbarrier.arrive(k_empty.index(stage), count=1)
            fa3._stamp(STAMP, here, WG, fa3._SOFTMAX, j, STAMPS)
            p_next, m_i, l_i, alpha, rescale = _fp8_softmax_step(
                s, m_i, l_i, row0, start_n, N_Q, N_K, causal_offset, f,
                fa3._needs_mask(start_n, N_K, first_row_keys, BLOCK_N, CAUSAL), CAUSAL, THETA, SHIFT, EXP_POLY,
                f_hi, HALVES, not L_MMA)
            # P is no dependency here: the wait cannot carry 8-bit registers (LLVM ERROR "Unexpected
            # bitwidth in WGMMAWaitGroupOp: 8"); ptxas keeps P's registers until the wgmma is done
            fa3._stamp(STAMP, here, WG, fa3._WAIT_PV, j - 1, STAMPS)
            if OVERLAP and L_MMA:
                o, l_blk = warpgroup_mma_wait(0, deps=(o_tok, l_tok))
                acc_l = acc_l + l_blk  # l = alpha l + rowsum(P_{j-1})
            elif OVERLAP:
                o = warpgroup_mma_wait(0, deps=(o_tok,))
            mbarrier.arrive(v_empty.index(prev), count=1)
            fa3._stamp(STAMP, here, WG, fa3._CONVERT, j, STAMPS)
            if P_SMEM:  # P_{j-1} V_{j-1} is done with p_buf
                _p_to_shared(p_next, p_buf, BLOCK_M, BLOCK_N)
            p = p_next
        mbarrier.arrive(q_empty.index(WG), count=1)  # Q_i's last GEMM is done

        last = (c + n_blocks - 1) % STAGES
        fa3._stamp(STAMP, here, WG, fa3._RESCALE, n_blocks - 1, STAMPS)
        o = _rescale(o, alpha, rescale, row_o)
        if L_MMA:
            acc_l = _rescale(acc_l, alpha, rescale, row_l)
        fa3._stamp(STAMP, here, WG, fa3._WAIT_V, n_blocks - 1, STAMPS)
        mbarrier.wait(v_full.index(last), ((c + n_blocks - 1) // STAGES) & 1)
        fa3._stamp(STAMP, here, WG, fa3._WAIT_TURN, n_blocks, STAMPS)  # turn n_blocks: the last P V's
        fa3._take_turn(turn, c + n + n_blocks, WG, PINGPONG)
        fa3._stamp(STAMP, here, WG, fa3._ISSUE_PV, n_blocks - 1, STAMPS)
        o_tok = warpgroup_mma(_pv_a(p, p_buf, p_layout, BLOCK_M, BLOCK_N, P_SMEM),
                              v_smem.index(last).permute((1, 0)), o, is_async=True)
        if L_MMA:
            l_tok = warpgroup_mma(p_buf, ones.permute((1, 0)), zero_l, use_acc=False, is_async=True)
        fa3._pass_turn(turn, WG, PINGPONG)
        fa3._stamp(STAMP, here, WG, fa3._WAIT_PV, n_blocks - 1, STAMPS)
        if L_MMA:
            o, l_blk = warpgroup_mma_wait(0, deps=(o_tok, l_tok))
            acc_l = acc_l + l_blk
            l_i = gl.convert_layout(gl.max(acc_l, 1), gl.SliceLayout(1, s_layout))  # every column holds l
        else:
            o = warpgroup_mma_wait(0, deps=(o_tok,))
        mbarrier.arrive(v_empty.index(last), count=1)
        fa3._stamp(STAMP, here, WG, fa3._WRITE, n_blocks - 1, STAMPS)
        # O = O dv / l and lse = m + log2(l) - SHIFT: l summed the 2^SHIFT-scaled P, as O did
        dv = _descale_at(VD, bh, 1, 0, 0)
        fa3._store_tile(desc_o, O, LSE, o_smem.index(WG), o * dv, m_i - SHIFT, l_i, row0, bh * N_Q, N_Q,
                        o_layout, BLOCK_M, HEAD_D)
        fa3._stamp(STAMP, here, WG, fa3._DONE, n_blocks, STAMPS)
        c += n_blocks
        n += 1
    tma.store_wait(0)


@gluon.jit(do_not_specialize=["N_Q", "DEAL"])  # as fa3._fa3_kernel
def _fa3_fp8_kernel(desc_q, desc_k, desc_vt, desc_o, O, LSE, QD, KD, VD, NQB, NKB, N_Q, N_K, BH, DEAL, qk_scale,
                    CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
                    STAGES: gl.constexpr, Q_SB: gl.constexpr, K_SB: gl.constexpr,
                    PINGPONG: gl.constexpr = True, OVERLAP: gl.constexpr = True, THETA: gl.constexpr = -1.0,
                    SHIFT: gl.constexpr = P_SHIFT, STAMP=None, STAMP_AT: gl.constexpr = 0,
                    STAMPS: gl.constexpr = False, EXP_POLY: gl.constexpr = -1, P_SMEM: gl.constexpr = False,
                    CONSUMERS: gl.constexpr = 2, L_MMA: gl.constexpr = False):
    """A persistent grid, as :func:`.fa3._fa3_kernel`. Q, K as (B * H * N, d) views, V^T as
    (B * H * d, N_k), O as (B * H * N_q, d). STAMPS: tile STAMP_AT writes the time stamps of its
    phases into STAMP (:func:`.fa3._stamp`), as the bf16 kernel's do."""
    q_smem, k_smem, v_smem, bars, turn = fa3._ring(desc_q, desc_k, desc_vt, STAGES, CONSUMERS)
    o_smem = gl.allocate_shared_memory(desc_o.dtype, [CONSUMERS] + desc_o.block_type.shape, desc_o.layout)
    p_smem = q_smem  # unread unless P_SMEM
    if P_SMEM:  # each consumer's P tile, (Br, Bc) e4m3
        # 128-byte swizzle, 8-bit elements: the layout get_default_for gives Q, K and V^T here
        p_smem = gl.allocate_shared_memory(gl.float8e4nv, [CONSUMERS, BLOCK_M, BLOCK_N], gl.NVMMASharedLayout(128, 8))
    ones_smem = q_smem  # unread unless L_MMA
    if L_MMA:  # each consumer's 1^T, (L_N, Bc) e4m3, the B operand of L = fp8(P) 1 (K-major, as V^T)
        ones_smem = gl.allocate_shared_memory(gl.float8e4nv, [CONSUMERS, L_N, BLOCK_N], gl.NVMMASharedLayout(128, 8))
    if CONSUMERS == 2:
        gl.warp_specialize([
            (_consumer_fp8, (desc_o, O, LSE, QD, KD, VD, NQB, NKB, q_smem, o_smem, k_smem, v_smem, p_smem, ones_smem,
                         bars, turn, N_Q, N_K, BH, DEAL, qk_scale, CAUSAL, 0, BLOCK_M, BLOCK_N, HEAD_D, STAGES,
                         Q_SB, K_SB, PINGPONG, OVERLAP, THETA, SHIFT, STAMP, STAMP_AT, STAMPS, EXP_POLY, P_SMEM,
                         CONSUMERS, L_MMA)),
            (_consumer_fp8, (desc_o, O, LSE, QD, KD, VD, NQB, NKB, q_smem, o_smem, k_smem, v_smem, p_smem, ones_smem,
                         bars, turn, N_Q, N_K, BH, DEAL, qk_scale, CAUSAL, 1, BLOCK_M, BLOCK_N, HEAD_D, STAGES,
                         Q_SB, K_SB, PINGPONG, OVERLAP, THETA, SHIFT, STAMP, STAMP_AT, STAMPS, EXP_POLY, P_SMEM,
                         CONSUMERS, L_MMA)),
            (fa3._producer, (desc_q, desc_k, desc_vt, q_smem, k_smem, v_smem, bars, N_Q, N_K, BH, DEAL,
                         CAUSAL, BLOCK_M, BLOCK_N, HEAD_D, STAGES, True, STAMP, STAMP_AT, STAMPS, CONSUMERS)),
        ], [4, 1], [fa3.CONSUMER_REGS, fa3.PRODUCER_REGS])
    else:  # three consumers: no ping-pong (its turns are for two), registers as fa3.MAXNREG_3
        gl.warp_specialize([
            (_consumer_fp8, (desc_o, O, LSE, QD, KD, VD, NQB, NKB, q_smem, o_smem, k_smem, v_smem, p_smem, ones_smem,
                         bars, turn, N_Q, N_K, BH, DEAL, qk_scale, CAUSAL, 0, BLOCK_M, BLOCK_N, HEAD_D, STAGES,
                         Q_SB, K_SB, False, OVERLAP, THETA, SHIFT, STAMP, STAMP_AT, STAMPS, EXP_POLY, P_SMEM,
                         CONSUMERS, L_MMA)),
            (_consumer_fp8, (desc_o, O, LSE, QD, KD, VD, NQB, NKB, q_smem, o_smem, k_smem, v_smem, p_smem, ones_smem,
                         bars, turn, N_Q, N_K, BH, DEAL, qk_scale, CAUSAL, 1, BLOCK_M, BLOCK_N, HEAD_D, STAGES,
                         Q_SB, K_SB, False, OVERLAP, THETA, SHIFT, STAMP, STAMP_AT, STAMPS, EXP_POLY, P_SMEM,
                         CONSUMERS, L_MMA)),
            (_consumer_fp8, (desc_o, O, LSE, QD, KD, VD, NQB, NKB, q_smem, o_smem, k_smem, v_smem, p_smem, ones_smem,
                         bars, turn, N_Q, N_K, BH, DEAL, qk_scale, CAUSAL, 2, BLOCK_M, BLOCK_N, HEAD_D, STAGES,
                         Q_SB, K_SB, False, OVERLAP, THETA, SHIFT, STAMP, STAMP_AT, STAMPS, EXP_POLY, P_SMEM,
                         CONSUMERS, L_MMA)),
            (fa3._producer, (desc_q, desc_k, desc_vt, q_smem, k_smem, v_smem, bars, N_Q, N_K, BH, DEAL,
                         CAUSAL, BLOCK_M, BLOCK_N, HEAD_D, STAGES, True, STAMP, STAMP_AT, STAMPS, CONSUMERS)),
        ], [4, 4, 1], [fa3.CONSUMER_REGS_3, fa3.CONSUMER_REGS_3, fa3.PRODUCER_REGS])


def _exp_poly(d: int, poly_fraction: object) -> int:
    """The kernel's EXP_POLY for ``poly_fraction`` (None: :data:`POLY_FRACTION` at d): -1 for 0,
    else s, the polynomial taking 1/2^s of P's columns (:func:`flashlab.kernels.fa4.poly_shift`:
    a number in [0, 1], rounded to 1, 1/2, 1/4 or 1/8)."""
    from .fa4 import poly_shift

    return poly_shift(POLY_FRACTION.get(d, 0.0) if poly_fraction is None else poly_fraction)


def _rescaling(rescale_threshold: object) -> dict[str, float]:
    """The kernel's THETA (-1: rescale at every block) and SHIFT (P = 2^SHIFT exp2(S - m)) for
    ``rescale_threshold`` (checked: None or a number in [0, 8])."""
    theta = check_rescale_threshold(rescale_threshold, P_SHIFT, f"P <= 2^{P_SHIFT:g} must stay in e4m3's range")
    return {"THETA": -1.0, "SHIFT": P_SHIFT} if theta is None else {"THETA": theta, "SHIFT": P_SHIFT - theta}


def _check(q, k, v, q_block, k_block, v_block, out_dtype) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 4-D tensor (B, H, N, d); got {got}")
        if t.dtype != FP8_DTYPE:
            raise TypeError(f"{name} must be float8_e4m3fn (see flashlab.kernels.fp8.quantize_qkv); got {t.dtype}")
    fa3.check_shapes(q, k, v, HEAD_DIMS)
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"out_dtype must be torch.bfloat16 or torch.float16; got {out_dtype}")
    for name, block, multiple in (("q_block", q_block, fa3.BLOCK_M), ("k_block", k_block, fa3.BLOCK_N)):
        if block is not None and (isinstance(block, bool) or not isinstance(block, int) or block < 1
                                  or block % multiple):
            raise ValueError(f"{name} must be None or a positive multiple of {multiple} (one descale per "
                             f"{'warpgroup' if name == 'q_block' else 'key block'}); got {block!r}")
    if v_block is not None:
        raise ValueError(f"v_block must be None: the Gluon FP8 kernel takes one V descale per head; got {v_block}")
    if not (k.device == q.device == v.device):
        raise ValueError(f"q, k, v must be on one device; got {q.device}, {k.device}, {v.device}")
    if not q.is_cuda or torch.cuda.get_device_capability(q.device)[0] != 9:  # last: the arguments first
        raise ValueError(f"the Gluon FP8 kernel needs a Hopper GPU (sm_90: H100, H200); got {q.device}")


def _descale(name: str, x: torch.Tensor | None, block: int | None, B: int, H: int, N: int,
             device: torch.device) -> torch.Tensor:
    """A descale argument as the kernel reads it: float32 (B, H, ceil(N / block)) contiguous, or
    (B, H, 1) of ones for None (one per head, the fp8 values being the true values)."""
    nb = 1 if block is None else -(-N // block)
    if x is None:
        if block is not None:
            raise ValueError(f"{name} must be given when its block is set; got None with block {block}")
        return torch.ones(B, H, 1, device=device, dtype=torch.float32)
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32 or x.device != device or tuple(x.shape) != (B, H, nb):
        got = f"{x.dtype} {tuple(x.shape)} on {x.device}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a float32 tensor of shape {(B, H, nb)} on {device}; got {got}")
    return x.contiguous()


def key_order(n: int, device=None, shared: bool = False) -> torch.Tensor:
    """The permutation of :func:`_as_operand` on n keys (n a multiple of 16): column k of the
    reordered P holds key key_order(n)[k]. ``shared``: :func:`_p_to_shared`'s, within every
    block of n = Bc keys: column (Bc / 4) q + 2 g + e holds key 8 g + 2 q + e."""
    if shared:
        idx = torch.arange(n, device=device).view(n // 8, 4, 2)  # (g, q, e)
        return idx.permute(1, 0, 2).reshape(n)  # (q, g, e)
    idx = torch.arange(n, device=device).view(n // 16, 2, 2, 2, 2)  # (a, c3, c2, c1, c0)
    return idx.permute(0, 2, 3, 1, 4).reshape(n)  # (a, c2, c1, c3, c0)


def wgmma_v(v: torch.Tensor, shared_block: int | None = None) -> torch.Tensor:
    """V as the kernel reads it: V^T (B, H, d, N_k'), contiguous, N_k' = N_k rounded up to a
    multiple of 16 (zero keys), its keys in :func:`key_order` within every 16. One copy of V
    (a second, for the padding, when N_k is not a multiple of 16). ``shared_block`` Bc: the
    order of P through shared memory, ``key_order(Bc, shared=True)`` within every Bc keys, N_k
    rounded up to a multiple of Bc."""
    B, H, n, d = v.shape
    unit = shared_block or 16
    padded = -(-n // unit) * unit
    x = v.view(torch.uint8)  # the bytes: pad and permute need no fp8 arithmetic
    if padded != n:
        x = torch.nn.functional.pad(x, (0, 0, 0, padded - n))
    if shared_block:
        x = x.reshape(B, H, padded // unit, unit // 8, 4, 2, d)  # keys as (block, g, q, e)
        x = x.permute(0, 1, 6, 2, 4, 3, 5)  # (d, block, q, g, e)
    else:
        x = x.reshape(B, H, padded // 16, 2, 2, 2, 2, d)  # keys as (a, c3, c2, c1, c0)
        x = x.permute(0, 1, 7, 2, 4, 5, 3, 6)  # (d, a, c2, c1, c3, c0): V^T in key_order
    return x.reshape(B, H, d, padded).view(v.dtype)


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None = None,
            q_descale: torch.Tensor | None = None, k_descale: torch.Tensor | None = None,
            v_descale: torch.Tensor | None = None, *, q_block: int | None = None, k_block: int | None = None,
            v_block: int | None = None, out_dtype: torch.dtype = torch.bfloat16,
            out: torch.Tensor | None = None, pingpong: bool | None = None,
            overlap: bool | None = None,
            rescale_threshold: float | None = RESCALE_THRESHOLD, stamps: torch.Tensor | None = None,
            stamp_at: int = 0, poly_fraction: float | None = None,
            p_smem: bool | None = None, consumers: int | None = None,
            l_mma: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the kernel; arguments as :func:`fa3_fp8_forward`, and ``pingpong``, ``overlap`` as
    :func:`flashlab.kernels.fa3.forward` takes them (None: :data:`SWITCHES`' default for d);
    ``rescale_threshold``: conditional rescaling (:data:`RESCALE_THRESHOLD`), theta in [0, 8];
    ``stamps``, ``stamp_at``: time stamps of one tile, as :func:`flashlab.kernels.fa3.forward`
    takes them (an int64 (n_blocks + 1, STAMP_SLOTS, 3, 2) buffer); ``poly_fraction``: the share
    of P's exp2 computed in software (None: :data:`POLY_FRACTION`' default for d); ``p_smem``:
    True, P through shared memory at Bc = 256; False, P from registers at Bc = 128; both with two
    consumers (None: :data:`P_SMEM`'s default for d, or Bc = 128 where ``stamps`` is given);
    ``consumers``: 2 or 3 consumer warpgroups (None: :data:`CONSUMERS`' default, or two where
    ``p_smem`` or ``stamps`` is given or ``pingpong`` is true; 3 takes P through shared memory at
    Bc = 128, no ping-pong and no stamps); ``l_mma``: l = rowsum(P) summed by the tensor cores
    (:data:`L_MMA`; None: its default for d), for builds that take P through shared memory; its lse
    is then that of the e4m3 P that P V multiplied.
    :func:`config` lists the builds. Returns o and lse2 (log2 units)."""
    rescaling = _rescaling(rescale_threshold)
    if poly_fraction is not None:
        _exp_poly(0, poly_fraction)  # checked before the tensors are
    config(0, p_smem, consumers)  # p_smem and consumers checked before the tensors are
    _check_l_mma(l_mma)
    _check(q, k, v, q_block, k_block, v_block, out_dtype)
    B, H, N_Q, D = q.shape
    N_K = k.shape[2]
    c = _build_config(D, p_smem, consumers, pingpong, stamps is not None)
    scale = check_scale(scale, D)
    pingpong, overlap = fa3.switches(D, pingpong, overlap, SWITCHES)
    _three_consumers_allow(c, pingpong, stamps is not None)
    l_on_mma = _l_mma(D, l_mma, c)
    exp_poly = _exp_poly(D, poly_fraction)
    qd = _descale("q_descale", q_descale, q_block, B, H, N_Q, q.device)
    kd = _descale("k_descale", k_descale, k_block, B, H, N_K, q.device)
    vd = _descale("v_descale", v_descale, None, B, H, N_K, q.device)
    q, k = q.contiguous(), k.contiguous()
    vt = wgmma_v(v, c["BLOCK_N"] if c["P_SMEM"] else None)
    o = torch.empty((B, H, N_Q, D), device=q.device, dtype=out_dtype) if out is None else out
    if o.shape != q.shape or o.dtype != out_dtype or not o.is_contiguous():
        raise ValueError(f"out must be a contiguous {out_dtype} tensor of shape {tuple(q.shape)}; "
                         f"got {o.dtype} {tuple(o.shape)}")
    lse2 = torch.empty((B, H, N_Q), device=q.device, dtype=torch.float32)
    stamping = fa3.stamp_args(stamps, stamp_at, (triton.cdiv(N_K, c["BLOCK_N"]) + 1, len(fa3.STAMP_PHASES), 3, 2),
                              q.device)
    f8 = gl.float8e4nv
    q_layout = gl.NVMMASharedLayout.get_default_for([c["BLOCK_M"], D], f8)
    k_layout = gl.NVMMASharedLayout.get_default_for([c["BLOCK_N"], D], f8)
    vt_layout = gl.NVMMASharedLayout.get_default_for([D, c["BLOCK_N"]], f8)
    descs = (TensorDescriptor.from_tensor(q.view(-1, D), [c["BLOCK_M"], D], q_layout),
             TensorDescriptor.from_tensor(k.view(-1, D), [c["BLOCK_N"], D], k_layout),
             TensorDescriptor.from_tensor(vt.reshape(-1, vt.shape[-1]), [D, c["BLOCK_N"]], vt_layout),
             fa3.o_descriptor(o))
    n_programs, deal = fa3.programs(triton.cdiv(N_Q, c["CONSUMERS"] * c["BLOCK_M"]) * B * H, bool(causal), q.device)
    _fa3_fp8_kernel[(n_programs,)](*descs, o, lse2, qd, kd, vd, qd.shape[-1], kd.shape[-1], N_Q, N_K, B * H, deal,
                                   scale * LOG2E, CAUSAL=bool(causal), Q_SB=q_block or 0, K_SB=k_block or 0,
                                   PINGPONG=pingpong, OVERLAP=overlap, **rescaling, **c, **stamping, EXP_POLY=exp_poly,
                                   L_MMA=l_on_mma, num_warps=fa3.NUM_WARPS, maxnreg=_registers(c))
    return o, lse2


def _build_config(d: int, p_smem: bool | None, consumers: int | None, pingpong: bool | None,
                  stamps: bool) -> dict:
    """:func:`config` for a launch or a build: a stamped build keeps Bc = 128 and two consumers,
    and an explicit ``pingpong=True`` two consumers (its turns are for two), where
    ``consumers`` is not given."""
    if consumers is None and (stamps or pingpong):
        consumers = 2
        if stamps and p_smem is None:
            p_smem = False
    return config(d, p_smem, consumers)


def _check_l_mma(l_mma: object) -> None:
    if l_mma is not None and not isinstance(l_mma, bool):
        raise TypeError(f"l_mma must be None, True or False; got {l_mma!r}")


def _l_mma(d: int, l_mma: object, c: dict) -> bool:
    """The kernel's L_MMA for ``l_mma`` (None: :data:`L_MMA` at d) and a build ``c`` of
    :func:`config`: the tensor cores sum l only where P is in shared memory for them to read."""
    _check_l_mma(l_mma)
    on = (L_MMA.get(d, False) and c["P_SMEM"]) if l_mma is None else l_mma  # a default only where it fits
    if on and not c["P_SMEM"]:
        raise ValueError("l_mma=True sums P from shared memory: it needs a build with P there (p_smem=True, "
                         f"or consumers=3); got P in registers (Bc = {c['BLOCK_N']}, {c['CONSUMERS']} consumers)")
    return on


def _three_consumers_allow(c: dict, pingpong: bool, stamps: bool) -> None:
    """Three consumers (``c`` from :func:`config`) run without ping-pong and without stamps."""
    if c["CONSUMERS"] == 3 and (pingpong or stamps):
        raise ValueError(f"consumers=3 runs without ping-pong and without stamps; got pingpong={pingpong}, "
                         f"stamps={'given' if stamps else None}")


def fa3_fp8_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    scale: float | None = None, q_descale: torch.Tensor | None = None,
                    k_descale: torch.Tensor | None = None, v_descale: torch.Tensor | None = None, *,
                    q_block: int | None = None, k_block: int | None = None, v_block: int | None = None,
                    out_dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(scale * Q K^T (+ causal mask)) V from e4m3 inputs by FlashAttention-3's FP8 forward.

    Parameters
    ----------
    q : float8_e4m3fn (B, H, N_q, d); k, v : (B, H, N_k, d); d = 64 or 128; on a Hopper GPU.
        Any strides: V is copied into the layout the kernel reads (:func:`wgmma_v`).
    causal : mask keys after the query, aligned bottom-right when N_q != N_k.
    scale : softmax scale, default 1/sqrt(d).
    q_descale, k_descale : float32 (B, H, ceil(N / block)), or (B, H, 1) when the block is None;
        None means 1. q_block a multiple of 64, k_block a multiple of 128, or None.
    v_descale : float32 (B, H, 1), one per head (v_block must be None).
    out_dtype : bfloat16 (default) or float16.

    Returns
    -------
    o : (B, H, N_q, d) in ``out_dtype``; lse : (B, H, N_q) float32, natural log.
    """
    o, lse2 = forward(q, k, v, causal, scale, q_descale, k_descale, v_descale, q_block=q_block, k_block=k_block,
                      v_block=v_block, out_dtype=out_dtype)
    return o, lse2 * LN2


def compile_sm90(d: int = 128, causal: bool = False, q_block: int | None = 128, k_block: int | None = 128,
                 out_dtype: torch.dtype = torch.bfloat16, pingpong: bool | None = None, overlap: bool | None = None,
                 rescale_threshold: float | None = RESCALE_THRESHOLD, stamps: bool = False,
                 poly_fraction: float | None = None, p_smem: bool | None = None, consumers: int | None = None,
                 l_mma: bool | None = None):
    """Compile the kernel for sm_90 without a GPU (see :func:`flashlab.kernels.fa3.compile_sm90`);
    ``pingpong``, ``overlap``, ``rescale_threshold``, ``poly_fraction``, ``p_smem``, ``consumers``,
    ``l_mma`` as :func:`forward` takes them; ``stamps``: the build with time stamps (STAMPS=True, an
    int64 STAMP buffer)."""
    if d not in HEAD_DIMS:
        raise ValueError(f"d must be one of {HEAD_DIMS}; got {d}")
    c = _build_config(d, p_smem, consumers, pingpong, bool(stamps))
    f8 = gl.float8e4nv
    pingpong, overlap = fa3.switches(d, pingpong, overlap, SWITCHES)
    _three_consumers_allow(c, pingpong, bool(stamps))
    constexprs = dict(CAUSAL=bool(causal), Q_SB=q_block or 0, K_SB=k_block or 0, PINGPONG=pingpong,
                      OVERLAP=overlap, **_rescaling(rescale_threshold), **c, STAMP_AT=0,
                      EXP_POLY=_exp_poly(d, poly_fraction), L_MMA=_l_mma(d, l_mma, c),
                      STAMPS=bool(stamps)) | ({} if stamps else dict(STAMP=None))
    signature = {"desc_q": fa3.tensor_descriptor_type(f8, [c["BLOCK_M"], d]),
                 "desc_k": fa3.tensor_descriptor_type(f8, [c["BLOCK_N"], d]),
                 "desc_vt": fa3.tensor_descriptor_type(f8, [d, c["BLOCK_N"]]),
                 "desc_o": fa3.tensor_descriptor_type(_GL_OUT[out_dtype], [c["BLOCK_M"], d]),
                 "O": f"*{_GL_OUT[out_dtype]}", "LSE": "*fp32", "QD": "*fp32", "KD": "*fp32", "VD": "*fp32",
                 "NQB": "i32", "NKB": "i32", "N_Q": "i32", "N_K": "i32", "BH": "i32", "DEAL": "i32",
                 "qk_scale": "fp32",
                 **{k: "constexpr" for k in constexprs}} | ({"STAMP": "*i64"} if stamps else {})
    pointers = tuple(_fa3_fp8_kernel.arg_names.index(name)
                     for name in ("O", "LSE", "QD", "KD", "VD") + (("STAMP",) if stamps else ()))
    return fa3.compile_for_sm90(_fa3_fp8_kernel, signature, constexprs, pointers, fa3.NUM_WARPS, _registers(c))
