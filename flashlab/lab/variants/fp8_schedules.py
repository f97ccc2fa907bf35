"""The FP8 forward (:mod:`flashlab.kernels.fp8`) with two other key-loop schedules, for the
experiments of chapter 6 (``fp8tiles``, ``fp8rescale``, ``fp8pipeline``) and the compile report.

``pipeline`` -- FlashAttention-3's intra-warpgroup overlap (§3.2) written in Triton, two ways:

- ``"qk"`` (or True): the next key tile's Q K^T is issued before this tile's softmax; the
  price is a second (BLOCK_M, BLOCK_N) tile of scores in registers.
- ``"pv"``: this tile's P V is issued after the next tile's Q K^T, so that it runs on the
  tensor cores during the next tile's softmax (its result only accumulates, so Triton keeps
  it in flight). P waits one iteration in registers as fp16, which holds every e4m3 value
  exactly; on a GPU Q becomes a register operand (:func:`_in_registers`), which frees its
  shared memory for one more V buffer.

``rescale_threshold`` -- FlashAttention-4's conditional rescaling (chapter 7, as
:mod:`flashlab.kernels.fa4`) in the FP8 kernel: m is a reference max that moves only when
some row of a tile rose above it by more than theta, and P = 2^(8 - theta) exp2(S - m_ref)
stays <= 2^8. Exact in real arithmetic; in FP8, P's smallest entries lose theta bits of
range. It saves O's multiplications only when V has one descale per (batch, head).

Both schedules apply to the unmasked key blocks; the masked ones (causal diagonal, ragged
N_k) follow the teaching kernel's loop, or with a threshold the same decision per tile.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlab.kernels._common import INTERPRET, Candidate, causal_range_tl, check_rescale_threshold
from flashlab.kernels.fp8 import (
    P_SHIFT,
    _SHIFT,
    _attend_fp8,
    _factors,
    _k_tile,
    _key_tiles,
    _query_tile,
    _softmax_fp8,
    _store_o,
    _tile_factor,
    _v_tile,
    launch_fp8,
    round_e4m3,
)

__all__ = ["flash_attention_fp8_scheduled", "schedule_constexprs"]


def schedule_constexprs(pipeline: bool | str, rescale_threshold: float | None) -> dict[str, object]:
    """The kernel's compile-time switches for ``pipeline`` and ``rescale_threshold`` (checked
    here): PIPELINE (0 plain, 1 scores early, 2 P V late) and THETA (< 0: rescale on every
    tile). :mod:`flashlab.lab.compile_report` compiles the kernel with the same switches."""
    if not (isinstance(pipeline, bool) or isinstance(pipeline, str) and pipeline in ("qk", "pv")):
        raise ValueError(f"pipeline must be False, True, 'qk' or 'pv'; got {pipeline!r}")
    mode = {False: 0, True: 1, "qk": 1, "pv": 2}[pipeline]
    theta = check_rescale_threshold(rescale_threshold, P_SHIFT, f"P <= 2^{P_SHIFT:g} must stay in e4m3's range")
    if mode == 2 and theta is not None:
        raise ValueError("pipeline='pv' rescales O on every tile; it cannot be combined with rescale_threshold "
                         f"(got {rescale_threshold!r})")
    return {"PIPELINE": mode, "THETA": -1.0 if theta is None else theta}


@triton.jit
def _in_registers(x):
    """x (fp8) through an opaque register copy. Triton reads a dot operand that comes straight
    from a load out of shared memory; one that an instruction produced, it reads from registers,
    as it does P. For Q this frees BLOCK_M x d bytes of shared memory for the whole program,
    which lets two programs of pipeline="pv" (one more V buffer) share an SM. GPU only (inline PTX)."""
    return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x.to(tl.uint8, bitcast=True)], dtype=tl.uint8,
                                     is_pure=True, pack=4).to(tl.float8e4nv, bitcast=True)


@triton.jit
def _fold_threshold(acc, l_i, m_i, v_unit, qk, v, row_factor, kd_ptr, vd_ptr, start_n, n, offs_m, N_K,
                    causal_offset, BLOCK_N: tl.constexpr, K_SB: tl.constexpr, V_SB: tl.constexpr,
                    MASKED: tl.constexpr, CAUSAL: tl.constexpr, EMULATE_CAST: tl.constexpr,
                    ROW_SCALAR: tl.constexpr, THETA: tl.constexpr):
    """Fold key tile j into the state with conditional rescaling: m_i is a reference max, moved
    (and O, l rescaled) only when some row of the tile rose above it by more than THETA; then
    P <= 2^(SHIFT + THETA) = 2^8 still. Any reference gives the same O / l (both carry the same
    exp2(-m_ref)). One decision for the whole tile."""
    SHIFT: tl.constexpr = _SHIFT - THETA
    qk, f, f_rows = _tile_factor(qk, row_factor, kd_ptr, start_n, n, N_K, BLOCK_N, K_SB, ROW_SCALAR)
    if MASKED:
        visible = n[None, :] < N_K
        if CAUSAL:
            visible = visible & (n[None, :] <= offs_m[:, None] + causal_offset)
        s = tl.where(visible, qk * f_rows, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))  # m_new = max(m_ref, rowmax(S_ij))
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * f)
    rise = tl.max(m_new - tl.maximum(m_i, -3.0e38), 0)  # largest rise over the rows (from -inf: huge)
    if rise > THETA:
        m_to = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen nothing stays at 0
        alpha = tl.math.exp2(m_i - m_to)
        acc = acc * alpha[:, None]
        l_i = l_i * alpha
        m_i = m_new
    if MASKED:
        m_ref = tl.where(m_i == float("-inf"), 0.0, m_i)
        p = tl.math.exp2(s - (m_ref - SHIFT)[:, None])  # P_ij = 2^SHIFT exp2(S_ij - m_ref) <= 2^8
    else:
        p = tl.math.exp2(qk * f_rows - (m_i - SHIFT)[:, None])  # the same P_ij, one FMA per score
    l_i = l_i + tl.sum(p, 1)
    if EMULATE_CAST:
        p = round_e4m3(p)
    if V_SB != 0:  # V_j has its own descale dv_j: O = (u / dv_j) O, a multiplication per tile after all
        vd = tl.load(vd_ptr + start_n // V_SB)
        acc = acc * (v_unit / vd)
        v_unit = vd
    acc = tl.dot(p.to(tl.float8e4nv), v, acc)  # O += fp8(P_ij) V8_j
    return acc, l_i, m_i, v_unit


@triton.jit
def _fold(acc, l_i, m_i, v_unit, qk, v, row_factor, kd_ptr, vd_ptr, start_n, n, offs_m, N_K, causal_offset,
          BLOCK_N: tl.constexpr, K_SB: tl.constexpr, V_SB: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
          EMULATE_CAST: tl.constexpr, ROW_SCALAR: tl.constexpr, THETA: tl.constexpr):
    """Tile j's scores qk and V8_j into the state: the teaching kernel's step, or with THETA >= 0
    :func:`_fold_threshold`."""
    if THETA >= 0:
        acc, l_i, m_i, v_unit = _fold_threshold(acc, l_i, m_i, v_unit, qk, v, row_factor, kd_ptr, vd_ptr, start_n, n,
                                                offs_m, N_K, causal_offset, BLOCK_N, K_SB, V_SB, MASKED, CAUSAL,
                                                EMULATE_CAST, ROW_SCALAR, THETA)
    else:
        p, o_scale, l_i, m_i, v_unit = _softmax_fp8(l_i, m_i, v_unit, qk, row_factor, kd_ptr, vd_ptr, start_n, n,
                                                    offs_m, N_K, causal_offset, BLOCK_N, K_SB, V_SB, MASKED, CAUSAL,
                                                    EMULATE_CAST, ROW_SCALAR)
        acc = tl.dot(p.to(tl.float8e4nv), v, acc * o_scale[:, None])
    return acc, l_i, m_i, v_unit


@triton.jit
def _attend_scheduled(
    acc, l_i, m_i, v_unit, q, row_factor, K, V, k_at, v_at, kd_ptr, vd_ptr, offs_m, lo, hi, N_K, causal_offset,
    D_HEAD: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, K_SB: tl.constexpr, V_SB: tl.constexpr,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, EMULATE_CAST: tl.constexpr, TMA: tl.constexpr,
    ROW_SCALAR: tl.constexpr, PIPELINE: tl.constexpr, THETA: tl.constexpr,
):
    """Fold key blocks [lo, hi) into the state with the schedule PIPELINE (unmasked blocks only;
    see the module docstring) and conditional rescaling where THETA >= 0."""
    d_ok = tl.arange(0, BLOCK_D) < D_HEAD
    offs_n = tl.arange(0, BLOCK_N)
    PADDED_D: tl.constexpr = BLOCK_D != D_HEAD
    if PIPELINE == 1 and not MASKED:
        if lo < hi:
            qk = tl.dot(q, _k_tile(K, k_at, lo, offs_n, d_ok, False, PADDED_D, TMA))
            for start_n in tl.range(lo, hi - BLOCK_N, BLOCK_N):
                # issued now, needed only in the next iteration: overlaps the softmax below
                qk_next = tl.dot(q, _k_tile(K, k_at, start_n + BLOCK_N, offs_n, d_ok, False, PADDED_D, TMA))
                v = _v_tile(V, v_at, start_n, offs_n, d_ok, False, PADDED_D, TMA)
                acc, l_i, m_i, v_unit = _fold(acc, l_i, m_i, v_unit, qk, v, row_factor, kd_ptr, vd_ptr, start_n,
                                              start_n + offs_n, offs_m, N_K, causal_offset, BLOCK_N, K_SB, V_SB,
                                              False, CAUSAL, EMULATE_CAST, ROW_SCALAR, THETA)
                qk = qk_next
            last = hi - BLOCK_N  # the final block's scores are already in qk
            v = _v_tile(V, v_at, last, offs_n, d_ok, False, PADDED_D, TMA)
            acc, l_i, m_i, v_unit = _fold(acc, l_i, m_i, v_unit, qk, v, row_factor, kd_ptr, vd_ptr, last,
                                          last + offs_n, offs_m, N_K, causal_offset, BLOCK_N, K_SB, V_SB, False,
                                          CAUSAL, EMULATE_CAST, ROW_SCALAR, THETA)
    elif PIPELINE == 2 and not MASKED:
        if lo < hi:  # the first tile's softmax; its P V is added in the first iteration below
            qk = tl.dot(q, _k_tile(K, k_at, lo, offs_n, d_ok, False, PADDED_D, TMA))
            p, o_scale, l_i, m_i, v_unit = _softmax_fp8(l_i, m_i, v_unit, qk, row_factor, kd_ptr, vd_ptr, lo,
                                                        lo + offs_n, offs_m, N_K, causal_offset, BLOCK_N, K_SB,
                                                        V_SB, False, CAUSAL, EMULATE_CAST, ROW_SCALAR)
            p16 = p.to(tl.float16)  # fp8(P) held as fp16, which represents every e4m3 number exactly
            for start_n in tl.range(lo + BLOCK_N, hi, BLOCK_N):
                qk = tl.dot(q, _k_tile(K, k_at, start_n, offs_n, d_ok, False, PADDED_D, TMA))
                # the previous tile's O = o_scale O + fp8(P) V, issued after this tile's scores: the
                # P V dot runs on the tensor cores while this tile's exponentials run below
                acc = acc * o_scale[:, None]
                v = _v_tile(V, v_at, start_n - BLOCK_N, offs_n, d_ok, False, PADDED_D, TMA)
                acc = tl.dot(p16.to(tl.float8e4nv), v, acc)
                p, o_scale, l_i, m_i, v_unit = _softmax_fp8(l_i, m_i, v_unit, qk, row_factor, kd_ptr, vd_ptr,
                                                            start_n, start_n + offs_n, offs_m, N_K, causal_offset,
                                                            BLOCK_N, K_SB, V_SB, False, CAUSAL, EMULATE_CAST,
                                                            ROW_SCALAR)
                p16 = p.to(tl.float16)
            acc = acc * o_scale[:, None]
            v = _v_tile(V, v_at, hi - BLOCK_N, offs_n, d_ok, False, PADDED_D, TMA)
            acc = tl.dot(p16.to(tl.float8e4nv), v, acc)  # the last tile's P V
    elif THETA >= 0:
        for start_n in tl.range(lo, hi, BLOCK_N):
            n = start_n + offs_n
            k = _k_tile(K, k_at, start_n, n < N_K, d_ok, MASKED, PADDED_D, TMA)
            v = _v_tile(V, v_at, start_n, n < N_K, d_ok, MASKED, PADDED_D, TMA)
            acc, l_i, m_i, v_unit = _fold_threshold(acc, l_i, m_i, v_unit, tl.dot(q, k), v, row_factor, kd_ptr,
                                                    vd_ptr, start_n, n, offs_m, N_K, causal_offset, BLOCK_N, K_SB,
                                                    V_SB, MASKED, CAUSAL, EMULATE_CAST, ROW_SCALAR, THETA)
    else:
        acc, l_i, m_i, v_unit = _attend_fp8(acc, l_i, m_i, v_unit, q, row_factor, K, V, k_at, v_at, kd_ptr, vd_ptr,
                                            offs_m, lo, hi, N_K, causal_offset, D_HEAD, BLOCK_D, BLOCK_N, K_SB, V_SB,
                                            MASKED, CAUSAL, EMULATE_CAST, TMA, ROW_SCALAR)
    return acc, l_i, m_i, v_unit


@triton.jit
def _fp8_scheduled_kernel(
    Q, K, V, O, QD, KD, VD, q_strides, k_strides, v_strides, o_strides, descale_strides, H, N_Q, N_K, qk_scale,
    D_HEAD: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
    Q_SB: tl.constexpr, K_SB: tl.constexpr, V_SB: tl.constexpr,
    EMULATE_CAST: tl.constexpr, TMA: tl.constexpr, TMA_Q: tl.constexpr, EVEN_N: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PIPELINE: tl.constexpr, THETA: tl.constexpr,  # see schedule_constexprs
):
    """The teaching kernel (flashlab.kernels.fp8._fp8_forward_kernel), its key loop scheduled by
    PIPELINE and THETA."""
    start_m = tl.program_id(0)
    off_zh = tl.program_id(1)
    off_z = off_zh // H
    off_h = off_zh % H
    causal_offset = N_K - N_Q
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)

    q = _query_tile(Q, q_strides, off_z, off_h, off_zh, start_m, N_Q, D_HEAD, BLOCK_M, BLOCK_D, TMA_Q)
    if PIPELINE == 2 and not EMULATE_CAST:  # Q8_i in registers instead of shared memory (see _in_registers)
        q = _in_registers(q)
    row_factor, kd_ptr, vd_ptr, v_unit = _factors(QD, KD, VD, descale_strides, off_z, off_h, start_m, N_Q, qk_scale,
                                                  Q_SB, K_SB, V_SB, BLOCK_M)
    ROW_SCALAR: tl.constexpr = Q_SB == 0 or Q_SB % BLOCK_M == 0
    k_src, v_src, k_at, v_at = _key_tiles(K, V, k_strides, v_strides, off_z, off_h, off_zh, N_K,
                                          D_HEAD, BLOCK_N, BLOCK_D, TMA)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    lo, hi = causal_range_tl(start_m, BLOCK_M, N_Q, N_K, BLOCK_N, CAUSAL)
    acc, l_i, m_i, v_unit = _attend_scheduled(acc, l_i, m_i, v_unit, q, row_factor, k_src, v_src, k_at, v_at,
                                              kd_ptr, vd_ptr, offs_m, 0, lo, N_K, causal_offset, D_HEAD, BLOCK_D,
                                              BLOCK_N, K_SB, V_SB, False, CAUSAL, EMULATE_CAST, TMA, ROW_SCALAR,
                                              PIPELINE, THETA)
    if not EVEN_N:
        acc, l_i, m_i, v_unit = _attend_scheduled(acc, l_i, m_i, v_unit, q, row_factor, k_src, v_src, k_at, v_at,
                                                  kd_ptr, vd_ptr, offs_m, lo, hi, N_K, causal_offset, D_HEAD,
                                                  BLOCK_D, BLOCK_N, K_SB, V_SB, True, CAUSAL, EMULATE_CAST, TMA,
                                                  ROW_SCALAR, 0, THETA)
    _store_o(O, o_strides, acc, l_i, v_unit, off_z, off_h, start_m, N_Q, D_HEAD, BLOCK_M, BLOCK_D)


def flash_attention_fp8_scheduled(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, scale: float | None = None,
    q_descale: torch.Tensor | None = None, k_descale: torch.Tensor | None = None,
    v_descale: torch.Tensor | None = None, *, config: Candidate, pipeline: bool | str = False,
    rescale_threshold: float | None = None, q_block: int | None = None, k_block: int | None = None,
    v_block: int | None = None, out_dtype: torch.dtype = torch.bfloat16, tma: bool | None = None,
) -> torch.Tensor:
    """:func:`flashlab.kernels.fp8.flash_attention_fp8` (same arguments) with the key loop's
    ``pipeline`` and ``rescale_threshold`` (theta in log2 units, 0 <= theta <= 8; see the module
    docstring), for one explicit ``config`` (no autotuning). Returns o (B, H, N_q, d)."""
    if config is None:
        raise ValueError("config must be given: (BLOCK_M, BLOCK_N, warps, stages[, max registers]); got None")
    schedule = schedule_constexprs(pipeline, rescale_threshold)
    return launch_fp8(_fp8_scheduled_kernel, q, k, v, causal, scale, q_descale, k_descale, v_descale,
                      q_block=q_block, k_block=k_block, v_block=v_block, out_dtype=out_dtype, config=config, tma=tma,
                      **schedule)
