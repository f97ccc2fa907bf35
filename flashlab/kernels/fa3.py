"""FlashAttention-3 forward (Shah et al. 2024, §3.1-3.2, Algorithms 1-2) in Gluon, for Hopper (sm_90).

One program (a CTA: CUDA's thread block) runs on each SM (fewer when there are fewer tiles) and
takes tiles of 2 * Br = 128 query rows of one (batch, head) in turn (a persistent kernel; 3 * Br
= 192 with three consumers). It runs three partitions (or four):

    producer    1 warp,  few registers:  TMA-loads Q_i, then K_j, V_j into a ring of STAGES
                                          shared-memory slots (full/empty mbarrier pairs), and
                                          goes on to the next tile's while the consumers finish
    consumer 0  4 warps (a warpgroup):    rows [0, Br) of the tile:  S = Q K^T, softmax, O += P V
    consumer 1  4 warps (a warpgroup):    rows [Br, 2 Br), on the same K_j, V_j
    consumer 2  4 warps (d = 64):         rows [2 Br, 3 Br), without the mask (:data:`CONSUMERS`)

The producer is Algorithm 1's producer warpgroup, the consumers its consumer warpgroups in the
form of Algorithm 2. Register reallocation (§3.1): the producer gives its registers up
(setmaxnreg), the consumers take them. Ping-pong (§3.1): an mbarrier pair makes the consumers
issue their GEMMs in turn, so one warpgroup's softmax runs while the other's GEMMs hold the
tensor cores. Intra-warpgroup overlap (§3.2, Algorithm 2): S_next = Q_i K_j^T is issued
asynchronously (wgmma) with P_cur V_{j-1}, and the softmax of S_next runs while P_cur V_{j-1}
is still on the tensor cores. The epilogue writes O through shared memory with one TMA store,
which runs on while the warpgroup starts its next tile (at d = 256, whose K and V blocks leave
no room for two O tiles, straight from registers). Each head dimension runs the schedule measured
fastest for it (:data:`SWITCHES`): both on at d = 128; at d = 64, where the tensor cores and
the exp unit need equal time, both off, with a third consumer where there is no mask
(:data:`CONSUMERS`); d = 256 takes d = 128's.

Glossary: Br = BLOCK_M (query rows per warpgroup), Bc = BLOCK_N (keys per block), S scores,
P = exp2(S - m) probabilities, m running max, l running sum, O unnormalised output, all in
log2 units (scale * log2(e) folded into the scores); lse = m + log2(l).
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.language import _core as gl_core
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from ._common import LN2, LOG2E, check_scale
from .fa4 import COEFFICIENTS

# TMA global -> shared copy: triton 3.6 names it async_copy_global_to_shared, later versions async_load
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global


@gl_core.builtin
def _tma_add_36(tensor_desc, coord, src, _semantic=None):
    """Triton 3.6 has TMA's reduce-add (cp.reduce.async.bulk.tensor .add) in its builder but not
    yet a Gluon name for it; later versions call it tma.async_atomic_add."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(gl_core.ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord,
                                              src.handle)


# TMA shared -> global add: global[coord + block] += shared, by bulk reduce-adds, asynchronous
_tma_add = getattr(tma, "async_atomic_add", None) or _tma_add_36

# the minimax cubic 2^f ~= 1 + f (c1 + f (c2 + f c3)) on [0, 1] of the software exp2 (_poly_exp2),
# the Triton kernel's (flashlab.kernels.fa4)
_POLY_C1, _POLY_C2, _POLY_C3 = (gl.constexpr(c) for c in COEFFICIENTS[1:])

__all__ = ["AUTO_HEAD_DIMS", "CONSUMERS", "DTYPES", "GLUON_IMPL", "HEAD_DIMS", "SWITCHES", "check_build",
           "check_shapes", "compile_for_sm90", "compile_sm90", "config", "consumer_count", "fa3_forward", "forward",
           "stamp_args", "supported", "switches", "tensor_descriptor_type"]

GLUON_IMPL = "gluon"  # the name flash_attention(impl=...) can give this kernel
HEAD_DIMS = (64, 128, 256)
# Where impl="auto" takes this kernel (flashlab.kernels.ops.resolve_impl): the head dimensions at
# which this kernel, as it is here, has been checked against float64 and timed beside the Triton
# forward on a Hopper GPU. d = 256 runs when asked for (impl="gluon"); results/fa3_backward/README.md
# (run 19) says what its GPU check and timing were of.
AUTO_HEAD_DIMS = (64, 128)
DTYPES = (torch.bfloat16, torch.float16)
_GL_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}

BLOCK_M = 64  # Br: query rows per consumer warpgroup (wgmma's M is 64 per warpgroup)
BLOCK_N = 128  # Bc: keys per block
NUM_WARPS = 4  # the default partition: consumer 0, one warpgroup
# Registers per thread (setmaxnreg). Triton rounds the 4 + 4 + 1 warps up to three warpgroups
# and gives the default partition what the kernel's maxnreg leaves: 3 * 168 - 240 - 24 = 240.
MAXNREG = 168
CONSUMER_REGS = gl.constexpr(240)
PRODUCER_REGS = gl.constexpr(24)
# With three consumers (d = 64, :data:`CONSUMERS`) the 4 + 4 + 4 + 1 warps round up to four
# warpgroups: a limit of 128 registers a thread, of which consumers 1 and 2 take 160 each, the
# producer 24 and the default partition (consumer 0) what is left, 4 * 128 - 2 * 160 - 24 = 168.
MAXNREG_3 = 128
CONSUMER_REGS_3 = gl.constexpr(160)

# Time stamps (STAMPS=True; the ping-pong chart of chapter 6, flashlab.lab.experiments.fa3_timeline):
# each partition notes when it begins each phase of key block j. Consumers: wait for K_j, wait
# for the turn, issue S_j = Q K_j^T, rescale O, wait for V_j, issue O += P_j V_j, wait for S_j,
# softmax of S_j, wait for P_j V_j, convert P_j to the GEMM's operand, write O. Producer: issue
# Q's loads, wait for a free K slot, issue K_j's load, the same for V_j. "done" closes the last.
STAMP_PHASES = ("wait_k", "wait_turn", "issue_s", "rescale", "wait_v", "issue_pv", "wait_s", "softmax",
                "wait_pv", "convert", "write", "load_q", "wait_slot_k", "load_k", "wait_slot_v", "load_v", "done")
(_WAIT_K, _WAIT_TURN, _ISSUE_S, _RESCALE, _WAIT_V, _ISSUE_PV, _WAIT_S, _SOFTMAX, _WAIT_PV, _CONVERT, _WRITE,
 _LOAD_Q, _WAIT_SLOT_K, _LOAD_K, _WAIT_SLOT_V, _LOAD_V, _DONE) = (gl.constexpr(p) for p in range(len(STAMP_PHASES)))
STAMP_SLOTS = gl.constexpr(len(STAMP_PHASES))
STAMP_PARTS = ("consumer 0", "consumer 1", "producer")  # the PART index of _stamp


# The schedule each head dimension runs by default: (ping-pong, intra-warpgroup overlap).
# For a pair of key blocks (one for each consumer) an SM's tensor cores take 8 Br Bc d / 4096
# cycles (4096 bf16 flops a cycle) and its exp unit 2 Br Bc / 16 cycles (16 exp2 a cycle).
# At d = 128 that is 2048 against 1024: ordering the GEMMs hides the softmax behind the other
# warpgroup's GEMMs. At d = 64 it is 1024 against 1024, with no slack for a late hand-over, and
# both switches off had the best median of the four settings at every d = 64 shape
# (results/fa3_backward/run12 and run13, 2-5 %); at d = 128 nothing beat both on beyond the
# rounds' spread.
# At d = 256 (Bc = 64) the GEMMs take 2048 cycles against the exponentials' 512: d = 128's schedule
# (chosen from these counts; the other settings have not been measured there).
SWITCHES = {64: (False, False), 128: (True, True), 256: (True, True)}
# Consumer warpgroups a program runs when both switches are off, each with its own Br query rows
# of the tile, by (head dimension, causal). At d = 64 a warpgroup's step is a chain (S, its row
# max, the exponentials, the row sum, P V) whose waits only other warpgroups' work can fill;
# FlashAttention-3 runs three there. Without the mask three were 2-10 % faster than two (runs
# 13, 14, 16).
# With it they lost: a tile of 3 Br = 192 rows ends mid key block, so its first consumers work
# through key blocks their rows never see (9 % more blocks than two consumers at N = 4096), and
# the last, ragged tile of a head is the longest. Ping-pong orders two warpgroups, and the
# overlap's second S would not fit three consumers' registers.
CONSUMERS = {(64, False): 3, (64, True): 2, (128, False): 2, (128, True): 2, (256, False): 2, (256, True): 2}


def switches(d: int, pingpong: bool | None = None, overlap: bool | None = None,
             table: dict[int, tuple[bool, bool]] = SWITCHES) -> tuple[bool, bool]:
    """(pingpong, overlap) for head dimension ``d``: each as given, or the default for ``d`` in
    ``table`` (:data:`SWITCHES`; the FP8 kernel passes its own) where it is None."""
    if d not in table:
        raise ValueError(f"d must be one of {tuple(table)}; got {d}")
    default_pingpong, default_overlap = table[d]
    return (default_pingpong if pingpong is None else bool(pingpong),
            default_overlap if overlap is None else bool(overlap))


def consumer_count(d: int, pingpong: bool, overlap: bool, causal: bool, n: int | None = None) -> int:
    """Consumer warpgroups for head dimension ``d``: ``n``, or where it is None
    :data:`CONSUMERS`' default for (d, causal) when both switches are off, else two. Ping-pong
    orders two warpgroups, and with the overlap a consumer holds a second S, which three
    consumers' registers (160 a thread) cannot; three fit only at d = 64 (at d = 128 their O and
    S would need more registers and shared memory than a CTA has)."""
    if n is None:
        return CONSUMERS[(d, bool(causal))] if not (pingpong or overlap) else 2
    allowed = (2, 3) if d == 64 else (2,)
    if isinstance(n, bool) or n not in allowed:
        raise ValueError(f"consumers must be one of {allowed} at d = {d}; got {n!r}")
    if n == 3 and (pingpong or overlap):
        raise ValueError(f"three consumers need pingpong and overlap off; got pingpong = {pingpong}, "
                         f"overlap = {overlap}")
    return n


def config(d: int) -> dict:
    """Tile sizes and ring depth for head dimension ``d``. Shared memory per CTA:
    Q and O 2 * C * Br * d (C consumers) + STAGES * (K + V) 2 * Bc * d elements, 2 bytes each;
    d = 128 with 2 stages is 192 KB of the 227 KB a CTA may use, d = 64 with 4 stages 160 KB (176
    KB with three consumers). d = 256 takes Bc = 64 and 2 stages, 192 KB without O's tiles; two
    more (64 KB) would not fit, so its O goes from registers to global memory (:func:`_write_tile`)."""
    if d == 256:
        return {"BLOCK_M": BLOCK_M, "BLOCK_N": 64, "HEAD_D": d, "STAGES": 2}
    return {"BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "HEAD_D": d, "STAGES": 2 if d == 128 else 4}


@gluon.jit
def _stamp(STAMP, here, PART: gl.constexpr, PHASE: gl.constexpr, j, STAMPS: gl.constexpr,
           SLOTS: gl.constexpr = STAMP_SLOTS, PARTS: gl.constexpr = 3):
    """STAMPS: partition PART (:data:`STAMP_PARTS`) begins phase PHASE (:data:`STAMP_PHASES`) of
    key block j now; ``here`` says whether the tile in hand is the stamped one. One thread writes
    (%globaltimer ns, %clock64 cycles of this SM) to STAMP[j, PHASE, PART, :] of an int64
    (n_blocks + 1, SLOTS, PARTS, 2) buffer; a slot no stamp reaches stays as the caller filled
    it. Every tile reads the clocks, so the stamped tile runs the same instructions as the others.
    (The backward, :mod:`.fa3_backward`, stamps its own phases with its own SLOTS and PARTS.)"""
    if STAMPS:
        ns = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=gl.int64, is_pure=False,
                                       pack=1)
        cycles = gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64, is_pure=False,
                                           pack=1)
        slot = STAMP + ((j * SLOTS + PHASE) * PARTS + PART) * 2
        gl.store(slot, ns, mask=here)
        gl.store(slot + 1, cycles, mask=here)


def stamp_args(stamps: torch.Tensor | None, stamp_at: int, want: tuple[int, ...],
               device: torch.device) -> dict[str, object]:
    """The launch arguments of a build with time stamps (:func:`_stamp`) for an int64 ``stamps``
    buffer of shape ``want`` on ``device``, tile or program ``stamp_at`` stamping; {} without
    ``stamps``. ValueError naming the buffer when it has another shape, dtype or device."""
    if stamps is None:
        return {}
    if tuple(stamps.shape) != want or stamps.dtype != torch.int64 or stamps.device != device:
        raise ValueError(f"stamps must be an int64 tensor of shape {want} on {device}; "
                         f"got {stamps.dtype} {tuple(stamps.shape)} on {stamps.device}")
    return dict(STAMP=stamps, STAMP_AT=int(stamp_at), STAMPS=True)


@gluon.jit
def _producer(desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, bars, N_Q, N_K, BH, DEAL,
              CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
              STAGES: gl.constexpr, V_KEYS_CONTIGUOUS: gl.constexpr,
              STAMP=None, STAMP_AT: gl.constexpr = 0, STAMPS: gl.constexpr = False,
              CONSUMERS: gl.constexpr = 2):
    """Algorithm 1's producer, for every tile of this program (:func:`_tile`): load Q_i, then
    K_j, V_j into the ring. The ring position c counts the key blocks of all the program's tiles,
    so block c sits in stage c % s and the next tile's first blocks load while the consumers
    finish this one. (Its register deallocation is warp_specialize's worker_num_regs.) V_j is
    rows bh N_k + j Bc + [0, Bc) of V's (B * H * N_k, d) view, or, V_KEYS_CONTIGUOUS (the FP8
    kernel, :mod:`.fa3_fp8`), columns j Bc + [0, Bc) of rows bh d + [0, d) of V^T's (B * H * d,
    N_k) view. STAMPS: time stamps of each phase of tile STAMP_AT (:func:`_stamp`)."""
    q_full, q_empty, k_full, k_empty, v_full, v_empty = bars
    c = 0  # key blocks loaded so far, over all tiles: the ring position
    n = 0  # tiles begun so far
    for tj in range(_tile_count(N_Q, BH, DEAL, BLOCK_M, CONSUMERS)):
        bh, m0, n_blocks, tile = _tile(tj, N_Q, N_K, DEAL, CAUSAL, BLOCK_M, BLOCK_N, CONSUMERS)
        here = tile == STAMP_AT
        _stamp(STAMP, here, 2, _LOAD_Q, 0, STAMPS)
        for w in gl.static_range(CONSUMERS):  # "issue load Q_i": each consumer's Br rows, once it is done with the last
            mbarrier.wait(q_empty.index(w), (n & 1) ^ 1)
            mbarrier.expect(q_full.index(w), desc_q.block_type.nbytes)
            _tma_load(desc_q, [bh * N_Q + m0 + w * BLOCK_M, 0], q_full.index(w), q_smem.index(w))
        for j in range(n_blocks):
            stage = (c + j) % STAGES
            phase = ((c + j) // STAGES) & 1
            # "wait for the (j % s)th stage to be consumed": every consumer released it; a fresh
            # barrier passes phase 1 at once, so the first s loads go ahead
            _stamp(STAMP, here, 2, _WAIT_SLOT_K, j, STAMPS)
            mbarrier.wait(k_empty.index(stage), phase ^ 1)
            # "issue loads of K_j, V_j ... upon completion, notify consumers": the full barrier
            # completes when the TMA engine has written the expected bytes
            _stamp(STAMP, here, 2, _LOAD_K, j, STAMPS)
            mbarrier.expect(k_full.index(stage), desc_k.block_type.nbytes)
            _tma_load(desc_k, [bh * N_K + j * BLOCK_N, 0], k_full.index(stage), k_smem.index(stage))
            _stamp(STAMP, here, 2, _WAIT_SLOT_V, j, STAMPS)
            mbarrier.wait(v_empty.index(stage), phase ^ 1)
            _stamp(STAMP, here, 2, _LOAD_V, j, STAMPS)
            mbarrier.expect(v_full.index(stage), desc_v.block_type.nbytes)
            if V_KEYS_CONTIGUOUS:
                _tma_load(desc_v, [bh * HEAD_D, j * BLOCK_N], v_full.index(stage), v_smem.index(stage))
            else:
                _tma_load(desc_v, [bh * N_K + j * BLOCK_N, 0], v_full.index(stage), v_smem.index(stage))
        _stamp(STAMP, here, 2, _DONE, n_blocks, STAMPS)
        c += n_blocks
        n += 1


@gluon.jit
def _take_turn(turn, t, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Ping-pong: wait until the other warpgroup has issued its GEMMs (this warpgroup's turn
    number t; a tile of n_blocks key blocks takes n_blocks + 1 turns, so tile n of a program, at
    ring position c, takes turns c + n, ..., c + n + n_blocks)."""
    if PINGPONG:
        mbarrier.wait(turn.index(WG), t & 1)


@gluon.jit
def _pass_turn(turn, WG: gl.constexpr, PINGPONG: gl.constexpr):
    """Ping-pong: this warpgroup's GEMMs are issued; the other one may issue its own."""
    if PINGPONG:
        mbarrier.arrive(turn.index(1 - WG), count=1)


@gluon.jit
def _needs_mask(start_n, N_K, first_row_keys, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """Whether block [start_n, start_n + Bc) holds a key some row of the warpgroup must not see:
    past N_k (the ragged tail) or, causal, past what its first row sees (the diagonal)."""
    masked = start_n + BLOCK_N > N_K
    if CAUSAL:
        masked = masked | (start_n + BLOCK_N > first_row_keys)
    return masked


# Row reductions through gl.reduce with Gluon combine functions: gl.max and gl.sum are triton.language's,
# which TRITON_INTERPRET=1 (the CPU test setting) turns into interpreter functions Gluon cannot call.
@gluon.jit
def _maximum(a, b):
    return gl.maximum(a, b)


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _masked_row_max(s, row0, start_n, N_K, causal_offset, qk_scale, masked, CAUSAL: gl.constexpr):
    """S = Q_i K_j^T (Br, Bc) of query rows row0 + [0, Br) and keys start_n + [0, Bc), raw, with
    -inf where a row must not see a key, and its row maximum (Br,) in log2 units, rowmax(S) * scale."""
    if masked:  # the ragged last block, and the blocks the diagonal crosses
        s_layout: gl.constexpr = s.type.layout
        rows = row0 + gl.arange(0, s.shape[0], layout=gl.SliceLayout(1, s_layout))  # (Br,) query indices i
        keys = start_n + gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s_layout))  # (Bc,) key indices j
        visible = keys[None, :] < N_K
        if CAUSAL:  # bottom-right alignment: query i sees key j iff j <= i + N_k - N_q
            visible = visible & (keys[None, :] <= rows[:, None] + causal_offset)
        s = gl.where(visible, s, float("-inf"))
    return s, gl.reduce(s, 1, _maximum) * qk_scale  # scale > 0: the max commutes with it


@gluon.jit
def _poly_exp2(x):
    """2^x (fp32) on the FMA and integer pipes: FlashAttention-4's software exp2, as
    :func:`flashlab.kernels.fa4.poly_exp2` (whose docstring derives it): x = n + f by one rounding
    add, 2^f by a minimax cubic, n added to the result's exponent field. x <= -127 gives 0."""
    x = gl.maximum(x, -127.0)  # clamp: the bit trick needs a normal exponent
    t = (x - 0.49609375) + 12582912.0  # (x - b) + 1.5 * 2^23 rounds to n = floor(x) (almost)
    f = x - (t - 12582912.0)  # x = n + f, f in [-2^-8, 1)
    p = gl.fma(gl.fma(gl.fma(f, _POLY_C3, _POLY_C2), f, _POLY_C1), f, 1.0)  # 1 + f (c1 + f (c2 + f c3))
    bits = p.to(gl.int32, bitcast=True) + (t.to(gl.int32, bitcast=True) << 23)  # exponent += n
    return bits.to(gl.float32, bitcast=True)


@gluon.jit
def _exp2_tile(x, EXP_POLY: gl.constexpr):
    """exp2 of a (Br, Bc) tile: the first Bc / 2^EXP_POLY columns by :func:`_poly_exp2`, the rest
    by the special-function unit (MUFU.EX2); EXP_POLY = -1: all by MUFU. The tile is cut in halves
    (:func:`_halves`, no data moves), not masked (a mask would evaluate both for every score), and
    the halves are put back where they were."""
    if EXP_POLY < 0:
        y = gl.exp2(x)
    elif EXP_POLY == 0:
        y = _poly_exp2(x)
    else:
        a, b = _halves(x)
        y = _join_halves(_exp2_tile(a, EXP_POLY - 1), gl.exp2(b), x)
    return y


@gluon.jit
def _halves(x):
    """A (Br, W) tile as its columns [0, W/2) and [W/2, W): in the wgmma accumulator layout a
    thread holds columns 8 g + {2 t, 2 t + 1} for every g, so a cut at a column bit >= 3 only
    regroups each thread's registers."""
    BM: gl.constexpr = x.shape[0]
    W: gl.constexpr = x.shape[1]
    return gl.split(gl.permute(gl.reshape(x, [BM, 2, W // 2]), [0, 2, 1]))


@gluon.jit
def _join_halves(a, b, like):
    """:func:`_halves` undone: the (Br, W) tile whose columns [0, W/2) are ``a``, in the layout of
    ``like``, the tile that was cut."""
    y = gl.reshape(gl.permute(gl.join(a, b), [0, 2, 1]), [a.shape[0], 2 * a.shape[1]])
    return gl.convert_layout(y, like.type.layout, assert_trivial=True)


@gluon.jit
def _exp_step(s, m_i, m_new, l_i, qk_scale, P_SHIFT: gl.constexpr = 0.0, EXP_POLY: gl.constexpr = -1,
              ROW_SUM: gl.constexpr = True):
    """P = 2^P_SHIFT exp2(S * scale * log2 e - m_new) (Br, Bc), l_new = alpha l + rowsum(P) and
    alpha = exp2(m - m_new) (Br,), for a reference maximum that moves from m_i to m_new (Br,).
    EXP_POLY: P's exp2 on Bc / 2^EXP_POLY of the columns in software (:func:`_exp2_tile`).
    ROW_SUM=False: l is summed elsewhere (the FP8 kernel's ``l_mma``) and returned as it came."""
    m_ref = gl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet: P = 0, not NaN
    alpha = gl.exp2(m_i - m_ref)  # exp2(m - m_new)
    if EXP_POLY < 0:
        p = gl.exp2(s * qk_scale - (m_ref - P_SHIFT)[:, None])  # P = exp2(S - m_new): one FFMA, one MUFU.EX2 a score
    else:
        p = _exp2_tile(s * qk_scale - (m_ref - P_SHIFT)[:, None], EXP_POLY)
    if ROW_SUM:
        l_i = l_i * alpha + gl.reduce(p, 1, _add)  # l = alpha l + rowsum(P)
    return p, l_i, alpha


@gluon.jit
def _softmax_step(s, m_i, l_i, row0, start_n, N_K, causal_offset, qk_scale, masked, CAUSAL: gl.constexpr):
    """Fold S = Q_i K_j^T (Br, Bc) of query rows row0 + [0, Br) and keys start_n + [0, Bc), raw,
    into (m, l) (Br,) in log2 units (Algorithm 1's softmax steps).
    Returns P = exp2(S * scale * log2 e - m_new) (Br, Bc), m_new, l_new and the factor
    alpha = exp2(m - m_new) (Br,) that brings O up to date. (The FP8 kernel, :mod:`.fa3_fp8`,
    computes P 2^8 times larger from the same two parts, so that it lands in e4m3's normal range.)"""
    s, row_max = _masked_row_max(s, row0, start_n, N_K, causal_offset, qk_scale, masked, CAUSAL)
    m_new = gl.maximum(m_i, row_max)  # m_new = max(m, rowmax(S))
    p, l_i, alpha = _exp_step(s, m_i, m_new, l_i, qk_scale)
    return p, m_new, l_i, alpha


@gluon.jit
def _consumer(desc_o, O, LSE, q_smem, o_smem, k_smem, v_smem, bars, turn, N_Q, N_K, BH, DEAL, qk_scale,
              CAUSAL: gl.constexpr, WG: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              HEAD_D: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr, OVERLAP: gl.constexpr,
              STAMP=None, STAMP_AT: gl.constexpr = 0, STAMPS: gl.constexpr = False,
              CONSUMERS: gl.constexpr = 2):
    """Algorithm 2, the consumer warpgroup WG (of CONSUMERS), for every tile of this program
    (:func:`_tile`): query rows m0 + WG * Br + [0, Br) of the tile. (Its register reallocation is
    warp_specialize's worker_num_regs and the kernel's maxnreg.) OVERLAP=False is the ablation
    without intra-warpgroup overlap: each step waits for both GEMMs before its softmax, so the
    softmax never runs beside this warpgroup's own GEMMs. STAMPS: time stamps of each phase of
    tile STAMP_AT (:func:`_stamp`)."""
    q_full, q_empty, k_full, k_empty, v_full, v_empty = bars
    # wgmma accumulators: S (Br, Bc) and O (Br, d) spread over the warpgroup's 128 threads
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, HEAD_D, 16])
    # P goes from registers straight into the second GEMM as its A operand (an RS-GEMM)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    dtype: gl.constexpr = q_smem.dtype
    q = q_smem.index(WG)  # Q_i (Br, d), read by wgmma from shared memory
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    causal_offset = N_K - N_Q
    c = 0  # key blocks consumed so far, over all tiles: the ring position, as the producer counts it
    n = 0  # tiles done so far
    if PINGPONG:
        if WG == 1:  # consumer 0 goes first
            mbarrier.arrive(turn.index(0), count=1)

    for tj in range(_tile_count(N_Q, BH, DEAL, BLOCK_M, CONSUMERS)):
        bh, m0, n_blocks, tile = _tile(tj, N_Q, N_K, DEAL, CAUSAL, BLOCK_M, BLOCK_N, CONSUMERS)
        here = tile == STAMP_AT
        row0 = m0 + WG * BLOCK_M  # this warpgroup's first query row
        first_row_keys = row0 + causal_offset + 1  # keys the first row sees: blocks past it need the mask

        # "initialize O_i = 0, l_i = 0, m_i = -inf", on chip
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
        l_i = gl.zeros([BLOCK_M], gl.float32, gl.SliceLayout(1, s_layout))
        o = gl.zeros([BLOCK_M, HEAD_D], gl.float32, o_layout)

        # "wait for Q_i and K_0; S_cur = Q_i K_0^T, commit and wait; release K_0; m_i, P_cur, l_i from S_cur"
        first = c % STAGES  # block 0's slot
        _stamp(STAMP, here, WG, _WAIT_K, 0, STAMPS)
        mbarrier.wait(q_full.index(WG), n & 1)
        mbarrier.wait(k_full.index(first), (c // STAGES) & 1)
        _stamp(STAMP, here, WG, _WAIT_TURN, 0, STAMPS)
        _take_turn(turn, c + n, WG, PINGPONG)
        _stamp(STAMP, here, WG, _ISSUE_S, 0, STAMPS)
        s_tok = warpgroup_mma(q, k_smem.index(first).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        _pass_turn(turn, WG, PINGPONG)
        _stamp(STAMP, here, WG, _WAIT_S, 0, STAMPS)
        s = warpgroup_mma_wait(0, deps=(s_tok,))
        mbarrier.arrive(k_empty.index(first), count=1)
        _stamp(STAMP, here, WG, _SOFTMAX, 0, STAMPS)
        p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, row0, 0, N_K, causal_offset, qk_scale,
                                           _needs_mask(0, N_K, first_row_keys, BLOCK_N, CAUSAL), CAUSAL)
        _stamp(STAMP, here, WG, _CONVERT, 0, STAMPS)
        p = gl.convert_layout(p.to(dtype), p_layout)  # P_cur (Br, Bc) in q's dtype

        for j in range(1, n_blocks):
            stage = (c + j) % STAGES
            prev = (c + j - 1) % STAGES
            # "wait for K_j; S_next = Q_i K_j^T, commit but do not wait"
            _stamp(STAMP, here, WG, _WAIT_K, j, STAMPS)
            mbarrier.wait(k_full.index(stage), ((c + j) // STAGES) & 1)
            _stamp(STAMP, here, WG, _WAIT_TURN, j, STAMPS)
            _take_turn(turn, c + n + j, WG, PINGPONG)
            _stamp(STAMP, here, WG, _ISSUE_S, j, STAMPS)
            s_tok = warpgroup_mma(q, k_smem.index(stage).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            # "rescale O_i" by exp2(m_old - m) of the last softmax, while the tensor cores compute S_next
            _stamp(STAMP, here, WG, _RESCALE, j - 1, STAMPS)
            o = o * gl.convert_layout(alpha, row_o)[:, None]
            # "wait for V_{j-1}; O_i = O_i + P_cur V_{j-1}, commit but do not wait"
            _stamp(STAMP, here, WG, _WAIT_V, j - 1, STAMPS)
            mbarrier.wait(v_full.index(prev), ((c + j - 1) // STAGES) & 1)
            _stamp(STAMP, here, WG, _ISSUE_PV, j - 1, STAMPS)
            o_tok = warpgroup_mma(p, v_smem.index(prev), o, is_async=True)
            _pass_turn(turn, WG, PINGPONG)
            _stamp(STAMP, here, WG, _WAIT_S, j, STAMPS)
            if OVERLAP:
                # "wait for the WGMMA Q_i K_j^T" (wgmma groups finish in order: P_cur V_{j-1} may still run)
                s = warpgroup_mma_wait(1, deps=(s_tok,))
            else:  # the ablation: wait for both GEMMs, so the softmax below runs alone
                o, s, p = warpgroup_mma_wait(0, deps=(o_tok, s_tok, p))
            mbarrier.arrive(k_empty.index(stage), count=1)  # "release the (j % s)th stage ... for K"
            # "compute m_i, P_next and l_i based on S_next"
            _stamp(STAMP, here, WG, _SOFTMAX, j, STAMPS)
            start_n = j * BLOCK_N
            p_next, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, row0, start_n, N_K, causal_offset,
                                                    qk_scale, _needs_mask(start_n, N_K, first_row_keys, BLOCK_N,
                                                                          CAUSAL), CAUSAL)
            _stamp(STAMP, here, WG, _WAIT_PV, j - 1, STAMPS)
            if OVERLAP:  # "wait for the WGMMA P_cur V_{j-1}"
                o, p = warpgroup_mma_wait(0, deps=(o_tok, p))
            mbarrier.arrive(v_empty.index(prev), count=1)  # "release the ((j - 1) % s)th stage ... for V"
            _stamp(STAMP, here, WG, _CONVERT, j, STAMPS)
            p = gl.convert_layout(p_next.to(dtype), p_layout)  # "copy S_next to S_cur", as P
        # Q_i's last GEMM is done: the producer may load the next tile's Q into this slot
        mbarrier.arrive(q_empty.index(WG), count=1)

        # "wait for V_{Tc-1}; O_i = O_i + P_cur V_{Tc-1}, commit and wait", after the last rescale
        last = (c + n_blocks - 1) % STAGES
        _stamp(STAMP, here, WG, _RESCALE, n_blocks - 1, STAMPS)
        o = o * gl.convert_layout(alpha, row_o)[:, None]
        _stamp(STAMP, here, WG, _WAIT_V, n_blocks - 1, STAMPS)
        mbarrier.wait(v_full.index(last), ((c + n_blocks - 1) // STAGES) & 1)
        _stamp(STAMP, here, WG, _WAIT_TURN, n_blocks, STAMPS)  # turn n_blocks: the last P V's
        _take_turn(turn, c + n + n_blocks, WG, PINGPONG)
        _stamp(STAMP, here, WG, _ISSUE_PV, n_blocks - 1, STAMPS)
        o_tok = warpgroup_mma(p, v_smem.index(last), o, is_async=True)
        _pass_turn(turn, WG, PINGPONG)
        _stamp(STAMP, here, WG, _WAIT_PV, n_blocks - 1, STAMPS)
        o, p = warpgroup_mma_wait(0, deps=(o_tok, p))
        mbarrier.arrive(v_empty.index(last), count=1)
        _stamp(STAMP, here, WG, _WRITE, n_blocks - 1, STAMPS)
        _store_tile(desc_o, O, LSE, o_smem.index(WG), o, m_i, l_i, row0, bh * N_Q, N_Q, o_layout,
                    BLOCK_M, HEAD_D)
        _stamp(STAMP, here, WG, _DONE, n_blocks, STAMPS)
        c += n_blocks
        n += 1
    tma.store_wait(0)  # the last tile's O has left shared memory before the program ends


@gluon.jit
def _write_tile(O, LSE, o, m_i, l_i, row0, o_row0, N_Q, o_layout: gl.constexpr, BLOCK_M: gl.constexpr,
                HEAD_D: gl.constexpr):
    """Epilogue: O_i = diag(l_i)^-1 O_i, L_i = m_i + log2(l_i), written for the rows row0 + [0, Br)
    below N_q ("write O_i and L_i to HBM"); a row that saw no key: O = 0, L = -inf."""
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    seen = l_i > 0
    l_safe = gl.where(seen, l_i, 1.0)
    o = o / gl.convert_layout(l_safe, row_o)[:, None]
    lse2 = gl.where(seen, m_i + gl.log2(l_safe), float("-inf"))
    rows = row0 + gl.arange(0, BLOCK_M, layout=m_i.type.layout)
    gl.store(LSE + o_row0 + rows, lse2, mask=rows < N_Q)
    o_rows = row0 + gl.arange(0, BLOCK_M, layout=row_o)
    o_cols = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, o_layout))
    offsets = (o_row0 + o_rows[:, None]).to(gl.int64) * HEAD_D + o_cols[None, :]
    gl.store(O + offsets, o.to(O.dtype.element_ty), mask=(o_rows < N_Q)[:, None])


@gluon.jit
def _store_tile(desc_o, O, LSE, o_smem, o, m_i, l_i, row0, o_row0, N_Q, o_layout: gl.constexpr,
                BLOCK_M: gl.constexpr, HEAD_D: gl.constexpr):
    """The epilogue of a persistent program: a warpgroup whose Br rows all lie below N_q writes O
    through shared memory and one TMA store (``o_smem``, (Br, d), this warpgroup's), which runs
    while the next tile begins; a ragged last tile of a head writes its rows by :func:`_write_tile`,
    so that no row of the next head is touched, and so does every tile at d = 256, which has no
    room for two O tiles (:func:`config`)."""
    if HEAD_D > 128:
        _write_tile(O, LSE, o, m_i, l_i, row0, o_row0, N_Q, o_layout, BLOCK_M, HEAD_D)
    elif row0 + BLOCK_M <= N_Q:
        # the normalisation of _write_tile, inside this branch: moved out of it (one copy for
        # both branches), Triton 3.6's ptxas spills in the key-block loop of the causal builds
        row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
        seen = l_i > 0
        l_safe = gl.where(seen, l_i, 1.0)
        o = o / gl.convert_layout(l_safe, row_o)[:, None]  # O_i = diag(l_i)^-1 O_i
        rows = row0 + gl.arange(0, BLOCK_M, layout=m_i.type.layout)
        gl.store(LSE + o_row0 + rows, gl.where(seen, m_i + gl.log2(l_safe), float("-inf")))  # L_i = m_i + log2(l_i)
        tma.store_wait(0)  # the last tile's store has finished reading o_smem
        o_smem.store(o.to(o_smem.dtype))
        fence_async_shared()  # the stores above are visible to the TMA engine
        _tma_store(desc_o, [o_row0 + row0, 0], o_smem)
    else:
        _write_tile(O, LSE, o, m_i, l_i, row0, o_row0, N_Q, o_layout, BLOCK_M, HEAD_D)


@gluon.jit
def _n_tiles(N_Q, BH, BLOCK_M: gl.constexpr, CONSUMERS: gl.constexpr = 2):
    """Tiles of CONSUMERS * Br query rows over all B * H heads."""
    return (N_Q + CONSUMERS * BLOCK_M - 1) // (CONSUMERS * BLOCK_M) * BH


@gluon.jit
def _tile_count(N_Q, BH, DEAL, BLOCK_M: gl.constexpr, CONSUMERS: gl.constexpr = 2):
    """How many tiles this program takes (:func:`_tile`): the tiles are dealt out DEAL (1 or 2)
    at a time, deal u to program u mod P (P programs); a last deal may hold fewer."""
    n_tiles = _n_tiles(N_Q, BH, BLOCK_M, CONSUMERS)
    pid = gl.program_id(0)
    P = gl.num_programs(0)
    deals = n_tiles // DEAL  # full deals
    mine = gl.maximum(deals - pid + P - 1, 0) // P  # deals pid, pid + P, ... below n_tiles // DEAL
    owns_last = (deals >= pid) & ((deals - pid) % P == 0)  # the partial deal, if there is one
    return DEAL * mine + gl.where(owns_last, n_tiles % DEAL, 0)


@gluon.jit
def _tile(j, N_Q, N_K, DEAL, CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
          CONSUMERS: gl.constexpr = 2):
    """This program's j-th tile of CONSUMERS * Br query rows -> (head bh, first query row m0,
    key blocks it visits, tile id
    = query tile + bh * query tiles per head). Tiles are numbered head by head, and within a head
    in the order longest, shortest, second longest, second shortest, ... (odd-numbered heads in
    the reverse order); they are dealt out DEAL at a time, deal u to program u mod P, fixed in
    advance. Causal, with DEAL = 2 a deal holds about N / Bc key blocks whichever it is (a pair
    that spans two heads, when a head has an odd number of tiles, is their two middle tiles), so
    the programs' loads even out (with fewer than two tiles per program, DEAL = 1 keeps every
    program busy); and the P programs at work at one time share a few heads' K and V in L2."""
    t = DEAL * (gl.program_id(0) + (j // DEAL) * gl.num_programs(0)) + j % DEAL
    ROWS: gl.constexpr = CONSUMERS * BLOCK_M
    n_m = (N_Q + ROWS - 1) // ROWS
    bh = t // n_m
    i = t % n_m
    i = gl.where(bh % 2 == 1, n_m - 1 - i, i)  # odd-numbered heads: the order backwards
    mt = gl.where(i % 2 == 0, n_m - 1 - i // 2, i // 2)  # i = 0, 1, 2, 3, ... -> the last, first, second last, ...
    m0 = mt * ROWS
    return bh, m0, _key_blocks(m0, N_Q, N_K, ROWS, BLOCK_N, CAUSAL), mt + bh * n_m


@gluon.jit
def _tile_rows(CAUSAL: gl.constexpr, ROWS: gl.constexpr):
    """The first query row m0 of this program's tile of ROWS rows, in a grid of one program per
    tile (the ablation's kernel without warp specialisation, :mod:`flashlab.lab.variants.fa3_schedules`).
    Causal: the longest tiles (the last rows) start first, so that short ones fill the tail."""
    tile = gl.num_programs(0) - 1 - gl.program_id(0) if CAUSAL else gl.program_id(0)
    return tile * ROWS


@gluon.jit
def _key_blocks(m0, N_Q, N_K, ROWS: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """Key blocks the tile of query rows m0 + [0, ROWS) visits. Causal block skipping: its last
    real row sees keys up to min(m0 + ROWS, N_q) - 1 + N_k - N_q; blocks past that are never
    loaded. At least one block is visited so that a tile with no visible key still writes O = 0
    and lse = -inf."""
    hi = N_K
    if CAUSAL:
        hi = gl.minimum(hi, gl.minimum(m0 + ROWS, N_Q) + N_K - N_Q)
    return (gl.maximum(hi, 1) + BLOCK_N - 1) // BLOCK_N  # ceil(max(hi, 1) / Bc)


@gluon.jit
def _ring(desc_q, desc_k, desc_v, STAGES: gl.constexpr, CONSUMERS: gl.constexpr = 2):
    """Shared memory of one program: each consumer's Q tile, the ring of STAGES K and V slots,
    the full/empty mbarrier pair of each Q tile and each slot, and the ping-pong turn barriers."""
    q_smem = gl.allocate_shared_memory(desc_q.dtype, [CONSUMERS] + desc_q.block_type.shape, desc_q.layout)
    k_smem = gl.allocate_shared_memory(desc_k.dtype, [STAGES] + desc_k.block_type.shape, desc_k.layout)
    v_smem = gl.allocate_shared_memory(desc_v.dtype, [STAGES] + desc_v.block_type.shape, desc_v.layout)
    q_full = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [CONSUMERS, 1], mbarrier.MBarrierLayout())
    k_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(CONSUMERS):
        mbarrier.init(q_full.index(i), count=1)  # the producer's expect + the TMA bytes
        mbarrier.init(q_empty.index(i), count=1)  # consumer i is done with its Q tile
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_full.index(i), count=1)
        mbarrier.init(v_full.index(i), count=1)
        mbarrier.init(k_empty.index(i), count=CONSUMERS)  # every consumer releases a slot
        mbarrier.init(v_empty.index(i), count=CONSUMERS)
    return q_smem, k_smem, v_smem, (q_full, q_empty, k_full, k_empty, v_full, v_empty), turn


# N_q and DEAL are never compile-time constants: Triton specialises an integer argument equal to 1,
# and a constant N_q = 1 makes the tile's rows constants that Triton 3.6 fails to lower (an
# assertion in ConvertTritonGPUToLLVM); DEAL, 1 or 2, needs no second build
@gluon.jit(do_not_specialize=["N_Q", "DEAL"])
def _fa3_kernel(desc_q, desc_k, desc_v, desc_o, O, LSE, N_Q, N_K, BH, DEAL, qk_scale,
                CAUSAL: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_D: gl.constexpr,
                STAGES: gl.constexpr, PINGPONG: gl.constexpr, OVERLAP: gl.constexpr,
                STAMP=None, STAMP_AT: gl.constexpr = 0, STAMPS: gl.constexpr = False,
                CONSUMERS: gl.constexpr = 2):
    """A persistent grid (at most one program per SM): each program takes tiles of CONSUMERS * Br
    query rows of one head in turn (:func:`_tile`), one consumer warpgroup for each Br of them.
    Q, K, V and O come as 2-D views (B * H * N, d): rows past a head's N belong to the next head
    (or are zero past the end) and are masked like any tail. STAMPS: tile STAMP_AT writes the time
    stamps of its phases into STAMP (:func:`_stamp`). The partitions are written out once for each
    number of consumers: warp_specialize takes a list fixed when the kernel is traced."""
    q_smem, k_smem, v_smem, bars, turn = _ring(desc_q, desc_k, desc_v, STAGES, CONSUMERS)
    if HEAD_D <= 128:
        o_smem = gl.allocate_shared_memory(desc_o.dtype, [CONSUMERS] + desc_o.block_type.shape, desc_o.layout)
    else:  # d = 256: no room for two O tiles; O goes from registers to global memory (_store_tile)
        # a stand-in that only gives _consumer's o_smem.index(WG) something to index (never accessed)
        o_smem = gl.allocate_shared_memory(desc_o.dtype, [CONSUMERS, 8, 64], desc_o.layout)
    if CONSUMERS == 2:
        gl.warp_specialize([  # the default partition (4 warps) is consumer 0
            (_consumer, (desc_o, O, LSE, q_smem, o_smem, k_smem, v_smem, bars, turn,
                         N_Q, N_K, BH, DEAL, qk_scale, CAUSAL, 0, BLOCK_M, BLOCK_N, HEAD_D,
                         STAGES, PINGPONG, OVERLAP, STAMP, STAMP_AT, STAMPS, CONSUMERS)),
            (_consumer, (desc_o, O, LSE, q_smem, o_smem, k_smem, v_smem, bars, turn,
                         N_Q, N_K, BH, DEAL, qk_scale, CAUSAL, 1, BLOCK_M, BLOCK_N, HEAD_D,
                         STAGES, PINGPONG, OVERLAP, STAMP, STAMP_AT, STAMPS, CONSUMERS)),
            (_producer, (desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, bars, N_Q, N_K, BH, DEAL,
                         CAUSAL, BLOCK_M, BLOCK_N, HEAD_D, STAGES, False, STAMP, STAMP_AT, STAMPS,
                         CONSUMERS)),
        ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])
    else:  # three consumers (d = 64, both switches off): see CONSUMERS
        gl.warp_specialize([
            (_consumer, (desc_o, O, LSE, q_smem, o_smem, k_smem, v_smem, bars, turn,
                         N_Q, N_K, BH, DEAL, qk_scale, CAUSAL, 0, BLOCK_M, BLOCK_N, HEAD_D,
                         STAGES, False, OVERLAP, STAMP, STAMP_AT, STAMPS, CONSUMERS)),
            (_consumer, (desc_o, O, LSE, q_smem, o_smem, k_smem, v_smem, bars, turn,
                         N_Q, N_K, BH, DEAL, qk_scale, CAUSAL, 1, BLOCK_M, BLOCK_N, HEAD_D,
                         STAGES, False, OVERLAP, STAMP, STAMP_AT, STAMPS, CONSUMERS)),
            (_consumer, (desc_o, O, LSE, q_smem, o_smem, k_smem, v_smem, bars, turn,
                         N_Q, N_K, BH, DEAL, qk_scale, CAUSAL, 2, BLOCK_M, BLOCK_N, HEAD_D,
                         STAGES, False, OVERLAP, STAMP, STAMP_AT, STAMPS, CONSUMERS)),
            (_producer, (desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, bars, N_Q, N_K, BH, DEAL,
                         CAUSAL, BLOCK_M, BLOCK_N, HEAD_D, STAGES, False, STAMP, STAMP_AT, STAMPS,
                         CONSUMERS)),
        ], [4, 4, 1], [CONSUMER_REGS_3, CONSUMER_REGS_3, PRODUCER_REGS])


def check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, head_dims: tuple[int, ...] = HEAD_DIMS) -> None:
    """q (B, H, N_q, d), k and v (B, H, N_k, d) as the Gluon kernels take them: the same B, H and
    d, d in ``head_dims`` (the calling kernel's), N_q and N_k positive; ValueError naming the
    argument otherwise."""
    if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError("q (B, H, N_q, d), k and v (B, H, N_k, d) must agree in B, H and d; "
                         f"got q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.shape[3] not in head_dims:
        raise ValueError(f"the head dimension d must be one of {head_dims}; got d = {q.shape[3]}")
    if q.shape[2] == 0 or k.shape[2] == 0:
        raise ValueError(f"N_q and N_k must be positive; got N_q = {q.shape[2]}, N_k = {k.shape[2]}")


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> float:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 4-D tensor (B, H, N, d); got {got}")
        if t.dtype not in DTYPES:
            raise ValueError(f"{name} must be bfloat16 or float16; got {t.dtype}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous (B, H, N, d); got strides {t.stride()}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}")
    check_shapes(q, k, v)
    if not (q.is_cuda and k.device == q.device == v.device):
        raise ValueError(f"q, k, v must be on one CUDA device; got {q.device}, {k.device}, {v.device}")
    if torch.cuda.get_device_capability(q.device)[0] != 9:
        major, minor = torch.cuda.get_device_capability(q.device)
        raise ValueError(f"the FlashAttention-3 kernel needs a Hopper GPU (sm_90: H100, H200); got sm_{major}{minor}")
    return check_scale(scale, q.shape[3])


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None) -> bool:
    """Whether :func:`fa3_forward` takes these inputs (dtype, d, layout, a Hopper GPU): for a
    dispatcher that falls back to another kernel otherwise."""
    try:
        _check(q, k, v, scale)
    except ValueError:
        return False
    return True


def _descriptors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor) -> tuple[TensorDescriptor, ...]:
    """TMA descriptors over the 2-D views (B * H * N, d), with Br-row blocks (Q, O) and Bc-row
    blocks (K, V)."""
    d = q.shape[3]
    c = config(d)
    gl_dtype = _GL_DTYPES[q.dtype]
    q_layout = gl.NVMMASharedLayout.get_default_for([c["BLOCK_M"], d], gl_dtype)
    kv_layout = gl.NVMMASharedLayout.get_default_for([c["BLOCK_N"], d], gl_dtype)
    return (TensorDescriptor.from_tensor(q.view(-1, d), [c["BLOCK_M"], d], q_layout),
            TensorDescriptor.from_tensor(k.view(-1, d), [c["BLOCK_N"], d], kv_layout),
            TensorDescriptor.from_tensor(v.view(-1, d), [c["BLOCK_N"], d], kv_layout),
            o_descriptor(o))


def o_descriptor(o: torch.Tensor) -> TensorDescriptor:
    """The TMA descriptor the epilogue stores O (B, H, N_q, d) through: its (B * H * N_q, d) view
    in Br-row blocks."""
    d = o.shape[3]
    block = [BLOCK_M, d]
    return TensorDescriptor.from_tensor(o.view(-1, d), block,
                                        gl.NVMMASharedLayout.get_default_for(block, _GL_DTYPES[o.dtype]))


def programs(n_tiles: int, causal: bool, device: torch.device) -> tuple[int, int]:
    """The persistent grid and how many tiles are dealt at a time (:func:`_tile`) on ``device``
    (see :func:`schedule`)."""
    return schedule(n_tiles, causal, torch.cuda.get_device_properties(device).multi_processor_count)


def schedule(n_tiles: int, causal: bool, sm_count: int) -> tuple[int, int]:
    """(programs, DEAL) for ``n_tiles`` tiles on ``sm_count`` SMs: one program per SM (one per
    tile when there are fewer). Causal tiles are dealt in pairs (a long and a short one) when
    every program gets at least one pair; tiles of equal length one at a time, which spreads
    them as evenly as whole tiles allow."""
    p = max(1, min(n_tiles, sm_count))
    return p, 2 if causal and n_tiles >= 2 * p else 1


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None = None,
            *, pingpong: bool | None = None, overlap: bool | None = None, consumers: int | None = None,
            out: torch.Tensor | None = None, stamps: torch.Tensor | None = None,
            stamp_at: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the kernel; the convention of :func:`flashlab.kernels.forward.forward`.

    q (B, H, N_q, d), k and v (B, H, N_k, d), contiguous, bf16 or fp16, d in HEAD_DIMS, on sm_90.
    ``pingpong=False`` lets both consumers issue their GEMMs freely, ``overlap=False`` waits for
    S before each softmax with no GEMM in flight; None takes the head dimension's default
    (:data:`SWITCHES`); ``consumers``: consumer warpgroups, 2 or 3 (None:
    :func:`consumer_count`, :data:`CONSUMERS`); ``out`` is a (B, H, N_q, d)
    buffer to write O into (tests fill it with NaN first). ``stamps``: build with time stamps
    (STAMPS=True, two consumers only) and let tile ``stamp_at`` (query tile + batch-head * query
    tiles per head, :func:`_tile`) write them into this int64
    (n_blocks + 1, STAMP_SLOTS, 3, 2) buffer (:func:`_stamp`).
    Returns o like q and lse2 (B, H, N_q) float32, the row log-sum-exp in log2 units, as the
    backward (:func:`flashlab.kernels.backward.backward`) takes it."""
    scale = _check(q, k, v, scale)
    B, H, N_Q, D = q.shape
    N_K = k.shape[2]
    o = torch.empty_like(q) if out is None else out
    if o.shape != q.shape or o.dtype != q.dtype or not o.is_contiguous() or o.device != q.device:
        raise ValueError(f"out must be a contiguous {q.dtype} tensor of shape {tuple(q.shape)} on {q.device}; "
                         f"got {o.dtype} {tuple(o.shape)} on {o.device}")
    lse2 = torch.empty((B, H, N_Q), device=q.device, dtype=torch.float32)
    c = config(D)
    pingpong, overlap = switches(D, pingpong, overlap)
    n_consumers = consumer_count(D, pingpong, overlap, causal, consumers)
    n_programs, deal = programs(triton.cdiv(N_Q, n_consumers * c["BLOCK_M"]) * B * H, bool(causal), q.device)
    grid = (n_programs,)
    if stamps is not None and n_consumers != 2:
        raise ValueError(f"stamps need two consumer warpgroups (their slots); got consumers = {n_consumers}")
    stamping = stamp_args(stamps, stamp_at, (triton.cdiv(N_K, c["BLOCK_N"]) + 1, len(STAMP_PHASES), 3, 2), q.device)
    _fa3_kernel[grid](*_descriptors(q, k, v, o), o, lse2, N_Q, N_K, B * H, deal, scale * LOG2E,  # scale * log2(e)
                      CAUSAL=bool(causal), PINGPONG=pingpong, OVERLAP=overlap, CONSUMERS=n_consumers, **c,
                      **stamping, num_warps=NUM_WARPS, maxnreg=MAXNREG if n_consumers == 2 else MAXNREG_3)
    return o, lse2


def fa3_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                scale: float | None = None, *, pingpong: bool | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact attention o = softmax(scale * q k^T (+ causal mask)) v by FlashAttention-3's forward.

    Parameters
    ----------
    q : (B, H, N_q, d) bfloat16 or float16, contiguous, on a Hopper GPU; d = 64, 128 or 256
    k, v : (B, H, N_k, d), same dtype
    causal : mask keys after the query, aligned bottom-right when N_q != N_k
        (query i sees key j iff j <= i + N_k - N_q); a row that sees no key gives 0.
    scale : multiplies q k^T; default 1/sqrt(d)
    pingpong : order the two consumer warpgroups' GEMMs (FA3 §3.1); None: the head dimension's
        default (:data:`SWITCHES`)

    Returns
    -------
    o : (B, H, N_q, d) in q's dtype
    lse : (B, H, N_q) float32, the row log-sum-exp in natural-log units

    Raises ValueError naming the argument when the inputs are not what the kernel takes
    (:func:`supported` asks the same without raising).
    """
    o, lse2 = forward(q, k, v, causal, scale, pingpong=pingpong)
    return o, lse2 * LN2  # log2 units -> natural log


def tensor_descriptor_type(dtype, block: list[int]) -> str:
    """The signature string of a TMA descriptor argument with ``block`` over ``dtype`` (a gl dtype)
    in its default NVMMA shared layout, as :class:`TensorDescriptor` with that layout gives."""
    shape = ", ".join(str(b) for b in block)
    return f"tensordesc<{dtype}[{shape}],{gl.NVMMASharedLayout.get_default_for(block, dtype)!r}>"


def check_build(dtype: torch.dtype, d: int, head_dims: tuple[int, ...] = HEAD_DIMS) -> None:
    """The arguments a bf16/fp16 Gluon kernel can be compiled for: ``dtype`` in DTYPES, ``d`` in
    ``head_dims`` (the calling kernel's)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be bfloat16 or float16; got {dtype}")
    if d not in head_dims:
        raise ValueError(f"d must be one of {head_dims}; got {d}")


def compile_for_sm90(kernel, signature: dict[str, str], constexprs: dict[str, object], pointers: tuple[int, ...],
                     num_warps: int, maxnreg: int | None):
    """Compile the Gluon ``kernel`` for sm_90 without a GPU: ``signature`` maps each parameter to
    its type ("i32", "*bf16", tensor_descriptor_type(...), "constexpr"), ``constexprs`` gives
    the constexprs' values, ``pointers`` the positions of the pointer arguments (16-byte aligned,
    as torch allocations are). Returns Triton's CompiledKernel."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    attrs = {(i,): [["tt.divisibility", 16]] for i in pointers}
    src = GluonASTSource(kernel, signature, constexprs, attrs)
    options = dict(num_warps=num_warps) | ({} if maxnreg is None else dict(maxnreg=maxnreg))
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)


def compile_sm90(dtype: torch.dtype = torch.bfloat16, d: int = 128, causal: bool = False,
                 pingpong: bool | None = None, overlap: bool | None = None, stamps: bool = False,
                 consumers: int | None = None):
    """Compile the kernel for sm_90 without a GPU, with the argument types :func:`forward` launches
    it with, and return Triton's CompiledKernel (``.asm["ptx"]``, ``.asm["ttgir"]``, ``.asm["cubin"]``,
    ``.metadata``). TRITON_INTERPRET may be set: Gluon kernels are always compiled. ``stamps``: the
    build with time stamps (STAMPS=True, an int64 STAMP buffer; :func:`_stamp`). ``pingpong`` and
    ``overlap`` as :func:`forward` takes them (None: :data:`SWITCHES`' default for ``d``), and
    ``consumers`` likewise (None: :func:`consumer_count`)."""
    check_build(dtype, d)
    c = config(d)
    gl_dtype = _GL_DTYPES[dtype]
    pingpong, overlap = switches(d, pingpong, overlap)
    n_consumers = consumer_count(d, pingpong, overlap, causal, consumers)
    if stamps and n_consumers != 2:
        raise ValueError(f"stamps need two consumer warpgroups (their slots); got consumers = {n_consumers}")
    constexprs = dict(CAUSAL=bool(causal), PINGPONG=pingpong, OVERLAP=overlap, CONSUMERS=n_consumers, **c,
                      STAMP_AT=0, STAMPS=bool(stamps)) | ({} if stamps else dict(STAMP=None))
    signature = {"desc_q": tensor_descriptor_type(gl_dtype, [c["BLOCK_M"], d]),
                 "desc_k": tensor_descriptor_type(gl_dtype, [c["BLOCK_N"], d]),
                 "desc_v": tensor_descriptor_type(gl_dtype, [c["BLOCK_N"], d]),
                 "desc_o": tensor_descriptor_type(gl_dtype, [c["BLOCK_M"], d]),
                 "O": f"*{gl_dtype}", "LSE": "*fp32", "N_Q": "i32", "N_K": "i32", "BH": "i32", "DEAL": "i32",
                 "qk_scale": "fp32",
                 **{k: "constexpr" for k in constexprs}} | ({"STAMP": "*i64"} if stamps else {})
    pointers = tuple(_fa3_kernel.arg_names.index(name) for name in ("O", "LSE") + (("STAMP",) if stamps else ()))
    return compile_for_sm90(_fa3_kernel, signature, constexprs, pointers, NUM_WARPS,
                            MAXNREG if n_consumers == 2 else MAXNREG_3)
