"""FlashAttention-4's two software tricks (Zadouri et al., 2026, §3.1-3.2) as Triton forward variants.

The kernel has forward.py's FlashAttention-2 structure (grid = (query blocks, batch x heads),
a K/V loop, exp2 with log2(e) folded into the scale, one division at the end, causal block
skipping with the same [0, lo) unmasked / [lo, hi) masked ranges). Two things change:

1. Software exp2 (软件指数) on part of every P tile. The special-function unit (MUFU) does
   16 exp2 per clock per SM on Hopper, the FMA pipes 128 fused multiply-adds. FA4 moves a
   fraction of the exponentials to the FMA pipes:

       x  <- max(x, -127)                        clamp: 2^-127 and below come out as 0
       t  = (x - b) + 1.5 * 2^23                 range reduction (范围约简): the fp32 add rounds to
                                                 the nearest integer n = round(x - b) (b = 127/256)
                                                 and leaves n in t's low mantissa bits
       n  = t - 1.5 * 2^23;   f = x - n          x = n + f, f in [-2^-8, 1)
       p  = 1 + f (c1 + f (c2 + f c3))           多项式 (polynomial), Horner: 3 FMAs
       2^x = bits(p) + (bits(t) << 23)           2^n * p: n added to p's exponent field

   The bias b makes round(x - b) = floor(x) except within 2^-8 below an integer, where it
   gives n = floor(x) + 1 and a tiny negative f (the cubic is as accurate there); it also
   sends the clamp value -127 to n = -127, f = 0, p = 1, whose bits + (-127 << 23) are
   exactly +0.0, so a masked score (-inf) gives an exact 0. bits(t) << 23 equals n << 23
   because the bits of 1.5 * 2^23 end in nine zeros: FA4's own trick (flash_attn/cute,
   ex2_emulation), which rounds with a round-down add instead (no rounding modes without
   inline asm, which the interpreter lacks). tl.floor or a float -> int conversion would
   not do: on sm_90 FRND and F2I issue at 16 per clock per SM, the MUFU's own rate.
   c1, c2, c3 are the minimax cubic of flashlab.reference.softexp.fit_coefficients(3).

   POLY_COLS of the BLOCK_N columns use the polynomial, the rest tl.math.exp2. The tile is
   cut, not masked: `tl.where(col < POLY_COLS, poly, exp2)` would evaluate both for every
   element and save no MUFU work. Instead the (BLOCK_M, W) tile is split in halves with
   reshape -> permute -> tl.split (the idiom of Triton's attention tutorial), recursively:

       S - m   --split-->  [cols < W/2 | cols >= W/2]  --split first half again, s times-->
       poly on the first BLOCK_N / 2^s columns, exp2 on the rest, tl.join back in order

   so poly_fraction is realised as 1/2^s: 1, 1/2, 1/4, 1/8 (0.1 -> 1/8), or 0 (no split).
   In Hopper's wgmma accumulator layout a thread holds columns 8g .. 8g + 7 (two of them)
   for every g, so cutting at a column bit >= 3 only regroups each thread's own registers:
   no data moves, and MUFU.EX2 really runs on (1 - 1/2^s) of the elements. Compiled for sm_90
   (triton 3.6, 128 x 128 tiles, 8 warps): MUFU.EX2 in the SASS 132 / 116 / 100 / 68 / 4 for
   fractions 0, 1/8, 1/4, 1/2, 1 (128 per tile, the 4 left are the rescale factors alpha), the
   same shared-memory stores, and the joined P reaches the P V wgmma without a convert_layout.
   On Hopper it is not faster: the MUFU is not this kernel's bottleneck (chapter 7).

2. Conditional rescaling (条件重缩放). A reference max m_ref per row replaces the running max;
   the tile moves it only when some row's block max exceeds it by more than theta (log2 units):

       m_new = max(m_ref, rowmax(S_ij))
       if max_rows(m_new - m_ref) > theta:         one decision per tile (block-uniform branch)
           alpha = exp2(m_ref - m_new);  l, O <- alpha l, alpha O;  m_ref <- m_new
       P_ij = exp2(S_ij - m_ref)  <= 2^theta       bounded: theta <= 15 keeps fp16's P finite
       l <- l + rowsum(P_ij);   O <- O + P_ij V_j
       O = O / l                                   exact: l and O carry the same 2^-m_ref

   rescale_threshold = None is the standard path (forward.py): rescale on every tile.

return_stats counts rescales per program: tiles whose branch was taken while some row already
held state (the first tile only initialises m_ref, as flashlab.reference.rescale counts). On
the standard path the count is of tiles where some row's max rose (= the count at theta = 0);
it costs a cross-warp max per tile there, so it is computed only when asked.

Glossary: 多项式 polynomial; 范围约简 range reduction (x = n + f); 条件重缩放 conditional
rescaling; m_ref = reference max (参考最大值); theta = threshold (阈值); MUFU = multi-function
unit (特殊函数单元); BLOCK_M = B_r (行块), BLOCK_N = B_c (列块).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..reference.softexp import fit_coefficients
from ._common import (
    INTERPRET,
    LOG2E,
    Candidate,
    causal_range_tl,
    check_qkv,
    check_rescale_threshold,
    check_runnable,
    check_scale,
    configs,
    launch_options,
    load_kv_tiles,
    pruner,
)

__all__ = ["flash_attention_fa4", "fa4_forward", "poly_exp2", "mixed_exp2", "poly_shift", "realised_poly_fraction",
           "COEFFICIENTS", "DEFAULT_CONFIG", "MAX_THRESHOLD"]

# The minimax cubic p(f) ~= 2^f on [0, 1] with p(0) = 1 (flashlab.reference.softexp): c0 = 1, c1, c2, c3.
COEFFICIENTS: tuple[float, float, float, float] = tuple(float(c) for c in fit_coefficients(3))  # type: ignore[assignment]
_C1, _C2, _C3 = COEFFICIENTS[1:]
MAX_THRESHOLD = 15.0  # P <= 2^theta must stay below fp16's largest value, 65504 < 2^16

# (BLOCK_M, BLOCK_N, warps, stages) autotuned when no config is given; the first is the default.
CANDIDATES: list[Candidate] = [(128, 128, 8, 3), (128, 64, 8, 3), (128, 64, 4, 3), (128, 128, 4, 3), (64, 64, 4, 4)]
WIDE_CANDIDATES: list[Candidate] = [(64, 32, 4, 2), (64, 64, 8, 2)]  # padded head dimension 256
DEFAULT_CONFIG: Candidate = CANDIDATES[0]
_CONFIGS = configs(CANDIDATES, WIDE_CANDIDATES, interpret_config={"BLOCK_M": 16, "BLOCK_N": 16})


def poly_shift(poly_fraction: float) -> int:
    """The constexpr POLY_SHIFT that realises ``poly_fraction``: -1 for 0 (hardware exp2 only),
    else s in 0..3 with 1/2^s the fraction nearest in ratio (0.1 -> 3, i.e. 1/8)."""
    if isinstance(poly_fraction, bool) or not isinstance(poly_fraction, (int, float)) \
            or not 0.0 <= float(poly_fraction) <= 1.0:
        raise ValueError(f"poly_fraction must be a number in [0, 1]; got {poly_fraction!r}")
    if poly_fraction == 0:
        return -1
    return min(3, max(0, round(-math.log2(poly_fraction))))


def realised_poly_fraction(poly_fraction: float) -> float:
    """The fraction of P's columns the kernel really computes with the polynomial."""
    s = poly_shift(poly_fraction)
    return 0.0 if s < 0 else 1.0 / (1 << s)


# ----------------------------------------------------------------------------- software exp2
@triton.jit
def poly_exp2(x, C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr):
    """2^x in fp32 on the FMA/ALU pipes: range reduction, Horner cubic, exponent insertion.

    Valid for x < 128; x <= -127 (and -inf) gives exactly 0, -127 < x < -126 a denormal."""
    x = tl.maximum(x, -127.0)  # clamp: the bit trick needs a normal exponent
    t = (x - 0.49609375) + 12582912.0  # (x - b) + 1.5 * 2^23: rounds to n = round(x - b) = floor(x) (almost)
    n = t - 12582912.0  # n as a float, exact
    f = x - n  # fractional part, in [-2^-8, 1)
    p = tl.fma(f, C3, C2)  # Horner: p = 1 + f (c1 + f (c2 + f c3))
    p = tl.fma(p, f, C1)
    p = tl.fma(p, f, 1.0)
    bits = p.to(tl.int32, bitcast=True) + (t.to(tl.int32, bitcast=True) << 23)  # exponent += n
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _halves(x, BLOCK_M: tl.constexpr, W: tl.constexpr):
    """(BLOCK_M, W) -> columns [0, W/2) and [W/2, W): a register regrouping, no data moves."""
    return tl.split(tl.permute(tl.reshape(x, (BLOCK_M, 2, W // 2)), (0, 2, 1)))


@triton.jit
def _unhalve(a, b, BLOCK_M: tl.constexpr, W: tl.constexpr):
    """Inverse of _halves: put columns [0, W/2) and [W/2, W) back side by side."""
    return tl.reshape(tl.permute(tl.join(a, b), (0, 2, 1)), (BLOCK_M, W))


@triton.jit
def mixed_exp2(x, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, POLY_SHIFT: tl.constexpr,
               C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr):
    """exp2 of a (BLOCK_M, BLOCK_N) tile: the first BLOCK_N >> POLY_SHIFT columns by the
    polynomial, the others by the hardware (MUFU). POLY_SHIFT = -1: hardware only."""
    if POLY_SHIFT < 0:
        y = tl.math.exp2(x)
    elif POLY_SHIFT == 0:
        y = poly_exp2(x, C1, C2, C3)
    else:
        a, b = _halves(x, BLOCK_M, BLOCK_N)  # columns [0, N/2) | [N/2, N)
        b = tl.math.exp2(b)
        if POLY_SHIFT == 1:
            a = poly_exp2(a, C1, C2, C3)
        else:
            a0, a1 = _halves(a, BLOCK_M, BLOCK_N // 2)  # [0, N/4) | [N/4, N/2)
            a1 = tl.math.exp2(a1)
            if POLY_SHIFT == 2:
                a0 = poly_exp2(a0, C1, C2, C3)
            else:
                a00, a01 = _halves(a0, BLOCK_M, BLOCK_N // 4)  # [0, N/8) | [N/8, N/4)
                a00 = poly_exp2(a00, C1, C2, C3)
                a01 = tl.math.exp2(a01)
                a0 = _unhalve(a00, a01, BLOCK_M, BLOCK_N // 4)
            a = _unhalve(a0, a1, BLOCK_M, BLOCK_N // 2)
        y = _unhalve(a, b, BLOCK_M, BLOCK_N)
    return y


# ----------------------------------------------------------------------------- the kernel
@triton.jit
def fa4_step(acc, l_i, m_i, count, qk, v, qk_scale, theta,
             MASKED: tl.constexpr, IEEE: tl.constexpr, COND: tl.constexpr, STATS: tl.constexpr,
             POLY_SHIFT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr):
    """Fold one block into (acc, l_i, m_i); m_i is the running max (COND=False) or the
    reference max m_ref (COND=True). qk: raw scores, masked entries -inf."""
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)  # m_new = max(m_ref, rowmax(S_ij))
    if COND or STATS:
        grow = m_new - tl.maximum(m_i, -3.0e38)  # how far each row's max rose; -inf state: huge, no NaN
    if COND:
        if tl.max(grow, 0) > theta:  # block-uniform: some row exceeds m_ref by more than theta
            count += (tl.max(m_i, 0) > float("-inf")).to(tl.int32)  # the first tile only initialises
            m_to = m_new
            if MASKED:
                m_to = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.math.exp2(m_i - m_to)  # 2^(m_ref - m_new)
            acc = acc * alpha[:, None]
            l_i = l_i * alpha
            m_i = m_new
    else:
        if STATS:
            count += ((tl.max(grow, 0) > 0.0) & (tl.max(m_i, 0) > float("-inf"))).to(tl.int32)
        m_to = m_new
        if MASKED:
            m_to = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen nothing: 0, not NaN
        alpha = tl.math.exp2(m_i - m_to)  # exp2(m - m_new): rescale every tile
        acc = acc * alpha[:, None]
        l_i = l_i * alpha
        m_i = m_new
    m_ref = m_i
    if MASKED:
        m_ref = tl.where(m_i == float("-inf"), 0.0, m_i)
    p = mixed_exp2(qk * qk_scale - m_ref[:, None], BLOCK_M, BLOCK_N, POLY_SHIFT, C1, C2, C3)  # P_ij
    l_i = l_i + tl.sum(p, 1)  # l += rowsum(P_ij)
    if IEEE:
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision="ieee")  # O += P_ij V_j
    else:
        acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_i, count


@triton.jit
def _attend_fa4(
    acc, l_i, m_i, count, q,
    k_ptrs, v_ptrs, stride_kn, stride_vn,  # K_0^T's and V_0's tiles, the strides between keys
    offs_m, lo, hi, qk_scale, theta, N_K, causal_offset,
    D_HEAD: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
    COND: tl.constexpr, STATS: tl.constexpr, POLY_SHIFT: tl.constexpr,
    C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr,
):
    """Fold key blocks [lo, hi) into the state, as forward.py's _attend."""
    k_ptrs += lo * stride_kn
    v_ptrs += lo * stride_vn
    d_ok = tl.arange(0, BLOCK_D) < D_HEAD
    for start_n in range(lo, hi, BLOCK_N):
        n = start_n + tl.arange(0, BLOCK_N)
        k, v = load_kv_tiles(k_ptrs, v_ptrs, n < N_K, d_ok, MASKED, BLOCK_D != D_HEAD, UPCAST)  # K_j^T, V_j
        if IEEE:
            qk = tl.dot(q, k, input_precision="ieee")
        else:
            qk = tl.dot(q, k)
        if MASKED:
            visible = n[None, :] < N_K
            if CAUSAL:
                visible = visible & (n[None, :] <= offs_m[:, None] + causal_offset)
            qk = tl.where(visible, qk, float("-inf"))
        acc, l_i, m_i, count = fa4_step(acc, l_i, m_i, count, qk, v, qk_scale, theta, MASKED, IEEE, COND, STATS,
                                        POLY_SHIFT, BLOCK_M, BLOCK_N, C1, C2, C3)
        k_ptrs += BLOCK_N * stride_kn
        v_ptrs += BLOCK_N * stride_vn
    return acc, l_i, m_i, count


@triton.autotune(configs=_CONFIGS, key=["N_Q", "N_K", "BLOCK_D", "CAUSAL", "IEEE", "COND", "POLY_SHIFT"],
                 prune_configs_by={"early_config_prune": pruner(WIDE_CANDIDATES)})
@triton.jit
def _fa4_kernel(
    Q, K, V, O, COUNT,  # COUNT (Z, H, cdiv(N_Q, BLOCK_M)) int32: rescales per program
    q_strides, k_strides, v_strides, o_strides,  # each (batch, head, row, d)
    H, GROUP, N_Q, N_K, qk_scale, theta,
    D_HEAD: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
    COND: tl.constexpr, STATS: tl.constexpr, POLY_SHIFT: tl.constexpr,
    C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr,
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
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D_HEAD
    row_ok = offs_m < N_Q

    q_ptrs = Q + off_z * q_strides[0] + off_h * q_strides[1] + offs_m[:, None] * q_strides[2] \
        + offs_d[None, :] * q_strides[3]
    k_ptrs = K + off_z * k_strides[0] + off_hkv * k_strides[1] + offs_n[None, :] * k_strides[2] \
        + offs_d[:, None] * k_strides[3]  # K_0^T (BLOCK_D, BLOCK_N)
    v_ptrs = V + off_z * v_strides[0] + off_hkv * v_strides[1] + offs_n[:, None] * v_strides[2] \
        + offs_d[None, :] * v_strides[3]  # V_0 (BLOCK_N, BLOCK_D)

    q = tl.load(q_ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # m (or m_ref) = -inf
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    count = tl.full([], 0, tl.int32)  # rescales taken by this program

    # Which key blocks to visit (_common.causal_key_range): [0, lo) unmasked, [lo, hi) masked.
    lo, hi = causal_range_tl(start_m, BLOCK_M, N_Q, N_K, BLOCK_N, CAUSAL)
    acc, l_i, m_i, count = _attend_fa4(acc, l_i, m_i, count, q, k_ptrs, v_ptrs, k_strides[2], v_strides[2],
                                       offs_m, 0, lo, qk_scale, theta, N_K, causal_offset,
                                       D_HEAD, BLOCK_D, BLOCK_M, BLOCK_N, False, CAUSAL, UPCAST, IEEE,
                                       COND, STATS, POLY_SHIFT, C1, C2, C3)
    acc, l_i, m_i, count = _attend_fa4(acc, l_i, m_i, count, q, k_ptrs, v_ptrs, k_strides[2], v_strides[2],
                                       offs_m, lo, hi, qk_scale, theta, N_K, causal_offset,
                                       D_HEAD, BLOCK_D, BLOCK_M, BLOCK_N, True, CAUSAL, UPCAST, IEEE,
                                       COND, STATS, POLY_SHIFT, C1, C2, C3)

    seen = l_i > 0  # rows that saw no key (causal, N_Q > N_K): output 0
    l_safe = tl.where(seen, l_i, 1.0)
    acc = acc / l_safe[:, None]  # O = diag(l)^-1 O, once: exact for any m_ref
    o_ptrs = O + off_z * o_strides[0] + off_h * o_strides[1] + offs_m[:, None] * o_strides[2] \
        + offs_d[None, :] * o_strides[3]
    tl.store(o_ptrs, acc.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
    if COND or STATS:
        tl.store(COUNT + off_zh * tl.num_programs(0) + start_m, count)


# ----------------------------------------------------------------------------- launcher and API
def fa4_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
                poly_fraction: float = 0.0, rescale_threshold: float | None = None, stats: bool = False,
                config: Candidate | None = None):
    """Launch the kernel on checked inputs (unit stride along d). Returns ``(o, counts, compiled)``:
    counts (Z, H, n_query_blocks) int32 or None, compiled the launched kernel (its ``asm`` holds
    the PTX and SASS on a GPU; None under the interpreter)."""
    Z, H, N_Q, D = q.shape
    H_KV, N_K = k.shape[1], k.shape[2]
    shift = poly_shift(poly_fraction)
    cond = rescale_threshold is not None
    o = torch.empty_like(q)
    block_d = max(16, triton.next_power_of_2(D))
    min_bm = config[0] if config is not None else min(c[0] for c in CANDIDATES + WIDE_CANDIDATES)
    # every program stores its count when COND or STATS (row-major over (Z * H, programs)), so empty suffices
    counts = torch.empty(Z * H * triton.cdiv(N_Q, 16 if INTERPRET else min_bm) if cond or stats else 1,
                         device=q.device, dtype=torch.int32)
    grid = lambda meta: (triton.cdiv(N_Q, meta["BLOCK_M"]), Z * H)  # noqa: E731
    kernel = _fa4_kernel if config is None else _fa4_kernel.fn
    compiled = kernel[grid](
        q, k, v, o, counts, q.stride(), k.stride(), v.stride(), o.stride(),
        H, H // H_KV, N_Q, N_K, scale * LOG2E, float(rescale_threshold) if cond else 0.0,
        D_HEAD=D, BLOCK_D=block_d, CAUSAL=causal, UPCAST=INTERPRET, IEEE=q.dtype == torch.float32,
        COND=cond, STATS=bool(stats), POLY_SHIFT=shift, C1=_C1, C2=_C2, C3=_C3,
        **launch_options(config),
    )
    if not (cond or stats):
        return o, None, compiled
    bm = config[0] if config is not None else _fa4_kernel.best_config.kwargs["BLOCK_M"]
    return o, counts[: Z * H * triton.cdiv(N_Q, bm)].view(Z, H, -1), compiled


def _check(q, k, v, scale, poly_fraction, rescale_threshold) -> float:
    d = check_qkv(q, k, v)
    poly_shift(poly_fraction)
    check_rescale_threshold(rescale_threshold, MAX_THRESHOLD, "P <= 2^threshold must fit fp16")
    scale = check_scale(scale, d)
    check_runnable(q.device)  # last: every argument is checked wherever the tensors live
    return scale


def flash_attention_fa4(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    poly_fraction: float = 0.0,
    rescale_threshold: float | None = None,
    return_stats: bool = False,
    config: Candidate | None = None,
):
    """Exact attention, forward only, with FA4's software exp2 and conditional rescaling.

    Parameters
    ----------
    q : (B, H, N_q, d) float16, bfloat16 or float32 (fp32 uses IEEE dot products)
    k, v : (B, H_kv, N_k, d), H_kv dividing H (GQA)
    causal, scale : as :func:`flashlab.kernels.flash_attention` (causal aligned bottom-right)
    poly_fraction : share of each P tile's columns exponentiated by the cubic instead of the
        MUFU; realised as 0 or 1/2^s, s = 0..3 (:func:`realised_poly_fraction`; 0.1 -> 1/8)
    rescale_threshold : theta in log2 units, 0 <= theta <= 15 (FA4: 8); None rescales every tile
    return_stats : also return the rescales per program, int32 (B, H, n_query_blocks)
    config : (BLOCK_M, BLOCK_N, warps, stages); None autotunes (one config under the interpreter)

    Returns
    -------
    o : (B, H, N_q, d) in q's dtype, or ``(o, rescales)``. No autograd.
    """
    scale = _check(q, k, v, scale, poly_fraction, rescale_threshold)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    with torch.no_grad():
        o, counts, _ = fa4_forward(q, k, v, bool(causal), scale, poly_fraction, rescale_threshold,
                                   stats=return_stats, config=config)
    return (o, counts) if return_stats else o
